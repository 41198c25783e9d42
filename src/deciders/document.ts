import { hiddenCopies, hiddenPath, shownUrl } from "../policy/hidden-url.js";
import { maxExpansion, needle, NeedleSet, redactText, type ConcealTally } from "../policy/secret-scan.js";
import type { SecretStore } from "../policy/secrets.js";
import type { DeciderPhase } from "./options.js";

export type { ConcealTally };

/**
 * The input document every external decider gets (README "External deciders"):
 *
 * ```
 * { "phase": "request" | "response", "guest": "<name>",
 *   "request": { "method", "url", "url_parsed": { "scheme", "host", "port", "path", "query" }, "headers": { … }, "body"? },
 *   "response": { "status", "headers": { … }, "body"? } }      // response phase only
 * ```
 *
 * Header names are lowercased and repeated fields joined with ", ". Every string that could
 * hold a secret (the URL, every header name and value) passes through `conceal` first, which puts the
 * placeholder back for a current value and redacts a retired one: a decider is a third party,
 * and on a redirect hop or in the response phase the request already carries real values.
 */
export interface DecisionDocument {
  readonly phase: DeciderPhase;
  readonly guest: string | null;
  readonly request: {
    readonly method: string;
    readonly url: string;
    readonly url_parsed: { readonly scheme: string; readonly host: string; readonly port: number; readonly path: string; readonly query: string };
    readonly headers: Record<string, string>;
    body?: DocumentBody;
  };
  readonly response?: { readonly status: number; readonly headers: Record<string, string>; body?: DocumentBody };
}

/** A body in the document: text when it is valid UTF-8, else base64; cut at `maxBodyBytes`. */
export interface DocumentBody {
  readonly encoding: "utf8" | "base64";
  readonly data: string;
  /** The whole body's size in bytes (more than the data holds when `truncated`). */
  readonly size: number;
  readonly truncated: boolean;
}

/**
 * What maps secret values back out of a text; the identity when the guest has no secrets.
 * `reach`: how far past a cut a value (in the longest encoding the scan decodes) that starts
 * before it can run, so a body is concealed past its cut and only then cut. A conceal with a
 * reach adds to `tally` what its replacements took out of the text, which is how far they can
 * have pulled what lay past the concealed window before the cut.
 */
export type Conceal = ((text: string, header?: string, tally?: ConcealTally) => string) & {
  readonly reach?: () => number;
  /** Whether there is any value to conceal now; a body that cannot be searched is then refused. */
  readonly active?: () => boolean;
};

export const revealNothing: Conceal = (text) => text;

/**
 * The conceal for a guest's secrets. The store is asked on each call, not once: a reload can
 * give an empty store the values it retired (SecretStore.inherit) after the guest's sources
 * were made.
 */
export function concealFor(secrets: SecretStore): Conceal {
  return Object.assign((text: string, header?: string, tally?: ConcealTally) => (secrets.size === 0 ? text : secrets.placeholdersFor(text, header, tally)), {
    reach: () => secrets.reach(),
    active: () => secrets.size > 0,
  });
}

/** A header list ([name, value, …]) as the document's object. */
export function headerObject(list: readonly string[], conceal: Conceal): Record<string, string> {
  // No prototype: a field named "__proto__" was a prototype to set, not a key, and went unseen
  // by the decider while the upstream got it; "constructor" started from Object's function.
  const out = Object.create(null) as Record<string, string>;
  for (let i = 0; i < list.length; i += 2) {
    // The name too: an upstream can echo the value it was sent into a response field's name,
    // which went to every decider as it came (black-box finding).
    const field = list[i]!.toLowerCase();
    const name = conceal(field);
    const value = conceal(list[i + 1]!, field);
    const before = out[name];
    out[name] = before === undefined ? value : `${before}, ${value}`;
  }
  return out;
}

/**
 * The request part of the document. `hidden`: the request is a redirect hop whose path and
 * query are shown as `/[REDACTED:NAME]` (OutboundRequest.hiddenPath).
 */
export function requestPart(method: string, url: URL, headers: readonly string[], conceal: Conceal, hidden?: string): DecisionDocument["request"] {
  const scheme = url.protocol.slice(0, -1);
  const hostname = url.hostname.startsWith("[") ? url.hostname.slice(1, -1) : url.hostname;
  const href = url.hash === "" ? url.href : url.href.slice(0, url.href.length - url.hash.length);
  // Concealed whole, then split: a value that holds `?` lies across the path and the query, and
  // neither half alone was recognised (black-box finding).
  const target = hidden === undefined ? conceal(`${url.pathname}${url.search}`) : hiddenPath(hidden);
  const query = target.indexOf("?");
  return {
    method,
    url: conceal(hidden === undefined ? href : shownUrl(url, hidden)),
    url_parsed: {
      scheme,
      host: conceal(hostname),
      port: Number(url.port || (scheme === "https" ? 443 : 80)),
      path: query < 0 ? target : target.slice(0, query),
      query: query < 0 ? "" : target.slice(query + 1),
    },
    headers: headerObject(headers, conceal),
  };
}

/**
 * The conceal for a document about a hidden redirect hop: `conceal`, and then the hop's path and
 * query as they went out ({@link hiddenCopies}) redacted too, wherever the document holds them
 * (a response that quotes its request, a `Content-Location`).
 */
export function concealHidden(conceal: Conceal, url: URL, hidden: string | undefined): Conceal {
  const copies = hidden === undefined ? [] : hiddenCopies(url, hidden);
  if (copies.length === 0) return conceal;
  const set = new NeedleSet(copies.map((copy) => needle(copy.name, copy.value)));
  const longest = Math.max(...copies.map((copy) => Buffer.byteLength(copy.value)));
  return Object.assign((text: string, header?: string, tally?: ConcealTally) => redactText(conceal(text, header, tally), set, undefined, undefined, tally), {
    reach: () => Math.max(conceal.reach?.() ?? 0, maxExpansion * longest + 16),
    active: () => true,
  });
}

/**
 * A body for the document. Text is concealed like any header; binary bodies are searched for
 * values too (as Latin-1 text, one character per byte), and a redacted copy is what is encoded.
 */
export function documentBody(bytes: Uint8Array, maxBytes: number, conceal: Conceal): DocumentBody {
  const buffer = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const truncated = buffer.length > maxBytes;
  // Text when what is kept is text (a character the cut splits is dropped).
  const textual = utf8Length(truncated ? buffer.subarray(0, maxBytes) : buffer, truncated) !== undefined;
  const encoding = textual ? "utf8" : "latin1";
  // A value the cut falls inside would not be recognised in what is left of it: the text is
  // mapped past the cut, then cut. A copy that starts `reach` bytes or more before the window's
  // end lies in it whole; the values mapped out shorten the text by what the conceal tallies,
  // pulling what lay further on before the cut, so the window grows until that cannot reach the
  // cut. The tally, not a count of placeholders and markers in the result: those a body can
  // hold by the million, and each grew the window and mapped it again from byte 0 (a 32 MiB
  // body of "EGRESSGATE_SECRET_ " held the event loop for 9 s).
  const reach = truncated ? (conceal.reach?.() ?? 0) : 0;
  let end = Math.min(buffer.length, maxBytes + reach);
  for (;;) {
    const tally: ConcealTally = { shortened: 0 };
    const concealed = Buffer.from(conceal(buffer.subarray(0, end).toString(encoding), undefined, tally), encoding);
    if (end === buffer.length || maxBytes + reach + tally.shortened <= end) {
      const kept = concealed.subarray(0, maxBytes);
      const data = textual ? kept.subarray(0, utf8Length(kept, true) ?? 0).toString("utf8") : kept.toString("base64");
      return { encoding: textual ? "utf8" : "base64", data, size: buffer.length, truncated };
    }
    end = Math.min(buffer.length, Math.max(2 * end, maxBytes + 2 * reach + tally.shortened));
  }
}

/**
 * How many bytes of `part` are valid UTF-8 text: all of them, or, when the body was cut, all but
 * the part of one character the cut left at the end; undefined when `part` is not text.
 */
function utf8Length(part: Buffer, truncated: boolean): number | undefined {
  const decoder = new TextDecoder("utf-8", { fatal: true });
  for (let drop = 0; drop <= (truncated ? Math.min(3, part.length) : 0); drop++) {
    try {
      decoder.decode(part.subarray(0, part.length - drop));
      return part.length - drop;
    } catch {
      // One byte shorter: the cut may have split a character.
    }
  }
  return undefined;
}
