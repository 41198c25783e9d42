import type { Readable, Writable } from "node:stream";

const ignore = (): void => undefined;

/**
 * Destroys a body nobody will read, without ever raising an unlistened `error` event. undici's
 * BodyReadable turns a plain `destroy()` into `RequestAbortedError` whenever its end was not yet
 * emitted, and when the response had already arrived in full nobody else listens for it: the
 * `error` event then ends the whole process, every guest with it.
 */
export function discardBody(body: Readable | null | undefined, reason?: Error): void {
  if (body === null || body === undefined) return;
  body.on("error", ignore);
  if (!body.destroyed) body.destroy(reason);
}

/** Small chunks pushed in one turn of the event loop are joined until this many bytes wait. */
const joinUpTo = 16 * 1024;

/**
 * The event loop's turn, counted by one `setImmediate` for every stream at once, and only in turns
 * where something was pushed: a stream that gets one push a turn (most bodies) costs no timer.
 */
let turn = 0;
let turnCounted = false;
const nextTurn = (): void => {
  turnCounted = false;
  turn += 1;
};
function currentTurn(): number {
  if (!turnCounted) {
    turnCounted = true;
    setImmediate(nextTurn);
  }
  return turn;
}

/**
 * Joins the chunks a producer pushes into `stream` within one turn of the event loop. Node's
 * HTTP/1.1 parser hands each chunk of a chunked body to JavaScript in a callback of its own, and
 * the tick queue runs after each, so every reader got a body of 1-byte chunks one byte at a time:
 * a million of them took a tier-2 policy's read 8.6 s of CPU and 350 MB (each chunk a Buffer, a
 * queued promise or two, a WHATWG enqueue), and the upload as many writes upstream. The first
 * push of a turn goes through at once, so a small body is never delayed; later ones wait for the
 * turn's end (`setImmediate`), or go as soon as 16 KiB waits, with the producer told what the
 * stream said. `pause` stops the producer when a push made at a turn's end finds the stream
 * full (for an IncomingMessage, its socket, as Node's parser does).
 */
export function joinSmallPushes(stream: Readable, pause: () => void): void {
  const push = stream.push;
  let held: Buffer[] = [];
  let heldBytes = 0;
  let lastTurn = -1;
  const release = (): boolean => {
    const chunk = held.length === 1 ? held[0]! : Buffer.concat(held, heldBytes);
    held = [];
    heldBytes = 0;
    return push.call(stream, chunk);
  };
  const endTurn = (): void => {
    if (held.length > 0 && !stream.destroyed && !release()) pause();
  };
  stream.push = function joinedPush(this: Readable, chunk: unknown, encoding?: BufferEncoding): boolean {
    if (!Buffer.isBuffer(chunk)) {
      // The end (null), or anything else: what waits goes first, in order.
      if (held.length > 0) release();
      return push.call(this, chunk, encoding);
    }
    const now = currentTurn();
    if (now !== lastTurn) {
      lastTurn = now;
      // The turn counts as new from the global count's setImmediate on, and this stream's
      // endTurn may not have run yet: what still waits goes first, with this chunk.
      if (held.length === 0) return push.call(this, chunk, encoding);
      held.push(chunk);
      heldBytes += chunk.length;
      return release();
    }
    if (held.length === 0) setImmediate(endTurn);
    held.push(chunk);
    heldBytes += chunk.length;
    return heldBytes >= joinUpTo ? release() : true;
  };
}

/**
 * Joins the chunks already waiting in `body`'s buffer, which a pipe would hand on one by one:
 * undici parses a whole socket read before a response is handed over, some 10,000 chunks of one
 * byte. A read in paused mode takes them as one buffer, which goes back in front; what the read
 * makes undici push meanwhile passes through {@link joinSmallPushes}, behind it. Only for
 * undici's bodies: on an IncomingMessage the read marks the body as consumed, and Node then no
 * longer drains one left unread before the connection's next request.
 */
export function joinBuffered(body: Readable): void {
  if (body.readableLength === 0 || body.readableFlowing === true || body.readableObjectMode) return;
  const buffered = body.read() as Buffer | null;
  if (buffered !== null) body.unshift(buffered);
}

const emptyEnded = new WeakSet<Readable>();

/**
 * Marks `body` as empty once `source`, which feeds it, has ended without a byte. A request body
 * of unknown length that turned out empty (an HTTP/2 guest's HEADERS, then a DATA frame with
 * END_STREAM and no bytes, as Node's own client sends a GET) can then be sent again to a
 * redirect's next hop. `source` must already be flowing (piped into `body`): this only listens.
 */
export function markEmptyEnd(source: Readable, body: Readable): void {
  let bytes = 0;
  source.on("data", (chunk: { length: number }) => {
    bytes += chunk.length;
  });
  source.once("end", () => {
    if (bytes === 0) emptyEnded.add(body);
  });
}

/** Whether {@link markEmptyEnd} saw `body`'s source end with no bytes. */
export function endedEmpty(body: Readable): boolean {
  return emptyEnded.has(body);
}

/** The HTTP/2 stream calls {@link resetH2Stream} needs (server and client streams alike). */
interface ResettableH2Stream {
  readonly destroyed: boolean;
  readonly writableFinished: boolean;
  close(code?: number): void;
  destroy(error?: Error): unknown;
}

/**
 * Ends an HTTP/2 stream with RST_STREAM, never with END_STREAM. Node's `close(code)` ends the
 * writable side first, and once the data written so far has been flushed that sends
 * END_STREAM before the RST_STREAM: a response or upload cut in the middle then reaches the peer
 * whole (a guest read a truncated download as complete; an upstream took a truncated upload).
 * `destroy(error)` skips that end and sends INTERNAL_ERROR; CANCEL would not do either, as Node
 * peers read a stream reset with CANCEL as ended. Once the writable side has finished (its end
 * and every write handed to nghttp2), `close(code)` keeps its code.
 */
export function resetH2Stream(stream: ResettableH2Stream, code: number, why: string): void {
  if (stream.destroyed) return;
  if (stream.writableFinished) stream.close(code);
  else stream.destroy(new Error(why));
}

/**
 * `body.pipe(stream)` for a request body going out on an HTTP/2 stream, unpiped the moment the
 * stream closes with its writable side still open. Node then ends that side itself, right after
 * `aborted` (an upstream that answered early, ending its response, and reset the stream with
 * NO_ERROR to stop the upload: RFC 9113 §8.1). The pipe went on writing the rest of the upload
 * into the ended stream, and "write after end" destroyed it with an error, though it is also the
 * response body: a whole early answer was logged with ERR_STREAM_WRITE_AFTER_END.
 */
export function pipeToH2Stream(body: Readable, stream: Writable): void {
  stream.once("aborted", () => body.unpipe(stream));
  body.pipe(stream);
}

/** What {@link onCutEnd} needs of an HTTP/2 stream's readable side. */
interface EndableH2Stream {
  readonly closed: boolean;
  push(chunk: unknown, encoding?: BufferEncoding): boolean;
}

/**
 * Runs `cut` instead of the end Node gives an HTTP/2 stream that closed before END_STREAM came.
 * Node ends the readable side of a stream reset with NO_ERROR or CANCEL (it counts neither as
 * an error), so a body cut that way looked whole: to a guest behind an h2 upstream that reset
 * mid-body, and to a hook reading an h2 guest's upload the guest cancelled. END_STREAM's own end
 * is pushed while the stream is still open (`closed` false); the other one after Node has
 * marked it closed. `whole`, given the bytes pushed before that end, says the body is complete
 * all the same (every byte its Content-Length announced): that end goes through.
 */
export function onCutEnd(stream: EndableH2Stream, cut: () => void, whole?: (bytes: number) => boolean): void {
  let ended = false;
  let bytes = 0;
  const push = stream.push.bind(stream);
  stream.push = (chunk: unknown, encoding?: BufferEncoding): boolean => {
    if (chunk !== null) {
      if (whole !== undefined && chunk instanceof Uint8Array) bytes += chunk.byteLength;
    } else if (!ended) {
      ended = true;
      if (stream.closed && whole?.(bytes) !== true) {
        // Not from inside Node's stream-close handling, which goes on using the stream's session
        // after this push (a destroy here made it throw, uncaught). The end is never pushed.
        process.nextTick(cut);
        return false;
      }
    }
    return push(chunk, encoding);
  };
}

/**
 * Settles once `body` has its first chunk buffered or has ended (undefined), or has failed or
 * closed before its end (with why), or once `signal` aborts (undefined: whoever sends the body
 * then finds the guest gone). What it read stays buffered, and the stream goes back to neither
 * flowing nor paused: a pipe or a `data` listener added after takes it from its first byte.
 */
export function firstChunk(body: Readable, signal: { readonly aborted: boolean; once(event: "abort", listener: () => void): unknown; off(event: "abort", listener: () => void): unknown }): Promise<Error | undefined> {
  if (body.destroyed) return Promise.resolve(body.errored ?? new Error("the body closed before its end"));
  if (signal.aborted || body.readableLength > 0 || body.readableEnded) return Promise.resolve(undefined);
  return new Promise((resolve) => {
    const done = (error?: Error): void => {
      body.off("readable", onReadable);
      body.off("error", onError);
      body.off("close", onClose);
      signal.off("abort", onAbort);
      resolve(error);
    };
    const onReadable = (): void => done();
    const onError = (error: Error): void => done(error);
    const onClose = (): void => done(body.errored ?? new Error("the body closed before its end"));
    const onAbort = (): void => done();
    // A `readable` listener reads ahead (one _read) without taking the chunk off the buffer.
    body.on("readable", onReadable);
    body.on("error", onError);
    body.on("close", onClose);
    signal.once("abort", onAbort);
  });
}
