import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "node:tls";
import { describe, expect, it, onTestFinished } from "vitest";
import { loadOrCreateCa } from "../../src/tls/ca-store.js";
import { alertRecord, alerts, ClientHelloReader, maxHelloRecords, readClientHello } from "../../src/tls/client-hello.js";
import { LeafCertCache } from "../../src/tls/leaf-cert-cache.js";
import { SigningLimitError, SigningQueue } from "../../src/tls/signing-queue.js";
import { LeafSigner } from "../../src/tls/x509.js";

/** The first bytes a real Node TLS client sends, captured by a plain TCP server. */
async function captureClientHello(servername: string | undefined): Promise<Buffer> {
  let resolveBytes!: (bytes: Buffer) => void;
  const captured = new Promise<Buffer>((resolve) => (resolveBytes = resolve));
  const server = createServer((socket) => {
    socket.once("data", (chunk: Buffer) => {
      resolveBytes(chunk);
      socket.destroy();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const client = connect({ port: (server.address() as AddressInfo).port, host: "127.0.0.1", ...(servername === undefined ? {} : { servername }) });
  client.on("error", () => undefined);
  const bytes = await captured;
  client.destroy();
  return bytes;
}

/** The same handshake message cut into two records, as a client may send a large hello. */
function inTwoRecords(record: Buffer, cut: number): Buffer {
  const body = record.subarray(5);
  const header = (length: number): Buffer => Buffer.from([0x16, record[1]!, record[2]!, length >> 8, length & 0xff]);
  return Buffer.concat([header(cut), body.subarray(0, cut), header(body.length - cut), body.subarray(cut)]);
}

describe("readClientHello", () => {
  it("reads the SNI of a real ClientHello, and waits while it arrives in pieces", async () => {
    const hello = await captureClientHello("api.test");
    expect(readClientHello(hello)).toEqual({ kind: "hello", servername: "api.test" });
    for (const cut of [1, 5, 20, hello.length - 1]) expect(readClientHello(hello.subarray(0, cut))).toEqual({ kind: "more" });
  });

  it("reads a ClientHello split over several records", async () => {
    const hello = await captureClientHello("victim-bank.example");
    for (const cut of [64, 200, hello.length - 10]) {
      const split = inTwoRecords(hello, cut);
      expect(readClientHello(split)).toEqual({ kind: "hello", servername: "victim-bank.example" });
      expect(readClientHello(split.subarray(0, split.length - 1))).toEqual({ kind: "more" });
    }
  });

  it("refuses a ClientHello cut into tiny records, after a bounded number of parse steps", () => {
    // A ClientHello header claiming 60,000 bytes, one byte per record, one record per write.
    const message = Buffer.concat([Buffer.from([0x01, 0x00, 0xea, 0x60]), Buffer.alloc(60_000, 0x41)]);
    const reader = new ClientHelloReader();
    let writes = 0;
    let result = readClientHello(Buffer.alloc(0));
    for (const byte of message) {
      writes++;
      result = reader.push(Buffer.from([0x16, 0x03, 0x01, 0x00, 0x01, byte]));
      if (result.kind !== "more") break;
    }
    expect(result).toEqual({ kind: "invalid", reason: "ClientHello fragmented into records of under 64 bytes" });
    expect(writes).toBe(1);
    expect(reader.work).toBeLessThanOrEqual(16);
  });

  it("refuses a ClientHello spread over more than 16 records, and reads one in 16", () => {
    const size = 64 * (maxHelloRecords + 1);
    const message = Buffer.concat([Buffer.from([0x01, 0x00, (size - 4) >> 8, (size - 4) & 0xff]), Buffer.alloc(size - 4, 0x41)]);
    const records = (count: number): Buffer[] => {
      const each = Math.ceil(message.length / count);
      return Array.from({ length: count }, (_, i) => {
        const part = message.subarray(i * each, (i + 1) * each);
        return Buffer.concat([Buffer.from([0x16, 0x03, 0x01, part.length >> 8, part.length & 0xff]), part]);
      });
    };
    const many = new ClientHelloReader();
    const outcomes = records(maxHelloRecords + 1).map((record) => many.push(record).kind);
    expect(outcomes.at(-1)).toBe("invalid");
    expect(outcomes.slice(0, maxHelloRecords).every((kind) => kind === "more")).toBe(true);
    // 16 records of 68 bytes: the limit, not a refusal (the 0x41 filler is not a valid hello body).
    const sixteen = new ClientHelloReader();
    const last = records(maxHelloRecords).map((record) => sixteen.push(record)).at(-1);
    expect(last).toEqual({ kind: "invalid", reason: "malformed ClientHello" });
  });

  it("reads a large record that arrives one byte per chunk with work proportional to its size", async () => {
    const hello = await captureClientHello("api.test");
    const reader = new ClientHelloReader();
    let result = reader.push(hello.subarray(0, 1));
    for (let i = 1; i < hello.length && result.kind === "more"; i++) result = reader.push(hello.subarray(i, i + 1));
    expect(result).toEqual({ kind: "hello", servername: "api.test" });
    expect(reader.work).toBeLessThanOrEqual(4 * hello.length);
    expect(reader.bytes().equals(hello)).toBe(true);
  });

  it("reports no SNI when the client sent none (as for an IP address)", async () => {
    const hello = await captureClientHello(undefined);
    expect(readClientHello(hello)).toEqual({ kind: "hello", servername: undefined });
  });

  it.each([
    ["another record type", Buffer.from([0x17, 0x03, 0x03, 0x00, 0x01, 0x00])],
    ["another handshake message", Buffer.from([0x16, 0x03, 0x01, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00])],
    ["a truncated body", Buffer.from([0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x03])],
    ["a ClientHello over 64 KiB", Buffer.from([0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x01, 0x00, 0x01])],
  ])("refuses %s", (_what, bytes) => {
    expect(readClientHello(bytes).kind).toBe("invalid");
  });

  it("an alert record repeats the hello's record version", async () => {
    const hello = await captureClientHello("api.test");
    expect([...alertRecord(alerts.unrecognizedName, hello)]).toEqual([0x15, 0x03, hello[2], 0x00, 0x02, 0x02, 112]);
  });
});

describe("SigningQueue", () => {
  it("serves sources in turn, so a flood from one waits behind a single piece of another's", async () => {
    const queue = new SigningQueue(32);
    const order: string[] = [];
    const work = (label: string) => async (): Promise<string> => {
      order.push(label);
      return label;
    };
    const flood = Array.from({ length: 10 }, (_, i) => queue.run("flooder", work(`f${i}`)));
    const other = queue.run("guest", work("g0"));
    await Promise.all([...flood, other]);
    expect(order.indexOf("g0")).toBeLessThanOrEqual(2);
    expect(order.filter((label) => label.startsWith("f"))).toEqual(Array.from({ length: 10 }, (_, i) => `f${i}`));
  });

  it("refuses one more piece from a source that has perSource waiting, and no other source's", async () => {
    const queue = new SigningQueue(3);
    const done: Promise<unknown>[] = [];
    for (let i = 0; i < 4; i++) done.push(queue.run("a", async () => i));
    await expect(queue.run("a", async () => "too many")).rejects.toBeInstanceOf(SigningLimitError);
    await expect(queue.run("b", async () => "fine")).resolves.toBe("fine");
    await Promise.all(done);
    await expect(queue.run("a", async () => "again")).resolves.toBe("again");
  });

  it("a piece that throws before its first await rejects its own caller and the queue goes on", async () => {
    const queue = new SigningQueue(8);
    const failed = queue.run("a", (): Promise<string> => {
      throw new Error("thrown at once");
    });
    const next = queue.run("a", async () => "next");
    await expect(failed).rejects.toThrow("thrown at once");
    await expect(next).resolves.toBe("next");
    await expect(queue.run("b", async () => "later")).resolves.toBe("later");
  });

  it("a piece that fails rejects its own caller and the queue goes on", async () => {
    const queue = new SigningQueue(8);
    const failed = queue.run("a", async () => {
      throw new Error("bad name");
    });
    const next = queue.run("a", async () => "next");
    await expect(failed).rejects.toThrow("bad name");
    await expect(next).resolves.toBe("next");
  });
});

describe("LeafCertCache", () => {
  it("a flooder at its signing limit evicts nothing: refused signings never enter the LRU", async () => {
    const dir = await mkdtemp(join(tmpdir(), "egressgate-leaves-"));
    onTestFinished(() => rm(dir, { recursive: true, force: true }));
    const signer = await LeafSigner.create(await loadOrCreateCa(dir), "ecdsa");
    const cache = new LeafCertCache(signer, { maxEntries: 8, validityDays: 30, signingsPerSource: 2 });
    const legit = ["a.legit", "b.legit", "c.legit", "d.legit", "e.legit"];
    for (const name of legit) await cache.get(name, "10.0.0.1");
    expect(cache.signed).toBe(5);
    // The queue goes idle a few microtasks after the last signing settles.
    await new Promise((resolve) => setImmediate(resolve));
    // All in one turn of the loop: f0 is signing, f1 and f2 wait (the limit), every x is refused.
    const accepted = ["f0", "f1", "f2"].map((name) => cache.get(name, "10.0.0.9"));
    const refused = Array.from({ length: 20 }, (_, i) => cache.get(`x${i}.flood`, "10.0.0.9"));
    const outcomes = await Promise.allSettled(refused);
    expect(outcomes.every((o) => o.status === "rejected" && o.reason instanceof SigningLimitError)).toBe(true);
    await Promise.all(accepted);
    expect(cache.signed).toBe(8);
    // Every legitimate name is still cached: none is signed again.
    for (const name of legit) await cache.get(name, "10.0.0.1");
    expect(cache.signed).toBe(8);
  });

  it("concurrent first handshakes for one name share one signing", async () => {
    const dir = await mkdtemp(join(tmpdir(), "egressgate-leaves-"));
    onTestFinished(() => rm(dir, { recursive: true, force: true }));
    const signer = await LeafSigner.create(await loadOrCreateCa(dir), "ecdsa");
    const cache = new LeafCertCache(signer, { maxEntries: 2, validityDays: 30, signingsPerSource: 1 });
    const contexts = await Promise.all(Array.from({ length: 5 }, () => cache.get("api.test", "10.0.0.1")));
    expect(new Set(contexts).size).toBe(1);
    expect(cache.signed).toBe(1);
  });
});
