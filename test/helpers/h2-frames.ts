import type { TLSSocket } from "node:tls";
import { openH2Tls } from "./h2-client.js";

/**
 * HTTP/2 frames written by hand (RFC 9113 §4, §6), so the hardening tests can send what no
 * well-behaved client library would: floods, resets in a loop, oversized header blocks.
 */
export const frameType = Object.freeze({
  data: 0x0,
  headers: 0x1,
  rstStream: 0x3,
  settings: 0x4,
  ping: 0x6,
  goaway: 0x7,
  windowUpdate: 0x8,
  continuation: 0x9,
});

export const flag = Object.freeze({ endStream: 0x1, ack: 0x1, endHeaders: 0x4 });

export const clientPreface = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

export function frame(type: number, flags: number, streamId: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head[3] = type;
  head[4] = flags;
  head.writeUInt32BE(streamId & 0x7fffffff, 5);
  return Buffer.concat([head, payload]);
}

/** SETTINGS with `[id, value]` pairs (0x3 MAX_CONCURRENT_STREAMS, 0x4 INITIAL_WINDOW_SIZE, …). */
export function settings(pairs: readonly (readonly [number, number])[] = []): Buffer {
  const payload = Buffer.alloc(pairs.length * 6);
  pairs.forEach(([id, value], i) => {
    payload.writeUInt16BE(id, i * 6);
    payload.writeUInt32BE(value, i * 6 + 2);
  });
  return frame(frameType.settings, 0, 0, payload);
}

export function rstStream(streamId: number, code: number): Buffer {
  const payload = Buffer.alloc(4);
  payload.writeUInt32BE(code, 0);
  return frame(frameType.rstStream, 0, streamId, payload);
}

export function ping(data: number): Buffer {
  const payload = Buffer.alloc(8);
  payload.writeUInt32BE(data >>> 0, 4);
  return frame(frameType.ping, 0, 0, payload);
}

/** An HPACK integer with an N-bit prefix (RFC 7541 §5.1); `first` holds the bits above the prefix. */
export function hpackInteger(value: number, prefixBits: number, first = 0): Buffer {
  const max = (1 << prefixBits) - 1;
  if (value < max) return Buffer.from([first | value]);
  const bytes = [first | max];
  let rest = value - max;
  while (rest >= 128) {
    bytes.push((rest % 128) + 128);
    rest = Math.floor(rest / 128);
  }
  bytes.push(rest);
  return Buffer.from(bytes);
}

function hpackString(text: string): Buffer {
  const bytes = Buffer.from(text, "latin1");
  return Buffer.concat([hpackInteger(bytes.length, 7), bytes]);
}

/** A literal field without indexing, new name (RFC 7541 §6.2.2). */
export function literal(name: string, value: string): Buffer {
  return Buffer.concat([Buffer.from([0x00]), hpackString(name), hpackString(value)]);
}

/** A literal field with incremental indexing, new name (§6.2.1): it lands in the dynamic table at index 62. */
export function literalIndexed(name: string, value: string): Buffer {
  return Buffer.concat([Buffer.from([0x40]), hpackString(name), hpackString(value)]);
}

/** An indexed field (§6.1): one byte for a table entry, however large the entry. */
export function indexed(index: number): Buffer {
  return hpackInteger(index, 7, 0x80);
}

/** A request's header block: the four pseudo-headers, then `extra` fields already encoded. */
export function requestBlock(authority: string, path: string, extra: readonly Buffer[] = [], method = "GET"): Buffer {
  return Buffer.concat([literal(":method", method), literal(":scheme", "https"), literal(":authority", authority), literal(":path", path), ...extra]);
}

export interface Frame {
  readonly type: number;
  readonly flags: number;
  readonly streamId: number;
  readonly payload: Buffer;
}

/**
 * A raw HTTP/2 client over the proxy's TLS tunnel: writes bytes, parses the frames that come
 * back (without decoding HPACK), and says when the connection closed.
 */
export class RawH2 {
  readonly frames: Frame[] = [];
  closed = false;
  private buffer = Buffer.alloc(0);
  private waiters: (() => void)[] = [];

  constructor(readonly socket: TLSSocket) {
    socket.on("data", (chunk: Buffer) => {
      this.buffer = Buffer.concat([this.buffer, chunk]);
      while (this.buffer.length >= 9) {
        const length = this.buffer.readUIntBE(0, 3);
        if (this.buffer.length < 9 + length) break;
        this.frames.push({
          type: this.buffer[3]!,
          flags: this.buffer[4]!,
          streamId: this.buffer.readUInt32BE(5) & 0x7fffffff,
          payload: this.buffer.subarray(9, 9 + length),
        });
        this.buffer = this.buffer.subarray(9 + length);
      }
      this.wake();
    });
    socket.on("error", () => undefined);
    socket.once("close", () => {
      this.closed = true;
      this.wake();
    });
  }

  /** Preface and SETTINGS; `pairs` go in the client's SETTINGS. */
  static async open(proxyPort: number, target: string, ca: string, pairs: readonly (readonly [number, number])[] = []): Promise<RawH2> {
    const socket = await openH2Tls(proxyPort, target, ca);
    if (socket.alpnProtocol !== "h2") throw new Error(`ALPN chose ${String(socket.alpnProtocol)}, not h2`);
    const client = new RawH2(socket);
    client.write(Buffer.concat([clientPreface, settings(pairs)]));
    return client;
  }

  /** False once the socket no longer takes bytes (the proxy closed it): a flood just stops there. */
  write(bytes: Buffer): boolean {
    if (this.socket.destroyed || !this.socket.writable) return false;
    this.socket.write(bytes);
    return true;
  }

  /** Resolves once `test` holds over what arrived, or the connection closes (then it may still not hold). */
  async until(test: (client: RawH2) => boolean): Promise<void> {
    while (!test(this) && !this.closed) await new Promise<void>((resolve) => this.waiters.push(resolve));
  }

  goaway(): { lastStreamId: number; code: number } | undefined {
    const found = this.frames.find((f) => f.type === frameType.goaway);
    return found === undefined ? undefined : { lastStreamId: found.payload.readUInt32BE(0) & 0x7fffffff, code: found.payload.readUInt32BE(4) };
  }

  resetCode(streamId: number): number | undefined {
    const found = this.frames.find((f) => f.type === frameType.rstStream && f.streamId === streamId);
    return found?.payload.readUInt32BE(0);
  }

  /** Whether a HEADERS frame (a response) arrived on the stream. */
  answered(streamId: number): boolean {
    return this.frames.some((f) => f.type === frameType.headers && f.streamId === streamId);
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}
