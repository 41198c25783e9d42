/**
 * The bench's embedded egressgate: `startProxy` from the package ("egressgate", i.e. dist/) with
 * the settings bench/targets.ts gives the CLI (the `--host` name resolved to 127.0.0.1, every
 * bench.test name allowed as an internal host, the upstream CA, log level warn, 127.0.0.1:0).
 * With `--hooks` it also registers a no-op tier-3 pair, `onRequest: () => undefined` and
 * `onResponse: () => undefined`; with `--djs FILE` a tier-2 policy file, which bench/targets.ts
 * writes from bench/policies.ts (a no-op pair, or a header allowlist); with `--webhook URL` or
 * `--command FILE` an external decider as its one chain entry (request phase, cacheMs off). So the
 * bench targets built on it (`egressgate-api`, `egressgate+hooks`, `egressgate+djs`,
 * `egressgate+djs-allowlist`, `egressgate+webhook`, `egressgate+command`) differ only in their hooks.
 *
 *   npx tsx bench/hooked-proxy.ts --ca-dir DIR --upstream-ca FILE --host NAME [--hooks] [--djs FILE] [--webhook URL] [--command FILE]
 *
 * prints `egressgate listening on http://127.0.0.1:PORT` like the CLI and serves until SIGINT or
 * SIGTERM. The bench does not run it under tsx: it transpiles this file into its temp dir and
 * runs it with plain node, so its CPU and RSS compare with the CLI's (tsx adds about 35 MiB).
 */
import { createDjsHooks, createHttpHooks, djsHooksOptionsFromFile, startProxy } from "egressgate";

interface Settings {
  readonly caDir: string;
  readonly upstreamCaFile: string;
  readonly host: string;
  readonly hooks: boolean;
  readonly djs: string | undefined;
  readonly webhook: string | undefined;
  readonly command: string | undefined;
}

const usage = "usage: hooked-proxy --ca-dir DIR --upstream-ca FILE --host NAME [--hooks] [--djs FILE] [--webhook URL] [--command FILE]";

function parseArgs(argv: readonly string[]): Settings {
  let caDir: string | undefined;
  let upstreamCaFile: string | undefined;
  let host: string | undefined;
  let hooks = false;
  let djs: Settings["djs"];
  let webhook: Settings["webhook"];
  let command: Settings["command"];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--hooks") hooks = true;
    else if (arg === "--ca-dir") caDir = argv[++i];
    else if (arg === "--upstream-ca") upstreamCaFile = argv[++i];
    else if (arg === "--host") host = argv[++i];
    else if (arg === "--djs") djs = argv[++i];
    else if (arg === "--webhook") webhook = argv[++i];
    else if (arg === "--command") command = argv[++i];
    else throw new TypeError(`unknown argument ${JSON.stringify(arg)}\n${usage}`);
  }
  if (caDir === undefined || upstreamCaFile === undefined || host === undefined) throw new TypeError(`--ca-dir, --upstream-ca and --host are required\n${usage}`);
  return { caDir, upstreamCaFile, host, hooks, djs, webhook, command };
}

async function main(): Promise<void> {
  const settings = parseArgs(process.argv.slice(2));
  // What the CLI builds from `--allow-internal-host *.bench.test`, plus the hooks when asked.
  const { httpHooks, env } = createHttpHooks({
    allowedInternalHosts: ["*.bench.test"],
    ...(settings.hooks ? { onRequest: () => undefined, onResponse: () => undefined } : {}),
    ...(settings.djs !== undefined ? createDjsHooks(djsHooksOptionsFromFile(settings.djs)) : {}),
    ...(settings.webhook !== undefined ? { hooks: [{ webhook: settings.webhook }] } : {}),
    ...(settings.command !== undefined ? { hooks: [{ command: [settings.command] }] } : {}),
  });
  const proxy = await startProxy({
    httpHooks,
    env,
    listen: { host: "127.0.0.1", port: 0 },
    caDir: settings.caDir,
    resolve: { [settings.host]: ["127.0.0.1"] },
    upstreamCa: [settings.upstreamCaFile],
    logLevel: "warn",
  });
  process.stdout.write(`egressgate listening on ${proxy.url}\n`);
  // As the CLI does: the first signal drains and closes, a second one exits at once.
  let stopping = false;
  const stop = (signal: NodeJS.Signals): void => {
    if (stopping) process.exit(130);
    stopping = true;
    process.stderr.write(`hooked-proxy: ${signal}, closing\n`);
    void proxy.close().then(() => process.exit(0));
  };
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
}

main().catch((error: unknown) => {
  process.stderr.write(`hooked-proxy: ${(error as Error)?.message ?? String(error)}\n`);
  process.exit(1);
});
