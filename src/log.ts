/** Structured logging: one JSON object per line on stderr, so decisions can be shipped as-is. */
export type LogLevel = "debug" | "info" | "warn" | "error" | "silent";

const rank: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40, silent: 100 };

export const logLevels: readonly LogLevel[] = ["debug", "info", "warn", "error", "silent"];

export type LogFields = Record<string, unknown>;

export interface Logger {
  readonly level: LogLevel;
  enabled(level: LogLevel): boolean;
  debug(msg: string, fields?: LogFields): void;
  info(msg: string, fields?: LogFields): void;
  warn(msg: string, fields?: LogFields): void;
  error(msg: string, fields?: LogFields): void;
}

export type LogSink = (line: string) => void;

const ignore = (): void => undefined;

/**
 * Bytes of log lines that may wait for stderr's reader. stderr a pipe is written asynchronously
 * (on Linux), so a reader that stops reading (a log shipper stalled, a `| less` left open) had
 * every later line kept in memory: 80,000 logged requests grew the proxy by over 120 MiB, and it went on
 * growing. Past this, lines are dropped and counted; the count is written once the reader has
 * caught up. A file or a terminal is written synchronously and never waits here.
 */
export const maxStderrBacklogBytes = 16 * 1024 * 1024;

let stderrWatched = false;
let droppedLines = 0;

/**
 * Writes `text` (whole lines) to stderr, or drops it while more than
 * {@link maxStderrBacklogBytes} wait for the reader; never throws, never blocks.
 *
 * stderr whose reader went away (`egressgate … 2>&1 | head`, a log shipper restarting) fails
 * every write with EPIPE, as an `error` event: unlistened, it ended the process, every guest with
 * it. The lines are lost instead; the proxy goes on.
 */
export function writeStderr(text: string): void {
  const stderr = process.stderr;
  if (!stderrWatched) {
    stderrWatched = true;
    stderr.on("error", ignore);
  }
  if (stderr.writableLength >= maxStderrBacklogBytes) {
    // The write that took the backlog past the mark returned false, so "drain" comes once the
    // reader has taken all of it; a reader that went away (EPIPE) empties it at once.
    if (droppedLines === 0) stderr.once("drain", reportDroppedLines);
    droppedLines += 1;
    return;
  }
  stderr.write(text);
}

function reportDroppedLines(): void {
  const dropped = droppedLines;
  droppedLines = 0;
  const line = { time: new Date().toISOString(), level: "warn", msg: "log lines were dropped: stderr's reader did not keep up", dropped, backlogBytes: maxStderrBacklogBytes };
  process.stderr.write(`${JSON.stringify(line)}\n`);
}

const stderrSink: LogSink = writeStderr;

/** Writes `line` to `sink`; a sink that throws, or rejects, loses the line and nothing else. */
function deliver(sink: LogSink, line: string): void {
  try {
    const result = sink(line) as { then?: unknown } | undefined;
    // Any thenable, not only this realm's Promise: an async sink from a vm context (Jest runs an
    // embedder's tests in one) returns another realm's, whose rejection ended the process.
    if (result !== null && (typeof result === "object" || typeof result === "function") && typeof result.then === "function") {
      (result as PromiseLike<unknown>).then(undefined, ignore);
    }
  } catch {
    // A log call must never throw: it runs in every error path, and one that threw there became
    // an unhandled rejection, or an uncaught exception from a socket's close listener.
  }
}

/**
 * A logger that drops everything below `level` before building the line. `redact` sees every
 * finished line, so no field (an error message, a URL) can carry a secret value out; a line it
 * could not scan within its budget is written with its fields replaced by redact's marker.
 */
export function createLogger(level: LogLevel = "info", sink: LogSink = stderrSink, redact?: (line: string) => string): Logger {
  const min = rank[level];
  const write = (lvl: LogLevel, msg: string, fields?: LogFields): void => {
    if (rank[lvl] < min) return;
    const entry = { time: new Date().toISOString(), level: lvl, msg, ...fields };
    let line: string;
    try {
      line = JSON.stringify(entry, errorReplacer);
    } catch {
      // A field that cannot be written (what a hook threw: a Proxy, a getter that throws, a
      // BigInt): the line still goes out, that field marked. A log call must never throw.
      line = JSON.stringify(Object.fromEntries(Object.entries(entry).map(([key, value]) => [key, serialisable(value) ? value : "(not serialisable)"])), errorReplacer);
    }
    let out = redact === undefined ? line : redact(line);
    // Redaction gives up on a line too complex to scan within its budget and returns a marker
    // for the whole line; the log stays one JSON object per line, with only what the proxy wrote.
    if (!out.startsWith("{")) {
      const quoted = JSON.stringify(msg);
      out = JSON.stringify({ time: entry.time, level: lvl, msg: redact!(quoted) === quoted ? msg : out, fields: out });
    }
    deliver(sink, `${out}\n`);
  };
  return {
    level,
    enabled: (lvl) => rank[lvl] >= min,
    debug: (msg, fields) => write("debug", msg, fields),
    info: (msg, fields) => write("info", msg, fields),
    warn: (msg, fields) => write("warn", msg, fields),
    error: (msg, fields) => write("error", msg, fields),
  };
}

function serialisable(value: unknown): boolean {
  try {
    JSON.stringify(value, errorReplacer);
    return true;
  } catch {
    return false;
  }
}

function errorReplacer(_key: string, value: unknown): unknown {
  if (value instanceof Error) {
    const code = (value as { code?: unknown }).code;
    return code === undefined ? value.message : `${String(code)}: ${value.message}`;
  }
  return value;
}
