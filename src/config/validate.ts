import { makeIssue, maxListedIssues, shownValue, unknownKeyReason, type OptionIssue, type OptionIssueKind, type OptionRequirement, type Segment } from "./option-error.js";

export { closest, editDistance } from "./option-error.js";

/**
 * The building blocks of the option schema, and the one walk that checks a value against them.
 * Hand-rolled on purpose: a dozen node kinds cover every option, and the walk collects every
 * issue with its path, which a config file needs (all its problems at once, each on its line).
 */

interface Common {
  /** One line for the docs and `--help`. */
  readonly doc: string;
  /** A parent object refuses the value's absence. */
  readonly required?: boolean;
}

export interface IntegerNode extends Common {
  readonly kind: "integer";
  readonly min: number;
  readonly max: number;
  readonly default?: number;
}

export interface BooleanNode extends Common {
  readonly kind: "boolean";
  readonly default?: boolean;
}

export interface StringNode extends Common {
  readonly kind: "string";
  /** What a value is, for messages: "a directory path". */
  readonly expect: string;
  readonly choices?: readonly string[];
  /** "" is a value (an environment variable may be empty); otherwise it is refused. */
  readonly allowEmpty?: boolean;
  /** A further check on a non-empty string; returns the reason it is wrong. */
  readonly check?: (value: string) => string | undefined;
  readonly default?: string;
}

export interface ListNode extends Common {
  readonly kind: "list";
  readonly items: OptionNode;
  /** What the list holds, for messages: "host patterns". */
  readonly expect: string;
  readonly minItems?: number;
}

export interface ObjectNode extends Common {
  readonly kind: "object";
  readonly fields: Readonly<Record<string, OptionNode>>;
  /** Extra words for an unknown key, for the keys people are known to try. */
  readonly hints?: Readonly<Record<string, string>>;
  /** Checks between fields, run once the fields themselves are valid. */
  readonly rules?: (value: Readonly<Record<string, unknown>>, report: Report) => void;
}

export interface MapNode extends Common {
  readonly kind: "map";
  /** What a key is, for the docs: "hostname". */
  readonly keyDoc: string;
  readonly checkKey: (key: string) => string | undefined;
  readonly values: OptionNode;
  readonly minEntries?: number;
  /**
   * What a key stands for, where two spellings name one thing (a hostname's case, its final
   * dot): two keys of one map that stand for the same are refused, as one key given twice is.
   */
  readonly keyIdentity?: (key: string) => string;
}

export interface FunctionNode extends Common {
  readonly kind: "function";
}

/** A value that no other kind describes (a secret's `env:`/`file:` source, say). */
export interface CustomNode extends Common {
  readonly kind: "custom";
  /** What a value is, for the docs. */
  readonly expect: string;
  readonly check: (value: unknown, report: Report, context: ValidateContext) => void;
}

export type OptionNode = IntegerNode | BooleanNode | StringNode | ListNode | ObjectNode | MapNode | FunctionNode | CustomNode;

/**
 * Reports an issue at `segments` below the node being checked (none: the node itself).
 * `requires` names an option the reported one needs; then `reason` says so in the API's words.
 */
export type Report = (reason: string, segments?: readonly Segment[], kind?: OptionIssueKind, requires?: OptionRequirement) => void;

/** Where the options come from; some values are allowed in one spelling only. */
export interface ValidateContext {
  /** CLI flags may give a secret's value inline (`--host-secret NAME@HOST=VALUE`); a file may not. */
  readonly inlineSecrets?: boolean;
  /** Where a decider's `${NAME}` header references are looked up (default: the process's environment). */
  readonly env?: NodeJS.ProcessEnv;
}

const reservedName = 'the name "__proto__" is reserved (JavaScript objects give it a meaning of their own); choose another';

/** The value as a message may quote it. */
export function shown(value: unknown): string {
  const text = shownValue(value);
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

export function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Checks `value` against `node`; every issue found goes to `issues`. Absent (`undefined`) is valid. */
export function validate(node: OptionNode, value: unknown, segments: readonly Segment[], issues: OptionIssue[], context: ValidateContext = {}): void {
  if (value === undefined) return;
  const report: Report = (reason, below = [], kind = "invalid", requires) => issues.push(makeIssue([...segments, ...below], reason, kind, requires));
  switch (node.kind) {
    case "integer":
      if (typeof value !== "number" || !Number.isInteger(value)) report(`must be an integer (got ${shown(value)})`);
      else if (value < node.min || value > node.max) report(`must be an integer from ${node.min} to ${node.max} (got ${value})`, [], "range");
      return;
    case "boolean":
      if (typeof value !== "boolean") report(`must be true or false (got ${shown(value)})`);
      return;
    case "string": {
      if (typeof value !== "string" || (value === "" && node.allowEmpty !== true)) return report(`must be ${node.expect} (got ${shown(value)})`);
      if (node.choices !== undefined && !node.choices.includes(value)) {
        return report(`must be one of ${node.choices.map((c) => JSON.stringify(c)).join(", ")} (got ${shown(value)})`);
      }
      const reason = node.check?.(value);
      if (reason !== undefined) report(reason);
      return;
    }
    case "list":
      if (!Array.isArray(value)) return report(`must be a list of ${node.expect} (got ${shown(value)})`);
      if (node.minItems !== undefined && value.length < node.minItems) return report(`must hold at least ${node.minItems} of ${node.expect}`);
      value.forEach((item, i) => validate(node.items, item, [...segments, i], issues, context));
      return;
    case "object":
      return validateObject(node, value, segments, issues, context, report);
    case "map": {
      if (!isPlainObject(value)) return report(`must be an object of ${node.keyDoc}: value (got ${shown(value)})`);
      const entries = Object.entries(value);
      if (node.minEntries !== undefined && entries.length < node.minEntries) return report(`must name at least ${node.minEntries} ${node.keyDoc}`);
      /** Each key's identity, and the key that first stood for it. */
      const seen = new Map<string, string>();
      for (const [key, item] of entries) {
        // A parser may give it as an own key (YAML, JSON.parse); assigned to an object it would set
        // the prototype instead, and the entry would vanish without a word.
        const reason = key === "__proto__" ? reservedName : node.checkKey(key);
        if (reason !== undefined) {
          issues.push(makeIssue([...segments, key], reason, "clause"));
          continue;
        }
        const identity = node.keyIdentity?.(key);
        const first = identity === undefined ? undefined : seen.get(identity);
        if (first !== undefined) {
          // `a.test` and `A.test.` in one resolve map: the second replaced the first without a word.
          issues.push(makeIssue([...segments, key], `names the same ${node.keyDoc} as ${JSON.stringify(first)}; give it once, with all its values`, "clause"));
          continue;
        }
        if (identity !== undefined) seen.set(identity, key);
        validate(node.values, item, [...segments, key], issues, context);
      }
      return;
    }
    case "function":
      if (typeof value !== "function") report(`must be a function (got ${shown(value)})`);
      return;
    case "custom":
      node.check(value, report, context);
      return;
  }
}

function validateObject(node: ObjectNode, value: unknown, segments: readonly Segment[], issues: OptionIssue[], context: ValidateContext, report: Report): void {
  if (!isPlainObject(value)) return report(`must be an object (got ${shown(value)})`);
  const known = Object.keys(node.fields);
  const before = issues.length;
  for (const [key, item] of Object.entries(value)) {
    // Own keys only: `toString` or `constructor` found on the prototype passed as known options.
    const field = Object.hasOwn(node.fields, key) ? node.fields[key] : undefined;
    if (field === undefined) {
      const hint = node.hints !== undefined && Object.hasOwn(node.hints, key) ? node.hints[key] : undefined;
      // Past the problems a message lists, no "did you mean" and no list of known keys: each costs
      // an edit distance to every known key and about 450 bytes, and a file of 150,000 unknown
      // keys (1.7 MB) took 36 s, most of it here, and 68 MB for lines no one is shown.
      issues.push(makeIssue([...segments, key], issues.length < maxListedIssues ? unknownKeyReason(key, known, hint) : "", "unknown"));
      continue;
    }
    validate(field, item, [...segments, key], issues, context);
  }
  for (const [key, field] of Object.entries(node.fields)) {
    if (field.required === true && value[key] === undefined) report("is required", [key]);
  }
  if (issues.length === before) node.rules?.(value, report);
}
