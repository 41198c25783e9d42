import { rmSync } from "node:fs";

/**
 * Files a recording has under way: the HAR's temporary file while it is written, and each body's
 * partial sidecar file (`FILE.har.d/.<hex>.part`) while it streams. A process that exits (the
 * CLI's second signal, `process.exit`, an uncaught error) removes them in one `exit` listener:
 * a partial body has not been searched for secrets yet, and stayed behind in a folder the
 * README's workflow commits (black-box finding). A SIGKILL or an out-of-memory abort runs no
 * listener: the next recording on the path removes what they left ({@link isRemovedAtExit}
 * tells it which files are a live capture's), and `har check` lists it.
 */
const files = new Set<string>();

function removeAll(): void {
  for (const file of files) {
    try {
      rmSync(file, { force: true });
    } catch {
      // Exiting anyway: a file that cannot be removed stays, and the next recording removes it.
    }
  }
}

/** Removes `path` if the process exits while it is held; the returned function lets it go. */
export function removeAtExit(path: string): () => void {
  if (files.size === 0) process.on("exit", removeAll);
  files.add(path);
  return () => {
    if (!files.delete(path)) return;
    if (files.size === 0) process.off("exit", removeAll);
  };
}

/** Whether `path` is held by this process (a capture still streaming into it). */
export function isRemovedAtExit(path: string): boolean {
  return files.has(path);
}
