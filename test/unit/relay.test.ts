import { Duplex } from "node:stream";
import { describe, expect, it } from "vitest";
import { relay } from "../../src/proxy/relay.js";

/**
 * One end of a relay whose far side the test drives: `arrive` is what its peer sends, `sent` what
 * the relay handed over so far. Its writes complete only when `flow` is on, as a socket's do only
 * while its peer reads; `onIdle` is the idle timer the relay set.
 */
class End extends Duplex {
  readonly sent: Buffer[] = [];
  private held: (() => void)[] = [];
  private flowing = false;
  onIdle: (() => void) | undefined;

  constructor(allowHalfOpen = true) {
    super({ highWaterMark: 1024, allowHalfOpen });
  }

  override _read(): void {}

  override _write(chunk: Buffer, _encoding: BufferEncoding, done: (error?: Error | null) => void): void {
    this.sent.push(chunk);
    if (this.flowing) done();
    else this.held.push(() => done());
  }

  override _final(done: () => void): void {
    if (this.flowing) done();
    else this.held.push(done);
  }

  setTimeout(_ms: number, onIdle: () => void): this {
    this.onIdle = onIdle;
    return this;
  }

  arrive(bytes: number): void {
    this.push(Buffer.alloc(bytes, 0x61));
  }

  flow(): void {
    this.flowing = true;
    for (const done of this.held.splice(0)) done();
  }

  bytesHandedOver(): number {
    return this.sent.reduce((sum, chunk) => sum + chunk.length, 0);
  }
}

const turn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

async function settle(ends: readonly End[]): Promise<void> {
  for (let i = 0; i < 20; i++) await turn();
  for (const end of ends) if (!end.destroyed && end.writableFinished) end.destroy();
  for (let i = 0; i < 5; i++) await turn();
}

describe("relay: the end of an upgraded connection", () => {
  // The upstream's last bytes are still buffered for a guest that has not read them when the
  // upstream's connection goes: they must reach the guest, and only then its FIN.
  it.each(["the upstream", "the guest"] as const)("%s sends its tail, ends and closes while the other side is not reading: every byte reaches it, then its end", async (from) => {
    const guest = new End();
    const upstream = new End();
    relay(guest, upstream, 60_000);
    const [sender, receiver] = from === "the upstream" ? [upstream, guest] : [guest, upstream];
    sender.arrive(64 * 1024);
    sender.push(null);
    await turn();
    sender.end();
    sender.flow();
    await settle([sender]);
    expect(sender.destroyed).toBe(true);
    // Closed, yet the other side is still open with the tail held for its peer.
    expect(receiver.destroyed).toBe(false);
    expect(receiver.writableEnded).toBe(true);
    receiver.flow();
    await settle([receiver]);
    expect(receiver.bytesHandedOver()).toBe(64 * 1024);
    expect(receiver.writableFinished).toBe(true);
  });

  // An upstream connection is not half-open: at its peer's FIN it ends its own side too, and a
  // write the guest's bytes made after that failed it, and took the guest's side down with it.
  it("an upstream that ends at its peer's FIN: the guest's later bytes are not written to it, and the guest still gets the tail", async () => {
    const guest = new End();
    const upstream = new End(false);
    relay(guest, upstream, 60_000);
    upstream.arrive(8 * 1024);
    upstream.push(null);
    await turn();
    guest.arrive(100);
    upstream.flow();
    await settle([upstream]);
    expect(guest.destroyed).toBe(false);
    expect(upstream.bytesHandedOver()).toBe(0);
    // Read and let go, so the guest's FIN behind them is seen (not held until idleMs).
    expect(guest.readableLength).toBe(0);
    guest.push(null);
    await turn();
    expect(guest.readableEnded).toBe(true);
    guest.flow();
    await settle([guest]);
    expect(guest.bytesHandedOver()).toBe(8 * 1024);
    expect(guest.writableFinished).toBe(true);
  });

  // Table: how one side goes × what becomes of the other.
  it.each([
    ["fails", (end: End) => end.destroy(new Error("ECONNRESET"))],
    ["is destroyed without an end (a reset, or the proxy's close)", (end: End) => end.destroy()],
  ] as const)("a side that %s takes the other down at once, held bytes and all", async (_how, go) => {
    const guest = new End();
    const upstream = new End();
    relay(guest, upstream, 60_000);
    upstream.arrive(4096);
    await turn();
    go(upstream);
    await settle([]);
    expect(guest.destroyed).toBe(true);
  });

  it("the idle timer of either side takes both down, bounding a peer that never reads its tail", async () => {
    const guest = new End();
    const upstream = new End();
    relay(guest, upstream, 60_000);
    upstream.arrive(4096);
    upstream.push(null);
    await turn();
    upstream.end();
    upstream.flow();
    await settle([upstream]);
    expect(guest.destroyed).toBe(false);
    guest.onIdle!();
    expect(guest.destroyed).toBe(true);
  });
});
