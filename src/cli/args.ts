import path from "node:path";
import yargs from "yargs";
import { buildProxyOptions, type BuiltConfig, type BuiltProxyOptions } from "../config/build.js";
import { computedDefaults, defaults } from "../config/defaults.js";
import { configOverrides, optionFlags } from "../config/flags.js";
import type { ProxyConfig } from "../config/document.js";
import { checkGuestName, checkListenHost, parseHostPort } from "../config/nodes.js";
import { homePath } from "../home-path.js";
import { optionFlagDeclarations } from "./flag-options.js";
import { asFlagError, configFromFile, configFromFlags, inFile } from "./serve-config.js";
import { UsageError } from "./usage-error.js";
import { makeIssue, OptionError } from "../option-error.js";
import type { CheckCommand } from "./check.js";
import { flagGroups } from "./flag-groups.js";
import { packageVersion } from "./version.js";

export { UsageError } from "./usage-error.js";
export { parseHostSecret, parseResolve } from "./serve-config.js";

/**
 * The environment variable that keeps secret placeholders and guest tokens stable: derived from
 * its value, the same in every worker of `--workers N` (which the primary sets for them) and
 * across restarts.
 */
export const logFormats = ["json", "pretty"] as const;
export type LogFormat = (typeof logFormats)[number];

export const placeholderKeyEnv = "EGRESSGATE_PLACEHOLDER_KEY";

export type CliCommand =
  | {
      readonly kind: "serve";
      /** startProxy's options (`built.options`). */
      readonly options: BuiltProxyOptions;
      readonly built: BuiltConfig;
      readonly config: ProxyConfig;
      readonly workers: number;
      /** `flags`, or the config file's path: how an option error is worded. */
      readonly source: string;
      /** `--log-format`; absent: pretty when stderr is a TTY, else JSON. */
      readonly logFormat?: LogFormat;
    }
  | { readonly kind: "help" }
  | { readonly kind: "ca"; readonly caDir: string | undefined }
  | { readonly kind: "env"; readonly caDir: string | undefined; readonly listen: { host: string; port: number }; readonly guest: string | undefined }
  | { readonly kind: "check-config"; readonly file: string }
  | { readonly kind: "check"; readonly check: CheckCommand; readonly built: BuiltConfig; readonly source: string }
  | { readonly kind: "har-check"; readonly file: string };

/** `HOST:PORT`, `[v6]:PORT` or a bare `PORT`, its host held to the rule the serve command's --listen is. */
export function parseListen(value: string): { host: string; port: number } {
  const parsed = parseHostPort(value, defaults.listen.host);
  if (parsed === undefined) throw new UsageError(`--listen: expected HOST:PORT, got ${JSON.stringify(value)}`);
  // `env --listen 'a b:80'` printed HTTPS_PROXY='http://a b:80', a URL no client parses.
  const problem = checkListenHost(parsed.host);
  if (problem !== undefined) throw new UsageError(`--listen: ${problem}`);
  return parsed;
}

function optionalString(value: unknown): string | undefined {
  return value === undefined ? undefined : String(value);
}

/** `ca` and `env`'s --ca-dir, read as serve reads it: `--ca-dir=~/ca` is under $HOME (a shell leaves that tilde alone). */
function caDirFlag(value: unknown, env: NodeJS.ProcessEnv): string | undefined {
  const written = optionalString(value);
  if (written === undefined) return undefined;
  return path.resolve(
    homePath(written, env, (reason) => {
      throw new UsageError(`--ca-dir: ${reason}`);
    }),
  );
}

/** Flags of a running proxy that `check`, which starts none, would ignore. */
const serveOnlyPaths = new Set<string>(["workers", "watch", "auditLog", "guestEnvFile"]);

/**
 * `check` sends nothing, writes nothing and starts no proxy, so a recording, a replay, workers,
 * a watch, an audit log or a guest env file named by a flag would be ignored: refused instead.
 * (A config file's values for them are ignored, so that the file the proxy serves can be
 * checked as it is.)
 */
function refuseServeOnlyFlags(args: Record<string, unknown>): void {
  for (const [path, flag] of Object.entries(optionFlags)) {
    if (args[flag.slice(2)] === undefined) continue;
    if (path.startsWith("upstream.")) {
      throw new UsageError(`check: ${flag} has no effect: check sends nothing and records nothing; give the upstream's answer with --response STATUS [-R 'Name: v']...`);
    }
    if (serveOnlyPaths.has(path)) throw new UsageError(`check: ${flag} has no effect: check starts no proxy and writes no file`);
  }
}

/**
 * The global flags (`--listen`, `--ca-dir`) given to a command that does not read them: refused,
 * as a flag a command does not know is, rather than ignored (an operator who wrote
 * `egressgate check-config f.yaml --ca-dir /srv/ca` would believe the file was checked with it).
 */
function refuseUnreadGlobals(command: string, args: Record<string, unknown>, flags: readonly string[], reads: string): void {
  for (const flag of flags) {
    if (args[flag] !== undefined) throw new UsageError(`${command}: --${flag} has no effect: ${reads}`);
  }
}

/**
 * A recording has one writer: with several workers each would write its own file over the
 * others'. Said in the words of where the setting came from (`--workers`, or the file's key).
 */
export function checkRecordingWriters(config: ProxyConfig, file: string | undefined): void {
  const upstream = config.proxy.upstream;
  if (config.workers <= 1 || (upstream?.record === undefined && upstream?.replay?.recordMissing !== true)) return;
  if (file === undefined) throw new UsageError(`--workers ${config.workers}: a recording has one writer; record with --workers 1`);
  throw new OptionError(makeIssue(["workers"], `is ${config.workers} with a recording (upstream.record or upstream.replay.recordMissing): a recording has one writer; record with workers: 1 (or --workers 1)`));
}

/**
 * The serve command: the configuration (from flags, or `--config FILE` with its overrides),
 * checked whole, then built, which loads the policies. Everything is checked before a policy
 * loads: a loaded policy has worker threads to stop again when something turns out bad.
 */
function serveCommand(args: Record<string, unknown>, env: NodeJS.ProcessEnv, argv: readonly string[]): CliCommand {
  const file = optionalString(args["config"]);
  // argv gives the order of the chain flags (--hooks-script, --hook-command, --hook-url, --hook-opa).
  const config = file === undefined ? configFromFlags(args, env, process.cwd(), argv) : configFromFile(file, args, env, process.cwd());
  let built: BuiltConfig;
  try {
    checkRecordingWriters(config, file);
    built = buildProxyOptions(config, { deploymentKey: env[placeholderKeyEnv] });
  } catch (error) {
    throw file === undefined ? asFlagError(error) : inFile(error, file);
  }
  return { kind: "serve", options: built.options, built, config, workers: config.workers, source: file ?? "flags" };
}

/** The flags that take a value, beyond the option flags: one value each unless `array`. */
const otherValueFlags: Record<string, { readonly type: string; readonly array?: boolean }> = {
  config: { type: "string" },
  json: { type: "boolean" },
  dns: { type: "boolean" },
  "ca-dir": { type: "string" },
  listen: { type: "string" },
  guest: { type: "string" },
  "log-format": { type: "string" },
  header: { type: "string", array: true },
  response: { type: "number" },
  "response-header": { type: "string", array: true },
};

/**
 * What yargs lets through on its own: a flag given no value (`--allow-host` last, or before
 * another flag) served as if it were absent; `--max-redirects ""` became 0; `--config ""` read
 * the working directory; and a flag of one value given twice was reported as a list.
 */
function refuseBadFlagValues(argv: readonly string[]): void {
  const declared: Record<string, { readonly type?: unknown; readonly array?: unknown }> = { ...optionFlagDeclarations(), ...otherValueFlags };
  const seen = new Set<string>();
  /** Each on/off flag's value so far, and how it was spelled. */
  const switches = new Map<string, { readonly on: boolean; readonly flag: string }>();
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--") break;
    if (!arg.startsWith("--")) continue;
    const eq = arg.indexOf("=");
    // yargs takes camelCase spellings too (--blockInternalRanges): judged as the flag they stand for.
    const name = (eq < 0 ? arg.slice(2) : arg.slice(2, eq)).replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`);
    const option = Object.hasOwn(declared, name) ? declared[name]! : undefined;
    const flag = `--${name}`;
    const negated = name.startsWith("no-") && Object.hasOwn(declared, name.slice(3)) && declared[name.slice(3)]!.type === "boolean";
    if (option?.type === "boolean" || negated) {
      // yargs reads any value but "true" as false: --block-internal-ranges=yes turned the block
      // off, with no word (black-box finding). As in a config file: true or false, or no value;
      // the --no- form takes none.
      const value = eq < 0 ? undefined : arg.slice(eq + 1);
      if (negated && value !== undefined) throw new UsageError(`${flag}: takes no value (got ${JSON.stringify(value)})`);
      if (value !== undefined && value !== "true" && value !== "false") throw new UsageError(`${flag}: takes no value, or true or false (got ${JSON.stringify(value)})`);
      // `--auth --no-auth` served an open proxy, the last one winning without a word (black-box
      // finding): a switch set both ways is a mistake in the command line, not a choice.
      const key = negated ? name.slice(3) : name;
      const on = !negated && value !== "false";
      const before = switches.get(key);
      if (before !== undefined && before.on !== on) throw new UsageError(`${before.flag} and ${arg}: given both ways; give one`);
      switches.set(key, { on, flag: arg });
      continue;
    }
    if (option === undefined) continue;
    const value = eq >= 0 ? arg.slice(eq + 1) : argv[i + 1];
    if (value === undefined || (eq < 0 && value.startsWith("--"))) throw new UsageError(`${flag}: needs a value`);
    if (value.trim() === "") throw new UsageError(option.type === "number" ? `${flag}: must be a number (got an empty value)` : `${flag}: needs a value (got an empty one)`);
    // yargs makes "abc" NaN, and the range check then said "(got NaN)" instead of what was given.
    if (option.type === "number" && Number.isNaN(Number(value))) throw new UsageError(`${flag}: must be a number (got ${JSON.stringify(value)})`);
    if (option.array !== true && seen.has(name)) throw new UsageError(`${flag}: given twice; it takes one value`);
    seen.add(name);
  }
}

/** Parses argv (without node and script) into a command. Throws UsageError or an option error on bad input. */
export function parseCli(argv: readonly string[], env: NodeJS.ProcessEnv = process.env): CliCommand {
  refuseBadFlagValues(argv);
  let command: CliCommand | undefined;
  const parser = yargs([...argv])
    .scriptName("egressgate")
    .usage("$0 [serve] [options]\n\nA TLS-terminating egress proxy for sandboxes.")
    .option("ca-dir", { type: "string", describe: "CA directory", defaultDescription: computedDefaults.caDir })
    // Outside serve (which declares its own), the one command that reads it is env, which prints
    // the running proxy's address and so refuses port 0: `env --help` said "port 0 picks a free port".
    .option("listen", { type: "string", describe: "HOST:PORT of the running proxy, whose real port env prints (not 0)", defaultDescription: `${defaults.listen.host}:${defaults.listen.port}` })
    .command(
      ["serve", "$0"],
      "run the proxy",
      (y) =>
        y
          .option("config", { type: "string", group: flagGroups.listening, describe: `run from a config file (YAML or JSON; docs/config.md); ${configOverrides.map((path) => optionFlags[path]).join(", ")} override it` })
          .options(optionFlagDeclarations())
          .option("log-format", { type: "string", choices: logFormats, group: flagGroups.logs, describe: "json (one object per line) or pretty (one coloured line per request)", defaultDescription: "pretty when stderr is a terminal, else json" }),
      (args) => {
        const serve = serveCommand(args, env, argv);
        const format = optionalString(args["log-format"]) as LogFormat | undefined;
        command = serve.kind === "serve" && format !== undefined ? { ...serve, logFormat: format } : serve;
      },
    )
    .command("ca", "print the CA certificate's path and PEM, creating the CA if missing", {}, (args) => {
      refuseUnreadGlobals("ca", args, ["listen"], "ca reads only --ca-dir");
      command = { kind: "ca", caDir: caDirFlag(args["ca-dir"], env) };
    })
    .command(
      "env",
      "print the guest environment as shell exports",
      (y) => y.option("guest", { type: "string", describe: `the guest whose credentialed proxy URL to print; needs $${placeholderKeyEnv}, the key the proxy runs with` }),
      (args) => {
        const listen = parseListen(String(args["listen"] ?? `${defaults.listen.host}:${defaults.listen.port}`));
        if (listen.port === 0) throw new UsageError("env: --listen needs the proxy's real port, not 0");
        const guest = optionalString(args["guest"]);
        if (guest !== undefined) {
          const bad = checkGuestName(guest);
          if (bad !== undefined) throw new UsageError(`--guest: ${bad}`);
          // A token derives from the deployment key; without it the proxy made a random one.
          if ((env[placeholderKeyEnv] ?? "").length < 32) {
            throw new UsageError(
              `env --guest ${guest}: needs $${placeholderKeyEnv} (at least 32 characters), the key the proxy runs with; without one, tokens are random per start: read them from the file --guest-env-file writes`,
            );
          }
        }
        command = { kind: "env", caDir: caDirFlag(args["ca-dir"], env), listen, guest };
      },
    )
    .command(
      "har <action> <file>",
      "har check FILE: check a HAR file (HAR 1.2, sidecar files), list its entries and any secret-looking strings (exit 0, 1 if any, 2 if not valid)",
      (y) => y.positional("action", { type: "string", choices: ["check"], demandOption: true }).positional("file", { type: "string", demandOption: true }),
      (args) => {
        refuseUnreadGlobals("har check", args, ["listen", "ca-dir"], "har check reads only the HAR file");
        command = { kind: "har-check", file: String(args["file"]) };
      },
    )
    .command(
      "check <method> <url>",
      "evaluate one request offline through the real pipeline and print each step, the resolution, the address verdicts and the answer; nothing is sent upstream (exit 0 allowed, 1 denied, 2 usage)",
      (y) =>
        y
          .positional("method", { type: "string", demandOption: true })
          .positional("url", { type: "string", demandOption: true })
          .option("config", { type: "string", describe: "the config file to check against (or give the serve flags)" })
          .options(optionFlagDeclarations())
          .option("guest", { type: "string", describe: "the guest the request comes from (when there are several)" })
          .option("header", { alias: "H", type: "string", array: true, describe: "'Name: value' request header, repeatable; {{NAME}} stands for the guest's placeholder of secret NAME" })
          .option("json", { type: "boolean", describe: "print the report as JSON" })
          .option("dns", { type: "boolean", default: true, describe: "resolve names with the system resolver (--no-dns: only resolve and IP literals; the address checks are skipped)" })
          .option("response", { type: "number", describe: "also run the response phase on an upstream answer with this status" })
          .option("response-header", { alias: "R", type: "string", array: true, describe: "'Name: value' header of that answer, repeatable" }),
      (args) => {
        refuseServeOnlyFlags(args);
        const serve = serveCommand(args, env, argv);
        if (serve.kind !== "serve") throw new UsageError("check: no configuration");
        const status = args["response"] as number | undefined;
        if (status !== undefined && (!Number.isInteger(status) || status < 100 || status > 599)) throw new UsageError(`--response: expected a status 100-599, got ${String(status)}`);
        const list = (value: unknown): string[] => (Array.isArray(value) ? value.map(String) : []);
        if (status === undefined && list(args["response-header"]).length > 0) throw new UsageError("-R needs --response STATUS");
        command = {
          kind: "check",
          built: serve.built,
          source: serve.source,
          check: {
            options: serve.options,
            guest: optionalString(args["guest"]),
            method: String(args["method"]),
            url: String(args["url"]),
            headers: list(args["header"]),
            json: args["json"] === true,
            dns: args["dns"] !== false,
            response: status === undefined ? undefined : { status, headers: list(args["response-header"]) },
          },
        };
      },
    )
    .command(
      "check-config <file>",
      "check a config file offline and print its guests, secrets redacted (exit 0, or 2)",
      (y) => y.positional("file", { type: "string", demandOption: true }),
      (args) => {
        refuseUnreadGlobals("check-config", args, ["listen", "ca-dir"], "check-config checks the file as it is, with its own listen and caDir; to try flags over a file, use egressgate check --config FILE");
        command = { kind: "check-config", file: String(args["file"]) };
      },
    )
    // In `check` (wherever the word comes: global flags may go first), a repeatable flag takes
    // one value each time (as curl's -H does): a greedy one
    // would swallow the method and URL after it (`check --allow-host a.test GET https://a.test/`).
    // Serving has no positionals, and its flags keep taking several values (`--allow-host A B`).
    .parserConfiguration({ "greedy-arrays": !argv.includes("check") })
    .strict()
    .wrap(100)
    .help()
    // -h as well: operators expect both spellings (as curl, mitmproxy and most CLIs take them).
    .alias("help", "h")
    .version("version", "print the version", packageVersion())
    .exitProcess(false)
    .fail((msg, err) => {
      if (err !== undefined && err !== null && (err instanceof UsageError || "code" in err)) throw err;
      throw new UsageError(msg ?? err?.message ?? "invalid arguments");
    });
  parser.parseSync();
  // yargs has already printed the help text when asked for it.
  if (command === undefined && (argv.includes("--help") || argv.includes("-h") || argv.includes("--version"))) return { kind: "help" };
  if (command === undefined) throw new UsageError("no command");
  return command;
}
