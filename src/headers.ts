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
 */
export function endToEndHeaders(raw: readonly string[], drop: ReadonlySet<string> = emptySet): HeaderList {
  let named: Set<string> | undefined;
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i]!.toLowerCase() === "connection") {
      named ??= new Set();
      for (const token of raw[i + 1]!.split(",")) named.add(token.trim().toLowerCase());
    }
  }
  const out: HeaderList = [];
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    const lower = name.toLowerCase();
    // `te: trailers` says the client takes trailers, which the proxy passes on: gRPC servers
    // refuse requests without it, and it is the one TE value HTTP/2 allows (RFC 9113 §8.2.2).
    if (lower === "te" && drop.has("te") === false && isTrailersOnly(raw[i + 1]!)) {
      out.push(name, "trailers");
      continue;
    }
    if (hopByHop.has(lower) || drop.has(lower) || named?.has(lower) === true) continue;
    out.push(name, raw[i + 1]!);
  }
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

function isTrailersOnly(value: string): boolean {
  return value.trim().toLowerCase() === "trailers";
}

/** undici's header object (arrays for repeated fields) as a raw list; Set-Cookie stays split. */
export function headerObjectToList(headers: Record<string, string | string[] | undefined>): HeaderList {
  const out: HeaderList = [];
  for (const [name, value] of Object.entries(headers)) {
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
 * A response's Content-Length spelled as a number is (RFC 9110 §8.6: `1*DIGIT`): without leading
 * zeros or the whitespace around it (`002` and ` 2 ` are `2`), so that the guest and every
 * client after it read the length the proxy framed the body by. llhttp and nghttp2 take leading
 * zeros, and an upstream's `Content-Length: 002` went to the guest as written (helper finding):
 * a parser that reads it as octal, or refuses it, disagrees with the proxy on where the body
 * ends. Undefined when the list holds more than one such field, or one that is not a number:
 * the caller refuses the response (RFC 9112 §6.3: invalid framing is an unrecoverable error),
 * never forwards it. Both parsers refuse those already; this keeps the rule where it is used.
 */
export function canonicalContentLength(list: HeaderList): HeaderList | undefined {
  let at = -1;
  for (let i = 0; i < list.length; i += 2) {
    if (list[i]!.toLowerCase() !== "content-length") continue;
    if (at >= 0) return undefined;
    at = i;
  }
  if (at < 0) return list;
  const value = list[at + 1]!.replace(/^[ \t]+|[ \t]+$/g, "");
  if (!/^[0-9]+$/.test(value)) return undefined;
  const number = value.replace(/^0+(?=[0-9])/, "");
  if (number === list[at + 1]) return list;
  const out = [...list];
  out[at + 1] = number;
  return out;
}
