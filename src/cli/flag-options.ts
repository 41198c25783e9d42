import type { Options } from "yargs";
import { computedDefaults } from "../config/defaults.js";
import { chainFlags, optionFlags, type FlagPath } from "../config/flags.js";
import { configFileSchema, schemaPaths } from "../config/schema.js";
import type { OptionNode } from "../config/validate.js";
import { groupTitle } from "./flag-groups.js";

/**
 * The serve command's option flags, declared from the one flags table and the schema: each
 * flag's type, choices, description and shown default come from the option it sets, so `--help`
 * cannot drift from what the file and startProxy accept. No flag has a yargs default: an absent
 * flag leaves the option to the defaults table (and, next to --config, to the file).
 */

const nodes = new Map(schemaPaths(configFileSchema).map(({ path, node }) => [path, node]));

/** What the flag's value looks like, where the option's own doc would not say. */
const flagDocs: Partial<Record<FlagPath, string>> = {
  listen: "HOST:PORT to listen on ([v6]:PORT; a bare PORT is on 127.0.0.1); port 0 picks a free port",
  resolve: "static name: HOST=IP[,IP]; IP checks still apply; repeatable",
  secrets: "NAME@HOST[,HOST...][=VALUE]: the guest gets a placeholder for it (value from $NAME if no =VALUE); repeatable",
  upstreamCa: "extra PEM root for upstream TLS; repeatable",
  allowHosts: "host pattern that may be reached (* matches any run); repeatable",
  allowInternalHosts: "host pattern that may resolve to internal addresses; repeatable",
  blockInternalRanges: "refuse internal addresses (--no-block-internal-ranges to allow)",
  followRedirectsTo: "host pattern that redirects may still reach over https:// with --secret-redirects refuse; repeatable",
  auth: 'the guest (named "default") must send credentials (egressgate env --guest default); --no-auth serves without them even beyond loopback',
  guestEnvFile: "write the guest environment (KEY=value lines) to FILE; with several guests, FILE.<guest> each",
  hooksTimeoutMs: "time limit for one policy call, 1 to 60000 (502 beyond); needs --hooks-script",
};

function shownDefault(path: FlagPath, node: OptionNode): string | undefined {
  const computed = (computedDefaults as Record<string, string>)[path];
  if (computed !== undefined) return computed;
  return "default" in node && node.default !== undefined ? String(node.default) : undefined;
}

/** The schema's sentence as `--help` words its lines: lowercase, no closing period. */
function asFlagDoc(doc: string): string {
  return `${doc.charAt(0).toLowerCase()}${doc.slice(1).replace(/\.$/, "")}`;
}

function flagOption(path: FlagPath): Options {
  const node = nodes.get(path);
  if (node === undefined) throw new Error(`the flags table names ${path}, which the schema lacks`);
  const shown = shownDefault(path, node);
  const group = groupTitle(path);
  const base: Options = {
    describe: flagDocs[path] ?? asFlagDoc(node.doc),
    ...(shown !== undefined ? { defaultDescription: shown } : {}),
    ...(group !== undefined ? { group } : {}),
  };
  switch (node.kind) {
    case "integer":
      return { ...base, type: "number" };
    case "boolean":
      return { ...base, type: "boolean" };
    case "string":
      return { ...base, type: "string", ...(node.choices !== undefined ? { choices: [...node.choices] } : {}) };
    default:
      return { ...base, type: "string", array: true };
  }
}

/** The decider flags: each adds one source to the chain (the config file's `hooks` entries). */
const deciderFlagDocs: Record<Exclude<keyof typeof chainFlags, "script">, string> = {
  command: 'external decider: a command (split into words, no shell) that gets the request as JSON on stdin; exit 0 allows, 2 blocks; repeatable, in chain order with the others',
  webhook: "external decider: a URL that gets the request as a JSON POST; a 2xx allows or answers in JSON, 422 blocks; repeatable, in chain order",
  opa: "external decider: an OPA Data API URL (http://127.0.0.1:8181/v1/data/egress) that gets {input: request}; repeatable, in chain order",
};

/** yargs key (the flag without its dashes) → its declaration, for every option flag. */
export function optionFlagDeclarations(): Record<string, Options> {
  const deciders = Object.entries(deciderFlagDocs).map(([key, describe]) => [
    chainFlags[key as keyof typeof deciderFlagDocs].slice(2),
    { describe, type: "string", array: true, group: groupTitle(`hook${key.charAt(0).toUpperCase()}${key.slice(1)}`) ?? "Hooks:" } satisfies Options,
  ]);
  return Object.fromEntries([...Object.entries(optionFlags).map(([path, flag]) => [flag.slice(2), flagOption(path as FlagPath)]), ...deciders]);
}

/** The decider flags given on the command line. */
export function givenDeciderFlags(args: Record<string, unknown>): string[] {
  return Object.keys(deciderFlagDocs)
    .map((key) => chainFlags[key as keyof typeof deciderFlagDocs])
    .filter((flag) => args[flag.slice(2)] !== undefined);
}

/** The option flags given on the command line, by option path. */
export function givenFlags(args: Record<string, unknown>): FlagPath[] {
  return (Object.entries(optionFlags) as Array<[FlagPath, string]>).filter(([, flag]) => args[flag.slice(2)] !== undefined).map(([path]) => path);
}
