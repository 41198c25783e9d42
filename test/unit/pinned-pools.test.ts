import { EventEmitter, once } from "node:events";
import { createServer } from "node:http";
import { connect as netConnect, createServer as createNetServer, type AddressInfo, type Socket } from "node:net";
import { Readable } from "node:stream";
import { createSecureContext } from "node:tls";
import { describe, expect, it, onTestFinished } from "vitest";
import { EgressError } from "../../src/errors.js";
import { PinnedPools, sameAddress } from "../../src/upstream/pinned-pools.js";
import { startH2Upstream } from "../helpers/h2-upstream.js";
import { testCa } from "../helpers/test-ca.js";

async function loopbackServer(): Promise<number> {
  const server = createServer((_req, res) => res.end("ok"));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return (server.address() as AddressInfo).port;
}

function pools(recheck: (hostname: string, remote: { ip: string }, port: number) => string | undefined): PinnedPools {
  const p = new PinnedPools({
    upstreamContext: createSecureContext({}),
    maxPools: 2,
    connectionsPerPool: 2,
    connectTimeoutMs: 2_000,
    headersTimeoutMs: 2_000,
    bodyTimeoutMs: 2_000,
    keepAliveTimeoutMs: 1_000,
    h2PingMs: 10_000,
    recheck,
  });
  onTestFinished(() => p.close());
  return p;
}

describe("pinned pools", () => {
  it("dial the pinned address whatever the hostname, and pass the hostname to the re-check", async () => {
    const port = await loopbackServer();
    const seen: string[] = [];
    const p = pools((hostname, remote) => {
      seen.push(`${hostname}@${remote.ip}`);
      return undefined;
    });
    const res = await p.get(new URL(`http://unresolvable.invalid:${port}`), { ip: "127.0.0.1", family: 4 }).request({ path: "/", method: "GET" });
    expect(await res.body.text()).toBe("ok");
    expect(seen).toEqual(["unresolvable.invalid@127.0.0.1"]);
  });

  it("refuse a connection whose remote address the re-check refuses, with a 403 EgressError", async () => {
    const port = await loopbackServer();
    const p = pools(() => "refused for the test");
    const attempt = p.get(new URL(`http://api.test:${port}`), { ip: "127.0.0.1", family: 4 }).request({ path: "/", method: "GET" });
    await expect(attempt).rejects.toSatisfy((e: unknown) => e instanceof EgressError && e.status === 403 && /refused for the test/.test(e.message));
  });

  it("once retired (a reload), still serve a request under way, on a pool that closes after it", async () => {
    const port = await loopbackServer();
    const p = pools(() => undefined);
    await p.close();
    const pool = p.get(new URL(`http://a.test:${port}`), { ip: "127.0.0.1", family: 4 });
    const res = await pool.request({ path: "/", method: "GET" });
    expect(await res.body.text()).toBe("ok");
    expect(p.size).toBe(0);
    await expect.poll(() => pool.closed).toBe(true);
  });

  it("are keyed by origin and IP and bounded, closing the least recently used", () => {
    const p = pools(() => undefined);
    const a = p.get(new URL("http://a.test"), { ip: "127.0.0.1", family: 4 });
    expect(p.get(new URL("http://a.test"), { ip: "127.0.0.1", family: 4 })).toBe(a);
    expect(p.get(new URL("http://a.test"), { ip: "127.0.0.2", family: 4 })).not.toBe(a);
    p.get(new URL("http://b.test"), { ip: "127.0.0.1", family: 4 });
    expect(p.size).toBe(2);
    expect(p.get(new URL("http://a.test"), { ip: "127.0.0.1", family: 4 })).not.toBe(a);
  });

  // get() hands out the last key made again for the same origin and IP, and moves a pool to the
  // most recent place only when it is not there already (docs/performance.md, fifteenth session).
  it("tell apart origins whose href starts like the last one's, and keep the least recently used order", () => {
    const p = new PinnedPools({
      upstreamContext: createSecureContext({}),
      maxPools: 8,
      connectionsPerPool: 2,
      connectTimeoutMs: 2_000,
      headersTimeoutMs: 2_000,
      bodyTimeoutMs: 2_000,
      keepAliveTimeoutMs: 1_000,
      h2PingMs: 10_000,
      recheck: () => undefined,
    });
    onTestFinished(() => p.close());
    const ip = { ip: "127.0.0.1", family: 4 as const };
    const a = p.get(new URL("http://a.test/x"), ip);
    expect(p.get(new URL("http://a.test/y?z"), ip)).toBe(a);
    expect(p.get(new URL("http://u:p@a.test/x"), ip)).toBe(a);
    for (const other of ["http://a.test.b/x", "http://a.test:8080/x", "https://a.test/x", "http://a.tes/t"]) {
      expect(p.get(new URL(other), ip), other).not.toBe(a);
      expect(p.get(new URL("http://a.test/x"), ip)).toBe(a);
    }
    expect(p.size).toBe(5);
    // The same URL object, changed in place after it was asked about, is another origin.
    const moved = new URL("http://a.test/x");
    expect(p.get(moved, ip)).toBe(a);
    moved.hostname = "moved.test";
    expect(p.get(moved, ip)).not.toBe(a);
    expect(p.size).toBe(6);

    const q = pools(() => undefined);
    const first = q.get(new URL("http://a.test"), ip);
    q.get(new URL("http://b.test"), ip);
    expect(q.get(new URL("http://a.test"), ip)).toBe(first);
    // b.test is now the least recently used: the third origin closes its pool, not a.test's.
    q.get(new URL("http://c.test"), ip);
    expect(q.get(new URL("http://a.test"), ip)).toBe(first);
  });
});

// removeGuest destroyed its guest's pools: a request already at the upstream failed as the
// upstream's, 502 "UND_ERR_DESTROYED: The client is destroyed" (black-box finding). Stopped pools
// let such a request finish and refuse what has not gone out, with the removal's 403.
describe("stopped pools (the guest removed)", () => {
  /** An HTTP/1.1 upstream that holds `/held` until `release()`; counts the requests it saw. */
  async function heldServer(): Promise<{ port: number; arrived: Promise<void>; release: () => void; hits: () => number }> {
    let hits = 0;
    let answer: (() => void) | undefined;
    let arrive!: () => void;
    const arrived = new Promise<void>((resolve) => (arrive = resolve));
    const server = createServer((req, res) => {
      hits += 1;
      if (req.url !== "/held") return void res.end("ok");
      answer = () => res.end("late answer");
      arrive();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    onTestFinished(async () => {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    });
    return { port: (server.address() as AddressInfo).port, arrived, release: () => answer?.(), hits: () => hits };
  }
  const removed = (e: unknown): boolean => e instanceof EgressError && e.status === 403 && /guest "x" was removed/.test(e.message);

  it("a request already at an HTTP/1.1 upstream gets its answer; one asked for afterwards gets the removal's 403; the pool then closes", async () => {
    const up = await heldServer();
    const p = pools(() => undefined);
    const origin = new URL(`http://a.test:${up.port}`);
    const address = { ip: "127.0.0.1", family: 4 } as const;
    const pool = p.get(origin, address);
    const answering = pool.request({ path: "/held", method: "GET" });
    await up.arrived;
    void p.stop('guest "x" was removed while its request was under way');
    expect(() => p.get(origin, address)).toThrow(/guest "x" was removed/);
    up.release();
    const res = await answering;
    expect(res.statusCode).toBe(200);
    expect(await res.body.text()).toBe("late answer");
    await expect.poll(() => pool.closed).toBe(true);
    expect(up.hits()).toBe(1);
  });

  it("a request dispatched while its connection was still being made never reaches the upstream: 403", async () => {
    const up = await heldServer();
    const p = pools(() => undefined);
    const pool = p.get(new URL(`http://a.test:${up.port}`), { ip: "127.0.0.1", family: 4 });
    // undici starts the connection as the request is dispatched; it is made a few turns later.
    const attempt = pool.request({ path: "/", method: "GET" });
    void p.stop('guest "x" was removed while its request was under way');
    await expect(attempt).rejects.toSatisfy(removed);
    expect(up.hits()).toBe(0);
  });

  it("a stream already at an HTTP/2 upstream gets its answer; one asked for afterwards gets the removal's 403", async () => {
    let answer: (() => void) | undefined;
    let arrive!: () => void;
    const arrived = new Promise<void>((resolve) => (arrive = resolve));
    const upstream = await startH2Upstream({
      "/held": (stream) => {
        answer = () => {
          stream.respond({ ":status": 200 });
          stream.end("late answer");
        };
        arrive();
      },
    });
    const ca = await testCa();
    const p = new PinnedPools({
      upstreamContext: createSecureContext({ ca: ca.certPem }),
      maxPools: 2,
      connectionsPerPool: 2,
      connectTimeoutMs: 2_000,
      headersTimeoutMs: 5_000,
      bodyTimeoutMs: 5_000,
      keepAliveTimeoutMs: 10_000,
      h2PingMs: 10_000,
      recheck: () => undefined,
    });
    onTestFinished(() => p.destroy());
    const address = { ip: "127.0.0.1", family: 4 } as const;
    const signal = Object.assign(new EventEmitter(), { aborted: false });
    const send = (path: string): ReturnType<PinnedPools["sendH2"]> => p.sendH2({ method: "GET", url: new URL(`https://api.test:${upstream.port}${path}`), headers: [], body: null }, address, signal, false, 10);
    const answering = send("/held");
    await arrived;
    void p.stop('guest "x" was removed while its request was under way');
    await expect(send("/echo")).rejects.toSatisfy(removed);
    answer!();
    const res = await answering;
    expect(res?.status).toBe(200);
    let text = "";
    for await (const chunk of res!.body!) text += String(chunk);
    expect(text).toBe("late answer");
    expect(upstream.seen.map((headers) => headers[":path"])).toEqual(["/held"]);
  });
});

describe("retired HTTP/2 sessions (a reload)", () => {
  // close() once closed every session at once: an upload that had been given a session but not
  // yet opened its stream on it was then refused by Node ("session is closing") and, its body
  // streamed, could not go again (502). A session with streams handed out closes after them.
  it("send an upload given a session just before close() on that session, then close it", async () => {
    const upstream = await startH2Upstream();
    const ca = await testCa();
    let closed = 0;
    const p = new PinnedPools({
      upstreamContext: createSecureContext({ ca: ca.certPem }),
      maxPools: 2,
      connectionsPerPool: 2,
      connectTimeoutMs: 2_000,
      headersTimeoutMs: 2_000,
      bodyTimeoutMs: 2_000,
      keepAliveTimeoutMs: 10_000,
      h2PingMs: 10_000,
      recheck: () => undefined,
      onConnection: (_protocol, connection) => connection.once("close", () => (closed += 1)),
    });
    onTestFinished(() => p.destroy());
    const address = { ip: "127.0.0.1", family: 4 } as const;
    const url = new URL(`https://api.test:${upstream.port}/echo`);
    const signal = Object.assign(new EventEmitter(), { aborted: false });
    const send = (body: Readable | null) => p.sendH2({ method: body === null ? "GET" : "POST", url, headers: [], body }, address, signal, false, 10);
    const warm = await send(null);
    expect(warm?.status).toBe(200);
    for await (const _ of warm!.body!);
    // sendH2 takes the open session in this turn, and opens its stream on it a few microtasks on.
    const upload = send(Readable.from([Buffer.from("hello")]));
    void p.close();
    const res = await upload;
    expect(res?.status).toBe(200);
    let text = "";
    for await (const chunk of res!.body!) text += String(chunk);
    expect(JSON.parse(text)).toMatchObject({ headers: { ":method": "POST" }, bodyBytes: 5 });
    expect(upstream.connections()).toBe(1);
    // And the retired session closes once that stream is done.
    await expect.poll(() => closed).toBe(1);
  });
});

describe("a close-delimited body (no Content-Length, ends at the upstream's FIN)", () => {
  it("ends when the FIN arrives while the reader is behind (undici 7's parser paused at the end)", async () => {
    // The whole response in one segment; the FIN only once the client has its head. With a
    // one-byte highWaterMark the body's push refuses at once, so undici's parser is paused with
    // nothing left to parse when the FIN comes: the state a slow guest leaves it in.
    const body = Buffer.alloc(4096, 0x61);
    let upstreamSocket: Socket | undefined;
    const server = createNetServer((socket) => {
      upstreamSocket = socket;
      socket.once("data", () => socket.write(Buffer.concat([Buffer.from("HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n"), body])));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    onTestFinished(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const port = (server.address() as AddressInfo).port;
    const p = pools(() => undefined);
    const res = await p.get(new URL(`http://api.test:${port}`), { ip: "127.0.0.1", family: 4 }).request({ path: "/", method: "GET", highWaterMark: 1 });
    const finished = once(upstreamSocket!, "finish");
    upstreamSocket!.end();
    // On loopback the FIN is in the client's receive queue once the shutdown has returned; the
    // next poll phase of this (shared) event loop reads it, before the second check phase.
    await finished;
    for (let i = 0; i < 2; i++) await new Promise((resolve) => setImmediate(resolve));
    const received = await res.body.arrayBuffer();
    expect(Buffer.from(received).equals(body)).toBe(true);
  });
});

describe("sameAddress", () => {
  it.each([
    ["127.0.0.1", "127.0.0.1", true],
    ["::ffff:127.0.0.1", "127.0.0.1", true],
    // Node reports a mapped peer dotted; the approved literal is the URL parser's spelling.
    ["::ffff:127.0.0.1", "::ffff:7f00:1", true],
    ["::FFFF:7F00:1", "127.0.0.1", true],
    ["::ffff:127.0.0.1", "::ffff:7f00:2", false],
    ["::7f00:1", "127.0.0.1", false],
    ["64:ff9b::7f00:1", "127.0.0.1", false],
    ["::1", "0:0:0:0:0:0:0:1", true],
    ["fe80::1", "FE80:0::1", true],
    ["127.0.0.1", "127.0.0.2", false],
    ["::1", "127.0.0.1", false],
  ])("%s and %s are the same address: %s", (a, b, same) => {
    expect(sameAddress(a, b)).toBe(same);
  });
});

/**
 * A TCP relay to 127.0.0.1:`port` that passes the client's bytes on at `bytesPerSecond` (a slow
 * uplink) and the upstream's at once; after `blackHole()` it passes nothing either way (a peer
 * gone without a FIN).
 */
async function slowUplink(port: number, bytesPerSecond: number): Promise<{ port: number; blackHole: () => void }> {
  const sockets = new Set<Socket>();
  let dropping = false;
  const server = createNetServer((client) => {
    const up = netConnect(port, "127.0.0.1");
    for (const s of [client, up]) {
      sockets.add(s);
      s.on("error", () => undefined);
      s.once("close", () => sockets.delete(s));
    }
    up.on("data", (chunk: Buffer) => {
      if (!dropping) client.write(chunk);
    });
    const queue: Buffer[] = [];
    let queued = 0;
    client.on("data", (chunk: Buffer) => {
      queue.push(chunk);
      queued += chunk.length;
      if (queued > 64 * 1024) client.pause();
    });
    const tick = setInterval(() => {
      let budget = Math.floor(bytesPerSecond / 20);
      while (budget > 0 && queue.length > 0) {
        const head = queue[0]!;
        const part = head.subarray(0, budget);
        if (!dropping) up.write(part);
        budget -= part.length;
        queued -= part.length;
        if (part.length === head.length) queue.shift();
        else queue[0] = head.subarray(part.length);
      }
      if (queued <= 64 * 1024) client.resume();
    }, 50);
    client.once("close", () => {
      clearInterval(tick);
      up.destroy();
    });
    up.once("close", () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { port: (server.address() as AddressInfo).port, blackHole: () => (dropping = true) };
}

// The PING a busy session is sent queues behind the upload's own DATA; over a slow uplink to an
// upstream with large flow-control windows (nothing comes back while it reads), its answer took
// longer than h2PingMs and the proxy gave up a healthy upload (black-box finding: 4 MiB at
// 200 KiB/s, 502 at 14 s where HTTP/1.1 took 21 s).
describe("the liveness PING of an HTTP/2 session", () => {
  async function setUp(): Promise<{ send: (body: Readable | null, path?: string) => ReturnType<PinnedPools["sendH2"]>; blackHole: () => void }> {
    const upstream = await startH2Upstream({
      "/hold": (stream) => {
        stream.respond({ ":status": 200 });
        stream.write("part");
      },
    });
    // Large windows, as gRPC servers and CDNs set them: the upstream sends no WINDOW_UPDATE while it reads.
    upstream.server.on("session", (session) => session.setLocalWindowSize(32 * 1024 * 1024));
    upstream.server.updateSettings({ initialWindowSize: 16 * 1024 * 1024 });
    const link = await slowUplink(upstream.port, 256 * 1024);
    const ca = await testCa();
    const p = new PinnedPools({
      upstreamContext: createSecureContext({ ca: ca.certPem }),
      maxPools: 2,
      connectionsPerPool: 2,
      connectTimeoutMs: 2_000,
      headersTimeoutMs: 10_000,
      bodyTimeoutMs: 10_000,
      // A PING every 100 ms, given up after 300 ms without an answer.
      keepAliveTimeoutMs: 100,
      h2PingMs: 300,
      recheck: () => undefined,
    });
    onTestFinished(() => p.destroy());
    const signal = Object.assign(new EventEmitter(), { aborted: false });
    const send = (body: Readable | null, path = "/echo"): ReturnType<PinnedPools["sendH2"]> =>
      p.sendH2({ method: body === null ? "GET" : "POST", url: new URL(`https://api.test:${link.port}${path}`), headers: [], body }, { ip: "127.0.0.1", family: 4 }, signal, false, 10);
    return { send, blackHole: link.blackHole };
  }
  const size = 640 * 1024;
  const upload = (): Readable => Readable.from(Array.from({ length: 10 }, () => Buffer.alloc(size / 10, 117)));

  it("does not give up an upload going out over a slow link whose PING answer waits behind the upload's DATA", async () => {
    const { send } = await setUp();
    const started = performance.now();
    const res = await send(upload());
    // The link takes about 2.5 s: many times the 300 ms a PING's answer may take on an idle link.
    expect(performance.now() - started).toBeGreaterThan(1_500);
    expect(res?.status).toBe(200);
    let text = "";
    for await (const chunk of res!.body!) text += String(chunk);
    expect(JSON.parse(text)).toMatchObject({ bodyBytes: size });
  });

  it("still gives up within h2PingMs a session that goes silent once a PING has answered for its upload", async () => {
    const { send, blackHole } = await setUp();
    // A response under way keeps the session busy, and so sent PINGs.
    const held = await send(null, "/hold");
    const body = held!.body![Symbol.asyncIterator]();
    expect(String((await body.next()).value)).toBe("part");
    const res = await send(upload());
    for await (const _ of res!.body!);
    // A PING answered after the upload confirms its bytes arrived.
    await new Promise((resolve) => setTimeout(resolve, 500));
    blackHole();
    const started = performance.now();
    await expect(body.next()).rejects.toThrow(/stopped answering/);
    // Not upstreamBodyMs (10 s), nor the wait an upload not yet confirmed gets (upstreamHeadersMs, 10 s).
    expect(performance.now() - started).toBeLessThan(2_000);
  });
});
