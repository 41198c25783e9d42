import { issueText, type OptionIssue } from "./option-error.js";

/**
 * The one table from option paths, as the config file spells them, to CLI flags. The CLI
 * declares its flags from it, and names the flag of an option error from the error's `path`
 * (never by rewriting message text).
 */
export const optionFlags = Object.freeze({
  listen: "--listen",
  caDir: "--ca-dir",
  resolve: "--resolve",
  upstreamCa: "--upstream-ca",
  leafKeyType: "--leaf-key",
  maxRedirects: "--max-redirects",
  refuseInTunnel: "--refuse-in-tunnel",
  maxHttpBodyBytes: "--max-body-bytes",
  maxHttpResponseBodyBytes: "--max-response-body-bytes",
  "timeouts.upstreamBodyMs": "--upstream-body-timeout-ms",
  "timeouts.requestMs": "--request-timeout-ms",
  "limits.connections": "--max-connections",
  "limits.connectionsPerSource": "--max-connections-per-source",
  workers: "--workers",
  watch: "--watch",
  logLevel: "--log-level",
  guestEnvFile: "--guest-env-file",
  "upstream.record.path": "--record",
  "upstream.record.cookies": "--record-cookies",
  "upstream.replay.path": "--replay",
  "upstream.replay.matchHeaders": "--replay-match-header",
  "upstream.replay.ignoreQuery": "--replay-ignore-query",
  "upstream.replay.ignoreBodyPaths": "--replay-ignore-body-path",
  "upstream.replay.exhausted": "--replay-exhausted",
  "upstream.replay.latency": "--replay-latency",
  "upstream.replay.recordMissing": "--record-missing",
  "upstream.replay.anyGuest": "--replay-any-guest",
  auditLog: "--audit-log",
  metricsListen: "--metrics-listen",
  auth: "--auth",
  allowHosts: "--allow-host",
  allowInternalHosts: "--allow-internal-host",
  blockInternalRanges: "--block-internal-ranges",
  secrets: "--host-secret",
  replaceSecretsInQuery: "--replace-secrets-in-query",
  secretRedirects: "--secret-redirects",
  followRedirectsTo: "--follow-redirects-to",
  hooksScript: "--hooks-script",
  hooksTimeoutMs: "--hooks-timeout-ms",
} as const);

export type FlagPath = keyof typeof optionFlags;

/**
 * The flags that may be given with `--config`: they say where and how this deployment runs, and
 * override the file's value, so one file serves several deployments. Any other option flag next
 * to `--config` is a usage error: a file and flags that both describe guests would leave it
 * unclear which one wins.
 */
export const configOverrides: readonly FlagPath[] = ["listen", "caDir", "guestEnvFile", "upstreamCa", "logLevel", "workers", "watch", "upstream.record.path", "upstream.record.cookies", "upstream.replay.path", "upstream.replay.matchHeaders", "upstream.replay.ignoreQuery", "upstream.replay.ignoreBodyPaths", "upstream.replay.exhausted", "upstream.replay.latency", "upstream.replay.recordMissing", "upstream.replay.anyGuest", "auditLog", "metricsListen"];

/** Options that come from the environment rather than a flag. */
export const environmentOptions = Object.freeze({ deploymentKey: "$EGRESSGATE_PLACEHOLDER_KEY" });

/** Paths as startProxy and createHttpHooks spell them, to the file's spelling. */
const apiSpellings: Readonly<Record<string, string>> = {
  "listen.host": "listen",
  "listen.port": "listen",
  allowedHosts: "allowHosts",
  allowedInternalHosts: "allowInternalHosts",
  secretPlaceholderKey: "deploymentKey",
};

/**
 * The flags that add a source to a guest's hook chain, repeatable, by the key of the `hooks`
 * entry each makes. Their order on the command line, across all four, is the chain's order.
 */
export const chainFlags = Object.freeze({ script: "--hooks-script", command: "--hook-command", webhook: "--hook-url", opa: "--hook-opa" } as const);

/** Flags whose values are keyed (`--resolve HOST=IP`, `--host-secret NAME@HOST`): the key is named too. */
const keyed = new Set<string>(["resolve", "secrets"]);

/**
 * The flag (or environment variable) an option path stands for, with the key for a keyed flag
 * (`secrets.GH_TOKEN.hosts[0]` → `--host-secret GH_TOKEN`); undefined when no flag sets it.
 */
export function flagFor(path: string): string | undefined {
  // A chain entry the flags made: `hooks[2].webhook` came from --hook-url.
  const entry = /^hooks\[\d+\]\.(script|command|webhook|opa)\b/.exec(path);
  if (entry !== null) return chainFlags[entry[1] as keyof typeof chainFlags];
  const segments = path.replace(/\[\d+\]/g, "").split(".");
  for (let n = segments.length; n > 0; n--) {
    const head = segments.slice(0, n).join(".");
    const key = apiSpellings[head] ?? head;
    const flag = (optionFlags as Record<string, string>)[key] ?? (environmentOptions as Record<string, string>)[key];
    if (flag === undefined) continue;
    const rest = segments.slice(n).join(".");
    if (!keyed.has(key) || rest === "") return flag;
    // A secret's name has no dots; a resolved hostname is all the rest.
    return `${flag} ${key === "secrets" ? rest.split(".")[0] : rest}`;
  }
  return undefined;
}

/** An option issue in the CLI's words: `--max-redirects: must be …`; the path where no flag sets it. */
export function flagText(issue: OptionIssue): string {
  const flag = flagFor(issue.path);
  if (flag === undefined) return issueText(issue);
  const needed = issue.requires;
  // The option it needs is named as a flag too: `--hooks-timeout-ms: only applies with --hooks-script`.
  const reason = needed === undefined ? issue.reason : `only applies with ${flagFor(needed.path) ?? needed.path}${needed.value === undefined ? "" : ` ${needed.value}`}`;
  // A flag is set apart by a colon, as the CLI always wrote it: `--workers: must be …`.
  return issue.kind === "unknown" ? `unknown option ${flag}${reason}` : `${flag}: ${reason}`;
}
