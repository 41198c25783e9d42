import { Transform, type TransformCallback } from "node:stream";
import { createBrotliDecompress, createGunzip, createInflate, createInflateRaw } from "node:zlib";

/**
 * Undoes one content coding the way fetch (undici) and browsers do for the two cases zlib alone
 * refuses: an empty body decodes to an empty body (a `201` or `200` with `Content-Encoding: gzip`
 * and no bytes), and `deflate` may be raw DEFLATE as well as zlib-wrapped (RFC 9110 says zlib;
 * servers have long sent both, and undici tells them apart by the first byte). zlib's own
 * decoder answered both with an error, so a hook that read such a response made it a 502.
 * Anything else that does not decode still fails, as before.
 */
class ContentDecoder extends Transform {
  private inner: Transform | undefined;

  constructor(private readonly make: (first: Buffer) => Transform) {
    super();
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    if (chunk.length === 0) {
      callback();
      return;
    }
    if (this.inner === undefined) {
      const inner = this.make(chunk);
      inner.on("data", (data: Buffer) => {
        if (!this.push(data)) inner.pause();
      });
      inner.once("error", (error) => this.destroy(error));
      this.inner = inner;
    }
    this.inner.write(chunk, callback);
  }

  override _flush(callback: TransformCallback): void {
    const inner = this.inner;
    if (inner === undefined) {
      callback();
      return;
    }
    inner.once("end", () => callback());
    inner.end();
  }

  override _read(size: number): void {
    this.inner?.resume();
    super._read(size);
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    this.inner?.destroy();
    callback(error);
  }
}

/** zlib's header names compression method 8 in the low nibble of its first byte; raw DEFLATE does not (undici's test). */
const zlibWrapped = (first: Buffer): boolean => (first[0]! & 0x0f) === 0x08;

const makers: Readonly<Record<string, (first: Buffer) => Transform>> = {
  gzip: () => createGunzip(),
  "x-gzip": () => createGunzip(),
  deflate: (first) => (zlibWrapped(first) ? createInflate() : createInflateRaw()),
  br: () => createBrotliDecompress(),
};

/** Whether {@link contentDecoder} can undo `coding` (lowercase, as `contentCodingList` gives it). */
export function canDecode(coding: string): boolean {
  return Object.hasOwn(makers, coding);
}

/** A stream that undoes `coding`; only for a coding {@link canDecode} accepts. */
export function contentDecoder(coding: string): Transform {
  const make = makers[coding];
  if (make === undefined) throw new TypeError(`no decoder for content coding ${JSON.stringify(coding)}`);
  return new ContentDecoder(make);
}
