#!/usr/bin/env node
import { defaultCaDir, loadOrCreateCa } from "../tls/ca-store.js";
import { formatShellExports, guestEnvironment } from "../proxy/guest-env.js";
import { startProxy } from "../proxy/start-proxy.js";
import { djsHooksOf } from "../hooks/http-hooks.js";
import { parseCli, UsageError } from "./args.js";
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
  const hooks = command.options.httpHooks;
  const djsHooks = hooks === undefined ? undefined : djsHooksOf(hooks);
  if (command.workers > 1 && !worker) {
    // The arguments are valid and the policy loads (parseCli loaded it); the workers load their
    // own. The CA is made here, once, so that no two workers race to create it.
    await djsHooks?.close();
    await loadOrCreateCa(command.options.caDir ?? defaultCaDir());
    const listen = { host: command.options.listen?.host ?? "127.0.0.1", port: command.options.listen?.port ?? 8080 };
    return runPrimary(argv, command.workers, listen, (line) => process.stdout.write(`${line}\n`));
  }
  // In a cluster, only the first worker writes the guest environment file, and for `--listen
  // HOST:0` every worker listens on the port the primary picked.
  const { guestEnvFile, ...rest } = command.options;
  void guestEnvFile;
  const port = worker ? siblingPort() : undefined;
  const options = {
    ...(worker && !isFirstWorker() ? rest : command.options),
    ...(port !== undefined ? { listen: { host: command.options.listen?.host ?? "127.0.0.1", port } } : {}),
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
    process.on("SIGINT", stop);
    process.on("SIGTERM", stop);
    if (worker) reportListening(proxy.url, close);
    else process.stdout.write(`egressgate listening on ${proxy.url}\n`);
  });
  return 0;
}

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
    process.stderr.write(`egressgate: ${(error as Error)?.message ?? String(error)}\n`);
    process.exitCode = 1;
  },
);

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
  return message.replace(/^startProxy: (\w+)/, (whole, name: string) => (flags[name] ? flags[name] : whole));
}
