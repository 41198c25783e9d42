import { createPrettySink } from "../log-pretty.js";
import { createLogger, writeStderr, type LogLevel, type LogSink } from "../log.js";

/** A line the CLI itself writes (a reload, a signal, a worker's exit), beside the proxy's own. */
export type CliLog = (level: "debug" | "info" | "warn" | "error", msg: string, fields?: Record<string, unknown>) => void;

/** What decides how the CLI's lines look: the same flags as the proxy's log. */
export interface CliLogOptions {
  readonly logLevel?: LogLevel | undefined;
  readonly logFormat?: string | undefined;
  /** In a --workers cluster's worker: its pid, which each line names as the proxy's do. */
  readonly workerPid?: number | undefined;
}

/** Whether lines are written for a person (`--log-format pretty`, or a terminal when not set). */
export function prettyLog(logFormat: string | undefined): boolean {
  return logFormat === "pretty" || (logFormat === undefined && process.stderr.isTTY === true);
}

/**
 * The sink of the proxy's lines and the CLI's alike: one JSON object per line, or one pretty line;
 * a worker's lines carry its pid (`"worker":PID` first, or a `[PID]` prefix).
 */
export function cliSink(logFormat: string | undefined, workerPid: number | undefined): LogSink | undefined {
  const write = writeStderr;
  if (prettyLog(logFormat)) return createPrettySink(write, workerPid !== undefined ? { prefix: `[${workerPid}] ` } : {});
  if (workerPid === undefined) return undefined;
  return (line) => write(line.startsWith("{") ? `{"worker":${workerPid},${line.slice(1)}` : line);
}

/**
 * The CLI's own lines, at --log-level and in --log-format like the proxy's, so that with `json`
 * every line on stderr is one JSON object (a primary's plain-text lines broke that).
 */
export function createCliLog(options: CliLogOptions): CliLog {
  const logger = createLogger(options.logLevel ?? "info", cliSink(options.logFormat, options.workerPid));
  return (level, msg, fields) => logger[level](msg, fields);
}
