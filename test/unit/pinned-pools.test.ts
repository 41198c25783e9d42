import { EventEmitter, once } from "node:events";
import { createServer } from "node:http";
import { createServer as createNetServer, type AddressInfo, type Socket } from "node:net";
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
    ["::1", "0:0:0:0:0:0:0:1", true],
    ["fe80::1", "FE80:0::1", true],
    ["127.0.0.1", "127.0.0.2", false],
    ["::1", "127.0.0.1", false],
  ])("%s and %s are the same address: %s", (a, b, same) => {
    expect(sameAddress(a, b)).toBe(same);
  });
});
