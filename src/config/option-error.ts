import { issueText, type OptionIssue } from "../option-error.js";

/** The option errors live at the root, so every layer can throw one; the config file's own is here. */
export {
  closest,
  editDistance,
  formatPath,
  invalidOptionCode,
  isOptionError,
  issueOf,
  issueText,
  makeIssue,
  OptionError,
  optionError,
  OptionRangeError,
  requiresReason,
  shownValue,
  unknownKeyReason,
  type OptionErrorOptions,
  type OptionFailure,
  type OptionIssue,
  type OptionIssueKind,
  type OptionRequirement,
  type Segment,
} from "../option-error.js";

/**
 * The most problems a ConfigFileError's message lists, one a line; the rest are counted
 * (`FILE: 149900 more problems not listed`), and all are in its `issues`. A file of 150,000
 * unknown keys (1.7 MB) made a message of 68 MB, each line with the list of known keys, printed
 * at a start and logged as one line by a reload.
 */
export const maxListedIssues = 100;

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
    const lines = issues.slice(0, maxListedIssues).map((issue) => `${file}${issue.line === undefined ? "" : `:${issue.line}`}: ${text(issue)}`);
    if (issues.length > maxListedIssues) lines.push(`${file}: ${issues.length - maxListedIssues} more problems not listed`);
    super(issues.length === 1 ? lines[0]! : `${file}: ${issues.length} problems\n${lines.join("\n")}`, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "ConfigFileError";
    this.file = file;
    this.issues = issues;
    this.path = issues[0]?.path ?? "options";
    this.line = issues[0]?.line;
  }
}
