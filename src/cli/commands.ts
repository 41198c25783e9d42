import path from "node:path";
import { buildProxyOptions } from "../config/build.js";
import { describeConfig } from "../config/describe.js";
import { loadConfigFile } from "../config/file.js";
import { flagText } from "../config/flags.js";
import { isOptionError, issueOf, issueText, makeIssue, type OptionIssue } from "../config/option-error.js";
import { guestToken } from "../proxy/auth.js";
import { formatShellExports, guestEnvironment } from "../proxy/guest-env.js";
import { resolveProxyOptions } from "../proxy/options.js";
import { checkRecordingWriters } from "./args.js";
import { defaultCaDir, loadOrCreateCa } from "../tls/ca-store.js";
import { checkHarFile, formatHarReport } from "../record/har-check.js";
import { placeholderKeyEnv, type CliCommand } from "./args.js";

/** The commands other than serve, and how any error reads to a CLI user. */

// The paths printed are absolute, as --guest-env-file writes them: a guest runs elsewhere, and
// a relative CA path in its environment names nothing there.
export async function printCa(caDir: string | undefined): Promise<number> {
  const ca = await loadOrCreateCa(path.resolve(caDir ?? defaultCaDir()));
  process.stdout.write(`${ca.certPath}\n${ca.certPem}`);
  return 0;
}

/** `egressgate env [--guest NAME]`: the guest environment as shell exports, credentials included for a guest. */
export async function printEnv(command: Extract<CliCommand, { kind: "env" }>, env: NodeJS.ProcessEnv): Promise<number> {
  const ca = await loadOrCreateCa(path.resolve(command.caDir ?? defaultCaDir()));
  const host = command.listen.host.includes(":") ? `[${command.listen.host}]` : command.listen.host;
  const key = env[placeholderKeyEnv];
  const credentials = command.guest === undefined || key === undefined ? undefined : { user: command.guest, password: guestToken(key, command.guest) };
  const variables = guestEnvironment({
    proxyUrl: `http://${host}:${command.listen.port}`,
    ...(credentials !== undefined ? { credentials } : {}),
    caCertPath: ca.certPath,
    caBundlePath: ca.bundlePath,
    extra: {},
  });
  process.stdout.write(formatShellExports(variables));
  return 0;
}

/**
 * `egressgate check-config FILE`: everything `--config` checks before it starts, offline: the
 * file, every secret source (read, never printed), every policy (compiled, then stopped) and
 * startProxy's own checks. Then the guests as they will run.
 */
export async function checkConfig(file: string, env: NodeJS.ProcessEnv): Promise<number> {
  const config = loadConfigFile(file, env);
  checkRecordingWriters(config, file);
  const built = buildProxyOptions(config, { deploymentKey: env[placeholderKeyEnv] });
  try {
    resolveProxyOptions(built.options);
  } finally {
    await built.close();
  }
  process.stdout.write(describeConfig(config));
  return 0;
}

/** `egressgate har check FILE`: HAR 1.2 checks, the entries, and any secret-looking strings. */
export async function checkHar(file: string): Promise<number> {
  const { text, status } = formatHarReport(await checkHarFile(file));
  process.stdout.write(text);
  return status;
}

/** startProxy's options are spelled as the file spells them, but for the listen address. */
function asFileIssue(issue: OptionIssue): OptionIssue {
  return issue.path.startsWith("listen.") ? makeIssue(["listen"], issue.reason, issue.kind) : issue;
}

/**
 * An error as the CLI prints it. Errors from parsing are worded already; an option error from
 * startProxy names the flag (`source` is `flags`) or the file and key it came from.
 */
export function failureText(error: unknown, source: string | undefined): string {
  if (!isOptionError(error) || source === undefined) return (error as Error)?.message ?? String(error);
  const issue = asFileIssue(issueOf(error));
  if (issue.path === "auth" && source === "flags") {
    // The refusal to run an open proxy: the two ways out, in flags.
    return "--listen: a single guest beyond loopback needs a word on authentication, or anyone who can reach the port could use the proxy with its allowlist and secrets; pass --auth to require credentials (egressgate env --guest default prints them), or --no-auth to serve without them on purpose";
  }
  return source === "flags" ? flagText(issue) : `${source}: ${issueText(issue)}`;
}
