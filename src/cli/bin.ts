#!/usr/bin/env node
import { defaultCaDir, loadOrCreateCa } from "../tls/ca-store.js";
import { formatShellExports, guestEnvironment } from "../proxy/guest-env.js";
import { startProxy } from "../proxy/start-proxy.js";
import { declarativeConfigOf, djsHooksOf } from "../hooks/http-hooks.js";
import { randomBytes } from "node:crypto";
import { resolveProxyOptions, type ProxyOptions } from "../proxy/options.js";
import { parseCli, placeholderKeyEnv, UsageError } from "./args.js";
import { isClusterWorker, isFirstWorker, reportListening, runPrimary, siblingPort } from "./cluster.js";

async function main(argv: readonly string[]): Promise<number> {
  const command = parseCli(argv);
  if (command.kind === "help") return 0;
  if (command.kind === "ca") {
    const ca = await loadOrCreateCa(command.caDir ?? defaultCaDir());
    process.stdout.write(`${ca.certPath}\n${ca.certPem}`);
    return 0;
  }
  if (command.kind === "env") {
    const ca = await loadOrCreateCa(command.caDir ?? defaultCaDir());
    const host = command.listen.host.includes(":") ? `[${command.listen.host}]` : command.listen.host;
    const env = guestEnvironment({
      proxyUrl: `http://${host}:${command.listen.port}`,
      caCertPath: ca.certPath,
      caBundlePath: ca.bundlePath,
      extra: {},
    });
    process.stdout.write(formatShellExports(env));
    return 0;
  }
  const worker = isClusterWorker();
  // Ctrl-C reaches every process of the group. In a cluster the primary orders the drain, so a
  // worker ignores SIGINT from its very start: one that closed on its own would look to the
  // primary like one that chose to stop, and one still starting would die of it.
  if (worker) process.on("SIGINT", () => undefined);
  const hooks = command.options.httpHooks;
  const secrets = declarativeConfigOf(hooks)?.secrets;
  if (secrets !== undefined) redactFatal = (text) => secrets.redact(text);
  const djsHooks = hooks === undefined ? undefined : djsHooksOf(hooks);
  try {
    if (command.workers > 1 && !worker) {
      // The flags are valid and the policy loads (parseCli loaded it); startProxy's own checks
      // run here too, so a bad option exits 2 before any worker starts. The workers load their
      // own policy. The CA is made here, once, so that no two workers race to create it.
      const { listen } = resolveProxyOptions(command.options);
      await djsHooks?.close();
      await loadOrCreateCa(command.options.caDir ?? defaultCaDir());
      // One placeholder key for all workers, so a guest's placeholders work whichever one serves it.
      const env = { [placeholderKeyEnv]: process.env[placeholderKeyEnv] ?? randomBytes(32).toString("hex") };
      return await runPrimary(argv, command.workers, listen, env, (line) => process.stdout.write(`${line}\n`));
    }
    // In a cluster, only the first worker writes the guest environment file, every worker's log
    // lines name it, and for `--listen HOST:0` every worker listens on the port the primary picked.
    const { guestEnvFile, ...rest } = command.options;
    void guestEnvFile;
    const port = worker ? siblingPort() : undefined;
    const options: ProxyOptions = {
      ...(worker && !isFirstWorker() ? rest : command.options),
      ...(port !== undefined ? { listen: { ...command.options.listen, port } } : {}),
      ...(worker ? { logSink: workerLogSink(process.pid) } : {}),
    };
    const proxy = await startProxy(options);
    await new Promise<void>((resolve) => {
      let closing = false;
      const close = (): void => {
        if (closing) return;
        closing = true;
        void proxy.close().then(async () => {
          await djsHooks?.close();
          // A worker's IPC channel would keep it alive after the drain.
          if (worker) process.disconnect?.();
          resolve();
        });
      };
      let signalled = false;
      const stop = (signal: NodeJS.Signals): void => {
        if (signalled) process.exit(130); // a second signal: stop waiting for the drain
        signalled = true;
        if (!worker) process.stderr.write(`egressgate: ${signal}, closing\n`);
        close();
      };
      if (!worker) process.on("SIGINT", stop);
      process.on("SIGTERM", stop);
      if (worker) reportListening(proxy.url, close);
      else process.stdout.write(`egressgate listening on ${proxy.url}\n`);
    });
  } catch (error) {
    // The policy's worker threads would otherwise keep a failed start alive.
    await djsHooks?.close();
    throw error;
  }
  return 0;
}

/** A worker's log lines carry its pid, so an operator can tell which process served what. */
function workerLogSink(pid: number): (line: string) => void {
  return (line) => void process.stderr.write(line.startsWith("{") ? `{"worker":${pid},${line.slice(1)}` : line);
}

/**
 * The last line of defence: an error nothing caught means the process's state is unknown, and
 * every guest depends on it. One JSON line with the stack (what a log pipeline can parse), then
 * a non-zero exit, so a supervisor (systemd's Restart=on-failure, or the --workers primary)
 * starts a clean one instead of leaving a half-broken proxy serving.
 */
let redactFatal: (text: string) => string = (text) => text;

function dieLoudly(kind: string, error: unknown): void {
  const err = error instanceof Error ? error : new Error(String(error));
  // The message and stack can quote a request (a URL, a header): redacted like every log line.
  const line = { time: new Date().toISOString(), level: "fatal", msg: kind, pid: process.pid, error: redactFatal(err.message), stack: redactFatal(err.stack ?? "") };
  try {
    process.stderr.write(`${JSON.stringify(line)}\n`);
  } finally {
    process.exit(70); // EX_SOFTWARE
  }
}
process.on("uncaughtException", (error) => dieLoudly("uncaught exception", error));
process.on("unhandledRejection", (reason) => dieLoudly("unhandled rejection", reason));

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    if (error instanceof UsageError || error instanceof TypeError || error instanceof RangeError) {
      process.stderr.write(`egressgate: ${flagNames(error.message)}\nRun "egressgate --help" for usage.\n`);
      process.exitCode = 2;
      return;
    }
    process.stderr.write(`egressgate: ${flagNames((error as Error)?.message ?? String(error))}\n`);
    process.exitCode = 1;
  },
).finally(() => {
  // A cluster worker that failed to start would stay alive on its IPC channel: the primary is
  // waiting for it to listen or to exit.
  if (isClusterWorker() && process.exitCode !== 0 && process.exitCode !== undefined) process.exit(process.exitCode);
});

/** startProxy names options as the API spells them; a CLI user knows the flags. */
function flagNames(message: string): string {
  const flags: Record<string, string> = {
    maxRedirects: "--max-redirects",
    resolve: "--resolve",
    upstreamCa: "--upstream-ca",
    listen: "--listen",
    caDir: "--ca-dir",
    guestEnvFile: "--guest-env-file",
    leafKeyType: "--leaf-key",
    logLevel: "--log-level",
  };
  return message
    .replace(/^startProxy: timeouts\.upstreamBodyMs/, "--upstream-body-timeout-ms")
    .replace(/^startProxy: limits\.connectionsPerSource/, "--max-connections-per-source")
    .replace(/^startProxy: limits\.connections/, "--max-connections")
    .replace(/^startProxy: (\w+)/, (whole, name: string) => (flags[name] ? flags[name] : whole));
}
