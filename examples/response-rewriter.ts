/**
 * Embedding egressgate with a tier-3 `onResponse` hook that rewrites JSON responses: every
 * field whose name looks like a credential (`token`, `secret`, `password`, `apiKey`, …), at any
 * depth, reaches the guest as "[REDACTED]". Everything else is forwarded as received.
 *
 *   npx tsx examples/response-rewriter.ts api.github.com
 *
 * prints the guest environment and serves until Ctrl-C. Tests call `startResponseRewriterProxy()`.
 * The package name resolves to dist/, so run `npm run build` first.
 *
 * The hook sees compressed responses already decoded (DESIGN.md §3 step 7). When it returns
 * `undefined`, even after reading the body, the guest gets the upstream's original bytes, still
 * compressed; so the hook replaces the response only when it changed something.
 */
import { pathToFileURL } from "node:url";
import { createHttpHooks, startProxy, type HttpHooksOptions, type ProxyOptions, type RunningProxy } from "egressgate";

export const redacted = "[REDACTED]";

const credentialName = /token|secret|password|passwd|api[-_]?key|credential/i;

function isJson(contentType: string | null): boolean {
  const mediaType = contentType?.split(";", 1)[0]?.trim().toLowerCase() ?? "";
  return mediaType === "application/json" || (mediaType.startsWith("application/") && mediaType.endsWith("+json"));
}

/** A copy of `value` with credential-named fields replaced, and whether any was. */
function redact(value: unknown): { value: unknown; changed: boolean } {
  if (Array.isArray(value)) {
    const items = value.map(redact);
    return { value: items.map((i) => i.value), changed: items.some((i) => i.changed) };
  }
  if (typeof value !== "object" || value === null) return { value, changed: false };
  let changed = false;
  const out: Record<string, unknown> = {};
  for (const [key, field] of Object.entries(value)) {
    if (credentialName.test(key) && field !== redacted) {
      out[key] = redacted;
      changed = true;
    } else {
      const inner = redact(field);
      out[key] = inner.value;
      changed ||= inner.changed;
    }
  }
  return { value: out, changed };
}

/** An `onResponse` hook: a JSON response with credential fields is replaced by a redacted copy. */
export async function redactJsonCredentials(response: Response): Promise<Response | undefined> {
  if (response.body === null || !isJson(response.headers.get("content-type"))) return undefined;
  let data: unknown;
  try {
    data = await response.json();
  } catch {
    // Not JSON after all: undefined forwards the original bytes, which were kept.
    return undefined;
  }
  const result = redact(data);
  if (!result.changed) return undefined;
  const headers = new Headers(response.headers);
  // The body is new: its length is recomputed, and validators of the old one must not vouch for it.
  headers.delete("content-length");
  headers.delete("etag");
  headers.delete("content-md5");
  headers.set("content-type", "application/json; charset=utf-8");
  return new Response(JSON.stringify(result.value), { status: response.status, headers });
}

export async function startResponseRewriterProxy(
  policy: Omit<HttpHooksOptions, "onResponse">,
  options: Omit<ProxyOptions, "httpHooks" | "env"> = {},
): Promise<RunningProxy> {
  const { httpHooks, env } = createHttpHooks({ ...policy, onResponse: redactJsonCredentials });
  return startProxy({ httpHooks, env, listen: { host: "127.0.0.1", port: 0 }, ...options });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const hosts = process.argv.slice(2);
  const proxy = await startResponseRewriterProxy({ allowedHosts: hosts.length > 0 ? hosts : ["api.github.com"] });
  for (const [key, value] of Object.entries(proxy.guestEnv())) console.log(`${key}=${value}`);
  process.once("SIGINT", () => void proxy.close());
}
