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
 * looked for as its UTF-8 bytes in that form, which is also how a header holds it once
 * substituted; for ASCII values the forms are the same. A server that reads that header (as
 * Latin-1, as Node does) and writes it out again as UTF-8 (a JSON echo, `Buffer.from(header)` into
 * base64) makes its bytes UTF-8 twice, the third form looked for.
 */
import { decoders, spanEnd, spanStart, type DecodeContext, type View } from "./scan-decoders.js";

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

/** Enough for a value percent-encoded twice and then base64-encoded, or any three in a row. */
export const maxDepth = 3;

/**
 * The most characters one character of a value can take in a text the scan still recognises:
 * JSON's `\u0041` (six) is the longest form a decoder undoes, and decoders chain to
 * {@link maxDepth}.
 */
export const maxExpansion = 6 ** maxDepth;

/** A value to look for, under the name reported with it. */
export interface Needle {
  readonly name: string;
  /**
   * The value as text, as its UTF-8 bytes in Latin-1 form, and as those bytes' Latin-1 characters
   * encoded in UTF-8 again (in Latin-1 form): all lowercased by {@link fold}, each once. A value
   * outside ASCII has these for its upper- and lower-case spellings too (see {@link needle}).
   */
  readonly forms: readonly string[];
  /** Length in bytes of the shortest form. */
  readonly bytes: number;
}

export function needle(name: string, value: string): Needle {
  // Decoded bytes are Latin-1 characters, and fold() lowercases those: the UTF-8 bytes of a letter
  // past ASCII differ between its cases in ways no such folding undoes (`п` is D0 BF, `П` D0 9F;
  // `ä` C3 A4, `Ä` C3 84). So a value outside ASCII that an upstream upper- or lower-cased, then
  // percent- or base64-encoded into a redirect to another host, was not recognised and the hop
  // was followed (secrets hunt, fifteenth session): its upper- and lower-case spellings are
  // looked for too. (Mixed case past ASCII is recognised only where the text holds the letters
  // themselves, within Latin-1.)
  const spellings = /[\u0080-\uffff]/.test(value) ? new Set([value, value.toLowerCase(), value.toUpperCase()]) : [value];
  const forms = new Set<string>();
  for (const spelling of spellings) {
    const utf8 = Buffer.from(spelling, "utf8").toString("latin1");
    const twice = Buffer.from(utf8, "utf8").toString("latin1");
    for (const form of [spelling, utf8, twice]) forms.add(fold(form));
  }
  return { name, forms: [...forms], bytes: Math.min(...[...forms].map((form) => form.length)) };
}

/**
 * What a scan looks for: needles, what decoders need to know of them, and how to find them in
 * one view. {@link NeedleSet} for a fixed few; the log's redactor keeps every guest's values in a
 * {@link NeedleIndex} (./needle-index.ts), which finds them in one pass however many there are.
 */
export interface NeedleSearch {
  readonly context: DecodeContext;
  /** How many needles there are: none, and a scan has nothing to do. */
  readonly size: number;
  /**
   * Calls `found` with each needle found in `lower` (a view's text, {@link fold}ed), where its
   * form starts and how long that form is, until `found` returns true; then returns true.
   */
  find(lower: string, found: (needle: Needle, at: number, length: number) => boolean): boolean;
}

/** Needles with what decoders need to know of them, worked out once. */
export class NeedleSet implements NeedleSearch {
  readonly context: DecodeContext;

  constructor(readonly needles: readonly Needle[]) {
    this.context = {
      minBytes: needles.length === 0 ? 0 : Math.min(...needles.map((n) => n.bytes)),
      chars: new Set(needles.flatMap((n) => n.forms.flatMap((form) => [...form, ...form.toUpperCase()]))),
    };
  }

  get size(): number {
    return this.needles.length;
  }

  find(lower: string, found: (needle: Needle, at: number, length: number) => boolean): boolean {
    for (const n of this.needles) {
      for (const form of n.forms) {
        for (let at = lower.indexOf(form); at >= 0; at = lower.indexOf(form, at + 1)) if (found(n, at, form.length)) return true;
      }
    }
    return false;
  }
}

/**
 * Lowercases the letters of ASCII and Latin-1 (decoded bytes are Latin-1 characters) and
 * nothing else, so every character keeps its index: `"İ".toLowerCase()` has two.
 */
export function fold(text: string): string {
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
 *
 * Two paths can decode to the same text: base64 of a query, and base64 of its percent-decoded,
 * unwrapped copy, are the same bytes when the only `%20` was outside the base64 run (as is a
 * JSON view's base64 when the only escape was). Depth-first meets it first at the end of the
 * longer path, where no pass is left; a text met again with more passes left is decoded again
 * (not searched again), or one `%41` in a URL hid every copy that needs the full three passes.
 * A text is decoded at most {@link maxDepth} times, each time with more passes left, and the
 * budget bounds all of it.
 */
export function eachView(
  text: string,
  context: DecodeContext,
  visit: (view: View) => boolean,
  budget: ScanBudget = ScanBudget.forLength(text.length),
): ScanOutcome {
  // For each text met, the most decoding passes that were left below it.
  const passesLeft = new Map<string, number>();
  const walk = (view: View, depth: number): ScanOutcome => {
    const left = view.opaque === true ? 0 : maxDepth - depth;
    const before = passesLeft.get(view.text);
    if (before !== undefined && before >= left) return "done";
    passesLeft.set(view.text, left);
    if (before === undefined && visit(view)) return "stopped";
    if (left === 0) return "done";
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
export function scan(text: string, set: NeedleSearch, found: (match: Match) => boolean, budget?: ScanBudget): ScanOutcome {
  if (set.size === 0 || text === "") return "done";
  return eachView(text, set.context, (view) =>
    set.find(fold(view.text), (n, at, length) => found({ needle: n, start: spanStart(view, at), end: spanEnd(view, at + length - 1), via: view.via })),
  budget);
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
export function findFirst(text: string, needles: NeedleSearch, budget?: ScanBudget): Match | undefined {
  let first: Match | undefined;
  const outcome = scan(text, needles, (match) => {
    first = match;
    return true;
  }, budget);
  if (first === undefined && outcome === "unscanned") throw new UnscannableError("too complex to scan for secrets");
  return first;
}

/**
 * How far, at most, replacing values in a text moved what follows them towards its start, in
 * UTF-8 bytes (never fewer than its characters): the sum, over every replacement, of what it
 * took out less what it put in, where that is positive. For a caller that cuts the result and
 * must know how much of the text beyond a window can have been pulled before the cut
 * (src/deciders/document.ts). Counting what the result holds instead (markers, placeholders)
 * would count what the text held already: a text is anyone's to write.
 */
export interface ConcealTally {
  shortened: number;
}

/** Adds to `tally` what replacing `removed` by `inserted` took out of a text, if anything. */
export function tallyReplacement(tally: ConcealTally, removed: string, inserted: string): void {
  tally.shortened += Math.max(0, Buffer.byteLength(removed) - Buffer.byteLength(inserted));
}

/**
 * `text` with every span where a needle was found, in any view, replaced by
 * `[REDACTED:NAME]`. Overlapping spans are merged and take the first needle's name. A text
 * that could not be scanned within its budget is replaced as a whole by {@link unscannedMarker}.
 * With `keep`, only what stands before position `keep` of `text` is kept, a match that starts
 * before it whole (as its marker): a value cut by `keep` is redacted as a whole, since it was
 * matched before the cut was made. With `tally`, adds what each replacement took out; the
 * marker for a text too complex to scan sets it to 0, as nothing of the text is left to move.
 */
export function redactText(text: string, needles: NeedleSearch, budget?: ScanBudget, keep = text.length, tally?: ConcealTally): string {
  const spans: { start: number; end: number; name: string }[] = [];
  const outcome = scan(text, needles, (match) => {
    spans.push({ start: match.start, end: match.end, name: match.needle.name });
    return false;
  }, budget);
  if (outcome === "unscanned") {
    if (tally !== undefined) tally.shortened = 0;
    return unscannedMarker;
  }
  if (spans.length === 0) return keep >= text.length ? text : text.slice(0, keep);
  spans.sort((a, b) => a.start - b.start || b.end - a.end);
  let out = "";
  let at = 0;
  for (let i = 0; i < spans.length; ) {
    const { start, name } = spans[i]!;
    if (start >= keep) break;
    let end = spans[i]!.end;
    for (i++; i < spans.length && spans[i]!.start < end; i++) end = Math.max(end, spans[i]!.end);
    const marker = `[REDACTED:${name}]`;
    if (tally !== undefined) tallyReplacement(tally, text.slice(start, end), marker);
    out += `${text.slice(at, start)}${marker}`;
    at = end;
  }
  return at >= keep ? out : out + text.slice(at, keep);
}
