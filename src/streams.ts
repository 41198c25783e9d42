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
