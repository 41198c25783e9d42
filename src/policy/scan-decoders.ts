/**
 * The encodings the secret scan undoes (./secret-scan.ts): each decoder turns a view of a text
 * into the views with its encoding undone, every character keeping the span of the original it
 * came from.
 */
import { domainToUnicode } from "node:url";
import { withFields } from "../objects.js";
import type { ScanBudget } from "./secret-scan.js";

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

/** What decoders know of the values looked for, to skip work that cannot find one. */
export interface DecodeContext {
  /** The length in bytes of the shortest value: runs too short to hold it are left alone. */
  readonly minBytes: number;
  /** Every character of every value's forms. */
  readonly chars: ReadonlySet<string>;
}

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
 * Punycode (RFC 3492) labels, as the URL parser writes a host name holding characters outside
 * ASCII (`pässwörd.api.test` is `xn--psswrd-bfb7y.api.test`), and as anyone reads them back.
 * An upstream that wrote a value outside ASCII into the host of its redirect had it quoted in
 * punycode by the recording, the log and the refusals, where nothing recognised it (secrets
 * hunt, fifteenth session). Each decoded character stands for its whole label.
 */
const punycode: Decoder = {
  name: "punycode",
  decode(view, _context, budget) {
    const { text } = view;
    if (!/xn--/i.test(text)) return [];
    const labels = [...text.matchAll(/xn--[A-Za-z0-9_+=!$&'*,;~-]+/gi)];
    const decoded = labels.map((m) => {
      const unicode = domainToUnicode(m[0]);
      // Invalid punycode comes back empty (or as it was); a label decodes to fewer characters than it has.
      return unicode === "" || unicode.toLowerCase() === m[0].toLowerCase() || unicode.length > m[0].length ? undefined : unicode;
    });
    if (decoded.every((unicode) => unicode === undefined) || !budget.take(text.length)) return [];
    const out = new ViewBuilder(view);
    let copied = 0;
    labels.forEach((m, i) => {
      const unicode = decoded[i];
      if (unicode === undefined) return;
      out.copy(copied, m.index);
      for (let k = 0; k < unicode.length; k++) out.char(unicode.charCodeAt(k), m.index, m.index + m[0].length);
      copied = m.index + m[0].length;
    });
    out.copy(copied, text.length);
    // Searched, not decoded again: what a host label decodes to is no other encoding's text.
    return [withFields(out.finish(this.name), { opaque: true })];
  },
};

/**
 * Every encoding the scan and the redactor undo. Letter case needs no decoder: every view is
 * searched case-insensitively. A new encoding is one more entry here.
 */
export const decoders: readonly Decoder[] = [percent, plus, json, wrapped, base64, hex, punycode];
