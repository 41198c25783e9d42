import type { Readable } from "node:stream";

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
 * marked it closed.
 */
export function onCutEnd(stream: EndableH2Stream, cut: () => void): void {
  let ended = false;
  const push = stream.push.bind(stream);
  stream.push = (chunk: unknown, encoding?: BufferEncoding): boolean => {
    if (chunk === null && !ended) {
      ended = true;
      if (stream.closed) {
        // Not from inside Node's stream-close handling, which goes on using the stream's session
        // after this push (a destroy here made it throw, uncaught). The end is never pushed.
        process.nextTick(cut);
        return false;
      }
    }
    return push(chunk, encoding);
  };
}
