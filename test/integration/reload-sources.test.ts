import { connect as h2Connect } from "node:http2";
import type { Socket } from "node:net";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { createHttpHooks, type HttpHooksOptions } from "../../src/index.js";
import { basic, credentialsOf, startGuestsProxy, testNames, type GuestsProxy } from "../helpers/guests.js";
import { h2Request } from "../helpers/h2-client.js";
import { openRaw, RawClient } from "../helpers/raw.js";
import { testCa } from "../helpers/test-ca.js";
import { startUpstream } from "../helpers/upstream.js";

// A tunnel known by its source address alone kept its guest after a reload took that address
// out of the guest's `sources` (or gave it to another guest): new CONNECTs from the address got
// 407, while the tunnels already open went on as the guest for as long as they stayed open
// (black-box finding). A tunnel opened with credentials still names its guest, and is kept.

const from = "127.0.0.5";

/** CONNECT from `from`, with credentials when given; the returned client is inside the tunnel. */
async function connectFrom(proxy: GuestsProxy, target: string, authorization?: string): Promise<RawClient> {
  const raw = await openRaw(proxy.port, { localAddress: from });
  raw.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${authorization !== undefined ? `Proxy-Authorization: ${authorization}\r\n` : ""}\r\n`);
  const res = await raw.readResponse({ forConnect: true });
  if (res.status !== 200) throw new Error(`CONNECT ${target} answered ${res.status}: ${res.body}`);
  return raw;
}

/** TLS inside the tunnel, offering `alpn`. */
async function tlsIn(proxy: GuestsProxy, tunnel: RawClient, alpn: "h2" | "http/1.1"): Promise<TLSSocket> {
  const socket = tlsConnect({ socket: tunnel.detach() as Socket, servername: "a.test", ca: proxy.caCertPem, ALPNProtocols: [alpn] });
  socket.on("error", () => undefined);
  onTestFinished(() => void socket.destroy());
  await new Promise<void>((resolve) => socket.once("secureConnect", () => resolve()));
  return socket;
}

/** One guest's requests, over HTTP/1.1 or HTTP/2 inside one tunnel: `get(path)` answers the status, or rejects when the tunnel is gone. */
interface Tunnel {
  get(path: string): Promise<number>;
  closesWithin(ms: number): Promise<boolean>;
}

async function openTunnel(proxy: GuestsProxy, port: number, protocol: "h1" | "h2", authorization?: string): Promise<Tunnel> {
  const tunnel = await connectFrom(proxy, `a.test:${port}`, authorization);
  const closesWithin = (ms: number): Promise<boolean> => tunnel.closesWithin(ms);
  if (protocol === "h1") {
    const client = new RawClient(await tlsIn(proxy, tunnel, "http/1.1"));
    return {
      get: async (path) => {
        client.write(`GET ${path} HTTP/1.1\r\nHost: a.test:${port}\r\n\r\n`);
        return (await client.readResponse()).status;
      },
      closesWithin,
    };
  }
  const socket = await tlsIn(proxy, tunnel, "h2");
  const session = h2Connect(`https://a.test:${port}`, { createConnection: () => socket });
  session.on("error", () => undefined);
  onTestFinished(() => void session.destroy());
  return { get: async (path) => (await h2Request(session, { ":path": path })).status, closesWithin };
}

describe("a reload that takes a source range from a guest", () => {
  it.each([
    ["h1", "removed"],
    ["h2", "removed"],
    ["h1", "moved to another guest"],
    ["h2", "moved to another guest"],
  ] as const)("%s: the guest's tunnels known by that address are closed (its request under way is the proxy's cut), with the range %s; a tunnel opened with credentials stays", async (protocol, change) => {
    const upstream = await startUpstream({ names: ["a.test"] });
    let arrive!: () => void;
    const arrived = new Promise<void>((resolve) => (arrive = resolve));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const carol: HttpHooksOptions = {
      allowedInternalHosts: ["a.test"],
      // `/held` waits here until the test lets it go: under way across the reload.
      isRequestAllowed: async (request) => {
        if (new URL(request.url).pathname !== "/held") return true;
        arrive();
        await released;
        return true;
      },
    };
    const proxy = await startGuestsProxy({ carol: { ...carol, sources: [`${from}/32`] }, alice: { allowedInternalHosts: ["a.test"] } });
    const carolAuth = basic("carol", credentialsOf(proxy, "carol").token);

    const bySource = await openTunnel(proxy, upstream.port, protocol);
    const byCredentials = await openTunnel(proxy, upstream.port, protocol, carolAuth);
    expect(await bySource.get("/echo")).toBe(200);
    expect(await byCredentials.get("/echo")).toBe(200);
    const held = bySource.get("/held").catch(() => "cut");
    await arrived;

    const ca = await testCa();
    const guests = change === "removed"
      ? { carol: { allowedInternalHosts: ["a.test"], sources: ["127.0.0.7/32"] }, alice: { allowedInternalHosts: ["a.test"] } }
      : { carol: { allowedInternalHosts: ["a.test"] }, alice: { allowedInternalHosts: ["a.test"], sources: [`${from}/32`] } };
    await proxy.reload({
      guests: Object.fromEntries(Object.entries(guests).map(([name, { sources, ...options }]) => {
        const { httpHooks, env } = createHttpHooks(options);
        return [name, { httpHooks, env, ...(sources !== undefined ? { sources } : {}) }];
      })),
      listen: { host: "127.0.0.1", port: 0 },
      upstreamCa: [ca.certPem],
      resolve: Object.fromEntries(testNames.map((name) => [name, ["127.0.0.1"]])),
    });
    release();

    // The tunnel known by its address alone is closed, whichever protocol it carries (an idle
    // HTTP/1.1 tunnel would close by itself only after the server's 5 s keep-alive timeout).
    expect(await bySource.closesWithin(2_000)).toBe(true);
    expect(await held).toBe("cut");
    await expect(bySource.get("/after")).rejects.toThrow();
    const cut = await vi.waitFor(() => {
      const line = proxy.logs.find((l) => l["msg"] === "request" && typeof l["target"] === "string" && l["target"].includes("/held"));
      expect(line).toBeDefined();
      return line!;
    });
    expect(cut).toMatchObject({ guest: "carol", status: 499 });
    expect(cut["reason"]).toMatch(/the proxy closed the connection: a reload took 127\.0\.0\.5 out of the guest "carol"'s sources/);
    expect(proxy.logs.find((l) => l["msg"] === "tunnels closed")).toMatchObject({ guest: "carol", tunnels: 1 });
    expect(upstream.seen.map((request) => new URL(request.url, "https://a.test").pathname)).not.toContain("/held");
    expect(upstream.seen.map((request) => new URL(request.url, "https://a.test").pathname)).not.toContain("/after");

    // The one opened with credentials still names carol, who still accepts them.
    expect(await byCredentials.get("/echo")).toBe(200);
    const last = proxy.logs.filter((l) => l["msg"] === "request" && l["status"] === 200).at(-1);
    expect(last?.["guest"]).toBe("carol");

    // A new tunnel from the address is the address's guest now, or nobody's.
    if (change === "removed") {
      const raw = await openRaw(proxy.port, { localAddress: from });
      raw.write(`CONNECT a.test:${upstream.port} HTTP/1.1\r\nHost: a.test:${upstream.port}\r\n\r\n`);
      expect((await raw.readResponse({ forConnect: true })).status).toBe(407);
    } else {
      const fresh = await openTunnel(proxy, upstream.port, protocol);
      expect(await fresh.get("/echo")).toBe(200);
      expect(proxy.logs.filter((l) => l["msg"] === "request" && l["status"] === 200).at(-1)?.["guest"]).toBe("alice");
    }
  });

  it("a tunnel whose address the reloaded guest still holds stays open as that guest", async () => {
    const upstream = await startUpstream({ names: ["a.test"] });
    const proxy = await startGuestsProxy({ carol: { allowedInternalHosts: ["a.test"], sources: [`${from}/32`] }, alice: { allowedInternalHosts: ["a.test"] } });
    const tunnel = await openTunnel(proxy, upstream.port, "h1");
    expect(await tunnel.get("/echo")).toBe(200);
    const ca = await testCa();
    const { httpHooks, env } = createHttpHooks({ allowedInternalHosts: ["a.test"] });
    const alice = createHttpHooks({ allowedInternalHosts: ["a.test"] });
    await proxy.reload({
      // A wider range that still holds the address.
      guests: { carol: { httpHooks, env, sources: ["127.0.0.4/30"] }, alice: { httpHooks: alice.httpHooks, env: alice.env } },
      listen: { host: "127.0.0.1", port: 0 },
      upstreamCa: [ca.certPem],
      resolve: Object.fromEntries(testNames.map((name) => [name, ["127.0.0.1"]])),
    });
    expect(await tunnel.get("/echo")).toBe(200);
    expect(proxy.logs.find((l) => l["msg"] === "tunnels closed")).toBeUndefined();
  });
});
