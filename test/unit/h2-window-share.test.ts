import { connect, type ClientHttp2Session } from "node:http2";
import { createServer, type AddressInfo, type Socket } from "node:net";
import { describe, expect, it, onTestFinished } from "vitest";
import { h2ServerOptions } from "../../src/proxy/h2-settings.js";
import { emptyStreams, sharedWindow, WindowShare } from "../../src/upstream/h2-window-share.js";

const streamWindow = 1_048_575;
const budget = 16 * 2 ** 20;

describe("sharedWindow", () => {
  it.each([
    [0, 1_048_575],
    [1, 1_048_575],
    [16, 1_048_575],
    [17, 524_287],
    [32, 524_287],
    [33, 262_143],
    [64, 262_143],
    [65, 131_071],
    [100, 131_071],
    [129, 65_535],
    [1_000, 65_535],
  ])("gives %i streams that hold nothing yet a window of %i bytes: together within the budget, never below 65,535", (streams, window) => {
    expect(sharedWindow(streamWindow, budget, emptyStreams(streams))).toBe(window);
    if (window > 65_535) expect(window * streams).toBeLessThanOrEqual(budget);
  });

  it("counts what a stream already holds past the window: 16 full windows leave a 17th stream the least one", () => {
    expect(sharedWindow(streamWindow, budget, [...new Array<number>(16).fill(streamWindow), 0])).toBe(65_535);
    expect(sharedWindow(streamWindow, budget, [...new Array<number>(8).fill(streamWindow), ...emptyStreams(9)])).toBe(524_287);
  });

  it("keeps a configured stream window that is not one byte under a power of two while it fits, and halves from there", () => {
    expect(sharedWindow(300_000, budget, emptyStreams(50))).toBe(300_000);
    expect(sharedWindow(300_000, budget, emptyStreams(60))).toBe(262_143);
  });

  it("never gives more than the budget to one stream", () => {
    expect(sharedWindow(streamWindow, 100_000, emptyStreams(1))).toBe(100_000);
  });
});

describe("the guest side's first SETTINGS", () => {
  it("gives limits.h2Streams streams' share of limits.h2ConnectionBufferBytes, raised once the guest has acknowledged it", () => {
    expect(h2ServerOptions({ h2Streams: 100, h2HeaderListBytes: 65_536, h2SessionMemoryMiB: 10, h2ResetsPer10s: 200, h2StreamWindowBytes: streamWindow, h2ConnectionWindowBytes: 2 ** 30 - 1, h2ConnectionBufferBytes: budget }).settings?.initialWindowSize).toBe(131_071);
  });
});

const preface = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

function frame(type: number, flags: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head[3] = type;
  head[4] = flags;
  return Buffer.concat([head, payload]);
}

interface Peer {
  readonly session: ClientHttp2Session;
  /** SETTINGS_INITIAL_WINDOW_SIZE of each SETTINGS the client sent (undefined where it had none), its first included. */
  readonly windows: (number | undefined)[];
  /** Acknowledges every SETTINGS received and not yet acknowledged. */
  readonly ackAll: () => void;
  /** A PING and its answer: every frame the client wrote before it has reached the peer. */
  readonly roundTrip: () => Promise<void>;
}

/**
 * A node:http2 client session on loopback to a peer written frame by frame (plain TCP, prior
 * knowledge): it sends an empty SETTINGS, answers PINGs, and acknowledges the client's SETTINGS
 * only as `onSettings` does (it is given the SETTINGS' number, from 1, and the socket).
 */
async function peerOf(onSettings: (nth: number, ack: () => void) => void = (_nth, ack) => ack()): Promise<Peer> {
  const windows: (number | undefined)[] = [];
  let unacknowledged = 0;
  let socket: Socket | undefined;
  const ack = (): void => {
    socket!.write(frame(0x4, 0x1));
    unacknowledged -= 1;
  };
  const server = createServer((s) => {
    socket = s;
    s.on("error", () => undefined);
    s.write(frame(0x4, 0));
    let buffered = Buffer.alloc(0);
    let prefaceSeen = false;
    s.on("data", (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      if (!prefaceSeen) {
        if (buffered.length < preface.length) return;
        buffered = buffered.subarray(preface.length);
        prefaceSeen = true;
      }
      while (buffered.length >= 9) {
        const length = buffered.readUIntBE(0, 3);
        if (buffered.length < 9 + length) return;
        const [type, flags] = [buffered[3]!, buffered[4]!];
        const payload = buffered.subarray(9, 9 + length);
        buffered = buffered.subarray(9 + length);
        if (type === 0x6 && (flags & 0x1) === 0) s.write(frame(0x6, 0x1, payload));
        if (type !== 0x4 || (flags & 0x1) !== 0) continue;
        let window: number | undefined;
        for (let at = 0; at + 6 <= payload.length; at += 6) if (payload.readUInt16BE(at) === 0x4) window = payload.readUInt32BE(at + 2);
        windows.push(window);
        unacknowledged += 1;
        onSettings(windows.length, ack);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const session = connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  session.on("error", () => undefined);
  onTestFinished(async () => {
    session.destroy();
    socket?.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  await new Promise<void>((resolve) => session.once("remoteSettings", () => resolve()));
  const roundTrip = (): Promise<void> => new Promise((resolve, reject) => session.ping((error) => (error === null ? resolve() : reject(error))));
  await roundTrip();
  return {
    session,
    windows,
    ackAll: () => {
      while (unacknowledged > 0) ack();
    },
    roundTrip,
  };
}

describe("WindowShare on a live session", () => {
  it("with the defaults, 16 streams about to open send no SETTINGS, and the 17th exactly one, with half the window", async () => {
    const peer = await peerOf();
    const share = new WindowShare(peer.session, { streamBytes: streamWindow, budgetBytes: budget, ackMs: 60_000, onUnacknowledged: () => undefined });
    for (let i = 0; i < 16; i++) share.reserve();
    await peer.roundTrip();
    expect(peer.windows).toEqual([undefined]);
    share.reserve();
    await peer.roundTrip();
    expect(peer.windows).toEqual([undefined, 524_287]);
    expect(share.window).toBe(524_287);
  });

  it("a peer that acknowledges no lowered window: the share stops short of Node's 10 SETTINGS unacknowledged, which would destroy the session, and goes on once they are", async () => {
    // Every halving of the window a count that doubles sends: 2,000 streams, 11 SETTINGS.
    const bytes = 2 ** 31 - 1;
    let errors = 0;
    const peer = await peerOf((nth, ack) => nth === 1 && ack());
    peer.session.on("error", () => void (errors += 1));
    const share = new WindowShare(peer.session, { streamBytes: bytes, budgetBytes: bytes, ackMs: 60_000, onUnacknowledged: () => undefined });
    for (let i = 0; i < 2_000; i++) share.reserve();
    expect(peer.session.destroyed).toBe(false);
    await peer.roundTrip();
    expect(errors).toBe(0);
    // Node's first SETTINGS (acknowledged) and the share's own, fewer than 10 unacknowledged.
    const lowered = peer.windows.slice(1);
    expect(lowered.length).toBeGreaterThan(0);
    expect(lowered.length).toBeLessThan(10);
    expect(lowered).toEqual(lowered.map((_, i) => 2 ** (30 - i) - 1));
    expect(share.window).toBe(lowered.at(-1));
    // Acknowledged at last: the window for 2,000 streams goes out.
    const before = peer.windows.length;
    peer.ackAll();
    await peer.roundTrip();
    await peer.roundTrip();
    expect(peer.windows.slice(before)).toEqual([1_048_575]);
    expect(share.window).toBe(1_048_575);
    expect(peer.session.destroyed).toBe(false);
  });

  it("judges the deadline after the reads: an acknowledgement that arrived while the process was busy past ackMs is not taken for silence", async () => {
    const ackMs = 50;
    let unacknowledged = 0;
    const bytes = 2 ** 31 - 1;
    // The lowering SETTINGS is acknowledged at once; the process then stays busy past the
    // deadline before it reads the acknowledgement (a pause, a starved host).
    const peer = await peerOf((nth, ack) => {
      ack();
      if (nth === 1) return;
      const until = performance.now() + 3 * ackMs;
      while (performance.now() < until);
    });
    const share = new WindowShare(peer.session, { streamBytes: bytes, budgetBytes: bytes, ackMs, onUnacknowledged: () => void (unacknowledged += 1) });
    share.reserve();
    share.reserve();
    await peer.roundTrip();
    await peer.roundTrip();
    expect(peer.windows).toEqual([undefined, 2 ** 30 - 1]);
    expect(peer.session.pendingSettingsAck).toBe(false);
    expect(unacknowledged).toBe(0);
  });
});
