import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { link, readFile, rename, rm, writeFile } from "node:fs/promises";
import type { Logger } from "../log.js";

/**
 * One recording per HAR file at a time. Two proxies recording to one path each truncated the
 * journal the other appended to, and the last to close wrote the file: the first one's entries
 * were lost without a word (black-box finding). `FILE.har.lock` holds the recorder's pid and
 * host from before the journal is opened until the recording is closed or abandoned.
 */
export function lockPath(harPath: string): string {
  return `${harPath}.lock`;
}

/** The locks this process holds: a lock naming this pid and not among them was left by an earlier process that had it. */
const held = new Set<string>();

/**
 * Takes the recording's lock, or throws an Error naming the proxy that holds it. A lock left by
 * a process that is gone (a SIGKILL, a crash) is taken over, and the log says so.
 */
export async function lockRecording(harPath: string, log: Logger): Promise<() => Promise<void>> {
  const lock = lockPath(harPath);
  const mine = `${process.pid} ${hostname()}\n`;
  for (let attempt = 0; attempt < 5; attempt++) {
    // Written whole under a name of its own, then linked into place: link() fails if a lock is
    // there, and a reader never sees a lock without its pid (which it would take as stale).
    const staged = `${lock}.${process.pid}.${randomBytes(6).toString("hex")}`;
    try {
      await writeFile(staged, mine, { mode: 0o600, flag: "wx" });
    } catch (error) {
      // A full disk fails the write after the file was made: it was left behind, named by no one.
      await rm(staged, { force: true }).catch(() => undefined);
      const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
      throw new Error(`cannot record to ${harPath}: cannot write its lock ${lock} (${code})`, { cause: error });
    }
    let taken: boolean;
    try {
      await link(staged, lock);
      taken = true;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      taken = false;
    } finally {
      await rm(staged, { force: true });
    }
    if (taken) {
      held.add(lock);
      return async () => {
        held.delete(lock);
        await rm(lock, { force: true }).catch(() => undefined);
      };
    }
    const holder = await readFile(lock, "utf8").catch((error: unknown) => {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw error;
    });
    if (holder === undefined) continue; // released meanwhile
    const [pid, host] = holder.trim().split(" ");
    if (!isStale(lock, Number(pid), host)) {
      throw new Error(
        `cannot record to ${harPath}: another proxy is recording to it (pid ${pid ?? "?"}${host !== undefined && host !== hostname() ? ` on ${host}` : ""}); give each proxy its own file, or remove ${lock} if no such proxy runs`,
      );
    }
    // Stale: moved aside under a name of our own, and removed only if it is still the lock that
    // was read; a proxy that took it over meanwhile gets its lock back.
    const aside = `${lock}.${process.pid}.${randomBytes(6).toString("hex")}.stale`;
    const moved = await rename(lock, aside).then(
      () => true,
      () => false,
    );
    if (!moved) continue;
    if ((await readFile(aside, "utf8").catch(() => undefined)) !== holder) await link(aside, lock).catch(() => undefined);
    else log.warn("a recording's lock was left by a process that is gone: taken over", { code: "EG_RECORD_LOCK_STALE", lock, pid: Number(pid) });
    await rm(aside, { force: true });
  }
  throw new Error(`cannot record to ${harPath}: ${lock} keeps changing hands`);
}

/** Whether the lock's holder is gone: a pid on this host that no process has, or this process's pid on a lock it does not hold. */
function isStale(lock: string, pid: number, host: string | undefined): boolean {
  // Another host's process cannot be asked (a folder shared over NFS): it is taken to be alive.
  if (host !== hostname() || !Number.isInteger(pid) || pid <= 0) return false;
  if (pid === process.pid) return !held.has(lock);
  try {
    process.kill(pid, 0);
    return false;
  } catch (error) {
    // EPERM: the process exists, under another user.
    return (error as NodeJS.ErrnoException).code === "ESRCH";
  }
}
