/**
 * Option errors: one shape for the API, the config file and the CLI flags. Each names the
 * option's path (`guests.ci.allowHosts[2]`, `timeouts.dnsMs`) in a field of its own, so the CLI
 * can name the flag and a config file error its line, without parsing message text.
 */

/** One step of an option path: a key, or an index into a list. */
export type Segment = string | number;

export type OptionIssueKind = "invalid" | "range" | "unknown";

/** One thing wrong with the options; validation collects these, then throws. */
export interface OptionIssue {
  readonly segments: readonly Segment[];
  /** `segments` as text: `guests.ci.allowHosts[2]`; `options` for the options object itself. */
  readonly path: string;
  /**
   * What is wrong, to follow the path: `must be an integer from 1 to 64 (got 0)`. For an
   * unknown key: the hint and the known keys (`; did you mean "allowHosts"? (known: …)`).
   */
  readonly reason: string;
  /** `range`: a number outside its bounds (a RangeError); `unknown`: a key no option has. */
  readonly kind: OptionIssueKind;
  /** In a config file: the 1-based line the option is on. */
  readonly line?: number;
}

const plainKey = /^[A-Za-z0-9_.*-]+$/;

/** `["guests", "ci", "allowHosts", 2]` → `guests.ci.allowHosts[2]`; odd keys are quoted. */
export function formatPath(segments: readonly Segment[]): string {
  let out = "";
  for (const segment of segments) {
    if (typeof segment === "number") out += `[${segment}]`;
    else if (plainKey.test(segment)) out += out === "" ? segment : `.${segment}`;
    else out += `[${JSON.stringify(segment)}]`;
  }
  return out === "" ? "options" : out;
}

export function makeIssue(segments: readonly Segment[], reason: string, kind: OptionIssueKind = "invalid"): OptionIssue {
  return { segments: [...segments], path: formatPath(segments), reason, kind };
}

/** The issue as one sentence: `listen.port must be …`, or `unknown option "x" …`. */
export function issueText(issue: OptionIssue): string {
  return issue.kind === "unknown" ? `unknown option "${issue.path}"${issue.reason}` : `${issue.path} ${issue.reason}`;
}

/** The stable code of every option error, whichever spelling (API, file, flag) it came from. */
export const invalidOptionCode = "EG_INVALID_OPTION";

/** What {@link OptionError} and {@link OptionRangeError} share. */
export interface OptionFailure extends Error {
  readonly code: typeof invalidOptionCode;
  readonly path: string;
  readonly segments: readonly Segment[];
  readonly reason: string;
  readonly kind: OptionIssueKind;
  readonly line: number | undefined;
}

export interface OptionErrorOptions {
  /** Put before the sentence: `startProxy: `, `egressgate.yaml:12: `. */
  readonly prefix?: string;
  readonly cause?: unknown;
  /** The sentence, where the path reads better in other words (the CLI names the flag). */
  readonly describe?: (issue: OptionIssue) => string;
}

function messageOf(issue: OptionIssue, options: OptionErrorOptions): string {
  return `${options.prefix ?? ""}${(options.describe ?? issueText)(issue)}`;
}

/** The issue an option error was made from, to report it again in other words. */
export function issueOf(error: OptionFailure): OptionIssue {
  return { segments: error.segments, path: error.path, reason: error.reason, kind: error.kind, ...(error.line !== undefined ? { line: error.line } : {}) };
}

/**
 * A bad option: a wrong type, a bad value or an unknown key. A TypeError, as before the schema,
 * so `instanceof TypeError` keeps working for callers.
 *
 * @example
 * ```ts
 * try { await startProxy({ timeouts: { dnsMs: "5s" } }); }
 * catch (e) { if (e.code === "EG_INVALID_OPTION") console.error(e.path); } // "timeouts.dnsMs"
 * ```
 */
export class OptionError extends TypeError implements OptionFailure {
  readonly code = invalidOptionCode;
  readonly path: string;
  readonly segments: readonly Segment[];
  readonly reason: string;
  readonly kind: OptionIssueKind;
  readonly line: number | undefined;

  constructor(issue: OptionIssue, options: OptionErrorOptions = {}) {
    super(messageOf(issue, options), options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "OptionError";
    this.path = issue.path;
    this.segments = issue.segments;
    this.reason = issue.reason;
    this.kind = issue.kind;
    this.line = issue.line;
  }
}

/** A number outside its bounds: a RangeError, with the same fields as {@link OptionError}. */
export class OptionRangeError extends RangeError implements OptionFailure {
  readonly code = invalidOptionCode;
  readonly path: string;
  readonly segments: readonly Segment[];
  readonly reason: string;
  readonly kind: OptionIssueKind;
  readonly line: number | undefined;

  constructor(issue: OptionIssue, options: OptionErrorOptions = {}) {
    super(messageOf(issue, options), options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "OptionRangeError";
    this.path = issue.path;
    this.segments = issue.segments;
    this.reason = issue.reason;
    this.kind = issue.kind;
    this.line = issue.line;
  }
}

/** The error for one issue: a RangeError for a number out of bounds, a TypeError otherwise. */
export function optionError(issue: OptionIssue, options: OptionErrorOptions = {}): OptionError | OptionRangeError {
  return issue.kind === "range" ? new OptionRangeError(issue, options) : new OptionError(issue, options);
}

export function isOptionError(error: unknown): error is OptionError | OptionRangeError {
  return error instanceof OptionError || error instanceof OptionRangeError;
}

/** The code of a config file that cannot be used: unreadable, not YAML, or holding bad options. */
export const invalidConfigCode = "EG_INVALID_CONFIG";

/**
 * A config file that cannot be used. Every issue found is in `issues` (the file is checked as a
 * whole before anything starts), each with its path and, where known, its line; `path` and
 * `line` are the first one's. A TypeError, so the CLI treats it as bad input (exit 2).
 */
export class ConfigFileError extends TypeError {
  readonly code = invalidConfigCode;
  readonly file: string;
  readonly issues: readonly OptionIssue[];
  readonly path: string;
  readonly line: number | undefined;

  constructor(file: string, issues: readonly OptionIssue[], options: { cause?: unknown } = {}) {
    // An issue with the file as a whole (unreadable, not YAML) has no option path to name.
    const text = (issue: OptionIssue): string => (issue.segments.length === 0 ? issue.reason : issueText(issue));
    const lines = issues.map((issue) => `${file}${issue.line === undefined ? "" : `:${issue.line}`}: ${text(issue)}`);
    super(lines.length === 1 ? lines[0]! : `${file}: ${issues.length} problems\n${lines.join("\n")}`, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "ConfigFileError";
    this.file = file;
    this.issues = issues;
    this.path = issues[0]?.path ?? "options";
    this.line = issues[0]?.line;
  }
}
