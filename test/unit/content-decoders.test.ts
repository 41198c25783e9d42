import { createHash } from "node:crypto";
import { Readable, Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { brotliCompressSync, deflateRawSync, deflateSync, gzipSync } from "node:zlib";
import { describe, expect, it } from "vitest";
import { canDecode, contentDecoder } from "../../src/content-decoders.js";
import { decodeBody } from "../../src/record/decode-body.js";
import { tempDir } from "../helpers/proxy.js";

const text = Buffer.from("a body a hook reads, ".repeat(20));

/** Everything `coding`'s decoder makes of `body`, fed in `piece`-byte writes and read slowly. */
async function decode(coding: string, body: Buffer, piece = body.length || 1): Promise<Buffer> {
  const out: Buffer[] = [];
  const pieces: Buffer[] = [];
  for (let i = 0; i < body.length; i += piece) pieces.push(body.subarray(i, i + piece));
  await pipeline(
    Readable.from(pieces),
    contentDecoder(coding),
    new Writable({
      highWaterMark: 1,
      write(chunk: Buffer, _encoding, callback) {
        out.push(chunk);
        setImmediate(callback);
      },
    }),
  );
  return Buffer.concat(out);
}

// zlib alone refused both of these with an error ("unexpected end of file", "incorrect header
// check"), which a hook reading the response saw as a 502 (DESIGN §3 step 7).
describe("content decoders, as fetch reads a body", () => {
  it.each([
    ["gzip", gzipSync(text)],
    ["x-gzip", gzipSync(text)],
    ["deflate", deflateSync(text)],
    ["deflate", deflateRawSync(text)],
    ["br", brotliCompressSync(text)],
  ])("%s decodes, whole or a byte at a time", async (coding, body) => {
    expect(await decode(coding, body)).toEqual(text);
    expect(await decode(coding, body, 1)).toEqual(text);
  });

  it.each(["gzip", "x-gzip", "deflate", "br"])("%s on an empty body decodes to an empty body", async (coding) => {
    expect(await decode(coding, Buffer.alloc(0))).toEqual(Buffer.alloc(0));
  });

  it("bytes that are not what they say still fail", async () => {
    await expect(decode("gzip", Buffer.from("not gzip at all"))).rejects.toThrow(/incorrect header check/);
    await expect(decode("gzip", gzipSync(text).subarray(0, 20))).rejects.toThrow(/unexpected end of file/);
    await expect(decode("br", Buffer.from([0xff, 0xff, 0xff]))).rejects.toThrow();
  });

  it("output larger than the stream's buffer waits for its reader and arrives whole", async () => {
    const big = Buffer.alloc(4 * 1024 * 1024);
    for (let i = 0; i < big.length; i++) big[i] = (i * 7) & 0xff;
    const decoded = await decode("gzip", gzipSync(big), 4096);
    expect(createHash("sha256").update(decoded).digest("hex")).toBe(createHash("sha256").update(big).digest("hex"));
  });

  it("only the codings it can undo", () => {
    expect(["gzip", "x-gzip", "deflate", "br", "zstd", "identity", "constructor"].map(canDecode)).toEqual([true, true, true, true, false, false, false]);
  });

  it("a recorded response body under raw deflate, or empty under gzip, is stored decoded", async () => {
    const dir = tempDir();
    const raw = await decodeBody(deflateRawSync(text), ["deflate"], dir, undefined);
    expect(raw?.bytes).toEqual(text);
    const empty = await decodeBody(Buffer.alloc(0), ["gzip"], dir, undefined);
    expect(empty?.size).toBe(0);
  });
});
