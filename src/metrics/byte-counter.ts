import type { Readable } from "node:stream";

/** A running count of body bytes, read when the record is made. */
export interface ByteCount {
  readonly bytes: number;
}

function sizeOf(chunk: unknown, encoding?: BufferEncoding): number {
  if (typeof chunk === "string") return Buffer.byteLength(chunk, encoding);
  return (chunk as Uint8Array | null | undefined)?.byteLength ?? 0;
}

/**
 * Counts what is pushed into a readable: for a guest's request (an IncomingMessage), the body
 * bytes its parser received, after chunked decoding. Counting at `push` rather than with a
 * `data` listener leaves the stream paused until someone reads it, so an unread body still waits
 * (a refused upload is never read) and backpressure is unchanged.
 */
export function countPushed(stream: Readable): ByteCount {
  const count = { bytes: 0 };
  const push = stream.push;
  stream.push = function countedPush(this: Readable, chunk: unknown, encoding?: BufferEncoding): boolean {
    count.bytes += sizeOf(chunk, encoding);
    return push.call(this, chunk, encoding);
  };
  return count;
}

/**
 * Counts what flows out of a readable that is about to be piped: the response body bytes sent to
 * the guest. Attached in the same turn as the pipe, so it changes nothing about the flow (pipe
 * pauses the source for every listener at once).
 */
export function countFlowing(stream: Readable): ByteCount {
  const count = { bytes: 0 };
  stream.on("data", (chunk: unknown) => {
    count.bytes += sizeOf(chunk);
  });
  return count;
}
