#!/usr/bin/env node
import { defaultCaDir, loadOrCreateCa } from "../tls/ca-store.js";
import { formatShellExports, guestEnvironment } from "../proxy/guest-env.js";
import { startProxy } from "../proxy/start-proxy.js";
import { parseCli, UsageError } from "./args.js";

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
  const proxy = await startProxy(command.options);
  process.stdout.write(`egressgate listening on ${proxy.url}\n`);
  await new Promise<void>((resolve) => {
    let stopping = false;
    const stop = (signal: NodeJS.Signals): void => {
      if (stopping) process.exit(130); // a second signal: stop waiting for the drain
      stopping = true;
      process.stderr.write(`egressgate: ${signal}, closing\n`);
      void proxy.close().then(resolve);
    };
    process.on("SIGINT", stop);
    process.on("SIGTERM", stop);
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
