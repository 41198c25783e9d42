import { constants, type ClientHttp2Session, type ClientHttp2Stream, type ClientSessionRequestOptions, type IncomingHttpHeaders, type OutgoingHttpHeaders } from "node:http2";
import type { EventEmitter } from "node:events";
import { maxHeaderSize } from "node:http";
import type { Readable } from "node:stream";
import { afterReads } from "../after-reads.js";
import { EgressError, quoteShort } from "../errors.js";
import { breaksFieldValue, hasNoContent, headerListSize, httpToken, type HeaderList } from "../headers.js";
import { onBodySilence } from "./h2-body-silence.js";
import { closedBeforeResponse } from "./h2-close-reason.js";
import { requestStream } from "./h2-request-call.js";
import { onCutEnd, pipeToH2Stream, resetH2Stream } from "../streams.js";
import { windowShares } from "./h2-window-share.js";

/** The request as the upstream layer needs it (the pipeline's OutboundRequest fits). */
export interface H2UpstreamRequest {
  readonly method: string;
  readonly url: URL;
  readonly headers: HeaderList;
  readonly body: Readable | Uint8Array | null;
}

export interface H2UpstreamResponse {
  readonly status: number;
  readonly headers: HeaderList;
  readonly body: Readable | null;
  readonly trailers: () => HeaderList | undefined;
}

export interface H2ExchangeOptions {
  readonly headersTimeoutMs: number;
  readonly bodyTimeoutMs: number;
  readonly maxInformational: number;
  /** Aborted when the guest goes away (GuestGone: an emitter with `aborted`). */
  readonly signal: EventEmitter & { readonly aborted: boolean };
  /** Called once when the stream is done with, however it ended: the session's slot is free. */
  readonly done: () => void;
}

/** The stream was refused before the upstream processed it (REFUSED_STREAM, or GOAWAY): safe to send again. */
export class H2Refused extends Error {
  override readonly name = "H2Refused";
}

/**
 * The last stream id of the GOAWAY a session received (set by the session pool): a stream with a
 * higher id was not processed (RFC 9113 §6.8), whatever code it is then closed with (Node reports
 * 0 when the upstream closes the connection after its GOAWAY).
 */
export const goawayLastStream = new WeakMap<ClientHttp2Session, number>();

/** The streams open on each session, for what the session pool does when the upstream's connection ends. */
export const sessionStreams = new WeakMap<ClientHttp2Session, Set<ClientHttp2Stream>>();

/** Request body bytes handed to each session's streams so far, for the session pool's liveness PING. */
export const sessionBodyBytes = new WeakMap<ClientHttp2Session, { sent: number }>();

// RFC 9113 §8.2.2, plus Host: HTTP/2 carries it as :authority.
const notOnH2 = new Set(["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host"]);

function requestHeaders(request: H2UpstreamRequest): OutgoingHttpHeaders {
  const { url } = request;
  const out: Record<string, string | string[]> = {
    ":method": request.method,
    ":scheme": "https",
    ":authority": url.host,
    ":path": `${url.pathname}${url.search}`,
  };
  const list = request.headers;
  for (let i = 0; i < list.length; i += 2) {
    const name = list[i]!.toLowerCase();
    const value = list[i + 1]!;
    if (notOnH2.has(name) || name.startsWith(":")) continue;
    // Node's client destroys its whole session (shared by every guest) on a name that is not a
    // token, and sends a value with CR, LF or NUL as it is (RFC 9113 §8.2.1 forbids them).
    if (!httpToken.test(name)) throw new EgressError("EG_UPSTREAM", 502, `the request has a header name HTTP/2 cannot carry: ${quoteShort(name)}`);
    if (breaksFieldValue.test(value)) throw new EgressError("EG_UPSTREAM", 502, `the request's ${name} header has a CR, LF or NUL, which HTTP/2 cannot carry`);
    if (name === "te" && value.trim().toLowerCase() !== "trailers") continue;
    const had = out[name];
    if (had === undefined) out[name] = value;
    else if (Array.isArray(had)) had.push(value);
    else out[name] = [had, value];
  }
  return out;
}

/**
 * The most bytes of header fields (names and values) an HTTP/2 upstream's response head may
 * carry: `http.maxHeaderSize` (16 KiB unless `--max-http-header-size`), what undici takes of an
 * HTTP/1.1 upstream's head. Node's client takes what the upstream sends (128 fields of a 4 KiB
 * HPACK entry each, 500 KB from 4 KB on the wire): heads past 64 KiB were logged 200 while the
 * proxy's own HTTP/2 server refused to send them (FRAME_SIZE_ERROR, the guest blamed), and a
 * hook that passed one on failed for its size (black-box finding).
 */
const maxHeadBytes = maxHeaderSize;

/**
 * The most a response's trailer section may hold, counted as RFC 9113 §6.5.2 counts a header list
 * (each field's name and value, and 32): what the proxy's HTTP/2 server can send a guest in one
 * header block (nghttp2 sends at most 64 KiB, and counts less per field). A larger one from an
 * HTTP/2 upstream was dropped on the way to an HTTP/2 guest, whose stream ended as if whole,
 * logged 200 (black-box finding); it is now refused as undici refuses one over its 16 KiB from an
 * HTTP/1.1 upstream: the response is cut.
 */
const maxTrailerListBytes = 64 * 1024;

/** The bytes of a head's field names and values, as undici counts an HTTP/1.1 head's. */
function headBytes(list: HeaderList): number {
  let bytes = 0;
  for (let i = 0; i < list.length; i += 2) bytes += list[i]!.length + list[i + 1]!.length;
  return bytes;
}

/** A response head's Content-Length, when it has one. */
function contentLength(head: IncomingHttpHeaders): number | undefined {
  const value = head["content-length"];
  return typeof value === "string" && /^\d+$/.test(value) ? Number(value) : undefined;
}

/**
 * Whether trailers were to end the response: it announced them (a `Trailer` field), it is gRPC's
 * (`application/grpc`, whose status comes in trailers), or the request asked for them (`te:
 * trailers`, which gRPC clients send).
 */
function awaitsTrailers(request: HeaderList, head: IncomingHttpHeaders): boolean {
  if (head.trailer !== undefined) return true;
  const type = head["content-type"];
  if (typeof type === "string" && /^application\/grpc(?:[+;\s]|$)/i.test(type)) return true;
  for (let i = 0; i < request.length; i += 2) {
    if (request[i]!.toLowerCase() === "te" && request[i + 1]!.split(",").some((token) => token.trim().toLowerCase() === "trailers")) return true;
  }
  return false;
}

function headerList(headers: IncomingHttpHeaders): HeaderList {
  const out: HeaderList = [];
  for (const [name, value] of Object.entries(headers)) {
    if (name.startsWith(":") || value === undefined) continue;
    if (Array.isArray(value)) for (const v of value) out.push(name, v);
    else out.push(name, String(value));
  }
  return out;
}

/**
 * request() clones its options and adds the priority fields it finds missing. Fields added to a
 * clone give every request's options a hidden class of its own on Node 20 (V8 11.3), about 10 µs
 * a request in a profile; with every field present the clone is only read. From Node 24.2 a
 * `weight` given draws a deprecation warning (DEP0194: priority signaling), so there only
 * `endStream` is passed.
 */
const withPriority = Number(process.versions.node.split(".")[0]) < 24;
/** `silent` is one of the fields request() fills in, though Node's types leave it out. */
type RequestOptions = ClientSessionRequestOptions & { readonly silent?: boolean };
const weight = constants.NGHTTP2_DEFAULT_WEIGHT;
const endedStream: RequestOptions = withPriority ? { endStream: true, weight, parent: 0, exclusive: false, silent: false } : { endStream: true };
const openStream: RequestOptions = withPriority ? { endStream: false, weight, parent: 0, exclusive: false, silent: false } : { endStream: false };

/**
 * One request on an upstream HTTP/2 session. The response body is the stream itself (flow
 * control is its backpressure), its trailers readable once it has ended. A stream the upstream
 * refused unprocessed rejects with {@link H2Refused}, so a request without a streamed body can
 * go again on another session.
 */
export function sendOnSession(session: ClientHttp2Session, request: H2UpstreamRequest, noBody: boolean, options: H2ExchangeOptions): Promise<H2UpstreamResponse> {
  const { url } = request;
  // The guest may have left while hooks ran: undici refuses an aborted signal before it connects,
  // and a stream opened here would send the request (HEADERS, END_STREAM) before any reset.
  if (options.signal.aborted) {
    options.done();
    throw new Error("the guest left before the request was sent");
  }
  let stream: ClientHttp2Stream;
  // Its response holds what the stream's window lets in until the guest reads it: counted before
  // its HEADERS go, so that a lower window for the session goes out ahead of them.
  const attach = windowShares.get(session)?.reserve();
  try {
    stream = requestStream(session, requestHeaders(request), request.body === null ? endedStream : openStream);
  } catch (error) {
    attach?.(undefined);
    options.done();
    if (error instanceof EgressError) throw error;
    const code = (error as NodeJS.ErrnoException).code;
    // The session went away between choosing it and this request: another may take it.
    if (code === "ERR_HTTP2_GOAWAY_SESSION" || code === "ERR_HTTP2_INVALID_SESSION") throw new H2Refused(`upstream session to ${url.host} is closing`, { cause: error });
    // A request Node will not encode (a header value it refuses): sending it again changes nothing.
    throw new EgressError("EG_UPSTREAM", 502, `the request to ${url.host} could not be sent over HTTP/2: ${(error as Error).message}`, { cause: error });
  }
  let released = false;
  const release = (): void => {
    if (released) return;
    released = true;
    options.done();
  };
  /** The error the stream was destroyed with: why it closed, which its close code alone does not say. */
  let failure: Error | undefined;
  stream.on("error", (error: Error) => (failure ??= error));
  stream.once("close", release);
  attach?.(stream);
  let open = sessionStreams.get(session);
  if (open === undefined) sessionStreams.set(session, (open = new Set()));
  open.add(stream);
  stream.once("close", () => open.delete(stream));
  const onAbort = (): void => {
    resetH2Stream(stream, constants.NGHTTP2_CANCEL, "the guest went away");
  };
  if (options.signal.aborted) onAbort();
  else options.signal.once("abort", onAbort);
  stream.once("close", () => options.signal.off("abort", onAbort));

  const body = request.body;
  /** Request body bytes handed to the stream: less its writableLength, what the upstream took. */
  let handed = 0;
  if (body !== null) {
    let counted = sessionBodyBytes.get(session);
    if (counted === undefined) sessionBodyBytes.set(session, (counted = { sent: 0 }));
    const count = counted;
    if (body instanceof Uint8Array) {
      handed = body.byteLength;
      count.sent += handed;
      stream.end(body);
    } else {
      body.once("error", () => resetH2Stream(stream, constants.NGHTTP2_CANCEL, "the request body failed"));
      body.on("data", (chunk: Uint8Array) => {
        handed += chunk.byteLength;
        count.sent += chunk.byteLength;
      });
      pipeToH2Stream(body, stream);
    }
  }
  // The request is sent once its writable side has finished (END_STREAM written).
  let uploading = body !== null && !stream.writableFinished;

  return new Promise<H2UpstreamResponse>((resolve, reject) => {
    let settled = false;
    const fail = (error: Error): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      reject(error);
    };
    // upstreamHeadersMs counts from the end of the request, as undici's headersTimeout does on
    // HTTP/1.1: counted from the stream's opening, an 8 MiB upload at 1 MiB/s got 504 from an h2
    // upstream and 200 from an h1 one, and a gRPC client stream longer than a minute was cut
    // (black-box finding). While the body goes out the same timer bounds an upload the upstream
    // stops taking (its flow-control window shut), as undici's does one whose socket stays full;
    // one the guest stops sending is the guest side's idleMs.
    let taken = 0;
    // The verdict waits for this turn's reads: after a pause of the proxy (SIGSTOP, a paused VM)
    // the timer fires before the poll, and a head the upstream sent in time got 504 "no response
    // head within N ms" (black-box finding). Those reads can also finish the upload, which
    // re-arms the deadline for the head: a firing from before that (`armed` has moved on) is
    // stale, or the window the upstream opened during the pause got 504 at once (review finding).
    let armed = 0;
    const onTimer = (): void => {
      const firing = armed;
      afterReads(() => {
        if (firing === armed) judge();
      });
    };
    const judge = (): void => {
      if (settled) return;
      if (uploading) {
        const now = handed - stream.writableLength;
        if (now !== taken || stream.writableLength === 0) {
          taken = now;
          timer.refresh();
          return;
        }
        fail(new EgressError("EG_UPSTREAM_TIMEOUT", 504, `upstream ${url.host} timed out: it took none of the request body for ${options.headersTimeoutMs} ms`));
        resetH2Stream(stream, constants.NGHTTP2_CANCEL, "the upload stalled");
        return;
      }
      fail(new EgressError("EG_UPSTREAM_TIMEOUT", 504, `upstream ${url.host} timed out: no response head within ${options.headersTimeoutMs} ms`));
      resetH2Stream(stream, constants.NGHTTP2_CANCEL, "no response head in time");
    };
    const timer = setTimeout(onTimer, options.headersTimeoutMs);
    if (uploading) {
      stream.once("finish", () => {
        uploading = false;
        armed += 1;
        if (!settled) timer.refresh();
      });
    }
    let informational = 0;
    stream.on("headers", () => {
      // 1xx heads: nobody reads them, and an upstream sending them for ever must not hold the request.
      if (++informational > options.maxInformational) {
        fail(new EgressError("EG_UPSTREAM", 502, `upstream ${url.host} sent more than ${options.maxInformational} informational (1xx) responses`));
        resetH2Stream(stream, constants.NGHTTP2_PROTOCOL_ERROR, "too many informational responses");
      }
    });
    stream.once("close", () => {
      if (settled) return;
      const code = stream.rstCode ?? 0;
      const last = goawayLastStream.get(session);
      if (code === constants.NGHTTP2_REFUSED_STREAM) fail(new H2Refused(`upstream ${url.host} refused the stream`));
      else if (last !== undefined && (stream.id === undefined || stream.id > last)) fail(new H2Refused(`upstream ${url.host} went away (GOAWAY) before processing the stream`));
      // A stream that was not its session's first (ids go 1, 3, 5…), on a session with no GOAWAY:
      // the connection's end may have crossed its HEADERS, as an idle close crosses a request on
      // a pooled HTTP/1.1 connection.
      else fail(closedBeforeResponse(url.host, code, failure, informational, last === undefined && stream.id !== undefined && stream.id > 1));
    });
    stream.once("response", (head: IncomingHttpHeaders, flags: number) => {
      if (settled) return;
      const headers = headerList(head);
      const bytes = headBytes(headers);
      if (bytes > maxHeadBytes) {
        fail(new EgressError("EG_UPSTREAM", 502, `upstream ${url.host} sent a response head of ${bytes} bytes of header fields, over the ${maxHeadBytes} the proxy takes from an upstream`));
        resetH2Stream(stream, constants.NGHTTP2_CANCEL, "the response head was over its limit");
        return;
      }
      settled = true;
      clearTimeout(timer);
      const status = Number(head[":status"]);
      let trailers: HeaderList | undefined;
      stream.once("trailers", (fields: IncomingHttpHeaders) => {
        const list = headerList(fields);
        const size = headerListSize(list);
        // Node emits the trailers before the body's end: the error comes first, and the guest's response is cut.
        if (size > maxTrailerListBytes) {
          stream.destroy(Object.assign(new Error(`upstream ${url.host} sent a trailer section of ${size} bytes, over the ${maxTrailerListBytes} the proxy passes on`), { code: "UND_ERR_HEADERS_OVERFLOW" }));
          return;
        }
        trailers = list;
      });
      // A head that ends the stream stays one: gRPC's Trailers-Only answer (grpc-status in the
      // head) is an error to a client that receives it followed by an empty body.
      const endsStream = (flags & constants.NGHTTP2_FLAG_END_STREAM) !== 0;
      const empty = noBody || endsStream || hasNoContent(status);
      if (empty) stream.resume();
      else {
        // Silence past the limit ends this stream only: the guest's connection is cut as an h1
        // body timeout would. Time the proxy holds the body (its reader behind) is not silence.
        onBodySilence(stream, options.bodyTimeoutMs, () => stream.destroy(Object.assign(new Error(`upstream body timed out after ${options.bodyTimeoutMs} ms of silence`), { code: "UND_ERR_BODY_TIMEOUT" })));
        // Node's client ends a stream's readable side when the stream is destroyed without an
        // error (the upstream's connection closed, the session destroyed): the body would look
        // whole. An end that comes after the stream was destroyed did not come from END_STREAM
        // (that one ends the body first and destroys the stream after): an error before anyone
        // sees the end, so the guest's response is cut, not ended cleanly.
        stream.prependOnceListener("end", () => {
          if (stream.destroyed) stream.emit("error", Object.assign(new Error(`upstream ${url.host} closed the HTTP/2 stream (code ${stream.rstCode ?? 0}) before the end of its body`), { code: "UND_ERR_SOCKET" }));
        });
        // And the end Node gives a stream the upstream reset with NO_ERROR or CANCEL mid-body.
        // RST_STREAM(NO_ERROR) after every byte the Content-Length announced is a whole
        // response: Node's own server sends it for a handler that calls stream.close() after
        // writing its body, with no END_STREAM, and curl takes it as complete. nghttp2 has
        // checked the Content-Length (one value, digits) and refused DATA past it. Not when
        // trailers were to end it (review finding): those are lost, and a gRPC call without its
        // grpc-status, or a checksum a client asked for, would pass as whole.
        const announced = awaitsTrailers(request.headers, head) ? undefined : contentLength(head);
        onCutEnd(
          stream,
          () => stream.destroy(Object.assign(new Error(`upstream ${url.host} reset the HTTP/2 stream (code ${stream.rstCode ?? 0}) before the end of its body`), { code: "UND_ERR_SOCKET" })),
          announced === undefined ? undefined : (bytes) => bytes === announced && stream.rstCode === constants.NGHTTP2_NO_ERROR,
        );
      }
      resolve({ status, headers, body: empty ? null : stream, trailers: () => trailers });
    });
  });
}
