import { connect, createServer, type Socket } from "node:net";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { closeLingering, isLingering, closeBegun, lingerBounds } from "../../src/proxy/linger.js";

/** A connected pair on loopback: the proxy's side (from the server) and the guest's. */
async function pair(): Promise<{ proxySide: Socket; guest: Socket }> {
  const server = createServer({ allowHalfOpen: true });
  const accepted = new Promise<Socket>((resolve) => server.once("connection", resolve));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => void server.close());
  const guest = connect({ host: "127.0.0.1", port: (server.address() as { port: number }).port, allowHalfOpen: true });
  guest.on("error", () => undefined);
  const proxySide = await accepted;
  proxySide.on("error", () => undefined);
  onTestFinished(() => {
    guest.destroy();
    proxySide.destroy();
  });
  await new Promise<void>((resolve) => (guest.connecting ? guest.once("connect", resolve) : resolve()));
  return { proxySide, guest };
}

/** What the guest reads until the proxy ends its side. */
function readAll(guest: Socket): Promise<string> {
  return new Promise((resolve) => {
    let text = "";
    guest.on("data", (chunk: Buffer) => (text += chunk.toString("latin1")));
    guest.once("end", () => resolve(text));
  });
}

const closed = (socket: Socket): Promise<void> => new Promise((resolve) => (socket.destroyed ? resolve() : socket.once("close", () => resolve())));

describe("closeLingering", () => {
  it("ends the proxy's side after what was written, reads on until the guest ends its own, and leaves no listener of its own on the socket", async () => {
    const { proxySide, guest } = await pair();
    const before = { data: proxySide.listenerCount("data"), end: proxySide.listenerCount("end"), close: proxySide.listenerCount("close") };
    const read = readAll(guest);
    proxySide.write("the answer");
    closeLingering(proxySide);
    expect(isLingering(proxySide)).toBe(true);
    expect(closeBegun(proxySide)).toBe(true);
    guest.write(Buffer.alloc(256 * 1024, 0x61));
    expect(await read).toBe("the answer");
    expect(proxySide.destroyed).toBe(false);
    guest.end();
    await closed(proxySide);
    expect({ data: proxySide.listenerCount("data"), end: proxySide.listenerCount("end"), close: proxySide.listenerCount("close") }).toEqual(before);
  });

  it("takes the socket from whoever read it: nothing after the answer reaches them", async () => {
    const { proxySide, guest } = await pair();
    const seen: Buffer[] = [];
    proxySide.on("data", (chunk: Buffer) => seen.push(chunk));
    guest.write("before");
    await vi.waitFor(() => expect(Buffer.concat(seen).toString()).toBe("before"));
    closeLingering(proxySide);
    guest.end("after");
    await closed(proxySide);
    expect(Buffer.concat(seen).toString()).toBe("before");
  });

  it("lets a guest that goes on sending go once it has dropped the byte bound", async () => {
    const { proxySide, guest } = await pair();
    closeLingering(proxySide);
    const chunk = Buffer.alloc(1024 * 1024, 0x61);
    let sent = 0;
    // Never ended: only the bound can end it.
    while (!proxySide.destroyed && sent <= lingerBounds.bytes + chunk.length) {
      await new Promise<void>((resolve) => guest.write(chunk, () => resolve()));
      sent += chunk.length;
    }
    await closed(proxySide);
    expect(sent).toBeGreaterThan(lingerBounds.bytes);
  });

  it("lets a guest that neither reads, sends nor ends go at the time bound", async () => {
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    onTestFinished(() => void vi.useRealTimers());
    const { proxySide, guest } = await pair();
    guest.pause();
    proxySide.write("the answer");
    closeLingering(proxySide);
    vi.advanceTimersByTime(lingerBounds.ms - 1);
    expect(proxySide.destroyed).toBe(false);
    vi.advanceTimersByTime(1);
    expect(proxySide.destroyed).toBe(true);
    await closed(proxySide);
  });
});
