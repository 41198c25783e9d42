/**
 * Embedding egressgate with a declarative allowlist.
 *
 *   npx tsx examples/allowlist.ts api.github.com '*.npmjs.org'
 *
 * prints the guest environment and serves until Ctrl-C. Tests call `startAllowlistProxy()`.
 */
import { pathToFileURL } from "node:url";
import { createHttpHooks, startProxy, type HttpHooksOptions, type ProxyOptions, type RunningProxy } from "egressgate";

export async function startAllowlistProxy(
  policy: HttpHooksOptions,
  options: Omit<ProxyOptions, "httpHooks" | "env"> = {},
): Promise<RunningProxy> {
  const { httpHooks, env } = createHttpHooks(policy);
  return startProxy({ httpHooks, env, listen: { host: "127.0.0.1", port: 0 }, ...options });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const hosts = process.argv.slice(2);
  const proxy = await startAllowlistProxy({ allowedHosts: hosts.length > 0 ? hosts : ["api.github.com"] });
  for (const [key, value] of Object.entries(proxy.guestEnv())) console.log(`${key}=${value}`);
  process.once("SIGINT", () => void proxy.close());
}
