import { createWriteStream, type WriteStream } from "node:fs";

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

/**
 * The audit log's file: lines appended through a buffered stream (`flags: "a"`), so no write
 * blocks the event loop and lines that arrive while one write is in flight go out together in
 * the next (fs.WriteStream's writev). A failed write never reaches the proxy: it is counted and
 * warned about, and the file is opened again on the next record after `retryMs`. `reopen()` is
 * for logrotate: lines already queued go to the old file, new ones to a new file at the path.
 */
export class AuditLogFile {
  private stream: WriteStream | undefined;
  /** Streams ending (after a reopen or close): close() waits for them to flush. */
  private readonly ending = new Map<WriteStream, Promise<void>>();
  private retryAt = 0;
  private closed = false;
  private droppedCount = 0;
  private readonly maxQueuedBytes: number;
  private readonly retryMs: number;
  /** One callback for every write, rather than a closure per record: a write that failed is a record lost. */
  private readonly onWritten = (error: Error | null | undefined): void => {
    if (error) this.droppedCount += 1;
  };

  private constructor(private readonly options: AuditLogFileOptions) {
    this.maxQueuedBytes = options.maxQueuedBytes ?? defaultMaxQueuedBytes;
    this.retryMs = options.retryMs ?? defaultRetryMs;
  }

  /**
   * Opens the file for appending, creating it (mode 0640) when missing. Rejects when it cannot
   * be opened at all (a directory, a missing folder, no permission), so a bad path fails the
   * start rather than every record.
   */
  static async open(options: AuditLogFileOptions): Promise<AuditLogFile> {
    const log = new AuditLogFile(options);
    const stream = createWriteStream(options.file, { flags: "a", mode: 0o640 });
    await new Promise<void>((resolve, reject) => {
      stream.once("ready", () => {
        stream.off("error", reject);
        resolve();
      });
      stream.once("error", reject);
    });
    log.adopt(stream);
    return log;
  }

  get file(): string {
    return this.options.file;
  }

  /** Records lost so far: dropped while the disk was full or stalled, or in a write that failed. */
  get dropped(): number {
    return this.droppedCount;
  }

  /** Appends one line (with its newline); never throws. */
  append(line: string): void {
    if (this.closed) {
      this.droppedCount += 1;
      return;
    }
    let stream = this.stream;
    if (stream === undefined) {
      if (performance.now() < this.retryAt) {
        this.droppedCount += 1;
        return;
      }
      stream = this.adopt(this.createStream());
    }
    if (stream.writableLength >= this.maxQueuedBytes) {
      this.droppedCount += 1;
      this.options.warn("audit:queue", "audit log: the disk is not keeping up; records are dropped while the queue is full", {
        file: this.options.file,
        queuedBytes: stream.writableLength,
        dropped: this.droppedCount,
      });
      return;
    }
    stream.write(line, this.onWritten);
  }

  /**
   * For logrotate (SIGUSR1): what is queued goes to the file as it was; new lines go to a new file
   * at the path. `opened` runs once the new file is open: one that cannot be opened is the write
   * failure's warning instead (a reopen onto a folder was logged "reopened", then failed).
   */
  reopen(opened?: () => void): void {
    if (this.closed) return;
    const old = this.stream;
    this.retryAt = 0;
    const stream = this.adopt(this.createStream());
    if (opened !== undefined) stream.once("open", opened);
    if (old !== undefined) this.finish(old);
  }

  /** Flushes what is queued and closes the file; waits at most `timeoutMs` for a stalled disk. */
  async close(timeoutMs = 10_000): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.stream !== undefined) this.finish(this.stream);
    this.stream = undefined;
    let timer: NodeJS.Timeout | undefined;
    const flushed = Promise.all(this.ending.values()).then(() => true);
    const late = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), timeoutMs);
      timer.unref();
    });
    const inTime = await Promise.race([flushed, late]);
    clearTimeout(timer);
    if (!inTime) {
      for (const stream of this.ending.keys()) stream.destroy();
      this.options.warn("audit:close", "audit log: the disk did not take the last records in time; closing without them", { file: this.options.file, timeoutMs });
    }
    if (this.droppedCount > 0) this.options.warn("audit:dropped", "audit log: records were lost while it ran", { file: this.options.file, dropped: this.droppedCount });
  }

  private createStream(): WriteStream {
    return createWriteStream(this.options.file, { flags: "a", mode: 0o640 });
  }

  private adopt(stream: WriteStream): WriteStream {
    this.stream = stream;
    stream.on("error", (error: NodeJS.ErrnoException) => {
      if (this.stream === stream) {
        this.stream = undefined;
        this.retryAt = performance.now() + this.retryMs;
      }
      this.options.warn("audit:error", "audit log: a write failed; records are dropped until the file can be written again", {
        file: this.options.file,
        error: error.code ?? error.message,
        retryMs: this.retryMs,
      });
    });
    return stream;
  }

  /** Ends a stream; its queued lines are written first. Settles when it has closed, failed or not. */
  private finish(stream: WriteStream): void {
    if (stream.closed) return;
    const done = new Promise<void>((resolve) => stream.once("close", resolve));
    this.ending.set(stream, done);
    void done.then(() => this.ending.delete(stream));
    if (!stream.destroyed) stream.end();
  }
}
