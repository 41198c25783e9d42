import { createServer as createHttpServer, type Server } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import { ProxyAgent, WebSocket } from "undici";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { WebSocketServer } from "ws";
import { createHttpHooks, type HttpHooksOptions } from "../../src/index.js";
import { basic, credentialsOf, startGuestsProxy, testNames, type GuestsProxy } from "../helpers/guests.js";
import { openRaw } from "../helpers/raw.js";
import { testCa } from "../helpers/test-ca.js";

// A WebSocket opened before a reload kept relaying after the reload took its host from its guest
// (the guest kept): new requests got 403, while the open relay echoed on for as long as it stayed
// open (black-box finding). A reload now judges every open relay of a kept guest again, by the
// checks that need no request: the allowlist for its host, the address rules for the address it
// is connected to, and its guest's identity.

/** A `ws` echo server on 127.0.0.1, in clear or over TLS for a.test and b.test; closed with the test. */
async function startEchoServer(tls: boolean): Promise<{ port: number; handshakes: () => number }> {
  let server: Server;
  if (tls) {
    const contexts = await (await testCa()).serverContexts(["a.test", "b.test"]);
    server = createHttpsServer({ SNICallback: (name: string, cb: (e: null, c: unknown) => void) => cb(null, contexts.get(name) ?? contexts.get("a.test")) } as never);
  } else server = createHttpServer();
  // Plain requests too: the keep-alive connection's next request, below.
  server.on("request", (_req, res) => res.end("ok"));
  let handshakes = 0;
  const wss = new WebSocketServer({ server });
  wss.on("connection", (socket) => {
    handshakes += 1;
    socket.on("message", (data, binary) => socket.send(data, { binary }));
    socket.on("error", () => undefined);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(async () => {
    for (const client of wss.clients) client.terminate();
    wss.close();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { port: (server.address() as AddressInfo).port, handshakes: () => handshakes };
}

type Transport = "wss in a tunnel" | "ws in a tunnel" | "ws in absolute form";

interface Relay {
  /** The text echoed back within 1 s, or undefined. */
  echo(text: string): Promise<string | undefined>;
  readonly closed: Promise<true>;
}

/** A guest's WebSocket through the proxy (undici's client), or why it did not open; `guest` is its name, or its proxy URL. */
async function openSocket(proxy: GuestsProxy, guest: string, transport: Transport, port: number, path = "/socket"): Promise<Relay | string> {
  const uri = guest.startsWith("http:") ? guest : credentialsOf(proxy, guest).proxyUrl;
  const agent = new ProxyAgent({ uri, requestTls: { ca: proxy.caCertPem }, proxyTunnel: transport !== "ws in absolute form" });
  onTestFinished(() => agent.close());
  const ws = new WebSocket(`${transport === "wss in a tunnel" ? "wss" : "ws"}://a.test:${port}${path}`, { dispatcher: agent } as never);
  onTestFinished(() => ws.close());
  const messages: string[] = [];
  const waiting: ((text: string) => void)[] = [];
  ws.addEventListener("message", (event) => {
    const text = String(event.data);
    const wake = waiting.shift();
    if (wake !== undefined) wake(text);
    else messages.push(text);
  });
  const closed = new Promise<true>((resolve) => ws.addEventListener("close", () => resolve(true)));
  const opened = await new Promise<string | true>((resolve) => {
    ws.addEventListener("open", () => resolve(true));
    ws.addEventListener("error", (event) => resolve(String((event as { message?: string }).message ?? "error")));
  });
  if (opened !== true) return opened;
  return {
    closed,
    echo: (text) => {
      if (ws.readyState !== WebSocket.OPEN) return Promise.resolve(undefined);
      ws.send(text);
      const queued = messages.shift();
      if (queued !== undefined) return Promise.resolve(queued);
      return new Promise((resolve) => {
        const timer = setTimeout(() => resolve(undefined), 1_000);
        waiting.push((echoed) => {
          clearTimeout(timer);
          resolve(echoed);
        });
      });
    },
  };
}

function opened(relay: Relay | string): Relay {
  if (typeof relay === "string") throw new Error(`the WebSocket did not open: ${relay}`);
  return relay;
}

/** A reload to these guests, with the test proxy's other options; `spread`: their hooks as a spread copy (`{ ...httpHooks }`). */
async function reloadTo(proxy: GuestsProxy, guests: Record<string, HttpHooksOptions>, spread = false): Promise<void> {
  const ca = await testCa();
  await proxy.reload({
    guests: Object.fromEntries(Object.entries(guests).map(([name, options]) => {
      const { httpHooks, env } = createHttpHooks(options);
      return [name, { httpHooks: spread ? { ...httpHooks } : httpHooks, env }];
    })),
    listen: { host: "127.0.0.1", port: 0 },
    upstreamCa: [ca.certPem],
    resolve: Object.fromEntries(testNames.map((name) => [name, ["127.0.0.1"]])),
  });
}

const before: HttpHooksOptions = { allowedHosts: ["a.test"], allowedInternalHosts: ["a.test"] };
const bob: HttpHooksOptions = { allowedInternalHosts: ["a.test"] };

/** What the reload makes of alice, and what becomes of her open relay. */
const changes = [
  { change: "host still allowed", alice: { allowedHosts: ["a.test", "b.test"], allowedInternalHosts: ["a.test"] }, relay: "keeps echoing", reason: undefined },
  { change: "host removed", alice: { allowedHosts: ["b.test"], allowedInternalHosts: ["b.test"] }, relay: "closes", reason: /closed by a reload: host "a\.test" is not in allowedHosts/ },
  { change: "guest removed", alice: undefined, relay: "closes", reason: undefined },
  { change: "allowedInternalHosts removed", alice: { allowedHosts: ["a.test"] }, relay: "closes", reason: /closed by a reload: host "a\.test" resolves to a loopback address/ },
] as const;

const transports: readonly Transport[] = ["wss in a tunnel", "ws in a tunnel", "ws in absolute form"];

describe("a reload judges the open WebSocket relays of a kept guest again", () => {
  it.each(changes.flatMap((row) => transports.map((transport) => [row.change, row.relay, transport, row] as const)))(
    "%s: alice's open relay %s (%s); bob's relay and the proxy keep serving",
    async (_change, outcome, transport, row) => {
      const upstream = await startEchoServer(transport === "wss in a tunnel");
      const proxy = await startGuestsProxy({ alice: before, bob });
      const aliceUrl = credentialsOf(proxy, "alice").proxyUrl;
      const alice = opened(await openSocket(proxy, aliceUrl, transport, upstream.port));
      const bobs = opened(await openSocket(proxy, "bob", transport, upstream.port));
      expect(await alice.echo("ping-1")).toBe("ping-1");
      expect(await bobs.echo("bob-1")).toBe("bob-1");

      await reloadTo(proxy, row.alice === undefined ? { bob } : { alice: row.alice, bob });

      if (outcome === "keeps echoing") {
        expect(await alice.echo("ping-2")).toBe("ping-2");
        expect(proxy.logs.find((l) => l["msg"] === "relays closed")).toBeUndefined();
      } else {
        const closed = await Promise.race([alice.closed, new Promise<false>((resolve) => setTimeout(() => resolve(false), 2_000))]);
        expect(closed).toBe(true);
        expect(await alice.echo("ping-2")).toBeUndefined();
        if (row.reason !== undefined) {
          const line = await vi.waitFor(() => {
            const found = proxy.logs.find((l) => l["msg"] === "relays closed");
            expect(found).toBeDefined();
            return found!;
          });
          expect(line).toMatchObject({ guest: "alice", relays: 1, targets: [expect.stringMatching(/a\.test:\d+\/socket$/)] });
          expect(line["reason"]).toMatch(row.reason);
        }
      }
      // A new WebSocket of alice's is judged by the new configuration.
      const fresh = await openSocket(proxy, aliceUrl, transport, upstream.port, "/fresh");
      if (row.change === "host still allowed") expect(await opened(fresh).echo("fresh")).toBe("fresh");
      else expect(typeof fresh).toBe("string");
      // Another guest's relay, and its new ones, are untouched.
      expect(await bobs.echo("bob-2")).toBe("bob-2");
      expect(await opened(await openSocket(proxy, "bob", transport, upstream.port, "/bob-fresh")).echo("bob-3")).toBe("bob-3");
    },
  );

  it("a guest reloaded with its hooks spread ({ ...httpHooks }) is judged by the configuration its generated functions carry", async () => {
    const upstream = await startEchoServer(false);
    const proxy = await startGuestsProxy({ alice: before, bob });
    const kept = opened(await openSocket(proxy, "alice", "ws in a tunnel", upstream.port));
    await reloadTo(proxy, { alice: before, bob }, true);
    expect(await kept.echo("kept")).toBe("kept");
    const cut = opened(await openSocket(proxy, "alice", "ws in a tunnel", upstream.port));
    await reloadTo(proxy, { alice: { allowedHosts: ["a.test"] }, bob }, true);
    expect(await Promise.race([cut.closed, new Promise<false>((resolve) => setTimeout(() => resolve(false), 2_000))])).toBe(true);
    expect(await kept.closed).toBe(true);
    const line = proxy.logs.find((l) => l["msg"] === "relays closed");
    expect(line).toMatchObject({ guest: "alice", relays: 2 });
    expect(line?.["reason"]).toMatch(/host "a\.test" resolves to a loopback address/);
  });

  it("an upgrade checked before a reload that took its host away, and switched after it, is answered 403 instead of relayed", async () => {
    const upstream = await startEchoServer(false);
    let arrive!: () => void;
    const arrived = new Promise<void>((resolve) => (arrive = resolve));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const proxy = await startGuestsProxy({
      alice: {
        ...before,
        // `/held` waits here, its checks under way, until the test lets it go after the reload.
        isRequestAllowed: async (request) => {
          if (new URL(request.url).pathname !== "/held") return true;
          arrive();
          await released;
          return true;
        },
      },
      bob,
    });
    const held = openSocket(proxy, "alice", "ws in a tunnel", upstream.port, "/held");
    await arrived;
    await reloadTo(proxy, { alice: { allowedHosts: ["b.test"] }, bob });
    release();
    expect(typeof (await held)).toBe("string");
    const line = await vi.waitFor(() => {
      const found = proxy.logs.find((l) => l["msg"] === "request" && typeof l["target"] === "string" && l["target"].includes("/held"));
      expect(found).toBeDefined();
      return found!;
    });
    expect(line).toMatchObject({ guest: "alice", status: 403, upgrade: true });
    expect(line["reason"]).toMatch(/host "a\.test" is not in allowedHosts/);
    expect(await opened(await openSocket(proxy, "bob", "ws in a tunnel", upstream.port)).echo("bob")).toBe("bob");
  });

  it("a kept guest's keep-alive connection judges its next request by the new configuration", async () => {
    const upstream = await startEchoServer(false);
    const proxy = await startGuestsProxy({ alice: before, bob });
    const raw = await openRaw(proxy.port);
    const auth = basic("alice", credentialsOf(proxy, "alice").token);
    const get = async (): Promise<number> => {
      raw.write(`GET http://a.test:${upstream.port}/plain HTTP/1.1\r\nHost: a.test:${upstream.port}\r\nProxy-Authorization: ${auth}\r\n\r\n`);
      return (await raw.readResponse()).status;
    };
    expect(await get()).toBe(200);
    await reloadTo(proxy, { alice: { allowedHosts: ["b.test"] }, bob });
    expect(await get()).toBe(403);
    expect(await get()).toBe(403);
  });
});
