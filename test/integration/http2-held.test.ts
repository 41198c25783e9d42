import type { ClientHttp2Session, ClientHttp2Stream, Http2Session, ServerHttp2Stream } from "node:http2";
import type { TLSSocket } from "node:tls";
import { setTimeout as delay } from "node:timers/promises";
import { describe, expect, it } from "vitest";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { flag, frame, frameType } from "../helpers/h2-frames.js";
import { latch } from "../helpers/latch.js";
import { startH2Upstream, startRawH2Upstream } from "../helpers/h2-upstream.js";
import { fetchVia, startTestProxy } from "../helpers/proxy.js";

/** The defaults (README, docs/config.md): the stream window, and what one connection's stream windows may add up to. */
const streamWindow = 1_048_575;
const budget = 16 * 2 ** 20;
/** A guest connection's fixed stream window at the defaults: 100 streams' share of the budget, one byte under a power of two. */
const guestWindow = 131_071;

/** A PING and its answer: every frame the proxy sent before it (its SETTINGS included) has been read. */
function roundTrip(session: ClientHttp2Session): Promise<void> {
  return new Promise((resolve, reject) => session.ping((error) => (error === null ? resolve() : reject(error))));
}

/**
 * Two round trips: the PING sent once the first is answered goes after the guest has read (and
 * acknowledged) the proxy's first SETTINGS, so its answer comes after whatever the proxy sent on
 * reading that acknowledgement (a window raised, before the guest side's window was fixed).
 */
async function settledConnection(session: ClientHttp2Session): Promise<void> {
  await roundTrip(session);
  await roundTrip(session);
}

// One guest connection's streams whose reader stopped held a stream window each: 100 of them,
// 100 MiB (docs/performance.md, "What a stopped HTTP/2 reader holds"). The guest's window was then
// lowered and raised with its count of uploads, and a guest that started many at once (by the
// window it last read, 1 MiB) had streams reset: now it is fixed at 100 streams' share.
describe("limits.h2ConnectionBufferBytes: what one HTTP/2 connection's stopped streams may hold", () => {
  it("a guest connection's stream window is 100 streams' share of the budget, from its first SETTINGS on, and never changes as its uploads come and go", async () => {
    const upstream = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const windows: number[] = [];
    session.on("remoteSettings", (settings) => windows.push(settings.initialWindowSize!));
    await settledConnection(session);
    expect(session.remoteSettings.initialWindowSize).toBe(guestWindow);
    expect(guestWindow * 100).toBeLessThanOrEqual(budget);
    // 17 uploads open, then all of them done: no SETTINGS with another window.
    const streams = Array.from({ length: 17 }, () => {
      const stream = session.request({ ":method": "POST", ":path": "/echo" }, { endStream: false });
      stream.on("error", () => undefined);
      stream.resume();
      return stream;
    });
    while (upstream.seen.length < 17) await new Promise((resolve) => upstream.server.once("stream", resolve));
    await roundTrip(session);
    expect(session.remoteSettings.initialWindowSize).toBe(guestWindow);
    await Promise.all(
      streams.map(async (stream) => {
        stream.end("x");
        if (!stream.closed) await new Promise((resolve) => stream.once("close", resolve));
      }),
    );
    await roundTrip(session);
    expect(windows).toEqual([guestWindow]);
  });

  it("100 uploads started together on an open connection to an upstream that takes none: none reset, what the guest could send within the budget, and another guest served", async () => {
    let requests = 0;
    let allArrived = (): void => undefined;
    const arrived = new Promise<void>((resolve) => (allArrived = resolve));
    // Never a WINDOW_UPDATE: the proxy can send it 65,535 bytes in all, and holds the rest.
    const holding = await startRawH2Upstream({ onHeaders: () => void (++requests === 100 && allArrived()) });
    const other = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const session = await h2Session(proxy.port, `api.test:${holding.port}`, proxy.caCertPem);
    // The connection settled, as one in use is: the window is what the guest has read last.
    await settledConnection(session);
    const chunk = 16_384;
    /** Per stream: the bytes whose write completed, i.e. went out in DATA frames within its window. */
    const sent = new Array<number>(100).fill(0);
    let settle = (): void => undefined;
    const settled = new Promise<void>((resolve) => (settle = resolve));
    /** A stream is done once it has sent all a 131,071-byte window takes in whole chunks (7), or closed. */
    const done = new Set<number>();
    const check = (i: number, stream: ClientHttp2Stream): void => {
      if (done.has(i) || (sent[i]! < Math.floor(guestWindow / chunk) * chunk && !stream.closed)) return;
      done.add(i);
      if (done.size === 100) settle();
    };
    const streams: ClientHttp2Stream[] = [];
    for (let i = 0; i < 100; i++) {
      const stream = session.request({ ":method": "POST", ":path": "/hold" }, { endStream: false });
      stream.on("error", () => undefined);
      stream.once("close", () => check(i, stream));
      // An upload as a client streams it: 2 MiB, past any window, a chunk written as the last
      // one went out (a write's callback comes once its bytes are in DATA frames; writes queued
      // behind one are handed on together, and complete together).
      const pump = (n: number): void => {
        if (n === 128) return;
        stream.write(Buffer.alloc(chunk, 0x61), (error) => {
          if (error !== undefined && error !== null) return;
          sent[i]! += chunk;
          check(i, stream);
          pump(n + 1);
        });
      };
      pump(0);
      streams.push(stream);
    }
    await arrived;
    await settled;
    await roundTrip(session);
    // None reset (Node's rstCode is 0 until a stream is), none closed.
    expect(streams.filter((stream) => stream.closed || (stream.rstCode ?? 0) !== 0).map((stream) => stream.rstCode)).toEqual([]);
    const total = sent.reduce((a, b) => a + b, 0);
    expect(total).toBeLessThanOrEqual(budget);
    expect(Math.max(...sent)).toBeLessThanOrEqual(guestWindow);
    expect(proxy.logs.some((line) => line["msg"] === "guest h2 stream reset")).toBe(false);
    expect((await fetchVia(proxy, `https://api.test:${other.port}/echo`)).status).toBe(200);
    session.destroy();
  });

  it("an h2 upstream sees the proxy's stream window shared by the responses a stopped guest holds: 40 streams on one connection stay within the budget, and another guest is served", async () => {
    /** At each stream's arrival: the proxy's window as the upstream has it, and the streams open on that connection. */
    const seen: { window: number; open: number }[] = [];
    const held: ServerHttp2Stream[] = [];
    const open = new Map<Http2Session, number>();
    const upstream = await startH2Upstream({
      "/big": (stream) => {
        stream.respond({ ":status": 200, "content-type": "application/octet-stream" });
        held.push(stream);
        // Every response goes out once all 40 are open: the guest has stopped reading them.
        if (held.length === 40) for (const each of held) each.write(Buffer.alloc(4 * streamWindow));
      },
    });
    upstream.server.on("stream", (stream: ServerHttp2Stream) => {
      const session = stream.session!;
      open.set(session, (open.get(session) ?? 0) + 1);
      stream.once("close", () => open.set(session, open.get(session)! - 1));
      seen.push({ window: session.remoteSettings.initialWindowSize!, open: open.get(session)! });
    });
    const other = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const answered: Promise<void>[] = [];
    for (let i = 0; i < 40; i++) {
      const stream = session.request({ ":path": "/big" });
      stream.on("error", () => undefined);
      answered.push(new Promise((resolve) => stream.once("response", () => resolve())));
      stream.pause();
    }
    await Promise.all(answered);
    expect(seen).toHaveLength(40);
    for (const { window, open: count } of seen) expect(window * count).toBeLessThanOrEqual(budget);
    expect(seen.at(-1)!.window).toBe(262_143);
    // Another origin: this upstream's own session, its 10 MiB of Node's session memory spent on the
    // responses it has queued, refuses new streams itself (ENHANCE_YOUR_CALM).
    expect((await fetchVia(proxy, `https://api.test:${other.port}/echo`)).status).toBe(200);
    // The proxy's close would wait for the stopped downloads.
    session.destroy();
  });

  it("an upstream that leaves the lowered window unacknowledged past timeouts.h2PingMs: the 17 responses under way on its connection finish whole, a later request goes on a new connection, and the old one is closed once they end", async () => {
    const pingMs = 500;
    const count = 17;
    const first = Buffer.alloc(1_000, 0x61);
    const rest = Buffer.alloc(1_000, 0x62);
    /** The first connection's streams whose response has its first part only. */
    const held: { socket: TLSSocket; stream: number }[] = [];
    const [allHeld, heldAll] = latch();
    let goawayCame = false;
    const [goaway, goawaySeen] = latch();
    /** The proxy's answer to a PING the upstream sends on the first connection: whatever it wrote before has arrived. */
    let pingAnswered = (): void => undefined;
    /** SETTINGS_INITIAL_WINDOW_SIZE in each SETTINGS the proxy sent on the first connection. */
    const windows: (number | undefined)[] = [];
    const upstream = await startRawH2Upstream({
      // The first SETTINGS (in the preface) is acknowledged, never a later one.
      ackSettings: (_connection, nth) => nth === 1,
      onFrame: (type, flags, _stream, payload, connection) => {
        if (connection !== 1) return;
        if (type === frameType.goaway) {
          goawayCame = true;
          goawaySeen();
        }
        if (type === frameType.ping && (flags & flag.ack) !== 0 && payload.readUInt32BE(4) === 0x7e57) pingAnswered();
        if (type !== frameType.settings || (flags & flag.ack) !== 0) return;
        let window: number | undefined;
        for (let at = 0; at + 6 <= payload.length; at += 6) if (payload.readUInt16BE(at) === 0x4) window = payload.readUInt32BE(at + 2);
        windows.push(window);
      },
      onHeaders: (socket, stream, connection) => {
        // `:status 200` is HPACK's static entry 8.
        socket.write(frame(frameType.headers, flag.endHeaders, stream, Buffer.from([0x88])));
        if (connection === 1 && held.length < count) {
          socket.write(frame(frameType.data, 0, stream, first));
          held.push({ socket, stream });
          if (held.length === count) heldAll();
          return;
        }
        // Any other request is answered whole, with the number of the connection it came on.
        socket.write(frame(frameType.data, flag.endStream, stream, Buffer.from(`connection ${connection}`)));
      },
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { h2PingMs: pingMs } });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const answers = Array.from({ length: count }, () => h2Request(session, { ":path": "/held" }));
    for (const answer of answers) answer.catch(() => undefined);
    await allHeld;
    // The 17th stream's lower window went out ahead of its HEADERS, and stays unacknowledged.
    expect(windows).toEqual([streamWindow, 524_287]);
    expect(upstream.connections()).toBe(1);
    // Polled through what a new request finds: the first connection's until the deadline has
    // passed and the session takes no new streams, then a new one's.
    for (;;) {
      const probe = await h2Request(session, { ":path": "/probe" });
      expect(probe.status).toBe(200);
      if (probe.body.toString() !== "connection 1") {
        expect(probe.body.toString()).toBe("connection 2");
        break;
      }
      await delay(pingMs / 10);
    }
    // Retired, not closed: no GOAWAY while its streams are under way.
    const answered = new Promise<void>((resolve) => (pingAnswered = resolve));
    held[0]!.socket.write(frame(frameType.ping, 0, 0, Buffer.from([0, 0, 0, 0, 0, 0, 0x7e, 0x57])));
    await answered;
    expect(goawayCame).toBe(false);
    // The upstream finishes every response it held (its acknowledgement only late, in effect).
    for (const { socket, stream } of held) socket.write(frame(frameType.data, flag.endStream, stream, rest));
    const settled = await Promise.allSettled(answers);
    expect(settled.map((answer) => (answer.status === "fulfilled" ? `${answer.value.status} ${answer.value.body.length}` : String(answer.reason)))).toEqual(new Array(count).fill(`200 ${first.length + rest.length}`));
    for (const answer of settled) if (answer.status === "fulfilled") expect(answer.value.body.equals(Buffer.concat([first, rest]))).toBe(true);
    // The retired connection is closed once its last stream ended: GOAWAY to the upstream.
    await goaway;
    expect(upstream.connections()).toBe(2);
  });
});
