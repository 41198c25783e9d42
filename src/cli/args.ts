import yargs from "yargs";
import { createHttpHooks } from "../hooks/http-hooks.js";
import { createDjsHooks, djsHooksOptionsFromFile, PolicyLoadError, type DjsHooks } from "../djs/create-djs-hooks.js";
import { logLevels, type LogLevel } from "../log.js";
import type { ProxyOptions } from "../proxy/options.js";

/**
 * The environment variable that keeps secret placeholders stable: derived from its value, the
 * same in every worker of `--workers N` (which the primary sets for them) and across restarts.
 */
export const placeholderKeyEnv = "EGRESSGATE_PLACEHOLDER_KEY";

/** Thrown for bad flags or values; the CLI prints the message and exits 2. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

export type CliCommand =
  | { readonly kind: "serve"; readonly options: ProxyOptions; readonly workers: number }
  | { readonly kind: "help" }
  | { readonly kind: "ca"; readonly caDir: string | undefined }
  | { readonly kind: "env"; readonly caDir: string | undefined; readonly listen: { host: string; port: number } };

/** `HOST:PORT`, `[v6]:PORT` or a bare `PORT`. */
export function parseListen(value: string): { host: string; port: number } {
  const match = /^(?:(\[[0-9a-fA-F:.]+\]|[^:[\]]+):)?([0-9]{1,5})$/.exec(value);
  const port = Number(match?.[2]);
  if (match === null || port > 65535) throw new UsageError(`--listen: expected HOST:PORT, got ${JSON.stringify(value)}`);
  const host = match[1] ?? "127.0.0.1";
  return { host: host.startsWith("[") ? host.slice(1, -1) : host, port };
}

/**
 * `NAME@HOST[,HOST...][=VALUE]`: split at the first "@", then at the first "=" after it, so a
 * value may contain both. Without "=VALUE" the value comes from the environment variable NAME.
 */
export function parseHostSecret(spec: string, env: NodeJS.ProcessEnv): { name: string; hosts: string[]; value: string } {
  const at = spec.indexOf("@");
  if (at <= 0) throw new UsageError(`--host-secret: expected NAME@HOST[,HOST...][=VALUE], got ${JSON.stringify(redactSpec(spec))}`);
  const name = spec.slice(0, at);
  const rest = spec.slice(at + 1);
  const eq = rest.indexOf("=");
  const hostList = eq < 0 ? rest : rest.slice(0, eq);
  const hosts = hostList.split(",").map((h) => h.trim()).filter((h) => h !== "");
  if (hosts.length === 0) throw new UsageError(`--host-secret ${name}: no hosts given (NAME@HOST[,HOST...][=VALUE])`);
  let value: string;
  if (eq >= 0) value = rest.slice(eq + 1);
  else {
    const fromEnv = env[name];
    if (fromEnv === undefined) {
      throw new UsageError(`--host-secret ${name}: no =VALUE given and the environment variable ${name} is not set`);
    }
    value = fromEnv;
  }
  if (value === "") throw new UsageError(`--host-secret ${name}: the value is empty`);
  return { name, hosts, value };
}

/** A malformed spec may still hold a value: show only what precedes any "=". */
function redactSpec(spec: string): string {
  const eq = spec.indexOf("=");
  return eq < 0 ? spec : `${spec.slice(0, eq)}=…`;
}

/** `HOST=IP[,IP]` entries into the `resolve` option. */
export function parseResolve(values: readonly string[]): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const value of values) {
    const eq = value.indexOf("=");
    if (eq <= 0 || eq === value.length - 1) throw new UsageError(`--resolve: expected HOST=IP[,IP], got ${JSON.stringify(value)}`);
    const host = value.slice(0, eq);
    out[host] = [...(out[host] ?? []), ...value.slice(eq + 1).split(",").map((ip) => ip.trim())];
  }
  return out;
}

function nonNegativeInteger(value: number, flag: string): number {
  if (!Number.isSafeInteger(value) || value < 0) throw new UsageError(`${flag}: expected a non-negative integer, got ${String(value)}`);
  return value;
}

/** A numeric flag that, when given, sets an option; an absent flag leaves the API's default. */
function optionalInteger<T>(value: number | undefined, flag: string, set: (n: number) => T): T | Record<string, never> {
  if (value === undefined) return {};
  if (!Number.isSafeInteger(value) || value < 1) throw new UsageError(`${flag}: expected a positive integer, got ${String(value)}`);
  return set(value);
}

function connectionLimits(connections: number | undefined, perSource: number | undefined): Pick<ProxyOptions, "limits"> {
  const limits = {
    ...optionalInteger(connections, "--max-connections", (n) => ({ connections: n })),
    ...optionalInteger(perSource, "--max-connections-per-source", (n) => ({ connectionsPerSource: n })),
  };
  return Object.keys(limits).length === 0 ? {} : { limits };
}

function optionalString(value: unknown): string | undefined {
  return value === undefined ? undefined : String(value);
}

function strings(value: unknown): string[] {
  if (value === undefined) return [];
  return (Array.isArray(value) ? value : [value]).map(String);
}

/** Parses argv (without node and script) into a command. Throws UsageError on bad input. */
export function parseCli(argv: readonly string[], env: NodeJS.ProcessEnv = process.env): CliCommand {
  let command: CliCommand | undefined;
  const parser = yargs([...argv])
    .scriptName("egressgate")
    .usage("$0 [serve] [options]\n\nA TLS-terminating egress proxy for sandboxes.")
    .option("ca-dir", { type: "string", describe: "CA directory (default $XDG_CONFIG_HOME/egressgate or ~/.config/egressgate)" })
    .option("listen", { type: "string", default: "127.0.0.1:8080", describe: "HOST:PORT to listen on; port 0 picks a free port" })
    .command(
      ["serve", "$0"],
      "run the proxy",
      (y) =>
        y
          .option("allow-host", { type: "string", array: true, describe: "host pattern that may be reached (* matches any run); repeatable" })
          .option("allow-internal-host", { type: "string", array: true, describe: "host pattern that may resolve to internal addresses; repeatable" })
          .option("block-internal-ranges", { type: "boolean", default: true, describe: "refuse internal addresses (--no-block-internal-ranges to allow)" })
          .option("host-secret", { type: "string", array: true, describe: "NAME@HOST[,HOST...][=VALUE]: the guest gets a placeholder for it (value from $NAME if no =VALUE); repeatable" })
          .option("replace-secrets-in-query", { type: "boolean", default: false, describe: "also substitute placeholders in query strings" })
          .option("secret-redirects", {
            choices: ["scan", "refuse"] as const,
            default: "scan" as const,
            describe: "a redirect leaving a sent secret's hosts: scan it for the value (followed if absent), or refuse it",
          })
          .option("follow-redirects-to", { type: "string", array: true, describe: "host pattern that redirects may still reach with --secret-redirects refuse; repeatable" })
          .option("resolve", { type: "string", array: true, describe: "static name: HOST=IP[,IP]; repeatable" })
          .option("upstream-ca", { type: "string", array: true, describe: "extra PEM root for upstream TLS; repeatable" })
          .option("guest-env-file", { type: "string", describe: "write the guest environment (KEY=value lines) to FILE" })
          .option("leaf-key", { choices: ["ecdsa", "rsa"] as const, default: "ecdsa" as const, describe: "leaf certificate key type" })
          .option("max-redirects", { type: "number", default: 10, describe: "redirect hops followed before 508" })
          .option("max-body-bytes", { type: "number", default: 64 * 1024 * 1024, describe: "largest request body a hook may read (413 beyond)" })
          .option("max-response-body-bytes", {
            type: "number",
            default: 64 * 1024 * 1024,
            describe: "largest response body a hook may read (502 beyond)",
          })
          .option("upstream-body-timeout-ms", { type: "number", describe: "longest silence inside an upstream response body before the guest connection is cut; default 120000" })
          .option("max-connections", { type: "number", describe: "guest connections open at once (503 beyond); default half the open-file limit, at most 16384" })
          .option("max-connections-per-source", { type: "number", describe: "guest connections open at once from one address (503 beyond); default 256" })
          .option("hooks-script", {
            type: "string",
            describe: "tier-2 policy run in a QuickJS sandbox: .js script, .mjs module, .ts/.mts TypeScript",
          })
          .option("hooks-timeout-ms", { type: "number", describe: "time limit for one policy call, 1 to 60000 (502 beyond); default 100; needs --hooks-script" })
          .option("workers", { type: "number", default: 1, describe: "processes that share the listening port (node:cluster); 1 serves from this process" })
          .option("log-level", { choices: logLevels as LogLevel[], default: "info" as LogLevel, describe: "log verbosity (JSON lines on stderr)" }),
      (args) => {
        const maxRedirects = nonNegativeInteger(args["max-redirects"], "--max-redirects");
        const workers = nonNegativeInteger(args.workers, "--workers");
        if (workers < 1 || workers > 64) throw new UsageError(`--workers: expected 1 to 64, got ${workers}`);
        const maxHttpBodyBytes = nonNegativeInteger(args["max-body-bytes"], "--max-body-bytes");
        const maxHttpResponseBodyBytes = nonNegativeInteger(args["max-response-body-bytes"], "--max-response-body-bytes");
        const secrets: Record<string, { hosts: string[]; value: string }> = {};
        for (const spec of strings(args["host-secret"])) {
          const { name, hosts, value } = parseHostSecret(spec, env);
          if (secrets[name] !== undefined) throw new UsageError(`--host-secret ${name}: given twice`);
          secrets[name] = { hosts, value };
        }
        // Everything else is checked before the policy loads: a loaded policy has worker threads
        // to stop again when a later flag turns out bad.
        const listen = parseListen(args.listen);
        const resolve = parseResolve(strings(args.resolve));
        const followRedirectsTo = strings(args["follow-redirects-to"]);
        if (followRedirectsTo.length > 0 && args["secret-redirects"] !== "refuse") {
          throw new UsageError("--follow-redirects-to: only applies with --secret-redirects refuse");
        }
        let djsHooks: DjsHooks | undefined;
        const script = args["hooks-script"];
        // A time limit with no policy to limit is a mistake in the command, not something to ignore.
        if (script === undefined && args["hooks-timeout-ms"] !== undefined) throw new UsageError("--hooks-timeout-ms: only applies with --hooks-script");
        if (script !== undefined) {
          const timeoutMs = nonNegativeInteger(args["hooks-timeout-ms"] ?? 100, "--hooks-timeout-ms");
          try {
            ({ djsHooks } = createDjsHooks({ ...djsHooksOptionsFromFile(script), limits: { timeoutMs } }));
          } catch (error) {
            const message = (error as Error).message.replace(/^createDjsHooks: limits\.timeoutMs/, "--hooks-timeout-ms");
            throw new UsageError(error instanceof PolicyLoadError ? `--hooks-script: ${message}` : message);
          }
        }
        let hooks: ReturnType<typeof createHttpHooks>;
        try {
          hooks = createHttpHooks({
            ...(djsHooks !== undefined ? { djsHooks } : {}),
            allowedHosts: strings(args["allow-host"]),
            allowedInternalHosts: strings(args["allow-internal-host"]),
            blockInternalRanges: args["block-internal-ranges"],
            secrets,
            replaceSecretsInQuery: args["replace-secrets-in-query"],
            secretRedirects: args["secret-redirects"],
            ...(followRedirectsTo.length > 0 ? { followRedirectsTo } : {}),
            ...(env[placeholderKeyEnv] !== undefined ? { secretPlaceholderKey: env[placeholderKeyEnv] } : {}),
          });
        } catch (error) {
          void djsHooks?.close();
          throw new UsageError(cliMessage((error as Error).message));
        }
        const caDir = args["ca-dir"];
        const envFile = args["guest-env-file"];
        command = {
          kind: "serve",
          workers,
          options: {
            httpHooks: hooks.httpHooks,
            env: hooks.env,
            listen,
            resolve,
            upstreamCa: strings(args["upstream-ca"]),
            leafKeyType: args["leaf-key"],
            maxRedirects,
            maxHttpBodyBytes,
            maxHttpResponseBodyBytes,
            ...optionalInteger(args["upstream-body-timeout-ms"], "--upstream-body-timeout-ms", (upstreamBodyMs) => ({ timeouts: { upstreamBodyMs } })),
            ...connectionLimits(args["max-connections"], args["max-connections-per-source"]),
            logLevel: args["log-level"],
            ...(caDir !== undefined ? { caDir } : {}),
            ...(envFile !== undefined ? { guestEnvFile: envFile } : {}),
          },
        };
      },
    )
    .command("ca", "print the CA certificate's path and PEM, creating the CA if missing", {}, (args) => {
      command = { kind: "ca", caDir: optionalString(args["ca-dir"]) };
    })
    .command("env", "print the guest environment as shell exports", {}, (args) => {
      const listen = parseListen(String(args["listen"]));
      if (listen.port === 0) throw new UsageError("env: --listen needs the proxy's real port, not 0");
      command = { kind: "env", caDir: optionalString(args["ca-dir"]), listen };
    })
    .strict()
    .wrap(100)
    .help()
    .version(false)
    .exitProcess(false)
    .fail((msg, err) => {
      if (err instanceof UsageError) throw err;
      throw new UsageError(msg ?? err?.message ?? "invalid arguments");
    });
  parser.parseSync();
  // yargs has already printed the help text when asked for it.
  if (command === undefined && (argv.includes("--help") || argv.includes("-h"))) return { kind: "help" };
  if (command === undefined) throw new UsageError("no command");
  return command;
}

/** Option names in library errors become flag names for CLI users. */
function cliMessage(message: string): string {
  return message
    .replace(/^createHttpHooks: /, "")
    .replace(/^secretPlaceholderKey/, `$${placeholderKeyEnv}`)
    .replace(/^secrets\.(\w+)\.hosts(\[\d+\])?/, "--host-secret $1")
    .replace(/^secrets\.(\w+)(\.value)?/, "--host-secret $1")
    .replace(/^followRedirectsTo(\[\d+\])?/, "--follow-redirects-to")
    .replace(/allowedInternalHosts(\[\d+\])?/, "--allow-internal-host")
    .replace(/allowedHosts(\[\d+\])?/, "--allow-host");
}
