import { homedir } from "node:os";
import path from "node:path";

/**
 * A leading `~` in a path an operator or a caller wrote, as a shell would have it: `~` and `~/…`
 * are the home folder; `~user/…` is refused, since whose home that is belongs to the system's
 * user database, not to the proxy. Only a shell expands a tilde, and only at a word's start:
 * YAML, `--ca-dir=~/ca` and a program's `startProxy({ caDir: "~/ca" })` hand it over as it is,
 * and taken as relative it made a folder named `~` in the working directory (black-box
 * findings). Every path the proxy is given goes through {@link homePath}, so that the config
 * file, the flags and the API (the proxy's options, a command decider's program in
 * createHttpHooks, a policy file for createDjsHooks) read it the same way.
 */

/**
 * `written` with a leading `~` or `~/` made the proxy's $HOME (the user database's without it),
 * anything else as it is; a `~user/…` goes to `refuse` with why it is not expanded, and what
 * `refuse` returns (or throws) is the answer.
 *
 * @example
 * ```ts
 * const file = homePath(written, process.env, (reason) => { throw new Error(`auditLog ${reason}`); });
 * ```
 */
export function homePath<T = never>(written: string, env: NodeJS.ProcessEnv, refuse: (reason: string) => T): string | T {
  if (written === "~" || written.startsWith("~/")) return path.join(homeOf(env), written.slice(1));
  if (!written.startsWith("~")) return written;
  const head = written.split("/", 1)[0]!;
  return refuse(`starts with ${JSON.stringify(head)}, which is not expanded: only ~ and ~/ are (the home folder, $HOME); write the folder out`);
}

function homeOf(env: NodeJS.ProcessEnv): string {
  const home = env["HOME"];
  return home !== undefined && home !== "" ? home : homedir();
}
