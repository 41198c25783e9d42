import { responseFields } from "../headers.js";
import { discardBody } from "../streams.js";
import type { ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { describeThrown, EgressError } from "../errors.js";
import { madeBodyOf } from "../hooks/made-bodies.js";
import { Transform, type Readable } from "node:stream";
import type { PipelineResponse, TraceEntry } from "../pipeline/exchange.js";
import { upstreamBodyEnded } from "../pipeline/trace.js";
import { countSent, type ByteCount } from "../metrics/byte-counter.js";
import { closeBegun, closeLingering, closeOnceWritten, isLingering, lingerAtClose } from "./linger.js";

/** The guest-facing error body: `403 Forbidden: host "x" is not in allowedHosts…`. */
export function errorBody(error: EgressError): string {
  return `${error.status} ${error.statusText}: ${error.message}\n`;
}

/**
 * A connection answered `Connection: close` before the guest's request body ended closes with a
 * lingering close (see closeLingering): Node's server closes such a socket as soon as the answer
 * is written, with the guest still sending, and the kernel answers its next bytes with RST.
 */
function lingerBeforeClose(res: ServerResponse): void {
  const socket = res.socket;
  // Only while the guest may still be sending: a request whose body has ended has nothing left.
  if (socket === null || socket.destroyed || res.req.complete || isLingering(socket)) return;
  lingerAtClose(socket);
}

/**
 * Answers with a short text error. When the guest's request body is still unread, the
 * connection is closed after the answer instead of draining (say) a refused 1 GiB upload, with a
 * lingering close. Returns the body bytes sent, for the audit record's `bytesDown`.
 */
export function sendError(res: ServerResponse, error: EgressError, closeConnection: boolean): number {
  if (res.headersSent) {
    cutAfterHead(res);
    return 0;
  }
  const body = errorBody(error);
  const headers: Record<string, string | number> = {
    "content-type": "text/plain; charset=utf-8",
    "content-length": Buffer.byteLength(body),
    "x-egressgate-error": error.code,
    ...error.headers,
  };
  if (closeConnection) {
    headers["connection"] = "close";
    lingerBeforeClose(res);
  }
  res.shouldKeepAlive = res.shouldKeepAlive && !closeConnection;
  res.writeHead(error.status, error.statusText, headers);
  res.end(body);
  // Node writes no body for a HEAD (RFC 9110 §9.3.2), and keeps the Content-Length a GET would get.
  return res.req.method === "HEAD" ? 0 : Buffer.byteLength(body);
}

/**
 * Cuts a response whose head has gone out: closing the connection is the only signal left. The
 * socket is destroyed without the error, which the request's decision line carries: given to
 * `destroy()`, Node's server reported it as the guest's `clientError`, logged as a "bad request"
 * (and, in a TLS tunnel, a "guest TLS error" too) that blamed the guest for the upstream's failure.
 */
function cutAfterHead(res: ServerResponse): void {
  res.destroy();
}

/**
 * The body failed before any byte of its response reached the guest's connection: `answer` went
 * out in its place (see sendResponse's `unsent`), and the connection was closed after it.
 */
export class AnsweredInstead extends Error {
  constructor(readonly answer: EgressError) {
    super(answer.message);
  }
}

/** The guest left before its response began: the log says 499, as for a guest gone sooner. */
export class GuestLeftFirst extends Error {}

/** The errors response bodies failed with after their heads went out, as the senders reported them. */
const bodyFailures = new WeakSet<object>();

/** `error` is the response body's own failure (not the guest's close): for {@link bodyCutReason}. */
export function bodyFailed(error: Error): Error {
  if (typeof error === "object" && error !== null) bodyFailures.add(error);
  return error;
}

/**
 * Why a response whose body failed after its head was cut, in words that name whose body it was:
 * the body of a Response a hook made (and which source made it), or the upstream's, with the
 * failure's own code and message. The line said only `boom`, or `UND_ERR_SOCKET: other side
 * closed`, which did not say which side broke (and a hook's, not which hook). Undefined for a
 * failure that is not the body's.
 */
export function bodyCutReason(body: Readable | null, error: Error): string | undefined {
  if (!bodyFailures.has(error)) return undefined;
  const made = madeBodyOf(body);
  if (made === undefined) {
    const code = (error as { code?: unknown }).code;
    return `the upstream response body failed after the response head was sent (${code === undefined ? "" : `${String(code)}: `}${error.message}); the guest's response was cut`;
  }
  // Its own words say the body fell silent and the response was cut.
  if (error instanceof EgressError && error.code === "EG_HOOK_TIMEOUT") return error.message;
  const by = made.source === undefined ? "" : ` (${made.source})`;
  return `${made.subject}${by} failed after the response head was sent (${describeThrown(error)}); the guest's response was cut`;
}

/** The guest's connection closed before its response was whole (the guest left, or the proxy's drain ended). */
export class GuestClosedMidResponse extends Error {}

/**
 * Streams the pipeline's response to the guest with backpressure. `pipe()` plus two listeners
 * rather than `stream.pipeline()`: on Node 20 pipeline() allocates an AbortController per call
 * and aborts it on completion (a DOMException with a stack trace), which profiled at ~10% of the
 * proxy's CPU for small responses.
 *
 * For the decision record: with `countBytes` it returns the count of body bytes sent (read when
 * the record is made); with `upstreamTrace` (a trace whose pending upstream exchange is this
 * body's, see claimUpstreamBody) the exchange's upstream time ends when the body closes, from the
 * close listener this function puts on the body anyway.
 *
 * Node sends the head with the first body bytes, not at writeHead: a body that fails before any
 * (an upstream reset that came while an onResponse hook ran, the hook passing the body on) has
 * sent nothing. With `unsent`, the error it makes of the failure is then the answer, and onDone
 * gets {@link AnsweredInstead}. Cut there, the guest got a bare close with no status at all, which
 * a client may take for a keep-alive connection closed before its request was read.
 */
export function sendResponse(
  res: ServerResponse,
  response: PipelineResponse,
  closeConnection: boolean,
  onDone: (error?: Error) => void,
  countBytes = false,
  upstreamTrace?: readonly TraceEntry[],
  unsent?: (cause: Error) => EgressError,
): ByteCount | undefined {
  const body = response.body;
  if (res.destroyed) {
    // The guest left while the upstream was answering: `close` has already fired.
    discardBody(body);
    onDone(new GuestLeftFirst("guest closed the connection before the response started"));
    return undefined;
  }
  // A guest body that was only partly read (a hook answered, or read a clone and rewrote) would
  // otherwise sit in front of the next request on this connection.
  const fields = responseFields(response.headers);
  const headers = closeConnection ? [...fields, "connection", "close"] : fields;
  if (closeConnection) {
    res.shouldKeepAlive = false;
    lingerBeforeClose(res);
  }
  res.writeHead(response.status, headers);
  if (body === null || res.req.method === "HEAD") {
    // A HEAD's answer has no body (RFC 9110 §9.3.2): Node drops what is written to it, yet sends
    // the head only at end(), so a hook's body for it was read whole, unseen, before the guest had
    // its head, and one that never ended held the guest and the proxy's drain for good. It goes unread.
    if (body !== null) {
      discardBody(body);
      if (upstreamTrace !== undefined) upstreamBodyEnded(upstreamTrace);
    }
    res.end();
    onDone();
    return undefined;
  }
  // After the head is stored and in the same turn as the pipe (see countSent).
  const sent = countBytes ? countSent(res, body) : undefined;
  // What a response framed by its length has sent, to tell a guest that closed once it had every
  // byte from one that left early (below); counted off the socket, at no cost per chunk.
  const declared = res.chunkedEncoding ? undefined : declaredLength(headers);
  const watchSent = declared === undefined ? undefined : (): void => watchAllSent(res, declared, sent ?? countSent(res, body));
  const trailers = response.trailers;
  // With trailers to come (an HTTP/2 upstream's, a chunked one's) and framed by its length, the
  // body's last byte waits for the body's end: an HTTP/2 upstream can break its stream after every
  // byte the length announced (trailers without END_STREAM, which nghttp2 resets), and a guest
  // sent them all had an answer that read as whole (fuzzer finding). Held back, the failure cuts
  // the response one byte short, as any other mid-body failure does.
  const source = trailers === undefined || declared === undefined || declared === 0 ? body : body.pipe(holdLastByte(declared));
  let settled = false;
  const settle = (error?: Error): void => {
    if (settled) return;
    settled = true;
    onDone(error);
  };
  /** The body failed: answered in its place while nothing was sent, cut otherwise. */
  const failed = (error: Error): void => {
    const socket = res.socket;
    if (unsent !== undefined && (res as ServerResponse & { _headerSent?: boolean })._headerSent === false && socket !== null && socket.writable) {
      const answer = unsent(error);
      writeRawError(socket, answer);
      settle(new AnsweredInstead(answer));
      return;
    }
    // Mid-body the status is already sent: cutting the connection is the only honest signal.
    cutAfterHead(res);
    settle(bodyFailed(error));
  };
  body.once("error", failed);
  // A body that closes before its end without an error (a source destroyed quietly) would leave
  // the pipe waiting for ever: cut the guest's connection, as for an error.
  body.once("close", () => {
    // After its end or its failure: the last of what came from upstream.
    if (upstreamTrace !== undefined) upstreamBodyEnded(upstreamTrace);
    if (body.readableEnded || settled) return;
    failed(new Error("the body closed before its end"));
  });
  res.once("close", () => {
    if (res.writableFinished) settle();
    else if (sentWhole(res)) {
      // Every byte the length announced went out, and the guest closed before the upstream body's
      // own end was seen (it comes a turn later): the response is whole, and the body is let
      // run to that end, which a recording waits for. Judged a cut before, logged as the guest's
      // doing, and dropped from the recording (a black-box run: 27 of 30 such guests).
      // A body whose last byte was held (`source`) has ended already: its end is not waited for.
      source.unpipe(res);
      if (source !== body) source.resume();
      if (body.readableEnded) settle();
      else {
        body.once("end", () => settle());
        body.resume();
      }
    } else {
      // The guest went away: stop reading the upstream instead of leaving it paused until its timeout.
      discardBody(body);
      settle(new GuestClosedMidResponse("guest closed the connection before the response was complete"));
    }
  });
  // Node sends the head with the first body bytes: a stream whose first bytes are late (SSE, a
  // long poll) held its guest with no head at all, where an HTTP/2 guest had its HEADERS at once.
  // Bytes at hand now go out with the head, in one write; without any, the head goes at the end
  // of this turn of the loop, alone (a body that then fails before its first byte is a cut).
  if (body.readableLength === 0) setImmediate(flushWaitingHead, res);
  if (trailers === undefined) {
    body.pipe(res);
    watchSent?.();
    return sent;
  }
  // The trailer section goes after the last chunk, so the end is ours to write. Node sends
  // trailers only on a chunked response: one with Content-Length (or to an HTTP/1.0 guest) ends without them.
  source.pipe(res, { end: false });
  watchSent?.();
  source.once("end", () => {
    try {
      const fields = trailerFields(trailers());
      if (fields.length > 0) res.addTrailers(fields);
    } catch {
      // A field Node refuses to write: the response still ends, without its trailers.
    }
    res.end();
  });
  return sent;
}

/**
 * Passes a body on but for the last of the `declared` bytes, which goes at the body's end: a
 * body that fails after its last byte came (and before its end) never sends it.
 */
function holdLastByte(declared: number): Transform {
  let seen = 0;
  let held: Buffer | undefined;
  // No buffer of its own (a chunk at a time): 16 KiB a side held ~95 KiB more per stopped
  // download from an HTTP/2 upstream (bench/h1-held.ts down-h2up, 64 connections).
  return new Transform({
    highWaterMark: 0,
    transform(chunk: Buffer, _encoding, callback) {
      seen += chunk.length;
      if (seen < declared || held !== undefined) {
        callback(null, chunk);
        return;
      }
      held = chunk.subarray(chunk.length - 1);
      callback(null, chunk.length > 1 ? chunk.subarray(0, chunk.length - 1) : undefined);
    },
    flush(callback) {
      callback(null, held);
    },
  });
}

/** Sends a response's head that is still waiting for its first body bytes. */
function flushWaitingHead(res: ServerResponse): void {
  if ((res as ServerResponse & { _headerSent?: boolean })._headerSent === false && !res.writableEnded && !res.destroyed) res.flushHeaders();
}

/** For a response framed by its Content-Length: whether every byte it announced reached the kernel. */
const allSent = new WeakMap<ServerResponse, () => boolean>();

/**
 * Every byte the Content-Length announced was handed to the socket, and the socket finished: its
 * writes all completed, and its end was written (the server ends it at the guest's FIN). A socket
 * destroyed (a reset, the proxy's own cut) before its writes completed never finishes.
 */
function watchAllSent(res: ServerResponse, declared: number, progress: ByteCount): void {
  const socket = res.socket;
  if (socket !== null) allSent.set(res, () => progress.bytes >= declared && socket.writableFinished);
}

/**
 * Whether the guest has had the whole response: Node finished writing it, or, framed by its
 * length, every byte went out and only the upstream body's own end was still to come when the
 * guest closed (it read the last byte and left, as clients do).
 */
export function sentWhole(res: ServerResponse): boolean {
  return res.writableFinished || allSent.get(res)?.() === true;
}

/** The Content-Length of a response head (as a list or Node's flat array), when it has one. */
function declaredLength(headers: readonly string[]): number | undefined {
  for (let i = 0; i < headers.length; i += 2) {
    if (headers[i]!.length === 14 && headers[i]!.toLowerCase() === "content-length") {
      const value = Number(headers[i + 1]);
      return Number.isSafeInteger(value) && value >= 0 ? value : undefined;
    }
  }
  return undefined;
}

/** Fields never sent as trailers (RFC 9110 §6.5.1): framing, routing and connection fields. */
const notTrailers = new Set(["content-length", "content-type", "content-encoding", "transfer-encoding", "connection", "keep-alive", "host", "te", "trailer", "upgrade", "proxy-connection"]);

function trailerFields(list: readonly string[] | undefined): [string, string][] {
  const out: [string, string][] = [];
  if (list === undefined) return out;
  for (let i = 0; i < list.length; i += 2) if (!notTrailers.has(list[i]!.toLowerCase()) && !list[i]!.startsWith(":")) out.push([list[i]!, list[i + 1]!]);
  return out;
}

/** How {@link writeRawError} answers. */
export interface RawErrorOptions {
  /** The status line's reason phrase; the error's statusText by default. */
  readonly reasonPhrase?: string;
  /** Close lingering (the default), or once written. */
  readonly linger?: boolean;
  /** The request's method, when the parser read it: a HEAD's answer gets the head alone. */
  readonly method?: string | undefined;
}

/**
 * Writes a bare HTTP/1.1 error on a socket that has no ServerResponse (CONNECT, upgrade, parse
 * errors, the connection limit) or whose response sent nothing (sendResponse's `unsent`), and
 * closes the connection after it, lingering unless `linger` is false: the guest may still be
 * sending (an upload, a head the parser refused, bytes behind a CONNECT), and closed at once the
 * connection drew a reset that cost a guest still sending its answer. No server timeout covers
 * these sockets any more and they allow half-open, so the close's own bounds release them (see
 * closeLingering). Returns the body bytes written, for the audit record's `bytesDown`.
 */
export function writeRawError(socket: Socket, error: EgressError, options: RawErrorOptions = {}): number {
  if (!socket.writable) {
    // An answer before it closed the connection, lingering: this one is not sent.
    if (!closeBegun(socket)) socket.destroy();
    return 0;
  }
  const body = errorBody(error);
  const extra = Object.entries(error.headers ?? {})
    .map(([name, value]) => `${name}: ${value}\r\n`)
    .join("");
  // A HEAD's answer has no content (RFC 9110 §9.3.2, RFC 9112 §6.3), whatever its Content-Length
  // says (the length a GET would get): a HEAD with Upgrade refused had the text written after
  // its head, which a client reads as the start of the next response.
  const sent = options.method === "HEAD" ? "" : body;
  socket.write(
    `HTTP/1.1 ${error.status} ${options.reasonPhrase ?? error.statusText}\r\n` +
      `Content-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\n` +
      `X-Egressgate-Error: ${error.code}\r\n${extra}Connection: close\r\n\r\n${sent}`,
  );
  if (options.linger ?? true) closeLingering(socket);
  else closeOnceWritten(socket);
  return Buffer.byteLength(sent);
}
