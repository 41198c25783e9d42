import { constants } from "node:fs";
import { lstat, mkdir, open, readdir, rename, rm, rmdir, stat, type FileHandle } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import type { Logger } from "../log.js";
import { fileKind, readFailure } from "../regular-file.js";
import { isRemovedAtExit, removeAtExit } from "./exit-cleanup.js";
import { isPartialBodyName, journalPath, sidecarDir, type RecordedEntry } from "./har.js";
import { lockRecording } from "./record-lock.js";
import { writeAll } from "./write-all.js";

/** The `creator` of every HAR this proxy writes. */
const creator = { name: "egressgate", version: "1", comment: "recorded network (issue 18); secrets appear only as EGRESSGATE_SECRET{NAME} or [REDACTED:NAME]" };

interface Journaled {
  readonly seq: number;
  readonly offset: number;
  readonly length: number;
}

/** How long close() waits for exchanges still streaming their bodies before it writes the file without them. */
const pendingGraceMs = 5_000;

/**
 * One HAR file being recorded. Entries are appended to a journal (`FILE.har.journal`, one JSON
 * entry per line) as they complete, so a crash loses at most the exchanges in flight; the HAR
 * itself is written from the journal, in the order the exchanges started (`seq`, so concurrent
 * requests come out in a stable order whatever order they finished in), to a temporary file
 * that is then renamed over FILE.har: a reader never sees half a file. A recording that cannot
 * be written logs why and records nothing more; the proxy goes on serving.
 */
export class Recording {
  private seq = 0;
  private readonly index: Journaled[] = [];
  private offset = 0;
  private queue: Promise<void> = Promise.resolve();
  private readonly pending = new Set<Promise<unknown>>();
  private failed = false;
  private closed: Promise<void> | undefined;
  /** The last flush asked for; the next one starts after it (write() never rejects). */
  private flushing: Promise<void> = Promise.resolve();
  /** Set once close() has waited for the exchanges in flight: later ones are not written. */
  private final = false;

  private constructor(
    readonly path: string,
    private readonly journal: FileHandle,
    private readonly log: Logger,
    /** Entries kept from the file being extended (`--record-missing`), written first. */
    private readonly kept: readonly RecordedEntry[],
    /** Lets the path go for the next recording ({@link lockRecording}). */
    private readonly unlock: () => Promise<void>,
    /** The folders open() made (the sidecar, and any missing above it), outermost first. */
    private readonly made: readonly string[],
  ) {
    this.seq = kept.reduce((max, entry) => Math.max(max, entry._egressgate?.seq ?? 0), 0);
  }

  static async open(path: string, log: Logger, kept: readonly RecordedEntry[] = []): Promise<Recording> {
    for (const [at, want] of [[path, "file"], [journalPath(path), "file"], [sidecarDir(path), "directory"]] as const) {
      const problem = await inTheWay(at, at === path ? "it" : at, want);
      if (problem !== undefined) throw new Error(`cannot record to ${path}: ${problem}`);
    }
    const made = await makeFolder(sidecarDir(path)).catch((error: unknown) => {
      throw new Error(`cannot record to ${path}: ${(error as Error).message}`, { cause: error });
    });
    let unlock: (() => Promise<void>) | undefined;
    try {
      // Before anything in the way is cleared: a live recording's journal and partial bodies are its own.
      unlock = await lockRecording(path, log);
      await removePartialBodies(path, log);
      await keepCrashedJournal(path, log);
      const journal = await open(journalPath(path), "w+", 0o600);
      return new Recording(path, journal, log, kept, unlock, made);
    } catch (error) {
      await unlock?.();
      await removeFolders(made);
      throw error;
    }
  }

  /** The next exchange's place in the recording. */
  nextSeq(): number {
    return ++this.seq;
  }

  /** Waits for `work` (an exchange still streaming) before the file is written on close. */
  track(work: Promise<unknown>): void {
    this.pending.add(work);
    void work.finally(() => this.pending.delete(work)).catch(() => undefined);
  }

  append(entry: RecordedEntry): void {
    if (this.failed || this.final) return;
    const line = Buffer.from(`${JSON.stringify(entry)}\n`, "utf8");
    const seq = entry._egressgate?.seq ?? 0;
    this.queue = this.queue.then(async () => {
      if (this.failed) return;
      try {
        await writeAll(this.journal, line, this.offset);
        this.index.push({ seq, offset: this.offset, length: line.length - 1 });
        this.offset += line.length;
      } catch (error) {
        this.fail("cannot append to the recording's journal", error);
      }
    });
  }

  private fail(what: string, error: unknown): void {
    if (!this.failed) this.log.error(what, { code: "EG_RECORD_FAILED", path: this.path, error, consequence: "nothing more is recorded; the proxy goes on serving" });
    this.failed = true;
  }

  /**
   * Writes FILE.har from what is journaled so far, atomically. Flushes run one at a time: SIGTERM
   * flushes before the drain and close() flushes after it, and two writers of one temporary file
   * would have the second rename find it gone.
   */
  flush(): Promise<void> {
    // Once closing, the close writes the file last (its journal is then gone).
    if (this.closed !== undefined) return this.closed;
    return this.queueWrite();
  }

  private queueWrite(): Promise<void> {
    const next = this.flushing.then(() => this.write());
    this.flushing = next;
    return next;
  }

  private async write(): Promise<void> {
    await this.queue;
    const tmp = `${this.path}.${process.pid}.tmp`;
    let out: FileHandle | undefined;
    // A process that exits while the file is written (the CLI's second SIGTERM stops waiting for
    // the drain) leaves no half-written temporary file behind; the journal stays for the next run.
    const release = removeAtExit(tmp);
    try {
      // Whatever stands at the temporary name (a link, a FIFO, what a crash left) goes, and the file
      // is created anew, never opened through a link: a link was written through, and a FIFO held
      // the flush in open() for good. Something put back there meanwhile fails the write (EEXIST).
      await rm(tmp, { force: true });
      out = await open(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
      let position = 0;
      const put = async (text: string): Promise<void> => {
        const bytes = Buffer.from(text, "utf8");
        await writeAll(out!, bytes, position);
        position += bytes.length;
      };
      // An entry a line: a file past the longest string JSON.parse takes is read so (har-file.ts).
      await put(`{"log":{"version":"1.2","creator":${JSON.stringify(creator)},"pages":[],"entries":[`);
      let first = true;
      for (const entry of this.kept) {
        await put(`${first ? "\n" : ",\n"}${JSON.stringify(entry)}`);
        first = false;
      }
      for (const { offset, length } of [...this.index].sort((a, b) => a.seq - b.seq)) {
        const line = Buffer.alloc(length);
        await this.journal.read(line, 0, length, offset);
        await put(first ? "\n" : ",\n");
        await writeAll(out, line, position);
        position += length;
        first = false;
      }
      await put("\n]}}\n");
      await out.sync();
      await out.close();
      out = undefined;
      await rename(tmp, this.path);
    } catch (error) {
      await out?.close().catch(() => undefined);
      await rm(tmp, { force: true }).catch(() => undefined);
      this.fail(`cannot write ${this.path}`, error);
    } finally {
      release();
    }
  }

  /** Waits (a while) for exchanges in flight, writes the file, and removes the journal. */
  close(): Promise<void> {
    return (this.closed ??= (async () => {
      if (this.pending.size > 0) {
        let timer: NodeJS.Timeout | undefined;
        await Promise.race([Promise.allSettled([...this.pending]), new Promise((resolve) => (timer = setTimeout(resolve, pendingGraceMs)))]);
        clearTimeout(timer);
      }
      this.final = true;
      await this.queueWrite();
      await this.journal.close().catch(() => undefined);
      if (!this.failed) await rm(journalPath(this.path), { force: true }).catch(() => undefined);
      await this.unlock();
    })());
  }

  /**
   * For a proxy whose start failed: nothing was served, so nothing is written. The journal is
   * closed and removed, the folders open() made go if they are still empty, and FILE.har stays
   * as it was. A failed start kept the journal's descriptor open and left both behind.
   */
  abandon(): Promise<void> {
    return (this.closed ??= (async () => {
      this.final = true;
      await this.queue;
      await this.journal.close().catch(() => undefined);
      await rm(journalPath(this.path), { force: true }).catch(() => undefined);
      // The lock is in the HAR's folder, which may be one of those made.
      await this.unlock();
      await removeFolders(this.made);
    })());
  }
}

/** Removes `folders` (innermost last in the list, so removed first) where they are empty. */
async function removeFolders(folders: readonly string[]): Promise<void> {
  for (const folder of [...folders].reverse()) {
    if (!(await rmdir(folder).then(() => true, () => false))) return;
  }
}

/**
 * The partial bodies (`.<hex>.part`) a recording killed outright (SIGKILL, out of memory) left in
 * the sidecar folder: nothing else removes them, and a body's bytes were kept there before it
 * was searched for secrets (an earlier version kept them in clear, and `git add FILE.har.d`
 * commits dotfiles). A file a capture of this process still writes (another proxy recording to
 * the same path) is left to it.
 */
async function removePartialBodies(path: string, log: Logger): Promise<void> {
  const dir = sidecarDir(path);
  const removed: string[] = [];
  const kept: string[] = [];
  for (const name of await readdir(dir)) {
    const file = join(dir, name);
    if (!isPartialBodyName(name) || isRemovedAtExit(file)) continue;
    // Something that cannot be removed this way (a directory by that name) is left, and said:
    // `har check` lists it too.
    await rm(file, { force: true }).then(
      () => removed.push(name),
      () => kept.push(name),
    );
  }
  if (removed.length > 0 || kept.length > 0) {
    log.warn("partial bodies an interrupted recording left were removed", { code: "EG_RECORD_PARTIAL_REMOVED", dir, files: removed, ...(kept.length > 0 ? { notRemoved: kept } : {}) });
  }
}

/**
 * A journal with entries in it is what a recording that crashed left (a clean close removes it):
 * opening it for this recording would empty it, silently. It is kept beside, under a name of its
 * own, and the log says where; each line is a HAR entry (docs/record-replay.md says how to
 * make a HAR of it).
 */
async function keepCrashedJournal(path: string, log: Logger): Promise<void> {
  const journal = journalPath(path);
  const size = await stat(journal).then((s) => s.size, () => 0);
  if (size === 0) return;
  const kept = `${journal}.${new Date().toISOString().replace(/[:.]/g, "-")}.crashed`;
  await rename(journal, kept);
  log.warn("a recording's journal was left by an earlier run (a crash?): kept, not overwritten", { code: "EG_RECORD_JOURNAL_KEPT", journal: kept, bytes: size });
}

/**
 * `dir` made, with any folder above it that is missing (`--record runs/today.har`), one level at
 * a time; returns the folders it made, outermost first. Not `mkdir(dir, { recursive: true })`: where mkdir fails with ENOENT under a parent
 * that exists (anywhere in /proc), Node's recursive mkdir makes the parent again and retries,
 * for ever, and `--record /proc/x.har` held the start at 100% CPU. Here that failure is the
 * answer.
 */
async function makeFolder(dir: string): Promise<string[]> {
  const missing: string[] = [];
  for (let at = resolve(dir); ; at = dirname(at)) {
    const stats = await stat(at).catch((error: unknown) => {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw new Error(`cannot make the folder ${dir}: ${at} cannot be read (${readFailure(error)})`, { cause: error });
    });
    if (stats !== undefined) {
      if (!stats.isDirectory()) throw new Error(`cannot make the folder ${dir}: ${at} is ${fileKind(stats)}, not a directory`);
      break;
    }
    if (dirname(at) === at) break;
    missing.push(at);
  }
  const made: string[] = [];
  for (const at of missing.reverse()) {
    try {
      await mkdir(at, { mode: 0o700 });
      made.push(at);
    } catch (error) {
      // Made meanwhile (two recordings starting at once) is as good as made here.
      if ((error as NodeJS.ErrnoException).code === "EEXIST" && (await stat(at).catch(() => undefined))?.isDirectory() === true) continue;
      throw new Error(`cannot make the folder ${at} (${readFailure(error)})`, { cause: error });
    }
  }
  return made;
}

/**
 * Why a recording may not use what is already at `path` (called `name` in the message), if
 * anything is there. The HAR is written by renaming a temporary file over it, which would
 * replace a device node or a FIFO with a regular file, and a symbolic link with a file of its
 * own (its target left stale); the journal is opened for writing, which would truncate a link's
 * target. So both must be regular files, not links. The sidecar folder only has files created
 * in it: a link to a directory is fine, anything else that is not a directory is refused.
 */
async function inTheWay(path: string, name: string, want: "file" | "directory"): Promise<string | undefined> {
  try {
    const stats = await lstat(path);
    if (want === "directory") {
      const target = stats.isSymbolicLink() ? await stat(path).catch(() => undefined) : stats;
      if (target === undefined) return `${name} is a symbolic link to nothing`;
      return target.isDirectory() ? undefined : `${name} is ${fileKind(target)}, not a directory`;
    }
    if (stats.isSymbolicLink()) return `${name} is a symbolic link; give the path of the file it names`;
    return stats.isFile() ? undefined : `${name} is ${fileKind(stats)}, not a regular file`;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    if ((error as NodeJS.ErrnoException).code === "ENOTDIR") return `${name} cannot be made: something above it is not a directory`;
    throw error;
  }
}
