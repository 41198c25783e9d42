import type { ServerHttp2Stream } from "node:http2";
import { defaultWindow } from "../upstream/h2-windows.js";

/**
 * The request bodies one guest connection has sent that nobody has read yet, against a ceiling:
 * `limits.h2ConnectionBufferBytes`, plus for each stream counted the least window (65,535 bytes:
 * WindowShare gives no less, even to a connection whose streams hold the whole budget) and what
 * Node reads ahead of a reader (its `readableHighWaterMark`, 16 KiB on Node 20), about 80 KiB.
 * The shared windows (WindowShare) keep a guest that follows the windows it has read under that,
 * but a guest sends by the window it last read until it reads a lower one (RFC 9113 §6.9.3): one
 * that opens its streams and writes their whole windows before reading (Node's client does, for
 * uploads started together) put 99 windows of 1 MiB into the proxy whatever the proxy then said. Node reads DATA for a
 * stream whose reader has stopped into the stream's buffer, and has no way to refuse it; so the
 * stream whose DATA takes the connection past the ceiling is reset (`onOver`), as Envoy's overload
 * manager resets the streams that hold the most, and its bytes are let go.
 *
 * Counted from each stream's `readableLength` as its DATA arrives (`push`): the running total is
 * raised on each push and checked exactly (every stream's buffer summed) only when it passes the
 * ceiling, as it may be stale by what has been read since.
 */
export class HeldBodies {
  private readonly streams = new Map<ServerHttp2Stream, number>();
  private readonly overs = new WeakMap<ServerHttp2Stream, (held: number, ceiling: number) => void>();
  private total = 0;
  /** The ceiling for the streams counted now. */
  private ceiling: number;

  constructor(budget: number) {
    this.ceiling = budget;
  }

  /**
   * A stream whose request body is still coming: its buffer counts until it ends or closes.
   * `onOver` is called (once, a turn later, outside nghttp2's read) if its DATA takes the
   * connection past the ceiling, with what the connection's streams held and the ceiling.
   */
  add(stream: ServerHttp2Stream, onOver: (held: number, ceiling: number) => void): void {
    if (this.streams.has(stream) || stream.readableEnded || stream.destroyed) return;
    this.streams.set(stream, 0);
    this.overs.set(stream, onOver);
    const slack = defaultWindow + stream.readableHighWaterMark;
    this.ceiling += slack;
    // Node's Http2Stream hands each DATA chunk to push(), flowing or not (WindowShare copies one
    // that stays, before this counts it).
    const push = stream.push;
    stream.push = (chunk: unknown, encoding?: BufferEncoding): boolean => {
      const more = push.call(stream, chunk, encoding);
      if (chunk !== null) this.pushed(stream);
      return more;
    };
    const drop = (): void => {
      const counted = this.streams.get(stream);
      if (counted === undefined) return;
      this.total -= counted;
      this.streams.delete(stream);
      this.ceiling -= slack;
    };
    stream.once("end", drop);
    stream.once("close", drop);
  }

  private pushed(stream: ServerHttp2Stream): void {
    const counted = this.streams.get(stream);
    if (counted === undefined) return;
    const now = stream.readableLength;
    this.streams.set(stream, now);
    this.total += now - counted;
    if (this.total <= this.ceiling) return;
    this.total = 0;
    for (const [each] of this.streams) {
      const held = each.readableLength;
      this.streams.set(each, held);
      this.total += held;
    }
    if (this.total > this.ceiling) {
      // Its bytes leave the count now: the reset that frees them comes a turn later.
      const held = this.total;
      const ceiling = this.ceiling;
      this.total -= now;
      this.streams.delete(stream);
      this.ceiling -= defaultWindow + stream.readableHighWaterMark;
      const onOver = this.overs.get(stream);
      if (onOver !== undefined) setImmediate(() => onOver(held, ceiling));
    }
  }
}
