import { Readable } from "node:stream";
import { describe, expect, it } from "vitest";
import { joinBuffered, joinSmallPushes } from "../../src/streams.js";

/** A readable whose producer pushes each chunk in a callback of its own, with the tick queue run between, as Node's HTTP parser does. */
function tickedProducer(): { stream: Readable; pushInTicks: (chunks: readonly Buffer[]) => Promise<void>; paused: () => number } {
  let paused = 0;
  const stream = new Readable({ read() {} });
  joinSmallPushes(stream, () => paused++);
  const pushInTicks = async (chunks: readonly Buffer[]): Promise<void> => {
    for (const chunk of chunks) {
      stream.push(chunk);
      await new Promise<void>((resolve) => process.nextTick(resolve));
    }
  };
  return { stream, pushInTicks, paused: () => paused };
}

async function readAll(stream: Readable): Promise<Buffer[]> {
  const reads: Buffer[] = [];
  for await (const chunk of stream) reads.push(chunk as Buffer);
  return reads;
}

describe("joinSmallPushes", () => {
  it("joins the chunks pushed in one turn: 10,000 one-byte pushes reach the reader in a few reads, bytes and order kept", async () => {
    const { stream, pushInTicks } = tickedProducer();
    const reading = readAll(stream);
    const chunks = Array.from({ length: 10_000 }, (_, i) => Buffer.from([i % 251]));
    await pushInTicks(chunks);
    stream.push(null);
    const reads = await reading;
    expect(Buffer.concat(reads).equals(Buffer.concat(chunks))).toBe(true);
    // The first push of the turn goes alone, then at most one read per 16 KiB.
    expect(reads.length).toBeLessThanOrEqual(3);
  });

  it("the first push of a turn is not held: a reader gets it before the turn ends", async () => {
    const { stream } = tickedProducer();
    stream.push(Buffer.from("first"));
    const got = await new Promise<Buffer>((resolve) => stream.once("data", resolve));
    expect(got.toString()).toBe("first");
  });

  it("what waits is pushed when 16 KiB waits, and at the end of the turn; the end comes after it", async () => {
    const { stream, pushInTicks } = tickedProducer();
    const reading = readAll(stream);
    await pushInTicks([Buffer.alloc(10), ...Array.from({ length: 20 }, () => Buffer.alloc(1024, 1))]);
    stream.push(null);
    const reads = await reading;
    expect(reads.map((r) => r.length)).toEqual([10, 16 * 1024, 4 * 1024]);
  });

  it("a push at the turn's end that finds the stream full pauses the producer", async () => {
    const { stream, pushInTicks, paused } = tickedProducer();
    // Nobody reads: the stream fills past its 16 KiB mark.
    await pushInTicks(Array.from({ length: 40 }, () => Buffer.alloc(1024)));
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(paused()).toBe(1);
    expect(stream.readableLength).toBe(40 * 1024);
  });
});

describe("joinBuffered, after joinSmallPushes, on a stream that already holds chunks", () => {
  it("joins what was pushed before it was called, ahead of what comes after, and the end still comes", async () => {
    const stream = new Readable({ read() {} });
    for (let i = 0; i < 1000; i++) stream.push(Buffer.from([i % 251]));
    joinSmallPushes(stream, () => undefined);
    joinBuffered(stream);
    stream.push(Buffer.from("after"));
    stream.push(null);
    const seen: Buffer[] = [];
    // Flowing, as a pipe reads: each chunk in the buffer is its own `data` event.
    stream.on("data", (chunk: Buffer) => seen.push(chunk));
    await new Promise((resolve) => stream.once("end", resolve));
    expect(seen.length).toBeLessThanOrEqual(2);
    const expected = Buffer.concat([Buffer.from(Array.from({ length: 1000 }, (_, i) => i % 251)), Buffer.from("after")]);
    expect(Buffer.concat(seen).equals(expected)).toBe(true);
  });
});

describe("joinSmallPushes keeps the order", () => {
  it("a push in the next turn, before this stream's turn has ended, goes behind what waits", async () => {
    const stream = new Readable({ read() {} });
    joinSmallPushes(stream, () => undefined);
    stream.push(Buffer.from("A"));
    // Queued before the stream's own end-of-turn: it runs once the turn counts as new.
    setImmediate(() => {
      stream.push(Buffer.from("C"));
      stream.push(null);
    });
    stream.push(Buffer.from("B"));
    const seen: Buffer[] = [];
    stream.on("data", (chunk: Buffer) => seen.push(chunk));
    await new Promise((resolve) => stream.once("end", resolve));
    expect(Buffer.concat(seen).toString()).toBe("ABC");
  });
});
