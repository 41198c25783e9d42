import { resolveDocument, resolveProxyWide, type ProxyConfig } from "../config/document.js";
import { loadConfigFile } from "../config/file.js";
import { chainFlags, configOverrides, flagText, optionFlags, type FlagPath } from "../config/flags.js";
import { issueOf, isOptionError, makeIssue, optionError, type OptionIssue, type Segment } from "../config/option-error.js";
import { configFileSchema } from "../config/schema.js";
import { InlineSecret } from "../config/secret-source.js";
import { validate } from "../config/validate.js";
import { givenDeciderFlags, givenFlags } from "./flag-options.js";
import { UsageError } from "./usage-error.js";

/**
 * The serve command's configuration, from flags or from `--config FILE`. The flags are turned
 * into a config document, the same shape a file has, and checked by the same schema; an error
 * then names the flag (from the flags table) instead of the option path.
 */

type Args = Readonly<Record<string, unknown>>;

function strings(value: unknown): string[] {
  if (value === undefined) return [];
  return (Array.isArray(value) ? value : [value]).map(String);
}

/** `HOST=IP[,IP]` entries into the `resolve` option. */
export function parseResolve(values: readonly string[]): Record<string, string[]> {
  // No prototype: a host named __proto__ stays a key, for the schema to refuse by name.
  const out = Object.create(null) as Record<string, string[]>;
  for (const value of values) {
    const eq = value.indexOf("=");
    if (eq <= 0 || eq === value.length - 1) throw new UsageError(`--resolve: expected HOST=IP[,IP], got ${JSON.stringify(value)}`);
    const host = value.slice(0, eq);
    out[host] = [...(out[host] ?? []), ...value.slice(eq + 1).split(",").map((ip) => ip.trim())];
  }
  return out;
}

/** A malformed spec may still hold a value: show only what precedes any "=". */
function redactSpec(spec: string): string {
  const eq = spec.indexOf("=");
  return eq < 0 ? spec : `${spec.slice(0, eq)}=…`;
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
  const listed = eq < 0 ? rest : rest.slice(0, eq);
  const hosts = listed.split(",").map((h) => h.trim());
  if (hosts.every((h) => h === "")) throw new UsageError(`--host-secret ${name}: no hosts given (NAME@HOST[,HOST...][=VALUE])`);
  // An empty entry (`NAME@a.test,`, `NAME@a.test,,b.test`) was dropped without a word: a host the
  // user meant to list, lost to a typo or an unset shell variable, is refused as a bad host is.
  const empty = hosts.indexOf("");
  if (empty >= 0) {
    throw new UsageError(`--host-secret ${name}: host ${empty + 1} of ${hosts.length} is empty (got ${JSON.stringify(listed)}); list hosts as NAME@HOST[,HOST...][=VALUE]`);
  }
  const value = eq >= 0 ? rest.slice(eq + 1) : Object.hasOwn(env, name) ? env[name] : undefined;
  if (value === undefined) throw new UsageError(`--host-secret ${name}: no =VALUE given and the environment variable ${name} is not set`);
  if (value === "") throw new UsageError(`--host-secret ${name}: the value is empty`);
  return { name, hosts, value };
}

function setPath(doc: Record<string, unknown>, path: string, value: unknown): void {
  const keys = path.split(".");
  let at = doc;
  for (const key of keys.slice(0, -1)) at = (at[key] ??= {}) as Record<string, unknown>;
  at[keys.at(-1)!] = value;
}

/**
 * The given flags as a config document. Only the `only` paths, when given. A secret's value,
 * given inline or read from $NAME, rides as an InlineSecret: flags may carry one, a file not.
 */
export function flagDocument(args: Args, env: NodeJS.ProcessEnv, only?: readonly FlagPath[], argv: readonly string[] = []): Record<string, unknown> {
  const doc: Record<string, unknown> = {};
  if (only === undefined && givenDeciderFlags(args).length > 0) {
    // Deciders make the chain the config file's `hooks`, policies included, in command-line order.
    doc["hooks"] = chainFromFlags(args, argv);
    only = (Object.keys(optionFlags) as FlagPath[]).filter((path) => path !== "hooksScript");
  }
  for (const [path, flag] of Object.entries(optionFlags) as Array<[FlagPath, string]>) {
    const value = args[flag.slice(2)];
    if (value === undefined || (only !== undefined && !only.includes(path))) continue;
    if (path === "resolve") doc["resolve"] = parseResolve(strings(value));
    else if (path === "secrets") {
      // No prototype: `constructor` is no secret given already, and __proto__ stays a key for the schema to refuse.
      const secrets = Object.create(null) as Record<string, unknown>;
      for (const spec of strings(value)) {
        const { name, hosts, value } = parseHostSecret(spec, env);
        if (secrets[name] !== undefined) throw new UsageError(`--host-secret ${name}: given twice`);
        // Without "=VALUE" after the hosts, the value came from $NAME: messages say so.
        const fromEnv = !spec.slice(spec.indexOf("@") + 1).includes("=");
        secrets[name] = { hosts, value: new InlineSecret(value, fromEnv ? `env:${name}` : "inline") };
      }
      doc["secrets"] = secrets;
    } else setPath(doc, path, value);
  }
  return doc;
}

/**
 * `--hooks-script`, `--hook-command`, `--hook-url` and `--hook-opa` as `hooks` entries, in the
 * order they appear in `argv` (yargs groups each flag's values, which loses the order between
 * flags). The values are yargs' own; argv gives only the order, so if the two disagree (a value
 * given another way yargs accepts) the entries follow in the flags' order instead.
 */
function chainFromFlags(args: Args, argv: readonly string[]): Record<string, unknown>[] {
  const kinds = Object.keys(chainFlags) as (keyof typeof chainFlags)[];
  const values = Object.fromEntries(kinds.map((kind) => [kind, strings(args[chainFlags[kind].slice(2)])])) as Record<keyof typeof chainFlags, string[]>;
  const byFlag = new Map(kinds.map((kind) => [chainFlags[kind] as string, kind]));
  const order: (keyof typeof chainFlags)[] = [];
  for (const arg of argv) {
    if (arg === "--") break;
    const kind = byFlag.get(arg.includes("=") ? arg.slice(0, arg.indexOf("=")) : arg);
    if (kind !== undefined) order.push(kind);
  }
  const agrees = kinds.every((kind) => order.filter((k) => k === kind).length === values[kind].length);
  const sequence = agrees ? order : kinds.flatMap((kind) => values[kind].map(() => kind));
  const next = Object.fromEntries(kinds.map((kind) => [kind, 0])) as Record<keyof typeof chainFlags, number>;
  return sequence.map((kind) => ({ [kind]: values[kind][next[kind]++]! }));
}

/** An option error in the CLI's words: the flag, not the option path. */
export function flagError(issue: OptionIssue, cause?: unknown): Error {
  return optionError(issue, { describe: flagText, ...(cause !== undefined ? { cause } : {}) });
}

/** Re-words an option error thrown past the schema (a policy that does not load, say) for the flags. */
export function asFlagError(error: unknown): unknown {
  return isOptionError(error) ? flagError(issueOf(error), error.cause ?? error) : error;
}

/** An option error past the file's own checks (a policy that does not load, say), naming the file. */
export function inFile(error: unknown, file: string): unknown {
  return isOptionError(error) ? optionError(issueOf(error), { prefix: `${file}: `, cause: error.cause ?? error }) : error;
}

/** The configuration the flags describe: one guest, named default. */
export function configFromFlags(args: Args, env: NodeJS.ProcessEnv, cwd: string, argv: readonly string[] = []): ProxyConfig {
  const { config, issues } = resolveDocument(flagDocument(args, env, undefined, argv), { baseDir: cwd, env, inlineSecrets: true, source: "flags" });
  if (config === undefined) throw flagError(issues[0]!);
  return config;
}

/**
 * The configuration of `--config FILE`, with the flags that may override it applied. Any other
 * option flag is a usage error: flags and a file both describing guests leave unclear which wins.
 */
export function configFromFile(file: string, args: Args, env: NodeJS.ProcessEnv, cwd: string): ProxyConfig {
  const deciders = givenDeciderFlags(args);
  if (deciders.length > 0) throw new UsageError(`${deciders.join(", ")}: cannot be combined with --config; list the deciders in ${file}'s hooks`);
  const refused = givenFlags(args).filter((path) => !configOverrides.includes(path));
  if (refused.length > 0) {
    // --log-format is no option of the file (it is how the CLI prints), so it goes with any.
    const allowed = [...configOverrides.map((path) => optionFlags[path]), "--log-format"].join(", ");
    throw new UsageError(`${refused.map((path) => optionFlags[path]).join(", ")}: cannot be combined with --config; set ${refused.join(", ")} in ${file} (only ${allowed} override the file)`);
  }
  const config = loadConfigFile(file, env);
  const doc = flagDocument(args, env, configOverrides);
  const issues: OptionIssue[] = [];
  validate(configFileSchema, doc, [], issues);
  // Flag paths are the working directory's, as for any flag.
  const proxy = resolveProxyWide(doc, cwd, (segments: readonly Segment[], reason: string) => issues.push(makeIssue(segments, reason)), env);
  if (issues.length > 0) throw flagError(issues[0]!);
  // A flag's false overrides the file's true (`--watch=false`), so the file's key goes first.
  const { watch: fileWatch, ...fromFile } = config;
  const watch = (doc["watch"] as boolean | undefined) ?? fileWatch;
  return { ...fromFile, proxy: { ...config.proxy, ...proxy }, workers: (doc["workers"] as number | undefined) ?? config.workers, ...(watch === true ? { watch } : {}) };
}
