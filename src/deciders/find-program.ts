import { accessSync, constants, statSync } from "node:fs";
import path from "node:path";

/**
 * Whether a command decider's program can be started, judged as `spawn` will look for it, so
 * that a configuration naming a program that is not there is refused when it is loaded, not
 * answered 502 on every request (black-box finding: `check-config` passed it, and `check` said
 * DENIED 502 with "could not start: ENOENT" only in its detail).
 *
 * A name with a slash is that file. A bare name is looked for as libuv's execvp does: in each
 * folder of the child's PATH in turn (`/usr/bin:/bin` without one; an empty entry, or a relative
 * one, is taken from the working directory), and a file there that is not executable is passed
 * over for the next folder.
 *
 * @param program the argv[0] the decider spawns (already absolute when it has a slash, for a file's).
 * @param searchPath the PATH the child gets (the proxy's), or undefined.
 * @param cwd the working directory the child starts in (the proxy's).
 * @returns why it cannot be started, or undefined when it can.
 */
export function programProblem(program: string, searchPath: string | undefined, cwd: string): string | undefined {
  if (program.includes("/")) {
    const file = path.resolve(cwd, program);
    const kind = fileKind(file);
    if (kind === "missing") return `names ${file}, which does not exist`;
    if (kind === "other") return `names ${file}, which is not a file`;
    if (kind === "file") return `names ${file}, which is not executable: make it so (chmod +x), or name its interpreter first ([sh, ${program}])`;
    return undefined;
  }
  const folders = (searchPath ?? defaultSearchPath).split(":");
  for (const folder of folders) {
    if (fileKind(path.resolve(cwd, folder, program)) === "executable") return undefined;
  }
  const where = searchPath === undefined ? `PATH is not set, so ${defaultSearchPath} is searched` : `PATH is ${JSON.stringify(searchPath)}`;
  return `names the program "${program}", which is not an executable file in any folder of PATH (${where}): install it, or give its path`;
}

/** What execvp searches when the environment has no PATH (glibc's and libuv's `_PATH_DEFPATH`). */
const defaultSearchPath = "/usr/bin:/bin";

function fileKind(file: string): "missing" | "other" | "file" | "executable" {
  try {
    if (!statSync(file).isFile()) return "other";
  } catch {
    return "missing";
  }
  try {
    accessSync(file, constants.X_OK);
    return "executable";
  } catch {
    return "file";
  }
}
