/** A header list as on the wire: [name, value, name, value, …], names in their original case. */
export type HeaderList = string[];

/** An RFC 9110 §5.6.2 token: what a method or a field name must be. */
export const httpToken = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** What no field value may hold: CR or LF would end the field (or the head), NUL no parser takes. */
export const breaksFieldValue = /[\r\n\0]/;
/**
 * The other characters a field value cannot carry: the C0 controls besides HTAB (and the CR, LF
 * and NUL of {@link breaksFieldValue}), and DEL. RFC 9110 §5.5 allows HTAB, SP, VCHAR and
 * obs-text only; undici refuses such a field ("invalid … header") and Node's HTTP/2 drops it.
 */
// eslint-disable-next-line no-control-regex
export const controlInFieldValue = /[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]/;

/** RFC 9110 §7.6.1 connection-specific fields, plus the de-facto proxy ones. */
const hopByHop = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authenticate",
  "proxy-authorization",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

/**
 * Copies a raw header list without hop-by-hop fields, without the fields that `Connection`
 * names (RFC 9110 §7.6.1: a client can mark any field hop-by-hop), and without `drop`.
 *
 * One pass, each name lowercased once: every request runs it (the guest's head), and every
 * response from an HTTP/1.1 upstream (whose `Connection: keep-alive` names only a field that
 * goes anyway). The fields a `Connection` names besides the hop-by-hop ones are taken out of the
 * copy after, which keeps the order of what stays.
 */
export function endToEndHeaders(raw: readonly string[], drop: ReadonlySet<string> = emptySet): HeaderList {
  return endToEnd(raw, drop, false)!;
}

/**
 * The one pass of {@link endToEndHeaders} and {@link upstreamResponseFields}: with `lengths`, a
 * Content-Length is rewritten as {@link canonicalLength} spells it, and undefined is returned for
 * a second one or one that is not a number.
 */
function endToEnd(raw: readonly string[], drop: ReadonlySet<string>, lengths: boolean): HeaderList | undefined {
  const out: HeaderList = [];
  let named: Set<string> | undefined;
  let seenLength = false;
  let keptTe = false;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    const lower = name.toLowerCase();
    let value = raw[i + 1]!;
    if (lengths && lower === "content-length") {
      const number = seenLength ? undefined : canonicalLength(value);
      if (number === undefined) return undefined;
      seenLength = true;
      value = number;
    } else if (lower === "connection") named = connectionNamed(value, named);
    // `te: trailers` says the client takes trailers, which the proxy passes on: gRPC servers
    // refuse requests without it, and it is the one TE value HTTP/2 allows (RFC 9113 §8.2.2).
    // Sent once, as `trailers` alone, whatever else the guest's TE lines list: two TE lines
    // naming it were two fields, which Node's HTTP/2 client refuses (an HTTP/1.1 guest's
    // request to an h2 upstream got 502), and `trailers, deflate` lost it (issue 20 audit).
    else if (lower === "te" && drop.has("te") === false && namesTrailers(value)) {
      if (!keptTe) out.push(name, "trailers");
      keptTe = true;
      continue;
    }
    if (hopByHop.has(lower) || drop.has(lower)) continue;
    out.push(name, value);
  }
  return named === undefined ? out : withoutNamed(out, named);
}

/**
 * The field names a `Connection` value lists, added to `named`, leaving out the hop-by-hop ones
 * (dropped whatever it says; `te: trailers` is kept even when named). Undefined while none is left.
 */
function connectionNamed(value: string, named: Set<string> | undefined): Set<string> | undefined {
  for (const token of value.split(",")) {
    const lower = token.trim().toLowerCase();
    if (!hopByHop.has(lower)) (named ??= new Set()).add(lower);
  }
  return named;
}

function withoutNamed(list: HeaderList, named: ReadonlySet<string>): HeaderList {
  const out: HeaderList = [];
  for (let i = 0; i < list.length; i += 2) if (!named.has(list[i]!.toLowerCase())) out.push(list[i]!, list[i + 1]!);
  return out;
}

const emptySet: ReadonlySet<string> = new Set();

/**
 * Whether a request's headers hold `Expect`. The proxy answers a guest's Expect itself (its 100
 * Continue) and never sends one upstream; undici refuses to (UND_ERR_NOT_SUPPORTED). One a hook
 * or a decider set reached undici, and the guest got 502 `EG_UPSTREAM` blaming the upstream.
 */
export function hasExpect(list: readonly string[]): boolean {
  for (let i = 0; i < list.length; i += 2) if (list[i]!.toLowerCase() === "expect") return true;
  return false;
}

/**
 * The bytes a head's fields take as HTTP/1.1 writes them: each name and value, ": " and CRLF, as
 * secret substitution counts a request's (a field's characters are Latin-1, one byte each).
 */
export function fieldBytes(list: readonly string[]): number {
  let bytes = 0;
  for (let i = 0; i < list.length; i += 2) bytes += list[i]!.length + list[i + 1]!.length + 4;
  return bytes;
}

/**
 * A header list's size as RFC 9113 §6.5.2 counts it: each field's name and value, and 32. What an
 * HTTP/2 peer's SETTINGS_MAX_HEADER_LIST_SIZE bounds, Node's own among them (the proxy's server
 * reads a guest's request by it), and more than nghttp2 counts when it sends a header block
 * (name, value and 12 a field, 17 a block, at most 64 KiB), so a list within 64 KiB by this count
 * can be sent in one.
 */
export function headerListSize(list: readonly string[]): number {
  let bytes = 0;
  for (let i = 0; i < list.length; i += 2) bytes += list[i]!.length + list[i + 1]!.length + 32;
  return bytes;
}

/** Why a hook's request may not carry `Expect`, after what names it. */
export const expectRefused = 'has an "expect" header, which the proxy answers itself and never sends upstream';

/** Whether a TE value's list names `trailers` (RFC 9110 §10.1.4: a keyword, without a weight). */
function namesTrailers(value: string): boolean {
  for (const member of value.split(",")) if (member.trim().toLowerCase() === "trailers") return true;
  return false;
}

/** undici's header object (arrays for repeated fields) as a raw list; Set-Cookie stays split. */
export function headerObjectToList(headers: Record<string, string | string[] | undefined>): HeaderList {
  const out: HeaderList = [];
  // Keys then values: Object.entries() made an array for every field of every response.
  for (const name of Object.keys(headers)) {
    const value = headers[name];
    if (value === undefined) continue;
    if (Array.isArray(value)) for (const v of value) out.push(name, v);
    else out.push(name, value);
  }
  return out;
}

export function getHeader(list: readonly string[], name: string): string | undefined {
  for (let i = 0; i < list.length; i += 2) if (list[i]!.toLowerCase() === name) return list[i + 1];
  return undefined;
}

/**
 * A response's fields without `te`: it speaks of what the sender of a request accepts (RFC 9110
 * §10.1.4), and is kept on requests (as `trailers`, for gRPC), so it rode along on responses too.
 */
export function responseFields(list: HeaderList): HeaderList {
  for (let i = 0; i < list.length; i += 2) {
    if (list[i]!.length === 2 && list[i]!.toLowerCase() === "te") return withoutHeaders(list, requestOnly);
  }
  return list;
}

const requestOnly: ReadonlySet<string> = new Set(["te"]);

export function withoutHeaders(list: readonly string[], names: ReadonlySet<string>): HeaderList {
  const out: HeaderList = [];
  for (let i = 0; i < list.length; i += 2) {
    if (!names.has(list[i]!.toLowerCase())) out.push(list[i]!, list[i + 1]!);
  }
  return out;
}

/**
 * A response's content codings in the order applied, over every Content-Encoding line (RFC 9110
 * §8.4), `identity` left out. Reading only the first line's undid a body gzipped twice once, and
 * took `gzip` then `br` for gzip alone.
 */
export function contentCodingList(headers: readonly string[]): readonly string[] {
  const codings: string[] = [];
  for (let i = 0; i < headers.length; i += 2) {
    if (headers[i]!.toLowerCase() !== "content-encoding") continue;
    for (const part of headers[i + 1]!.split(",")) {
      const coding = part.trim().toLowerCase();
      if (coding !== "" && coding !== "identity") codings.push(coding);
    }
  }
  return codings;
}

/**
 * Statuses whose responses have no content, whatever their framing says: 204, 205 (RFC 9110
 * §15.3.6: the server MUST NOT generate content) and 304. Node's HTTP/1.1 server suppresses a body
 * only for 204 and 304, its HTTP/2 server for all three: a 205 with a body reached HTTP/1.1
 * guests with it and HTTP/2 guests without.
 */
export function hasNoContent(status: number): boolean {
  return status === 204 || status === 205 || status === 304;
}

/**
 * The length fields of a response without content: none on a 204 (RFC 9110 §8.6: a server MUST
 * NOT send it; an HTTP/2 guest's nghttp2 refuses the response, and an HTTP/1.1 client may read it
 * as framing), `Content-Length: 0` on a 205 (§15.3.6's first way to say it has none). A 304's
 * describes the representation and stays.
 */
export function noContentFraming(status: number, headers: HeaderList): HeaderList {
  if (status === 204) return withoutHeaders(headers, contentLength);
  if (status === 205) return [...withoutHeaders(headers, contentLength), "content-length", "0"];
  return headers;
}

const contentLength: ReadonlySet<string> = new Set(["content-length"]);

/**
 * An upstream response's header fields as they may go on (the guest's, and hooks' view): end to
 * end only ({@link endToEndHeaders}, in one pass with the rest), and the Content-Length spelled
 * as a number is (RFC 9110 §8.6: `1*DIGIT`): without leading zeros or the whitespace around it
 * (`002` and ` 2 ` are `2`), so that the guest and every client after it read the length the
 * proxy framed the body by. llhttp and nghttp2 take leading zeros, and an upstream's
 * `Content-Length: 002` went to the guest as written (helper finding): a parser that reads it as
 * octal, or refuses it, disagrees with the proxy on where the body ends. Undefined when the list
 * holds more than one such field, or one that is not a number (even one that `Connection`
 * names): the caller refuses the response (RFC 9112 §6.3: invalid framing is an unrecoverable
 * error), never forwards it. Both parsers refuse those already; this keeps the rule where it is
 * used.
 */
export function upstreamResponseFields(list: readonly string[]): HeaderList | undefined {
  return endToEnd(list, emptySet, true);
}

/** A Content-Length value as digits without leading zeros or the whitespace around; undefined when it is not a number. */
function canonicalLength(value: string): string | undefined {
  // Already spelled so (nearly every response): as it is, without the regular expressions below.
  if (plainLength(value)) return value;
  const trimmed = value.replace(/^[ \t]+|[ \t]+$/g, "");
  if (!/^[0-9]+$/.test(trimmed)) return undefined;
  return trimmed.replace(/^0+(?=[0-9])/, "");
}

/** `0`, or digits without a leading zero: a Content-Length that needs no rewriting. */
function plainLength(value: string): boolean {
  const n = value.length;
  if (n === 0 || (value.charCodeAt(0) === 48 && n > 1)) return false;
  for (let i = 0; i < n; i++) {
    const c = value.charCodeAt(i);
    if (c < 48 || c > 57) return false;
  }
  return true;
}
