import path from "node:path";
import { homePath } from "../home-path.js";
import type { Segment } from "./option-error.js";

/**
 * The paths of a config document (a file's, or the flags'), as a shell would have them: `~` and
 * `~/…` are the home folder (home-path.ts), everything else relative is taken from `baseDir`.
 */

/** A document's path as written at `segments`, resolved; undefined when it cannot be (reported). */
export type DocumentPath = (segments: readonly Segment[], written: string) => string | undefined;

/** Paths from `baseDir`, `~/` from $HOME in `env`; `at` hears of a `~user/` that is not expanded. */
export function documentPath(baseDir: string, env: NodeJS.ProcessEnv, at: (segments: readonly Segment[], reason: string) => void): DocumentPath {
  return (segments, written) => {
    const home = homePath(written, env, (reason) => at(segments, reason));
    return home === undefined ? undefined : path.resolve(baseDir, home);
  };
}
