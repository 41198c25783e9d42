import { homedir } from "node:os";
import path from "node:path";

/**
 * A leading `~` in a path an operator or a caller wrote, as a shell would have it: `~` and `~/…`
 * are the home folder; `~user/…` is refused with {@link homeProblem}, since whose home that is
 * belongs to the system's user database, not to the proxy. Only a shell expands a tilde, and only
 * at a word's start: YAML, `--ca-dir=~/ca` and a program's `startProxy({ caDir: "~/ca" })` hand
 * it over as it is, and taken as relative it made a folder named `~` in the working directory
 * (black-box findings). At the root, so that the config file, the flags and the API (the proxy's
 * options, a command decider's program in createHttpHooks) read it the same way.
 */

/** `written` with a leading `~` or `~/` made the proxy's $HOME (the user database's without it); anything else as it is. */
export function expandHome(written: string, env: NodeJS.ProcessEnv): string {
  if (written === "~" || written.startsWith("~/")) return path.join(homeOf(env), written.slice(1));
  return written;
}

/** Why `written` cannot be expanded (`~user/…`), or undefined. */
export function homeProblem(written: string): string | undefined {
  if (!written.startsWith("~") || written === "~" || written.startsWith("~/")) return undefined;
  const head = written.split("/", 1)[0]!;
  return `starts with ${JSON.stringify(head)}, which is not expanded: only ~ and ~/ are (the home folder, $HOME); write the folder out`;
}

function homeOf(env: NodeJS.ProcessEnv): string {
  const home = env["HOME"];
  return home !== undefined && home !== "" ? home : homedir();
}
