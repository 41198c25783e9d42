/**
 * Option errors: one shape for the API (startProxy, createHttpHooks), the config file and the CLI
 * flags. Each names the option's path (`guests.ci.allowHosts[2]`, `timeouts.dnsMs`) in a field of
 * its own, so the CLI can name the flag and a config file error its line, without parsing message
 * text. At the root, like errors.ts, so that every layer can throw one.
 */

/** One step of an option path: a key, or an index into a list. */
export type Segment = string | number;

/**
 * `range`: a number out of bounds (a RangeError); `unknown`: a key no option has; `clause`: a
 * reason that is a sentence of its own (a bad key's name, a policy's own error), set apart by a
 * colon; `invalid`: anything else.
 */
export type OptionIssueKind = "invalid" | "range" | "unknown" | "clause";

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
  /**
   * The option is given without another it needs (`hooksTimeoutMs` without `hooksScript`). Kept
   * apart from `reason` so the CLI can name that option's flag in its own words.
   */
  readonly requires?: OptionRequirement;
}

/** An option another one needs: its path, and the value it must have, if any. */
export interface OptionRequirement {
  readonly path: string;
  readonly value?: string;
}

/** The reason for a missing requirement, as the API and the file spell options. */
export function requiresReason(requires: OptionRequirement): string {
  return `only applies with ${requires.path}${requires.value === undefined ? "" : `: ${JSON.stringify(requires.value)}`}`;
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

/**
 * A bad value as an option error quotes it: as JSON where JSON can say it, and never with a throw
 * of its own. JSON.stringify throws on a BigInt, a cycle, a getter or `toJSON` that throws and a
 * Proxy's traps, and String() on an object without a prototype: `maxRedirects: 5n` got "Do not
 * know how to serialize a BigInt" in place of the error naming the option, and `limits.timeoutMs:
 * 5n` read "must be an integer from 1 to 60000 (got 5)" (black-box finding).
 */
export function shownValue(value: unknown): string {
  switch (typeof value) {
    case "undefined":
      return "undefined";
    case "function":
      return "a function";
    case "symbol":
      return value.toString();
    case "bigint":
      return `${value}n`;
    case "number":
      // JSON has no NaN or Infinity.
      return String(value);
    default:
      try {
        return JSON.stringify(value) ?? "a value JSON cannot show";
      } catch {
        return "a value JSON cannot show (a BigInt, a cycle, or a getter that throws)";
      }
  }
}

export function makeIssue(segments: readonly Segment[], reason: string, kind: OptionIssueKind = "invalid", requires?: OptionRequirement): OptionIssue {
  return { segments: [...segments], path: formatPath(segments), reason, kind, ...(requires !== undefined ? { requires } : {}) };
}

/** The issue as one sentence: `listen.port must be …`, or `unknown option "x" …`. */
export function issueText(issue: OptionIssue): string {
  if (issue.kind === "unknown") return `unknown option "${issue.path}"${issue.reason}`;
  // A clause stands on its own ("secrets.a-b: a secret name must be …"); any other reason goes on
  // from the path ("listen.port must be …").
  return issue.kind === "clause" ? `${issue.path}: ${issue.reason}` : `${issue.path} ${issue.reason}`;
}

/** Levenshtein distance, case-insensitive: `allowedhosts` is 2 from `allowHosts`. */
export function editDistance(a: string, b: string): number {
  const x = a.toLowerCase();
  const y = b.toLowerCase();
  let previous = Array.from({ length: y.length + 1 }, (_, i) => i);
  for (let i = 1; i <= x.length; i++) {
    const row = [i];
    for (let j = 1; j <= y.length; j++) {
      row[j] = Math.min(previous[j]! + 1, row[j - 1]! + 1, previous[j - 1]! + (x[i - 1] === y[j - 1] ? 0 : 1));
    }
    previous = row;
  }
  return previous[y.length]!;
}

/** The known key nearest to `key`, when it is within 2 edits (a typo, not another word). */
export function closest(key: string, known: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = 3;
  for (const candidate of known) {
    const d = editDistance(key, candidate);
    if (d < bestDistance) {
      best = candidate;
      bestDistance = d;
    }
  }
  return best;
}

/** The words after an unknown key: a likely meant key, or a hint, and the known keys. */
export function unknownKeyReason(key: string, known: readonly string[], hint?: string): string {
  const near = closest(key, known);
  const guess = hint ?? (near === undefined ? "" : `did you mean "${near}"?`);
  return `${guess === "" ? "" : `; ${guess}`} (known: ${known.join(", ")})`;
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
  readonly requires: OptionRequirement | undefined;
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
  return {
    segments: error.segments,
    path: error.path,
    reason: error.reason,
    kind: error.kind,
    ...(error.line !== undefined ? { line: error.line } : {}),
    ...(error.requires !== undefined ? { requires: error.requires } : {}),
  };
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
  readonly requires: OptionRequirement | undefined;

  constructor(issue: OptionIssue, options: OptionErrorOptions = {}) {
    super(messageOf(issue, options), options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "OptionError";
    this.path = issue.path;
    this.segments = issue.segments;
    this.reason = issue.reason;
    this.kind = issue.kind;
    this.line = issue.line;
    this.requires = issue.requires;
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
  readonly requires: OptionRequirement | undefined;

  constructor(issue: OptionIssue, options: OptionErrorOptions = {}) {
    super(messageOf(issue, options), options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "OptionRangeError";
    this.path = issue.path;
    this.segments = issue.segments;
    this.reason = issue.reason;
    this.kind = issue.kind;
    this.line = issue.line;
    this.requires = issue.requires;
  }
}

/** The error for one issue: a RangeError for a number out of bounds, a TypeError otherwise. */
export function optionError(issue: OptionIssue, options: OptionErrorOptions = {}): OptionError | OptionRangeError {
  return issue.kind === "range" ? new OptionRangeError(issue, options) : new OptionError(issue, options);
}

export function isOptionError(error: unknown): error is OptionError | OptionRangeError {
  return error instanceof OptionError || error instanceof OptionRangeError;
}
