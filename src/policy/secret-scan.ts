/**
 * Finding a secret's value in text however it was encoded: the redirect scan and redaction both
 * use this (issue 14). An in-scope upstream that echoes what it received can re-encode a value
 * into a redirect's Location (a `return_to` or OAuth `state` parameter), and a log line or an
 * error body can quote a URL that the parser percent-encoded in its own way. A list of spellings
 * of the value can never be complete, so the text is decoded instead.
 *
 * A text is turned into views: one decoding pass per encoding ({@link decoders}), chained up to
 * {@link maxDepth} passes deep, so a value percent-encoded twice, or base64 inside a
 * percent-encoded query, is found. Every view is searched for every value in any letter case
 * (of ASCII and Latin-1). A view remembers, for each of its characters, the span of the original text it came
 * from, so a match can be cut out of the original (redaction) as well as reported.
 *
 * Decoded bytes are held as Latin-1 characters (one character per byte), so each value is also
 * looked for as its UTF-8 bytes in that form; for ASCII values the two are the same.
 */
import { withFields } from "../objects.js";

export interface View {
  /** The decoded text: characters as they were, or bytes as Latin-1 characters. */
  readonly text: string;
  /**
   * For the view's character i, the original text's span `[start[i], end[i])` it came from;
   * undefined for the original text itself (each character its own span).
   */
  readonly start: Int32Array | undefined;
  readonly end: Int32Array | undefined;
  /** The encodings undone to reach this view, outermost first. */
  readonly via: readonly string[];
  /** Decoded noise (a wrong alignment): searched, but not decoded again. */
  readonly opaque?: boolean;
}

/**
 * One encoding. `decode` returns the views of `view` with this encoding undone (several when
 * the encoding's alignment is unknown, as for base64 and hex inside a longer token), or none
 * when the view holds nothing this decoder could change, or nothing that could be part of a value.
 */
export interface Decoder {
  readonly name: string;
  /** Takes each view's length from `budget` before building it, and builds no more once it is spent. */
  decode(view: View, context: DecodeContext, budget: ScanBudget): View[];
}

/**
 * A bound on the decoding one scan may do, in characters of decoded views (issue 14: a guest's
 * crafted 60 KB URL path, whose every view decodes to text again, made hundreds of views of
 * tens of kilobytes each, 200-400 ms per log line). Past the bound a scan stops and reports
 * that it could not finish: the redirect scan then refuses the hop, and redaction replaces the
 * whole text ({@link unscannedMarker}). A text is never let through unscanned.
 */
export class ScanBudget {
  private used = 0;
  private spent = false;

  constructor(readonly limit: number) {}

  /** `perChar` decoded characters per character of `length`, plus a floor for short texts. */
  static forLength(length: number): ScanBudget {
    return new ScanBudget(budgetPerChar * length + budgetFloor);
  }

  /** Characters decoded so far. */
  get decoded(): number {
    return this.used;
  }

  get exhausted(): boolean {
    return this.spent;
  }

  /** Takes `chars` for a view about to be built; false (and exhausted from then on) if that would pass the limit. */
  take(chars: number): boolean {
    if (this.spent || this.used + chars > this.limit) {
      this.spent = true;
      return false;
    }
    this.used += chars;
    return true;
  }
}

/**
 * Ordinary text (a log line, a redirect's URL) decodes into a handful of views (3-7 measured
 * for a log line), most of them short or opaque; 8 times the text plus 16 K characters leaves
 * room for those and stops a crafted text long before it costs much.
 */
export const budgetPerChar = 8;
export const budgetFloor = 16 * 1024;

/** What redaction puts in place of a text too complex to scan within its budget. */
export const unscannedMarker = "[REDACTED:UNSCANNED]";

/** What decoders know of the values looked for, to skip work that cannot find one. */
export interface DecodeContext {
  /** The length in bytes of the shortest value: runs too short to hold it are left alone. */
  readonly minBytes: number;
  /** Every character of every value's forms. */
  readonly chars: ReadonlySet<string>;
}

/** Enough for a value percent-encoded twice and then base64-encoded, or any three in a row. */
export const maxDepth = 3;

/**
 * The most characters one character of a value can take in a text the scan still recognises:
 * JSON's `\u0041` (six) is the longest form a decoder undoes, and decoders chain to
 * {@link maxDepth}.
 */
export const maxExpansion = 6 ** maxDepth;

/**
 * Builds a view character by character, each with its span in the original text. A decoded
 * view is never longer than the view it comes from, which sizes the span arrays.
 */
class ViewBuilder {
  private readonly parts: string[] = [];
  private readonly starts: Int32Array;
  private readonly ends: Int32Array;
  private length = 0;

  constructor(
    private readonly from: View,
    capacity = from.text.length,
  ) {
    this.starts = new Int32Array(capacity);
    this.ends = new Int32Array(capacity);
  }

  /** Copies the view's characters `[a, b)` unchanged. */
  copy(a: number, b: number): void {
    if (b <= a) return;
    this.parts.push(this.from.text.slice(a, b));
    const { start, end } = this.from;
    if (start === undefined || end === undefined) {
      for (let i = a; i < b; i++, this.length++) {
        this.starts[this.length] = i;
        this.ends[this.length] = i + 1;
      }
    } else {
      this.starts.set(start.subarray(a, b), this.length);
      this.ends.set(end.subarray(a, b), this.length);
      this.length += b - a;
    }
  }

  /** One decoded character standing for the view's characters `[a, b)`. */
  char(code: number, a: number, b: number): void {
    this.parts.push(String.fromCharCode(code));
    this.starts[this.length] = spanStart(this.from, a);
    this.ends[this.length] = spanEnd(this.from, b - 1);
    this.length++;
  }

  /**
   * Decoded bytes, as Latin-1 characters, standing for groups of the view's characters: byte k
   * for `[from + ⌊k / groupBytes⌋ · groupChars, … + groupChars)`, cut at `limit`.
   */
  bytes(bytes: Buffer, from: number, groupChars: number, groupBytes: number, limit: number): void {
    this.parts.push(bytes.toString("latin1"));
    for (let k = 0; k < bytes.length; k++, this.length++) {
      const group = from + Math.floor(k / groupBytes) * groupChars;
      this.starts[this.length] = spanStart(this.from, group);
      this.ends[this.length] = spanEnd(this.from, Math.min(group + groupChars, limit) - 1);
    }
  }

  finish(name: string): View {
    return {
      text: this.parts.join(""),
      start: this.starts.subarray(0, this.length),
      end: this.ends.subarray(0, this.length),
      via: [...this.from.via, name],
    };
  }
}

export function spanStart(view: View, i: number): number {
  return view.start === undefined ? i : view.start[i]!;
}

export function spanEnd(view: View, i: number): number {
  return view.end === undefined ? i + 1 : view.end[i]!;
}

/** `%XX` as the byte it stands for; a `%` not followed by two hex digits stays as it is. */
const percent: Decoder = {
  name: "percent",
  decode(view, _context, budget) {
    const { text } = view;
    if (!/%[0-9A-Fa-f]{2}/.test(text) || !budget.take(text.length)) return [];
    const out = new ViewBuilder(view);
    let copied = 0;
    for (const m of text.matchAll(/%[0-9A-Fa-f]{2}/g)) {
      out.copy(copied, m.index);
      out.char(Number.parseInt(m[0].slice(1), 16), m.index, m.index + 3);
      copied = m.index + 3;
    }
    out.copy(copied, text.length);
    return [out.finish(this.name)];
  },
};

/**
 * `+` for space, as HTML forms and query strings write it. Only when a value holds a space: the
 * view differs from its source only where a `+` became one, so without such a value it finds
 * nothing new, and base64 text (whose alphabet has `+`) cost a second copy of every view made
 * from it, about half the scan's budget for a long base64 field.
 */
const plus: Decoder = {
  name: "plus",
  decode(view, { chars }, budget) {
    if (!chars.has(" ") || !view.text.includes("+") || !budget.take(view.text.length)) return [];
    return [{ text: view.text.replaceAll("+", " "), start: view.start, end: view.end, via: [...view.via, this.name] }];
  },
};

/**
 * Line breaks and spaces inside an encoded run, as MIME and PEM wrap base64 (every 76 or 64
 * characters) and as a URL carries them (`%0D%0A`, `%20`): runs of one or two whitespace
 * characters between encoding characters are taken out, so the run decodes whole. Only in a
 * decoded view: a URL holds whitespace only percent-encoded, and ordinary text (a log line) is
 * full of spaces. One or two, so a value character still takes at most three characters here,
 * and only after a run of 16 (MIME and PEM lines are 76 and 64): joining ordinary words made
 * long runs that base64 then decoded at every alignment (5 to 6 times the budget of a line with
 * one `%XX`, and some lines no longer scanned within it), and matched across words.
 */
const wrapped: Decoder = {
  name: "wrapped",
  decode(view, _context, budget) {
    // A `plus` view's spaces were `+`, which base64 reads itself.
    if (view.via.length === 0 || view.via.at(-1) === "plus") return [];
    const { text } = view;
    const gaps = [...text.matchAll(/(?<=[A-Za-z0-9+/_=-]{16})[ \t\r\n]{1,2}(?=[A-Za-z0-9+/_=-]{4})/g)];
    if (gaps.length === 0 || !budget.take(text.length)) return [];
    const out = new ViewBuilder(view);
    let copied = 0;
    for (const m of gaps) {
      out.copy(copied, m.index);
      copied = m.index + m[0].length;
    }
    out.copy(copied, text.length);
    return [out.finish(this.name)];
  },
};

const jsonEscapes: Record<string, string> = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" };

/**
 * JSON and JavaScript string escapes: a log line is JSON, so `"` and `\` in a value arrive
 * escaped. Every log line has `\"`, so the view is made only when an escape stands for a
 * character some value holds (or for any character, as `\u0041` can).
 */
const json: Decoder = {
  name: "json",
  decode(view, { chars }, budget) {
    const { text } = view;
    if (!text.includes("\\")) return [];
    const escapes = [...text.matchAll(/\\(?:u([0-9A-Fa-f]{4})|x([0-9A-Fa-f]{2})|(["\\/bfnrt]))/g)];
    if (!escapes.some((m) => m[3] === undefined || chars.has(jsonEscapes[m[3]]!))) return [];
    if (!budget.take(text.length)) return [];
    const out = new ViewBuilder(view);
    let copied = 0;
    for (const m of escapes) {
      out.copy(copied, m.index);
      const code = m[1] ?? m[2];
      out.char(code !== undefined ? Number.parseInt(code, 16) : jsonEscapes[m[3]!]!.charCodeAt(0), m.index, m.index + m[0].length);
      copied = m.index + m[0].length;
    }
    out.copy(copied, text.length);
    return [out.finish(this.name)];
  },
};

/** A run of characters of one encoding, decoded from one alignment. */
interface DecodedRun {
  readonly from: number;
  readonly chars: number;
  readonly bytes: Buffer;
  /** Holds a stretch of text, so it may hold another encoding. */
  readonly textual: boolean;
}

/**
 * Whether decoded bytes may hold another encoding: a stretch of at least `min` printable ASCII
 * characters. Most alignments of a run decode to noise, which is searched but not decoded
 * again; that keeps the views of one text to a few dozen. A stretch, not the whole run: a run
 * often starts before the encoding does (`/echo/` before a base64 token), and its first
 * group then decodes to noise.
 */
function hasText(bytes: Buffer, min: number): boolean {
  let stretch = 0;
  for (const b of bytes) {
    stretch = (b >= 0x20 && b < 0x7f) || b === 0x09 ? stretch + 1 : 0;
    if (stretch >= min) return true;
  }
  return false;
}

/**
 * A decoder for encodings written as runs of characters in fixed groups (`groupChars`
 * characters make `groupBytes` bytes) whose start inside a run is unknown: each of the first
 * `groupChars` characters is tried as the start. Each decoded byte stands for its whole group.
 */
function runDecoder(
  name: string,
  pattern: string,
  groupChars: number,
  groupBytes: number,
  minChars: (minBytes: number) => number,
  usable: (chars: number) => number,
  decodeRun: (text: string) => Buffer,
): Decoder {
  return {
    name,
    decode(view, { minBytes }, budget) {
      // A `plus` view differs from its source only where a `+` became a space: its runs are parts
      // of its source's runs, which were decoded at every alignment already.
      if (view.via.at(-1) === "plus") return [];
      const minRun = Math.max(2, minChars(minBytes));
      const runs = [...view.text.matchAll(runPattern(pattern, minRun))];
      if (runs.length === 0) return [];
      const views: View[] = [];
      for (let align = 0; align < groupChars; align++) {
        const capacity = runs.reduce((n, m) => n + Math.max(0, usable(m[0].length - align)) + 1, 1);
        if (!runs.some((m) => usable(m[0].length - align) >= minRun)) continue;
        if (!budget.take(capacity)) break;
        const decoded: DecodedRun[] = [];
        for (const m of runs) {
          const from = m.index + align;
          const chars = usable(m[0].length - align);
          if (chars < minRun) continue;
          const bytes = decodeRun(view.text.slice(from, from + chars));
          decoded.push({ from, chars, bytes, textual: hasText(bytes, Math.max(4, minBytes)) });
        }
        views.push(withFields(build(view, decoded, name, groupChars, groupBytes, capacity), { opaque: !decoded.some((r) => r.textual) }));
      }
      return views;
    },
  };
}

const runPatterns = new Map<string, RegExp>();

/** `[class]{min,}`: the regex engine skips short runs without building a match for each. */
function runPattern(charClass: string, min: number): RegExp {
  const key = `${charClass}{${min},}`;
  let re = runPatterns.get(key);
  if (re === undefined) {
    re = new RegExp(key, "g");
    if (runPatterns.size < 256) runPatterns.set(key, re);
  }
  re.lastIndex = 0;
  return re;
}

/**
 * The decoded runs only, each gap between them (already searched in `view` itself) standing as
 * one NUL, which no value holds: a long text with one long run makes a view of that run's
 * size, not of the text's, at each of the run's alignments.
 */
function build(view: View, runs: readonly DecodedRun[], name: string, groupChars: number, groupBytes: number, capacity: number): View {
  const out = new ViewBuilder(view, capacity);
  let copied = 0;
  for (const { from, chars, bytes } of runs) {
    if (from > copied) out.char(0, copied, from);
    out.bytes(bytes, from, groupChars, groupBytes, from + chars);
    copied = from + chars;
  }
  if (view.text.length > copied) out.char(0, copied, view.text.length);
  return out.finish(name);
}

/**
 * Base64, standard (`+/`) and URL-safe (`-_`), padded or not. A run of base64 characters may
 * start before the encoded value does (`/echo/UzNj…` is one run), so it is decoded from each of
 * its first four characters: one of them is the encoding's own start, whatever the byte
 * alignment of the value inside it.
 */
const base64 = runDecoder(
  "base64",
  "[A-Za-z0-9+/_-]",
  4,
  3,
  (minBytes) => Math.ceil((minBytes * 4) / 3),
  // A trailing group of 2 or 3 characters still holds 1 or 2 bytes; a lone one holds none.
  (length) => Math.floor(length / 4) * 4 + (length % 4 >= 2 ? length % 4 : 0),
  (text) => Buffer.from(text, "base64"),
);

/** Hex in either case, from each of a run's first two characters. */
const hex = runDecoder(
  "hex",
  "[0-9A-Fa-f]",
  2,
  1,
  (minBytes) => minBytes * 2,
  (length) => Math.floor(length / 2) * 2,
  (text) => Buffer.from(text, "hex"),
);

/**
 * Every encoding the scan and the redactor undo. Letter case needs no decoder: every view is
 * searched case-insensitively. A new encoding is one more entry here.
 */
export const decoders: readonly Decoder[] = [percent, plus, json, wrapped, base64, hex];

/** A value to look for, under the name reported with it. */
export interface Needle {
  readonly name: string;
  /** The value as text, and as its UTF-8 bytes in Latin-1 form: both lowercased by {@link fold}. */
  readonly forms: readonly string[];
  /** Length in bytes of the shortest form. */
  readonly bytes: number;
}

export function needle(name: string, value: string): Needle {
  const text = fold(value);
  const bytes = fold(Buffer.from(value, "utf8").toString("latin1"));
  return { name, forms: text === bytes ? [text] : [text, bytes], bytes: Math.min(text.length, bytes.length) };
}

/** Needles with what decoders need to know of them, worked out once. */
export class NeedleSet {
  readonly context: DecodeContext;

  constructor(readonly needles: readonly Needle[]) {
    this.context = {
      minBytes: needles.length === 0 ? 0 : Math.min(...needles.map((n) => n.bytes)),
      chars: new Set(needles.flatMap((n) => n.forms.flatMap((form) => [...form, ...form.toUpperCase()]))),
    };
  }
}

/**
 * Lowercases the letters of ASCII and Latin-1 (decoded bytes are Latin-1 characters) and
 * nothing else, so every character keeps its index: `"İ".toLowerCase()` has two.
 */
function fold(text: string): string {
  // Within Latin-1, toLowerCase maps character for character (and is much faster).
  if (!/[\u0100-\uffff]/.test(text)) return text.toLowerCase();
  return text.replace(/[A-Z\xc0-\xd6\xd8-\xde]+/g, (run) => run.toLowerCase());
}

/** One place a needle was found: its span in the original text and how it was encoded. */
export interface Match {
  readonly needle: Needle;
  readonly start: number;
  readonly end: number;
  readonly via: readonly string[];
}

/**
 * How a walk over the views ended: `visit` returned true ("stopped"), every view was visited
 * ("done"), or the budget ran out first ("unscanned": some views were never searched).
 */
export type ScanOutcome = "stopped" | "done" | "unscanned";

/**
 * Calls `visit` with `text` and every view decoded from it, depth-first, until it returns true.
 * Each distinct view is visited once. At most 9 views come from one view (one each for
 * percent, plus and json, four for base64 and two for hex), and only those that hold some text
 * are decoded again, to {@link maxDepth}. A text crafted so that every view holds text still
 * makes 9³ views, so the decoded characters are also bounded by `budget` (by default
 * {@link ScanBudget.forLength} of the text).
 */
export function eachView(
  text: string,
  context: DecodeContext,
  visit: (view: View) => boolean,
  budget: ScanBudget = ScanBudget.forLength(text.length),
): ScanOutcome {
  const seen = new Set<string>();
  const walk = (view: View, depth: number): ScanOutcome => {
    if (seen.has(view.text)) return "done";
    seen.add(view.text);
    if (visit(view)) return "stopped";
    if (depth >= maxDepth || view.opaque === true) return "done";
    for (const decoder of decoders) {
      for (const next of decoder.decode(view, context, budget)) {
        const outcome = walk(next, depth + 1);
        if (outcome !== "done") return outcome;
      }
      if (budget.exhausted) return "unscanned";
    }
    return "done";
  };
  return walk({ text, start: undefined, end: undefined, via: [] }, 0);
}

/**
 * Calls `found` for every occurrence of every needle in every view of `text`, in any letter
 * case, until it returns true ("stopped") or the budget runs out ("unscanned").
 */
export function scan(text: string, set: NeedleSet, found: (match: Match) => boolean, budget?: ScanBudget): ScanOutcome {
  const { needles, context } = set;
  if (needles.length === 0 || text === "") return "done";
  return eachView(text, context, (view) => {
    const lower = fold(view.text);
    for (const n of needles) {
      for (const form of n.forms) {
        for (let at = lower.indexOf(form); at >= 0; at = lower.indexOf(form, at + 1)) {
          const match = { needle: n, start: spanStart(view, at), end: spanEnd(view, at + form.length - 1), via: view.via };
          if (found(match)) return true;
        }
      }
    }
    return false;
  }, budget);
}

/** Thrown by {@link findFirst} when the budget ran out before a match was found. */
export class UnscannableError extends Error {
  override readonly name = "UnscannableError";
}

/**
 * The first match in `text`, if any. Throws {@link UnscannableError} when the budget ran out
 * before one was found: the text may hold a value, and a caller that does not expect that
 * fails closed.
 */
export function findFirst(text: string, needles: NeedleSet, budget?: ScanBudget): Match | undefined {
  let first: Match | undefined;
  const outcome = scan(text, needles, (match) => {
    first = match;
    return true;
  }, budget);
  if (first === undefined && outcome === "unscanned") throw new UnscannableError("too complex to scan for secrets");
  return first;
}

/**
 * `text` with every span where a needle was found, in any view, replaced by
 * `[REDACTED:NAME]`. Overlapping spans are merged and take the first needle's name. A text
 * that could not be scanned within its budget is replaced as a whole by {@link unscannedMarker}.
 * With `keep`, only what stands before position `keep` of `text` is kept, a match that starts
 * before it whole (as its marker): a value cut by `keep` is redacted as a whole, since it was
 * matched before the cut was made.
 */
export function redactText(text: string, needles: NeedleSet, budget?: ScanBudget, keep = text.length): string {
  const spans: { start: number; end: number; name: string }[] = [];
  const outcome = scan(text, needles, (match) => {
    spans.push({ start: match.start, end: match.end, name: match.needle.name });
    return false;
  }, budget);
  if (outcome === "unscanned") return unscannedMarker;
  if (spans.length === 0) return keep >= text.length ? text : text.slice(0, keep);
  spans.sort((a, b) => a.start - b.start || b.end - a.end);
  let out = "";
  let at = 0;
  for (let i = 0; i < spans.length; ) {
    const { start, name } = spans[i]!;
    if (start >= keep) break;
    let end = spans[i]!.end;
    for (i++; i < spans.length && spans[i]!.start < end; i++) end = Math.max(end, spans[i]!.end);
    out += `${text.slice(at, start)}[REDACTED:${name}]`;
    at = end;
  }
  return at >= keep ? out : out + text.slice(at, keep);
}
