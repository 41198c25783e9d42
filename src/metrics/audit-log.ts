import { close as closeFd, constants, fstat, open as openFd, writev, type Stats } from "node:fs";
import { open as openFile } from "node:fs/promises";
import { firstFullWaitMs, longestFullWaitMs, openWaitingForReader } from "../fifo-writer.js";
import { writeStderr } from "../log.js";

/** A warning that may repeat per record: the caller rate-limits it by `kind`. */
export type AuditWarn = (kind: string, msg: string, fields?: Record<string, unknown>) => void;

export interface AuditLogFileOptions {
  readonly file: string;
  readonly warn: AuditWarn;
  /**
   * Bytes that may wait for the disk. Past them a record is dropped and counted, not queued: a
   * stalled disk must not grow the proxy's memory without bound. Default 16 MiB.
   */
  readonly maxQueuedBytes?: number;
  /** After a failed write or open, how long records are dropped before the file is opened again. Default 1 s. */
  readonly retryMs?: number;
}

const defaultMaxQueuedBytes = 16 * 1024 * 1024;
const defaultRetryMs = 1_000;

// O_NONBLOCK: opening a FIFO for writing waits in open() until it has a reader, and a write to
// one whose reader stopped reading waits for room. Either held a libuv threadpool thread: a
// logrotate reopen each, until DNS lookups (on the same four threads) timed out, and the process
// never exited (a request still in the threadpool keeps the event loop alive). Non-blocking, the
// open fails with ENXIO (a failed write: dropped, counted, tried again after retryMs) and a full
// pipe answers EAGAIN; on a regular file the flag changes nothing.
const appendFlags = constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT | (constants.O_NONBLOCK ?? 0);
/** Records per write: Linux's IOV_MAX, so each batch is one write(2) (one O_APPEND append). */
const maxBatch = 1_024;

/** Errors that mean a FIFO at the path has no reader: none opened it (ENXIO), or it went away (EPIPE). */
const noReader = new Set(["ENXIO", "EPIPE"]);

interface TargetEvents {
  readonly opened: (target: AppendTarget) => void;
  /** The file it opened ended in part of a line: its first record starts a new one. */
  readonly torn: () => void;
  /** `lost`: records that were queued or in flight for it. */
  readonly failed: (target: AppendTarget, error: NodeJS.ErrnoException, lost: number) => void;
  /** Records of a write under way when it was abandoned that the write did not take whole. */
  readonly lost: (count: number) => void;
}

/** Of a batch a write took `written` bytes of: the records it took whole, and the bytes it took of the next. */
function takenWhole(batch: readonly Buffer[], written: number): { whole: number; rest: number } {
  let rest = written;
  let whole = 0;
  while (whole < batch.length && rest >= batch[whole]!.length) rest -= batch[whole++]!.length;
  return { whole, rest };
}

/**
 * One open of the file and the records waiting for it: a queue written in batches with writev,
 * one batch in flight at a time, so records that arrive meanwhile go out together in the next.
 * Never blocks a thread on a FIFO: a full pipe is tried again after a short wait rather than in
 * a write that waits for room.
 */
class AppendTarget {
  private fd: number | undefined;
  private readonly queue: Buffer[] = [];
  private inFlight: Buffer[] | undefined;
  private fullTimer: NodeJS.Timeout | undefined;
  private fullWaitMs = firstFullWaitMs;
  private ending = false;
  private gone = false;
  private bytes = 0;
  /** The file ends in part of a line (a record a full disk cut short): a newline goes first. */
  private midLine = false;
  /**
   * The rest of a record a write took all but the newline of, queued to go first: that record is
   * whole in the file, so a failure to write its newline does not lose it. A disk that filled at
   * that byte counted the record as lost although a reader of the file finds it (CI finding).
   */
  private lineEnd: Buffer | undefined;
  private settle!: () => void;
  /** Settles once its descriptor is closed, or it never had one. */
  readonly done = new Promise<void>((resolve) => (this.settle = resolve));

  constructor(
    file: string,
    private readonly events: TargetEvents,
    opened?: { readonly fd: number; readonly midLine: boolean },
  ) {
    if (opened !== undefined) {
      this.fd = opened.fd;
      this.midLine = opened.midLine;
      if (opened.midLine) events.torn();
      return;
    }
    openFd(file, appendFlags, 0o640, (error, fd) => {
      if (error) {
        // Abandoned while it opened (a close() that timed out): nothing is owed to anyone.
        if (this.gone) this.settle();
        else guarded("handling a failed open", () => this.fail(error, 0));
        return;
      }
      // A rejection nobody handles ends the process. endsMidLine answers false for any failure,
      // and the events and the first write do not throw, so none comes as written; one that did
      // is this target's failed open (records dropped and counted, the file opened again after
      // retryMs), not the proxy's end. The handler of that failure calls `warn`, which may throw
      // too: the chain ends in one that only writes a line (review finding).
      let handed = false;
      void endsMidLine(file, fd)
        .then((midLine) => {
          handed = true;
          this.opened(fd, midLine);
        })
        .catch((thrown: unknown) => {
          const error: NodeJS.ErrnoException = thrown instanceof Error ? thrown : new Error(String(thrown));
          if (handed) this.failedOpening(error);
          else closeFd(fd, () => (this.gone ? this.settle() : guarded("handling a failed open", () => this.fail(error, 0))));
        })
        .catch((thrown: unknown) => reportUnhandled("handling a failed open", thrown));
    });
  }

  private opened(fd: number, midLine: boolean): void {
    if (this.gone) {
      closeFd(fd, () => this.settle());
      return;
    }
    this.fd = fd;
    this.midLine = midLine;
    if (midLine) this.events.torn();
    this.events.opened(this);
    this.pump();
  }

  /**
   * {@link opened} threw. Not yet gone, it had taken the descriptor: the target fails as a write
   * would, the descriptor closed now or, with a write under way, by that write's callback (which
   * counts what it did not take). Gone, whatever made it so closes the descriptor.
   */
  private failedOpening(error: NodeJS.ErrnoException): void {
    if (this.gone) return;
    const lost = this.records(this.queue);
    this.drop();
    if (this.inFlight === undefined) this.closeNow();
    this.events.failed(this, error, lost);
  }

  /** Bytes queued or in flight. */
  get queuedBytes(): number {
    return this.bytes;
  }

  write(line: string): void {
    const chunk = Buffer.from(line);
    this.queue.push(chunk);
    this.bytes += chunk.length;
    this.pump();
  }

  /** Writes what is queued, then closes. */
  end(): void {
    this.ending = true;
    this.pump();
  }

  /**
   * Gives up on what is queued (closing without it): returns the records dropped. A write under
   * way is let finish, and what it did not take is counted then (`events.lost`): it cannot be
   * taken back, and the descriptor is closed only once it returns (closed now, its number could
   * be reused by another file the write would then land in).
   */
  abandon(): number {
    if (this.gone) return 0;
    const dropped = this.records(this.queue);
    this.drop();
    if (this.inFlight === undefined) this.closeNow();
    return dropped;
  }

  private pump(): void {
    if (this.gone || this.fd === undefined || this.inFlight !== undefined || this.fullTimer !== undefined) return;
    if (this.queue.length === 0) {
      if (this.ending) {
        this.gone = true;
        this.closeNow();
      }
      return;
    }
    const batch = this.queue.splice(0, maxBatch);
    if (this.midLine) {
      this.midLine = false;
      batch[0] = Buffer.concat([newline, batch[0]!]);
      this.bytes += newline.length;
    }
    this.inFlight = batch;
    writev(this.fd, batch, (error, written) => {
      this.inFlight = undefined;
      if (this.gone) {
        // Abandoned while under way: a record it took only in part (a full FIFO's) is lost too.
        const taken = error ? 0 : takenWhole(batch, written).whole;
        const lost = this.records(batch.slice(taken));
        if (lost > 0) this.events.lost(lost);
        this.closeNow();
        return;
      }
      if (error?.code === "EAGAIN") {
        this.queue.unshift(...batch);
        this.waitForRoom();
        return;
      }
      if (error) {
        guarded("handling a failed write", () => this.fail(error, this.records(batch)));
        return;
      }
      this.bytes -= written;
      // A FIFO takes what fits: the rest of a record written in part goes first next time.
      const { whole, rest } = takenWhole(batch, written);
      if (whole < batch.length) {
        const unwritten = batch.slice(whole);
        unwritten[0] = unwritten[0]!.subarray(rest);
        if (unwritten[0].length === newline.length && unwritten[0].equals(newline)) this.lineEnd = unwritten[0];
        this.queue.unshift(...unwritten);
        if (written === 0) {
          this.waitForRoom();
          return;
        }
      }
      this.fullWaitMs = firstFullWaitMs;
      this.pump();
    });
  }

  /** A full pipe: try again shortly, more slowly while it stays full. Ref'd: a close() waits for it. */
  private waitForRoom(): void {
    this.fullTimer = setTimeout(() => {
      this.fullTimer = undefined;
      this.pump();
    }, this.fullWaitMs);
    this.fullWaitMs = Math.min(this.fullWaitMs * 2, longestFullWaitMs);
  }

  /** Of `buffers`, those that hold a record not yet whole in the file. */
  private records(buffers: readonly Buffer[]): number {
    return buffers.length - (this.lineEnd !== undefined && buffers.includes(this.lineEnd) ? 1 : 0);
  }

  /** `inFlight`: the records of the write that failed, on top of those queued. */
  private fail(error: NodeJS.ErrnoException, inFlight: number): void {
    const lost = inFlight + this.records(this.queue);
    this.drop();
    this.closeNow();
    this.events.failed(this, error, lost);
  }

  private drop(): void {
    this.gone = true;
    this.queue.length = 0;
    this.bytes = 0;
    clearTimeout(this.fullTimer);
    this.fullTimer = undefined;
  }

  private closeNow(): void {
    const fd = this.fd;
    this.fd = undefined;
    if (fd === undefined) {
      this.settle();
      return;
    }
    closeFd(fd, () => this.settle());
  }
}

const newline = Buffer.from("\n");

/**
 * Whether the regular file open for appending at `fd` ends in part of a line. A write that a full
 * disk (ENOSPC, a quota, a file size limit) cut short leaves the start of a record without its
 * newline; the next record appended after it, once there was room (or by the next start), was
 * glued to it, and a JSON-lines reader lost both. Read through a descriptor of its own (the
 * append one is write-only), and only when it is the same file. Best effort: a file that
 * cannot be read is taken to end a line.
 */
async function endsMidLine(file: string, fd: number): Promise<boolean> {
  try {
    const appending = await new Promise<Stats>((resolve, reject) => fstat(fd, (error, stats) => (error ? reject(error) : resolve(stats))));
    if (!appending.isFile() || appending.size === 0) return false;
    // Non-blocking: a FIFO put at the path meanwhile must not hold the open (it is not the file, below).
    const reader = await openFile(file, constants.O_RDONLY | (constants.O_NONBLOCK ?? 0));
    try {
      const stats = await reader.stat();
      if (stats.ino !== appending.ino || stats.dev !== appending.dev || stats.size === 0) return false;
      const { bytesRead, buffer } = await reader.read(Buffer.alloc(1), 0, 1, stats.size - 1);
      return bytesRead === 1 && buffer[0] !== newline[0];
    } finally {
      await reader.close();
    }
  } catch {
    return false;
  }
}

/**
 * The last handler of a promise chain or an fs callback whose own failure handling threw (an
 * `AuditWarn` that throws): one line on stderr, as the log writes its own, and never a rejection
 * or an uncaught exception, either of which would end the process. `what` names what threw.
 */
function reportUnhandled(what: string, thrown: unknown): void {
  try {
    const error = thrown instanceof Error ? thrown.message : String(thrown);
    writeStderr(`${JSON.stringify({ time: new Date().toISOString(), level: "error", msg: `audit log: ${what} threw`, error })}\n`);
  } catch {
    // A thrown value whose message cannot be read: nothing is left to say, and nothing to end.
  }
}

/**
 * Runs the failure handling of an fs callback, which nobody returns to: a throw there (the
 * `warn` it ends with) was an uncaught exception, which ends the process. The handling changes
 * its state before it warns, so what threw is reported and the log goes on as it would have.
 * The calls a caller makes (`open`, `append`, `close`) let a `warn`'s throw reach that caller.
 */
function guarded(what: string, handle: () => void): void {
  try {
    handle();
  } catch (thrown) {
    reportUnhandled(what, thrown);
  }
}

/**
 * The audit log's file: lines appended in batches (one writev of the records that arrived while
 * the last write was in flight), opened `O_APPEND|O_NONBLOCK`, so no write blocks the event loop
 * and none holds a threadpool thread on a FIFO. A failed write never reaches the proxy: it is
 * counted and warned about, and the file is opened again on the next record after `retryMs`.
 * A FIFO whose reader went away is such a failure (EPIPE, then ENXIO at each open until a reader
 * comes back). `reopen()` is for logrotate: lines already queued go to the old file, new ones to
 * a new file at the path.
 */
export class AuditLogFile {
  private target: AppendTarget | undefined;
  /** Targets ending (after a reopen or close): close() waits for them to flush. */
  private readonly ending = new Set<AppendTarget>();
  /** reopen()'s callbacks, run once their target is open. */
  private readonly onOpened = new Map<AppendTarget, () => void>();
  private retryAt = 0;
  private closed = false;
  private droppedCount = 0;
  private readonly maxQueuedBytes: number;
  private readonly retryMs: number;
  private readonly events: TargetEvents = {
    opened: (target) => {
      const opened = this.onOpened.get(target);
      this.onOpened.delete(target);
      opened?.();
    },
    lost: (count) => {
      this.droppedCount += count;
    },
    torn: () => {
      this.options.warn("audit:torn", "audit log: the file ends in part of a record (a write a full disk cut short); the next record starts on a new line", { file: this.options.file });
    },
    failed: (target, error, lost) => {
      this.onOpened.delete(target);
      this.droppedCount += lost;
      if (this.target === target) {
        this.target = undefined;
        this.retryAt = performance.now() + this.retryMs;
      }
      const code = error.code ?? error.message;
      const fields = { file: this.options.file, error: code, retryMs: this.retryMs };
      if (noReader.has(code)) this.options.warn("audit:reader", "audit log: the FIFO has no reader; records are dropped until one opens it", fields);
      else this.options.warn("audit:error", "audit log: a write failed; records are dropped until the file can be written again", fields);
    },
  };

  private constructor(private readonly options: AuditLogFileOptions) {
    this.maxQueuedBytes = options.maxQueuedBytes ?? defaultMaxQueuedBytes;
    this.retryMs = options.retryMs ?? defaultRetryMs;
  }

  /**
   * Opens the file for appending, creating it (mode 0640) when missing. Rejects when it cannot
   * be opened at all (a directory, a missing folder, no permission), so a bad path fails the
   * start rather than every record. A FIFO is waited for until it has a reader.
   */
  static async open(options: AuditLogFileOptions): Promise<AuditLogFile> {
    const log = new AuditLogFile(options);
    const appendOpen = (): Promise<number> => new Promise((resolve, reject) => openFd(options.file, appendFlags, 0o640, (error, fd) => (error ? reject(error) : resolve(fd))));
    const fd = await openWaitingForReader(options.file, appendOpen, () =>
      options.warn("audit:reader", "audit log: the FIFO has no reader; the start waits for one to open it", { file: options.file }),
    );
    log.target = new AppendTarget(options.file, log.events, { fd, midLine: await endsMidLine(options.file, fd) });
    return log;
  }

  get file(): string {
    return this.options.file;
  }

  /** Records lost so far: dropped while the disk was full or stalled, or in a write that failed. */
  get dropped(): number {
    return this.droppedCount;
  }

  /** Appends one line (with its newline); never throws, but for what `warn` throws (a full queue's warning). */
  append(line: string): void {
    if (this.closed) {
      this.droppedCount += 1;
      return;
    }
    let target = this.target;
    if (target === undefined) {
      if (performance.now() < this.retryAt) {
        this.droppedCount += 1;
        return;
      }
      target = this.target = new AppendTarget(this.options.file, this.events);
    }
    if (target.queuedBytes >= this.maxQueuedBytes) {
      this.droppedCount += 1;
      this.options.warn("audit:queue", "audit log: the disk (or the FIFO's reader) is not keeping up; records are dropped while the queue is full", {
        file: this.options.file,
        queuedBytes: target.queuedBytes,
        dropped: this.droppedCount,
      });
      return;
    }
    target.write(line);
  }

  /**
   * For logrotate (SIGUSR1): what is queued goes to the file as it was; new lines go to a new file
   * at the path. `opened` runs once the new file is open: one that cannot be opened (a folder, a
   * FIFO without a reader) is the write failure's warning instead.
   */
  reopen(opened?: () => void): void {
    if (this.closed) return;
    const old = this.target;
    this.retryAt = 0;
    const target = (this.target = new AppendTarget(this.options.file, this.events));
    if (opened !== undefined) this.onOpened.set(target, opened);
    if (old !== undefined) this.finish(old);
  }

  /**
   * Flushes what is queued and closes the file; waits at most `timeoutMs` for a stalled disk or a
   * FIFO's reader that stopped reading, then closes without the records still queued (counted as
   * lost). A write under way then is waited for: its records are on their way to the file, and
   * its descriptor is closed only once it returns (on a FIFO, which is written without blocking,
   * it returns at once).
   */
  async close(timeoutMs = 10_000): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.onOpened.clear();
    if (this.target !== undefined) this.finish(this.target);
    this.target = undefined;
    let timer: NodeJS.Timeout | undefined;
    const flushed = Promise.all([...this.ending].map((target) => target.done)).then(() => true);
    const late = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), timeoutMs);
      timer.unref();
    });
    const inTime = await Promise.race([flushed, late]);
    clearTimeout(timer);
    if (!inTime) {
      // Given up on while a write was under way, a record in it was counted lost, and warned
      // about, though it was in the file (CI, on a loaded machine: a small write's trip through
      // the threadpool took up to 135 ms, past a 100 ms bound); and with only a descriptor's
      // close left, nothing lost, the warning came all the same.
      const before = this.droppedCount;
      const left = [...this.ending];
      for (const target of left) this.droppedCount += target.abandon();
      await Promise.all(left.map((target) => target.done));
      if (this.droppedCount > before) this.options.warn("audit:close", "audit log: the disk did not take the last records in time; closing without them", { file: this.options.file, timeoutMs });
    }
    if (this.droppedCount > 0) this.options.warn("audit:dropped", "audit log: records were lost while it ran", { file: this.options.file, dropped: this.droppedCount });
  }

  /** Ends a target; its queued lines are written first. */
  private finish(target: AppendTarget): void {
    this.ending.add(target);
    void target.done.then(() => this.ending.delete(target));
    target.end();
  }
}
