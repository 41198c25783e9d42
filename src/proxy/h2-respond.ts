import type { OutgoingHttpHeaders, ServerHttp2Stream } from "node:http2";
import type { EgressError } from "../errors.js";
import type { HeaderList } from "../headers.js";
import type { PipelineResponse } from "../pipeline/exchange.js";
import type { Readable } from "node:stream";
import { countFlowing, type ByteCount } from "../metrics/byte-counter.js";
import { discardBody, resetH2Stream } from "../streams.js";
import { bodyFailed, errorBody, GuestClosedMidResponse, GuestLeftFirst } from "./respond.js";
import { h2Codes, h2ConnectionHeaders } from "./h2-settings.js";
import { withFields } from "../objects.js";

/** Fields that never go into an HTTP/2 trailer section (RFC 9110 §6.5.1: framing, routing, pseudo-headers). */
const notInTrailers: ReadonlySet<string> = new Set([...h2ConnectionHeaders, "content-length", "content-type", "content-encoding", "te", "trailer"]);

/**
 * A header list as the object Node's http2 takes. Set-Cookie stays a list (RFC 9113 §8.2.3 lets
 * only Cookie be split); any other repeated field is joined with ", ", which means the same for
 * list-valued fields and spares Node's throw on a repeated single-value one.
 */
export function h2HeaderObject(list: HeaderList, skip: ReadonlySet<string> = h2ConnectionHeaders): OutgoingHttpHeaders {
  const out: Record<string, string | string[]> = {};
  for (let i = 0; i < list.length; i += 2) {
    const name = list[i]!.toLowerCase();
    if (name.startsWith(":") || skip.has(name)) continue;
    // A request's field (RFC 9110 §10.1.4), which HTTP/2 allows only as `trailers` (RFC 9113 §8.2.2).
    if (name === "te") continue;
    const value = list[i + 1]!;
    const had = out[name];
    if (had === undefined) out[name] = name === "set-cookie" ? [value] : value;
    else if (Array.isArray(had)) had.push(value);
    else out[name] = `${had}, ${value}`;
  }
  return out;
}

/** The trailer fields worth forwarding, as Node's http2 takes them. */
export function h2TrailerObject(list: HeaderList | undefined): OutgoingHttpHeaders {
  return list === undefined ? {} : h2HeaderObject(list, notInTrailers);
}

/**
 * The pipeline's `beforeBody` for a stream whose guest asked for `100 Continue` (RFC 9110
 * §10.1.1): the proxy is about to read the body (a hook reads it, or the upload starts), so the
 * guest may send it. One 100 at most, and never once the final head is out or the stream is gone.
 * A refusal before the read sends its answer alone: the guest is not asked for a body that could
 * only be refused. `send` is the `beforeBody`; `sent` resolves once the 100 is out (never, if none is).
 */
export function h2ContinueOnce(stream: ServerHttp2Stream): { readonly send: () => void; readonly sent: Promise<void> } {
  let done = false;
  let sentNow: () => void = () => undefined;
  const sent = new Promise<void>((resolve) => (sentNow = resolve));
  const send = (): void => {
    if (done || stream.headersSent || stream.destroyed || stream.closed) return;
    done = true;
    try {
      stream.additionalHeaders({ ":status": 100 });
      sentNow();
    } catch {
      // The stream is closing under a reset: its close decides what comes next.
    }
  };
  return { send, sent };
}

/**
 * Streams the pipeline's response on one guest stream. Backpressure is the stream's own: its
 * writable side stops taking bytes while the guest's flow-control window is shut, and `pipe()`
 * stops reading the upstream body meanwhile, so one stalled stream holds a buffer, never the
 * whole download, and never another stream.
 *
 * For the decision record: with `countBytes` it returns the count of body bytes sent (read when
 * the record is made). `closes`, when given, is handed the response's reaction to the stream's
 * close, which the caller's own close listener runs (each listener added to an Http2Stream costs
 * an emit of `newListener`); without it, the reaction is a listener of its own.
 */
export function sendH2Response(stream: ServerHttp2Stream, response: PipelineResponse, onDone: (error?: Error) => void, stall?: StallWatch, countBytes = false, closes?: ResponseCloseHook): ByteCount | undefined {
  if (stream.destroyed || stream.closed) {
    discardBody(response.body);
    onDone(new GuestLeftFirst("guest reset the stream before the response started"));
    return undefined;
  }
  // A HEAD's answer has no body (RFC 9110 §9.3.2), and Node ended the stream's writable side when
  // the request came: a body a hook made for it is released unread. It was pumped into the ended
  // stream, and counted in bytesDown as though the guest had had it (black-box finding).
  const body = (stream as HeadAware).headRequest === true ? released(response.body) : response.body;
  const headers = h2HeaderObject(response.headers);
  headers[":status"] = response.status;
  const trailers = body === null ? undefined : response.trailers;
  // The guest may still be sending its request (an upstream that answered before the end of the
  // upload): the stream then stays open once the response is out, and its close never comes. The
  // response's end is this response's end; onDone then closes the stream (RST_STREAM(NO_ERROR),
  // RFC 9113 §8.1). Held open before, with its place under the stream limit (black-box finding).
  const uploading = body !== null && !stream.endAfterHeaders && !stream.readableEnded;
  try {
    // An upload's answer ends with a trailer section (empty if it has none) for `wantTrailers`:
    // the moment its END_STREAM can go (see below).
    stream.respond(headers, { endStream: body === null, waitForTrailers: trailers !== undefined || uploading });
  } catch (error) {
    // A field Node refuses to encode (an invalid value a hook produced): nothing is sent yet.
    discardBody(body);
    resetH2Stream(stream, h2Codes.internalError, "the response head could not be encoded");
    onDone(error as Error);
    return undefined;
  }
  if (body === null) {
    onDone();
    return undefined;
  }
  // The END_STREAM is nghttp2's to send, and it waits, as DATA does, for the guest's window: a
  // body whose last bytes fill that window exactly, and whose end comes after them (the upstream's
  // end in a later read, or the pump's last write taken only after a drain), has its END_STREAM
  // held back until the guest opens the window again. An RST_STREAM goes ahead of a stream's DATA
  // and closes it: the END_STREAM then never goes, and the guest reads a whole answer as cut.
  if (trailers !== undefined || uploading) {
    // `wantTrailers` comes once nghttp2 has reached the body's end with the window open.
    stream.once("wantTrailers", () => {
      try {
        const fields = trailers === undefined ? {} : h2TrailerObject(trailers());
        stream.sendTrailers(fields);
        if (!uploading) return;
        // Node sends trailers (HEADERS, queued before the reset, as frames of their kind go in
        // order) a turn later; an empty section as an empty DATA frame with END_STREAM, which a
        // reset queued before it is written overtakes (onDone's destroy() submits one at once while
        // a write to the guest is in flight). A PING sent after it is answered once the guest has
        // read what went with it, and nghttp2 writes the open stream's DATA in the same batch.
        if (Object.keys(fields).length > 0) setImmediate(settleSent);
        else setImmediate(() => afterFlush(stream, settleSent));
      } catch {
        resetH2Stream(stream, h2Codes.internalError, "the trailers could not be encoded");
      }
    });
  }
  // Node 20 closes a server stream whose request side nothing has read (`kMaybeDestroy`: no
  // trailers pending, `readableFlowing` null) a turn after its writable side finishes, with
  // RST_STREAM(NO_ERROR), whether or not its END_STREAM has gone. The request side of a bodiless
  // request is only paused, not read: its end still comes at nghttp2's close of the stream, once
  // the END_STREAM is out, after `finish` as before, so the close reads as a whole answer
  // (reading it instead ended it early, and a close that came before `finish` was logged as the
  // guest's reset).
  if (!uploading && stream.readableFlowing === null) stream.pause();
  let settled = false;
  // Armed the first time the guest's window holds the body back (watch() below); a response that
  // never waits (most of them) costs no timer. Declared here: settle() may run for a body sent whole.
  let watchdog: NodeJS.Timeout | undefined;
  const settle = (error?: Error): void => {
    if (settled) return;
    settled = true;
    if (watchdog !== undefined) clearInterval(watchdog);
    onDone(error);
  };
  /** The response went out whole: only when its body ended and the guest did not reset the stream (Node ends the writable side of a reset stream too). */
  const settleSent = (): void => {
    if (body.readableEnded && !stream.aborted && !stream.destroyed) settle();
  };
  // A small body the upstream has sent whole by now (most small responses: it came in the read
  // that brought the head) goes out in one end() below: its write and the end in one turn, as the
  // pump would send them, without the pump's flowing mode, its two turns and its three listeners.
  // Under the stream's high-water mark, the pump's write would have been taken at once as well,
  // so no wait on the guest's window is given up (the stall watch arms only on one).
  const whole = wholeBuffered(body, stream.writableHighWaterMark);
  // on(), not once(): each of these events comes once (settle() holds the rest to one outcome),
  // and once() wraps every listener in a bound function and a state object, then takes it off
  // again, four times per response.
  body.on("error", (error: Error) => {
    // Mid-body the status is sent: resetting this stream is the only honest signal, and it
    // leaves every other stream on the connection alone.
    resetAfterHead(stream, "the response body failed", stall?.ms);
    settle(bodyFailed(error));
  });
  // A body taken whole (below) has nothing left to cut by closing.
  if (whole === undefined) {
    body.on("close", () => {
      if (body.readableEnded || settled) return;
      resetAfterHead(stream, "the response body closed before its end", stall?.ms);
      settle(bodyFailed(new Error("the body closed before its end")));
    });
  }
  const onClose = (): void => {
    // A reset with NO_ERROR mid-response ends the writable side too: `aborted` tells them apart.
    if (stream.writableFinished && stream.rstCode === h2Codes.noError && !stream.aborted) settle();
    else {
      discardBody(body);
      // How the stream ended (the guest's reset, nghttp2's for a frame that broke HTTP/2, the
      // session's failure) is the guest side's to say: it knows the stream's watch and session.
      settle(new GuestClosedMidResponse("guest reset the stream before the response was complete"));
    }
  };
  if (closes !== undefined) closes.onResponseClose = onClose;
  else stream.on("close", onClose);
  if (whole !== undefined) {
    stream.end(whole);
    return countBytes ? { bytes: whole.length } : undefined;
  }
  // A pump of its own rather than pipe(): pipe() puts six listeners on the two streams per
  // response and takes them off again, a share of a small response's cost. Backpressure is the
  // same: the body pauses while the stream's buffer is full and resumes on its drain.
  /** Since when the body has waited on the guest's window; undefined while it flows or waits on the upstream. */
  let waitingSince: number | undefined;
  const resume = (): void => {
    waitingSince = undefined;
    body.resume();
  };
  // A silent upstream is upstreamBodyMs's to judge, not the watchdog.
  const watch = (): void => {
    if (stall === undefined || watchdog !== undefined) return;
    // Cleared by settle(), however the response ends.
    watchdog = setInterval(() => {
      if (waitingSince !== undefined && performance.now() - waitingSince >= stall.ms) {
        clearInterval(watchdog);
        stall.onStall();
      }
    }, Math.max(1, Math.floor(stall.ms / 4)));
    watchdog.unref();
  };
  // A write nghttp2 has taken whole (its callback) is bytes the guest's window let through: the
  // wait starts again. Only a drain counted, so a guest that read steadily through a small window
  // (a slow reader, a client with a tiny SETTINGS_INITIAL_WINDOW_SIZE) had its stream reset as
  // one that "read nothing for timeouts.idleMs" once a buffer's worth took longer than idleMs
  // to go (fuzzer, h2guest). A write is one chunk of the body as it came (16 KiB at most from a
  // TLS or HTTP/2 upstream: a TLS record, a DATA frame); the chunks the stream buffers behind it
  // (under its 16 KiB high-water mark, and the one that reaches it) go to nghttp2 together
  // (`_writev`), their callbacks all at once: at most 32 KiB for the guest to take within idleMs.
  // Chunks are not cut smaller: 16 KiB slices of a 64 KiB chunk went the same way, showing
  // progress at 16 KiB and then at 64 KiB only, and cost a sending loop about 30% more CPU per
  // byte (docs/performance.md, fifteenth session).
  const progressed = (): void => {
    if (waitingSince !== undefined) waitingSince = performance.now();
  };
  // In the same turn as the pump's own listener: counting changes nothing about the flow.
  const sent = countBytes ? countFlowing(body) : undefined;
  body.on("data", (chunk: Buffer) => {
    if (!stream.write(chunk, progressed)) {
      body.pause();
      waitingSince = performance.now();
      stream.once("drain", resume);
      watch();
    }
  });
  body.on("end", () => {
    if (!stream.destroyed) stream.end();
  });
  return sent;
}

/** Where a caller that already listens for the stream's close takes the response's reaction to it (sendH2Response). */
export interface ResponseCloseHook {
  onResponseClose: (() => void) | undefined;
}

/**
 * The whole of a body whose end has been pushed and whose bytes (fewer than `max`) are all
 * buffered, read out at once; undefined for any other body, which is left as it was. Read only
 * from a body nobody reads yet (not flowing, no encoding, bytes rather than objects): `read()`
 * then hands back every buffered byte in one Buffer and emits it as `data`, and the body emits
 * `end` (and, auto-destroyed, `close`) on its own, as when it is pumped.
 */
function wholeBuffered(body: Readable, max: number): Buffer | undefined {
  if (body.readableFlowing !== null || body.readableObjectMode || body.readableEncoding !== null || body.destroyed) return undefined;
  const ended = (body as unknown as { _readableState?: { ended?: unknown } })._readableState?.ended === true;
  const length = body.readableLength;
  if (!ended || length === 0 || length >= max) return undefined;
  // A byte-mode Readable's read() gives a Buffer; null (nothing taken) leaves the body to the pump.
  const chunk = body.read() as Buffer | null;
  return chunk ?? undefined;
}

/** What an empty write hands nghttp2: nothing, only the question of when the stream is asked for data. */
const nothing = Buffer.alloc(0);

/**
 * Resets a stream whose response head was handed to Node (RST_STREAM(INTERNAL_ERROR)), never
 * ahead of that head. While a write to the guest's connection is in flight (over TLS, every
 * write is until the next turn of the loop), Node's `Http2Stream::SubmitRstStream` puts the
 * RST_STREAM aside to send after it, and `destroy()` submits it at once all the same
 * (`Http2Stream::Destroy` flushes the one put aside): nghttp2 marks the stream closing, and a
 * HEADERS still in its queue for a closing stream is dropped unsent (NGHTTP2_ERR_STREAM_CLOSING).
 * A response whose body failed in the turn its head was queued, on a connection another stream
 * had just written to, reached the guest as RST_STREAM(INTERNAL_ERROR) and no head at all,
 * logged 200 with the cut (the soak's `h2-reset-body`, 2 in 1,843). An HTTP/1.1 guest gets the
 * head and what was written, then the cut.
 *
 * The session's frame queue empty, the head has been serialised, and the reset goes at once.
 * Otherwise it waits for an empty write to be taken: nghttp2 asks the stream for data only
 * once its HEADERS have gone, and Node takes the empty chunk after what was written before it.
 * `boundMs` bounds the wait for a guest that takes nothing (its window shut).
 */
function resetAfterHead(stream: ServerHttp2Stream, why: string, boundMs: number | undefined): void {
  if (stream.destroyed) return;
  if (stream.writableEnded || (stream.session?.state.outboundQueueSize ?? 0) === 0) {
    resetH2Stream(stream, h2Codes.internalError, why);
    return;
  }
  let timer: NodeJS.Timeout | undefined;
  const reset = (): void => {
    clearTimeout(timer);
    resetH2Stream(stream, h2Codes.internalError, why);
  };
  // Its callback runs within nghttp2's serialisation of the stream: the reset goes out of it, a turn later.
  stream.write(nothing, () => setImmediate(reset));
  if (boundMs !== undefined) {
    timer = setTimeout(reset, boundMs);
    timer.unref();
    stream.once("close", () => clearTimeout(timer));
  }
}

/**
 * Runs `then` once the guest has answered a PING sent now (at once if none can be sent): by then
 * it has read every frame nghttp2 wrote with it, DATA for streams whose windows are open included.
 */
function afterFlush(stream: ServerHttp2Stream, then: () => void): void {
  let done = false;
  const once = (): void => {
    if (done) return;
    done = true;
    then();
  };
  const session = stream.session;
  let sent = false;
  try {
    // False past the session's outstanding PINGs; a closing session calls back at once, unanswered.
    sent = session !== undefined && !session.destroyed && session.ping(once) === true;
  } catch {
    // A destroyed session takes no PING.
  }
  if (!sent) once();
}

/** A ServerHttp2Stream's `headRequest`: Node's own (it ends a HEAD stream's writable side), not in @types/node 20. */
interface HeadAware {
  readonly headRequest?: boolean;
}

/** Lets a body go unread: null, for a response sent without one. */
function released(body: Readable | null): null {
  discardBody(body);
  return null;
}

/**
 * A response the guest stops taking: once the body has waited on the guest's window for `ms`
 * with no drain, `onStall` runs (the caller resets the stream). Node's own
 * `Http2Stream#setTimeout` cannot tell: it counts the chunks the whole session sends, so one
 * stalled stream among busy ones was never let go, and it fires on a silent upstream too.
 */
export interface StallWatch {
  readonly ms: number;
  readonly onStall: () => void;
}

/** gRPC status codes for the proxy's own refusals (gRPC's "HTTP to gRPC status code mapping"). */
export function grpcStatusFor(httpStatus: number): number {
  if (httpStatus === 400) return 13; // INTERNAL
  if (httpStatus === 401 || httpStatus === 407) return 16; // UNAUTHENTICATED
  if (httpStatus === 403) return 7; // PERMISSION_DENIED
  if (httpStatus === 404) return 12; // UNIMPLEMENTED
  // 431 as gRPC's own servers answer metadata past their limit.
  if (httpStatus === 413 || httpStatus === 429 || httpStatus === 431) return 8; // RESOURCE_EXHAUSTED
  if (httpStatus >= 500) return 14; // UNAVAILABLE
  return 2; // UNKNOWN
}

/** grpc-message is percent-encoded: anything outside printable ASCII, and `%` itself. */
function grpcMessage(text: string): string {
  return Array.from(Buffer.from(text, "utf8"), (byte) =>
    byte >= 0x20 && byte <= 0x7e && byte !== 0x25 ? String.fromCharCode(byte) : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`,
  ).join("");
}

/**
 * Answers one stream with the proxy's error. A gRPC request gets a Trailers-Only response
 * (`:status 200`, `grpc-status`, `grpc-message` with the reason): a gRPC client reports only
 * those, and an HTTP status alone would reach the caller as a bare UNKNOWN/UNAVAILABLE. Past the
 * head, the stream is reset instead: nothing else can still be said on it.
 */
export function sendH2Error(stream: ServerHttp2Stream, error: EgressError, grpc: boolean): number {
  if (stream.destroyed || stream.closed) return 0;
  if (stream.headersSent) {
    resetH2Stream(stream, h2Codes.internalError, "the response failed after its head");
    return 0;
  }
  try {
    if (grpc) {
      stream.respond(
        {
          ":status": 200,
          "content-type": "application/grpc",
          "grpc-status": String(grpcStatusFor(error.status)),
          "grpc-message": grpcMessage(`${error.status} ${error.statusText}: ${error.message}`),
          "x-egressgate-error": error.code,
        },
        { endStream: true },
      );
      return 0;
    }
    const body = errorBody(error);
    const extra: Record<string, string> = {};
    for (const [name, value] of Object.entries(error.headers ?? {})) if (!h2ConnectionHeaders.has(name.toLowerCase())) extra[name.toLowerCase()] = String(value);
    // A HEAD's answer is its head (RFC 9110 §9.3.2), with the Content-Length a GET would get:
    // Node ends a HEAD stream's writable side at respond(), and the text written after it
    // destroyed the stream with ERR_STREAM_WRITE_AFTER_END, and was counted in bytesDown.
    const head = (stream as HeadAware).headRequest === true;
    stream.respond(
      withFields(extra, {
        ":status": error.status,
        "content-type": "text/plain; charset=utf-8",
        "content-length": Buffer.byteLength(body),
        "x-egressgate-error": error.code,
      }),
      { endStream: head },
    );
    if (head) return 0;
    stream.end(body);
    return Buffer.byteLength(body);
  } catch {
    resetH2Stream(stream, h2Codes.internalError, "the error answer could not be encoded");
    return 0;
  }
}
