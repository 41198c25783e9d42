import path from "node:path";
import { expandHome, homeProblem } from "../home-path.js";
import type { Segment } from "./option-error.js";

export { homeProblem } from "../home-path.js";

/**
 * The paths of a config document (a file's, or the flags'), as a shell would have them: `~` and
 * `~/…` are the home folder (home-path.ts), everything else relative is taken from `baseDir`.
 */

/** `written` from `baseDir`, with a leading `~` or `~/` meaning the proxy's $HOME (the user database's without it). */
export function resolvePath(baseDir: string, written: string, env: NodeJS.ProcessEnv): string {
  return path.resolve(baseDir, expandHome(written, env));
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
