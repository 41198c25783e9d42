import { homedir } from "node:os";
import path from "node:path";
import type { Segment } from "./option-error.js";

/**
 * The paths of a config document (a file's, or the flags'), as a shell would have them: `~` and
 * `~/…` are the home folder, everything else relative is taken from `baseDir`. YAML hands `~/ca`
 * over as it is, and so does a shell in `--ca-dir=~/ca` (it expands a tilde only at a word's
 * start): taken as relative, either made a folder named `~` in the working directory (black-box
 * finding). `~user/…` is refused with {@link homeProblem}: whose home that is belongs to the
 * system's user database, not to the proxy.
 */

/** `written` from `baseDir`, with a leading `~` or `~/` meaning the proxy's $HOME (the user database's without it). */
export function resolvePath(baseDir: string, written: string, env: NodeJS.ProcessEnv): string {
  if (written === "~" || written.startsWith("~/")) return path.join(homeOf(env), written.slice(1));
  return path.resolve(baseDir, written);
}

/** Why `written` cannot be resolved (`~user/…`), or undefined. */
export function homeProblem(written: string): string | undefined {
  if (!written.startsWith("~") || written === "~" || written.startsWith("~/")) return undefined;
  const head = written.split("/", 1)[0]!;
  return `starts with ${JSON.stringify(head)}, which is not expanded: only ~ and ~/ are (the home folder, $HOME); write the folder out`;
}

function homeOf(env: NodeJS.ProcessEnv): string {
  const home = env["HOME"];
  return home !== undefined && home !== "" ? home : homedir();
}

/** A document's path as written at `segments`, resolved; undefined when it cannot be (reported). */
export type DocumentPath = (segments: readonly Segment[], written: string) => string | undefined;

/** Paths from `baseDir`, `~/` from $HOME in `env`; `at` hears of a `~user/` that is not expanded. */
export function documentPath(baseDir: string, env: NodeJS.ProcessEnv, at: (segments: readonly Segment[], reason: string) => void): DocumentPath {
  return (segments, written) => {
    const problem = homeProblem(written);
    if (problem === undefined) return resolvePath(baseDir, written, env);
    at(segments, problem);
    return undefined;
  };
}
