import type { Header } from "har-format";
import { contentCodingList, getHeader } from "../headers.js";
import type { OutboundRequest } from "../pipeline/exchange.js";
import { secretToken, type SecretStore } from "../policy/secrets.js";
import { secretInLocation, unscannedName } from "../policy/hidden-url.js";
import { UnscannableError, unscannedMarker } from "../policy/secret-scan.js";
import type { CapturedBody } from "./body-capture.js";
import { isText, type RecordedContent, type RecordedEntry, type RecordedPostData } from "./har.js";
import { fullScanLimit, LiteralScanner } from "./leak-scan.js";
import { maskCookieHeader, maskSetCookie } from "./cookies.js";
import { bodyWithTokens } from "./match.js";
import type { RecordedValues } from "./recorded-values.js";
import { withFields } from "../objects.js";

/**
 * One exchange made into a HAR entry with no real secret left in it (issue 18):
 * - the request as it left, with every value the proxy put in (headers, Basic credentials, the
 *   query, a redirect hop's URL) and every placeholder turned into `EGRESSGATE_SECRET{NAME}`,
 *   and Cookie values masked unless cookies are kept;
 * - response headers and text bodies with any value replaced by `[REDACTED:NAME]` (Location
 *   tokenized instead, so a replayed redirect leads to the hop that was recorded), and
 *   Set-Cookie values masked unless cookies are kept;
 * - then the whole entry searched for every current and retired value: if one survives (a hook
 *   put it into a request body, say), the entry is not written at all.
 * Redaction and the last search use every guest's values ({@link RecordedValues}): one file
 * holds every guest's entries.
 */

export interface Exchange {
  readonly seq: number;
  readonly hop: number;
  readonly guest: string;
  /** A guest named `default` that was one of several: marked, so that its entries answer only it on replay. */
  readonly named: boolean;
  readonly started: Date;
  /** The request as it left (placeholders substituted). */
  readonly request: OutboundRequest;
  readonly requestBody: CapturedBody | null;
  readonly serverIPAddress: string;
  /** The protocol the upstream spoke: `HTTP/1.1`, or `HTTP/2`. */
  readonly httpVersion: string;
  readonly status: number;
  readonly headers: readonly string[];
  /** The response's trailer fields, when it had any. */
  readonly trailers?: readonly string[] | undefined;
  readonly responseBody: CapturedBody | null;
  /**
   * An encoded response body kept inline, with its codings undone by the recorder (decode-body.ts):
   * in memory, or in a sidecar file when it decodes to more than the inline limit. Undefined when
   * it could not be decoded: it is stored as it came.
   */
  readonly decodedBody?: CapturedBody | undefined;
  /** A secret the streaming search found in the response's sidecar body (the decoded one's, if any). */
  readonly sidecarLeak?: string | undefined;
  /** A secret the streaming search found in the request body. */
  readonly requestLeak?: string | undefined;
  readonly timings: { readonly send: number; readonly wait: number; readonly receive: number };
}

export interface EntryOptions {
  /** Keep cookie values, of Set-Cookie and of Cookie (`--record-cookies`). */
  readonly cookies: boolean;
}

/** Why an entry was not written: the secret whose value it held, and where. */
export interface Leak {
  readonly secret: string;
  readonly where: string;
}

const basicCredentials = /^(basic[ \t]+)([A-Za-z0-9+/=_-]+)[ \t]*$/i;
const tokenizedResponseHeaders = new Set(["location", "content-location"]);

/** Thrown inside the builder when something cannot be made safe: the entry is dropped. */
class LeakFound extends Error {
  constructor(readonly leak: Leak) {
    super(`${leak.where} holds the value of secret ${leak.secret}`);
  }
}

/**
 * `secrets` is the exchange's guest's store (its placeholders and values become tokens), and
 * `values` every guest's values, this one's included (redacted in responses, searched for last).
 */
export function buildEntry(exchange: Exchange, secrets: SecretStore | undefined, values: RecordedValues | undefined, options: EntryOptions): { entry: RecordedEntry } | { leak: Leak } {
  try {
    const entry = build(exchange, values, secrets, options);
    if (values !== undefined) finalCheck(entry, values);
    return { entry };
  } catch (error) {
    if (error instanceof LeakFound) return { leak: error.leak };
    throw error;
  }
}

function build(x: Exchange, values: RecordedValues | undefined, secrets: SecretStore | undefined, options: EntryOptions): RecordedEntry {
  const tokenize = (text: string, where: string): string => {
    if (secrets === undefined) return text;
    const out = secrets.tokenize(text);
    if (out === undefined) throw new LeakFound({ secret: "(unscannable)", where });
    return out;
  };
  const hidden = x.request.hiddenPath;
  if (hidden === unscannedName) throw new LeakFound({ secret: "(unscannable)", where: "the request URL" });
  // A hidden hop's path and query hold a copy of the value that tokenizing may not recognise.
  const url = hidden === undefined ? tokenize(x.request.url.href, "the request URL") : `${tokenize(x.request.url.origin, "the request URL")}/${secretToken(hidden)}`;
  /**
   * A Location, or a hidden hop's Content-Location, as recorded. One that holds a value leads to
   * a hidden hop (as does any Location of a hidden hop), recorded as the hop's origin and its
   * token alone: a replay that follows it then asks for the entry the hop made.
   */
  const recordedLocation = (value: string, where: string, location: boolean): string => {
    const name = hidden ?? (location ? secretInLocation(secrets, value) : undefined);
    if (name === undefined) return tokenize(value, where);
    if (name === unscannedName) throw new LeakFound({ secret: "(unscannable)", where });
    let target: URL;
    try {
      target = new URL(value, x.request.url);
    } catch {
      return tokenize(value, where);
    }
    if (target.protocol !== "http:" && target.protocol !== "https:") return tokenize(value, where);
    if (target.origin === x.request.url.origin) return `/${secretToken(name)}`;
    // Another origin is named as the upstream wrote it: the parser lowercased the host, and a
    // base64 copy in it would no longer be recognised. One not found as written is not recorded.
    const authority = writtenAuthority(value, target);
    if (authority === undefined) throw new LeakFound({ secret: name, where });
    return `${target.protocol}//${tokenize(authority, where)}/${secretToken(name)}`;
  };
  const requestHeaders: Header[] = [{ name: "host", value: tokenize(x.request.url.host, "the request host") }];
  for (let i = 0; i < x.request.headers.length; i += 2) {
    const name = x.request.headers[i]!;
    const value = x.request.headers[i + 1]!;
    if (name.toLowerCase() === "cookie" && !options.cookies) requestHeaders.push({ name, value: maskCookieHeader(value) });
    else requestHeaders.push({ name, value: tokenizeHeader(value, (text) => tokenize(text, `request header ${name}`)) });
  }
  const parsed = new URL(url);
  const requestType = getHeader(x.request.headers, "content-type") ?? "";
  if (x.requestLeak !== undefined) throw new LeakFound({ secret: x.requestLeak, where: "the request body" });
  const postData = x.requestBody === null || x.requestBody.size === 0 ? undefined : postDataOf(x.requestBody, requestType, secrets);

  const contentType = getHeader(x.headers, "content-type") ?? "";
  const codings = contentCodingList(x.headers);
  const responseHeaders: Header[] = [];
  for (let i = 0; i < x.headers.length; i += 2) {
    const name = x.headers[i]!;
    const lower = name.toLowerCase();
    const value = x.headers[i + 1]!;
    if (lower === "set-cookie" && !options.cookies) responseHeaders.push({ name, value: maskSetCookie(value) });
    else if (tokenizedResponseHeaders.has(lower)) responseHeaders.push({ name, value: recordedLocation(value, `response header ${name}`, lower === "location") });
    else responseHeaders.push({ name, value: values === undefined ? value : placeholdersAsTokens(values.redact(value), secrets) });
  }
  const content = contentOf(x.responseBody, x.decodedBody, contentType, codings, values, secrets, x.sidecarLeak);
  const trailers = x.trailers === undefined || x.trailers.length === 0 ? undefined : trailersOf(x.trailers, values, secrets, options);
  const location = getHeader(x.headers, "location");
  const { send, wait, receive } = x.timings;
  return {
    startedDateTime: x.started.toISOString(),
    time: send + wait + receive,
    request: {
      method: x.request.method,
      url,
      httpVersion: x.httpVersion,
      cookies: [],
      headers: requestHeaders,
      queryString: [...parsed.searchParams].map(([name, value]) => ({ name, value })),
      ...(postData !== undefined ? { postData } : {}),
      headersSize: -1,
      bodySize: x.requestBody?.size ?? 0,
    },
    response: {
      status: x.status,
      statusText: "",
      httpVersion: x.httpVersion,
      cookies: [],
      headers: responseHeaders,
      content,
      redirectURL: location === undefined ? "" : recordedLocation(location, "the Location header", true),
      headersSize: -1,
      bodySize: x.responseBody?.size ?? 0,
      ...(trailers !== undefined ? { _trailers: trailers } : {}),
    },
    cache: {},
    timings: { send, wait, receive },
    serverIPAddress: x.serverIPAddress,
    _egressgate: {
      seq: x.seq,
      hop: x.hop,
      guest: x.guest,
      ...(x.named ? { named: true as const } : {}),
      ...(x.responseBody?.chunks !== undefined && x.responseBody.chunks.length > 1 ? { chunks: x.responseBody.chunks } : {}),
    },
  };
}

/**
 * The host and port of an absolute Location as the upstream wrote them, letter case and all;
 * undefined unless they are plainly there, naming the host and port the parser found.
 */
function writtenAuthority(location: string, parsed: URL): string | undefined {
  const written = /^[ \t]*(?:[A-Za-z][A-Za-z0-9+.-]*:)?[/\\]{2}([^/\\?#]*)/.exec(location)?.[1];
  if (written === undefined) return undefined;
  const authority = written.slice(written.lastIndexOf("@") + 1);
  try {
    return new URL(`${parsed.protocol}//${authority}/`).host === parsed.host ? authority : undefined;
  } catch {
    return undefined;
  }
}

/**
 * A request header value tokenized; Basic credentials are decoded, tokenized and encoded again,
 * so the recorder and the replay's match agree on them whatever the value or placeholder was.
 */
export function tokenizeHeader(value: string, tokenize: (text: string) => string): string {
  const basic = basicCredentials.exec(value);
  if (basic !== null) {
    const decoded = Buffer.from(basic[2]!, "base64").toString("utf8");
    const tokenized = tokenize(decoded);
    if (tokenized !== decoded) value = `${basic[1]}${Buffer.from(tokenized, "utf8").toString("base64")}`;
  }
  return tokenize(value);
}

/**
 * The request body, kept as it was sent (it is half of the match key) with placeholders
 * tokenized whatever its type, as the replay's key has them ({@link bodyWithTokens}): text as
 * text, binary as base64, a large one in its sidecar. A value in it is a leak.
 */
function postDataOf(body: CapturedBody, mimeType: string, secrets: SecretStore | undefined): RecordedPostData {
  if (body.withheld === true) throw new LeakFound({ secret: "(a body that was not kept)", where: "the request body" });
  if (body.file !== undefined) return { mimeType, text: "", _file: body.file };
  // Placeholders only: a value here was not put by the proxy, and fails the final check.
  const bytes = bodyWithTokens(body.bytes!, secrets);
  if (isText(bytes, mimeType)) return { mimeType, text: bytes.toString("utf8") };
  return { mimeType, text: bytes.toString("base64"), _encoding: "base64" };
}

/** This guest's placeholders in a text turned into their tokens (another guest's are not its to name). */
function placeholdersAsTokens(text: string, secrets: SecretStore | undefined): string {
  return secrets === undefined ? text : secrets.tokenizePlaceholders(text);
}

function contentOf(
  body: CapturedBody | null,
  decoded: CapturedBody | undefined,
  mimeType: string,
  codings: readonly string[],
  values: RecordedValues | undefined,
  secrets: SecretStore | undefined,
  sidecarLeak: string | undefined,
): RecordedContent {
  if (body === null || body.size === 0) return { size: 0, mimeType, text: "" };
  const encoding = codings.join(", ");
  if (body.file !== undefined) {
    if (sidecarLeak !== undefined) throw new LeakFound({ secret: sidecarLeak, where: "the response body" });
    if (body.withheld === true) throw new LeakFound({ secret: "(a body that was not kept)", where: "the response body" });
    return { size: body.size, mimeType, _file: body.file, ...(encoding !== "" ? { _encoded: encoding } : {}) };
  }
  // Decoded by the recorder, off the event loop and bounded; one that did not decode is stored
  // as it came, and replayed as it came.
  const plain = codings.length === 0 ? body : decoded;
  if (plain?.file !== undefined) {
    // It decoded to more than the inline limit: kept decoded in its sidecar, as any large body
    // is, and encoded again on replay as its header says.
    if (sidecarLeak !== undefined) throw new LeakFound({ secret: sidecarLeak, where: "the response body" });
    if (plain.withheld === true) throw new LeakFound({ secret: "(a body that was not kept)", where: "the response body" });
    return { size: plain.size, compression: plain.size - body.size, mimeType, _file: plain.file };
  }
  const bytes = plain?.bytes ?? body.bytes!;
  const encoded = plain === undefined ? encoding : undefined;
  // Bytes the proxy could not decode cannot be searched for a secret's value: not written.
  if (encoded !== undefined && values !== undefined) throw new LeakFound({ secret: "(a body in a coding the proxy cannot undo, or that decodes past 16 MiB: not searchable)", where: "the response body" });
  const compression = encoded === undefined ? { compression: bytes.length - body.size } : {};
  if (encoded === undefined && isText(bytes, mimeType)) {
    let text = bytes.toString("utf8");
    // A placeholder the upstream echoed (a body goes out as it is) is kept as its token, as the
    // request's is: the file means the same whatever the run's placeholders, and replay puts
    // the replaying run's back.
    if (values !== undefined) text = placeholdersAsTokens(redactBody(text, values), secrets);
    return { size: Buffer.byteLength(text), ...compression, mimeType, text };
  }
  if (values !== undefined) {
    const scanner = new LiteralScanner(values.valuesToFind());
    scanner.push(bytes);
    if (scanner.found !== undefined) throw new LeakFound({ secret: scanner.found, where: "the binary response body" });
  }
  return { size: bytes.length, ...compression, mimeType, text: bytes.toString("base64"), encoding: "base64", ...(encoded !== undefined ? { _encoded: encoded } : {}) };
}

/** Trailer fields as the response headers are recorded: values redacted, cookies masked. */
function trailersOf(list: readonly string[], values: RecordedValues | undefined, secrets: SecretStore | undefined, options: EntryOptions): Header[] {
  const out: Header[] = [];
  for (let i = 0; i < list.length; i += 2) {
    const name = list[i]!;
    const value = list[i + 1]!;
    if (name.toLowerCase() === "set-cookie" && !options.cookies) out.push({ name, value: maskSetCookie(value) });
    else out.push({ name, value: values === undefined ? value : placeholdersAsTokens(values.redact(value), secrets) });
  }
  return out;
}

/**
 * A text body redacted: decoded and searched in full when small, else searched for the common
 * spellings first. A small body the full scan cannot finish within its budget is searched as a
 * large one is: a JSON document with a large base64 field, with a short value to look for, ran
 * out of budget at about 25 KB, and was written as the marker alone (and replayed so).
 */
function redactBody(text: string, values: RecordedValues): string {
  if (text.length <= fullScanLimit) {
    const out = values.redact(text);
    if (out !== unscannedMarker) return out;
  }
  const scanner = new LiteralScanner(values.valuesToFind());
  scanner.push(Buffer.from(text, "utf8"));
  return scanner.found === undefined ? text : values.redact(text);
}

/**
 * The last look before the entry is written: everything but the bodies decoded and searched in
 * full; bodies searched as they are stored (decoded from base64 first), in full when small.
 */
function finalCheck(entry: RecordedEntry, secrets: RecordedValues): void {
  const scanBytes = (bytes: Buffer, where: string): void => {
    const scanner = new LiteralScanner(secrets.valuesToFind());
    scanner.push(bytes);
    if (scanner.found !== undefined) throw new LeakFound({ secret: scanner.found, where });
  };
  /** With `orAsLarge`, a text the full scan cannot finish is searched as a large body is (see redactBody). */
  const find = (text: string, where: string, orAsLarge = false): void => {
    let secret: string | undefined;
    try {
      secret = secrets.findValue(text);
    } catch (error) {
      if (!(error instanceof UnscannableError)) throw error;
      if (orAsLarge) return scanBytes(Buffer.from(text, "utf8"), where);
      secret = "(unscannable)";
    }
    if (secret !== undefined) throw new LeakFound({ secret, where });
  };
  const { postData, ...request } = entry.request;
  const { content, ...response } = entry.response;
  const { text: contentText, ...contentMeta } = content;
  find(JSON.stringify({ request, response, contentMeta, postMeta: withFields(postData ?? {}, { text: undefined }) }), "the entry's URL or headers");
  for (const [text, isBase64, where] of [
    [postData?.text, postData?._encoding === "base64", "the request body"],
    [contentText, content.encoding === "base64", "the response body"],
  ] as const) {
    if (text === undefined || text === "") continue;
    if (!isBase64 && text.length <= fullScanLimit) find(text, where, true);
    else scanBytes(isBase64 ? Buffer.from(text, "base64") : Buffer.from(text, "utf8"), where);
  }
}
