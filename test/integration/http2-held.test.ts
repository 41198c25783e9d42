import type { ClientHttp2Stream, Http2Session, ServerHttp2Stream } from "node:http2";
import { once } from "node:events";
import { describe, expect, it } from "vitest";
import { h2Session } from "../helpers/h2-client.js";
import { flag, frame, frameType, RawH2, requestBlock } from "../helpers/h2-frames.js";
import { startH2Upstream, startRawH2Upstream } from "../helpers/h2-upstream.js";
import { fetchVia, startTestProxy } from "../helpers/proxy.js";

/** The defaults (README, docs/config.md): the stream window, and what one connection's stream windows may add up to. */
const streamWindow = 1_048_575;
const budget = 16 * 2 ** 20;
/** What HeldBodies allows each stream past the budget: the least window and Node's read-ahead (16 KiB on Node 20). */
const slackPerStream = 65_535 + 16 * 1024;
const enhanceYourCalm = 0xb;
const settingsTimeout = 0x4;
/** RFC 9113 §6.5.2. */
const initialWindowSize = 0x4;

/** The SETTINGS_INITIAL_WINDOW_SIZE values, in order, of the SETTINGS frames (not ACKs) a raw guest got. */
function windowsSent(client: RawH2): number[] {
  const values: number[] = [];
  for (const f of client.frames) {
    if (f.type !== frameType.settings || (f.flags & flag.ack) !== 0) continue;
    for (let at = 0; at + 6 <= f.payload.length; at += 6) if (f.payload.readUInt16BE(at) === initialWindowSize) values.push(f.payload.readUInt32BE(at + 2));
  }
  return values;
}

/** Acknowledges every SETTINGS of the proxy's that has arrived and not been acknowledged yet. */
function acknowledge(client: RawH2, acked: { count: number }): void {
  const sent = client.frames.filter((f) => f.type === frameType.settings && (f.flags & flag.ack) === 0).length;
  for (; acked.count < sent; acked.count++) client.write(frame(frameType.settings, flag.ack, 0));
}

/** A PING and its answer: every frame the proxy read before it has been acted on. */
async function pingRoundTrip(client: RawH2, data: number): Promise<void> {
  const payload = Buffer.alloc(8);
  payload.writeUInt32BE(data, 4);
  client.write(frame(frameType.ping, 0, 0, payload));
  await client.until((c) => c.frames.some((f) => f.type === frameType.ping && (f.flags & flag.ack) !== 0 && f.payload.readUInt32BE(4) === data));
}

/** DATA frames (16,384 bytes at most, the default frame size) carrying `bytes` on a stream, without END_STREAM. */
function dataFrames(stream: number, bytes: number): Buffer {
  const frames: Buffer[] = [];
  for (let left = bytes; left > 0; left -= 16_384) frames.push(frame(frameType.data, 0, stream, Buffer.alloc(Math.min(16_384, left), 0x61)));
  return Buffer.concat(frames);
}

// One guest connection's streams whose reader stopped held a stream window each: 100 of them,
// 100 MiB (docs/performance.md, "What a stopped HTTP/2 reader holds").
describe("limits.h2ConnectionBufferBytes: what one HTTP/2 connection's stopped streams may hold", () => {
  it("an HTTP/2 guest's uploads to an upstream that takes none share the budget: 40 of them are given windows that 40 fill within it, and another guest is served", async () => {
    let requests = 0;
    let allArrived = (): void => undefined;
    const arrived = new Promise<void>((resolve) => (allArrived = resolve));
    // Never a WINDOW_UPDATE: the proxy can send it 65,535 bytes in all, and holds the rest.
    const holding = await startRawH2Upstream({ onHeaders: () => void (++requests === 40 && allArrived()) });
    const other = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const session = await h2Session(proxy.port, `api.test:${holding.port}`, proxy.caCertPem);
    const streams: ClientHttp2Stream[] = [];
    for (let i = 0; i < 40; i++) {
      const stream = session.request({ ":method": "POST", ":path": "/hold" }, { endStream: false });
      stream.on("error", () => undefined);
      streams.push(stream);
    }
    // Every stream reached the upstream, and a PING's answer came after the proxy read them all.
    await arrived;
    await new Promise<void>((resolve, reject) => session.ping((error) => (error === null ? resolve() : reject(error))));
    const window = session.remoteSettings.initialWindowSize!;
    expect(window).toBe(262_143);
    expect(window * 40).toBeLessThanOrEqual(budget);
    // Each writes more than its window: nghttp2 holds the guest to it (past it is a flow-control error).
    for (const stream of streams) stream.write(Buffer.alloc(2 * streamWindow));
    expect((await fetchVia(proxy, `https://api.test:${other.port}/echo`)).status).toBe(200);
  });

  it("a guest's window comes back once its uploads are done, and not at every stream: lowered at 17, kept at 16, raised again at 10", async () => {
    const upstream = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const windowIs = async (value: number): Promise<void> => {
      while (session.remoteSettings.initialWindowSize !== value) await once(session, "remoteSettings");
    };
    const roundTrip = (): Promise<void> => new Promise((resolve, reject) => session.ping((error) => (error === null ? resolve() : reject(error))));
    // The full window once the guest has acknowledged the first SETTINGS (no upload open).
    await windowIs(streamWindow);
    const streams = Array.from({ length: 17 }, () => {
      const stream = session.request({ ":method": "POST", ":path": "/echo" }, { endStream: false });
      stream.on("error", () => undefined);
      stream.resume();
      return stream;
    });
    while (upstream.seen.length < 17) await once(upstream.server, "stream");
    await roundTrip();
    expect(session.remoteSettings.initialWindowSize).toBe(524_287);
    const finish = async (stream: ClientHttp2Stream): Promise<void> => {
      stream.end("x");
      if (!stream.closed) await once(stream, "close");
    };
    await finish(streams[0]!);
    await roundTrip();
    expect(session.remoteSettings.initialWindowSize).toBe(524_287);
    for (const stream of streams.slice(1, 7)) await finish(stream);
    await windowIs(streamWindow);
    expect(session.remoteSettings.initialWindowSize).toBe(streamWindow);
  });

  it("a guest that writes its streams' whole windows before reading the proxy's lowered one has the streams past the budget reset with ENHANCE_YOUR_CALM, and another guest is served", async () => {
    const holding = await startRawH2Upstream();
    const other = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const authority = `api.test:${holding.port}`;
    const client = await RawH2.open(proxy.port, authority, proxy.caCertPem);
    const acked = { count: 0 };
    // The proxy's first SETTINGS, then the full window once the guest has acknowledged them.
    await client.until((c) => windowsSent(c).length >= 1);
    acknowledge(client, acked);
    await client.until((c) => windowsSent(c).includes(streamWindow));
    acknowledge(client, acked);
    await pingRoundTrip(client, 1);
    // 30 streams and a full window of DATA on each, written before reading anything more: what
    // a guest that opens its uploads together sends (Node's client does).
    const ids = Array.from({ length: 30 }, (_, i) => 2 * i + 1);
    client.write(Buffer.concat(ids.map((id) => Buffer.concat([frame(frameType.headers, flag.endHeaders, id, requestBlock(authority, "/hold", [], "POST")), dataFrames(id, streamWindow)]))));
    // Two round trips: the resets are made a turn after the DATA that went past is read.
    await pingRoundTrip(client, 2);
    await pingRoundTrip(client, 3);
    const reset = ids.filter((id) => client.resetCode(id) === enhanceYourCalm);
    const kept = ids.length - reset.length;
    expect(reset.length).toBeGreaterThan(0);
    expect(kept * streamWindow).toBeLessThanOrEqual(budget + ids.length * slackPerStream);
    expect(proxy.logs.some((line) => line["msg"] === "guest h2 stream reset" && String(line["reason"]).includes("limits.h2ConnectionBufferBytes"))).toBe(true);
    expect(client.closed).toBe(false);
    expect((await fetchVia(proxy, `https://api.test:${other.port}/echo`)).status).toBe(200);
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

  it("a guest that leaves a lowered window unacknowledged for timeouts.h2PingMs gets GOAWAY(SETTINGS_TIMEOUT)", async () => {
    const holding = await startRawH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { h2PingMs: 500, idleMs: 600_000 } });
    const authority = `api.test:${holding.port}`;
    const client = await RawH2.open(proxy.port, authority, proxy.caCertPem);
    const acked = { count: 0 };
    await client.until((c) => windowsSent(c).length >= 1);
    acknowledge(client, acked);
    await client.until((c) => windowsSent(c).includes(streamWindow));
    acknowledge(client, acked);
    await pingRoundTrip(client, 1);
    // 20 uploads open: the proxy lowers the window, and the guest never acknowledges it (nor anything after).
    client.write(Buffer.concat(Array.from({ length: 20 }, (_, i) => frame(frameType.headers, flag.endHeaders, 2 * i + 1, requestBlock(authority, "/hold", [], "POST")))));
    await client.until((c) => windowsSent(c).at(-1)! < streamWindow);
    await client.until((c) => c.goaway() !== undefined);
    expect(client.goaway()!.code).toBe(settingsTimeout);
    expect(proxy.logs.some((line) => line["msg"] === "guest h2 connection closed" && String(line["reason"]).includes("did not acknowledge the proxy's SETTINGS"))).toBe(true);
  });
});
