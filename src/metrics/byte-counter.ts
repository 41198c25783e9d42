import type { ServerResponse } from "node:http";
import type { Socket } from "node:net";
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

/**
 * Counts the body bytes a ServerResponse sends, once its head is stored (after writeHead) and
 * before its body is piped. Without chunked framing, the body is every byte the connection takes
 * after the head, so the count is read off the socket's own `bytesWritten` when the record is
 * made: no `data` listener and no closure per response, which profiled at several percent of a
 * small GET's CPU. A chunked body (whose framing is no body byte), or a response without its
 * socket yet, is counted as it flows. The guest side reads the count before the connection's
 * next response starts: requests on a connection are answered one at a time.
 */
export function countSent(res: ServerResponse, body: Readable): ByteCount {
  const socket = res.socket;
  const head = (res as unknown as { _header?: unknown })._header;
  const before = socket?.bytesWritten;
  // Node writes the head as latin1 (and refuses any header character past \xff): one byte a character.
  if (res.chunkedEncoding || socket == null || typeof head !== "string" || typeof before !== "number") return countFlowing(body);
  return new SocketCount(socket, before + head.length);
}

class SocketCount implements ByteCount {
  constructor(
    private readonly socket: Socket,
    private readonly from: number,
  ) {}

  get bytes(): number {
    const now = this.socket.bytesWritten;
    return typeof now === "number" && now > this.from ? now - this.from : 0;
  }
}
