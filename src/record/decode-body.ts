import { Readable, Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { canDecode, contentDecoder } from "../content-decoders.js";
import { BodyCapture, type CapturedBody } from "./body-capture.js";
import { inlineBodyLimit } from "./har.js";
import type { LiteralScanner } from "./leak-scan.js";

/**
 * The most a recorded body is decoded to: past it, it is stored as it came (and replayed so).
 * A body that small decodes to about 1,000 times its size under gzip and to much more under br.
 */
export const maxDecodedBytes = 16 * inlineBodyLimit;

/**
 * A response body that came encoded (kept inline, so at most {@link inlineBodyLimit} as it came)
 * with its content codings undone, the last applied first. It is decoded in zlib's threadpool
 * and kept as any body streaming past is (body-capture.ts): in memory up to the inline limit,
 * else in a sidecar file, searched by `scanner` as it is written. Decoding it whole on the event
 * loop, and keeping it inline whatever its size, let 16 KB of gzip become 16 MiB of text in the
 * HAR: twenty such responses stalled every guest for seconds, and 34 made a file that could no
 * longer be read back. Undefined when a coding is one the proxy cannot undo, the bytes do not
 * decode, or they decode to more than {@link maxDecodedBytes}.
 */
export async function decodeBody(bytes: Buffer, codings: readonly string[], dir: string, scanner: LiteralScanner | undefined): Promise<CapturedBody | undefined> {
  const stages: NodeJS.ReadWriteStream[] = [];
  for (const coding of [...codings].reverse()) {
    if (!canDecode(coding)) return undefined;
    stages.push(contentDecoder(coding));
  }
  const capture = new BodyCapture(dir, { scanner });
  let size = 0;
  const sink = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      size += chunk.length;
      if (size > maxDecodedBytes) return callback(new RangeError(`decodes to more than ${maxDecodedBytes} bytes`));
      const waiting = capture.write(chunk);
      if (waiting === undefined) callback();
      else void waiting.then(() => callback());
    },
  });
  try {
    await pipeline([Readable.from([bytes]), ...stages, sink]);
    return await capture.finish();
  } catch {
    await capture.discard();
    return undefined;
  }
}
