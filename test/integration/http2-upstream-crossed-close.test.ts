import { createSecureServer, constants, type IncomingHttpHeaders, type Http2Session, type ServerHttp2Stream } from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import type { TLSSocket } from "node:tls";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import type { HttpHooksOptions } from "../../src/index.js";
import { fetchVia, startTestProxy } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";

// An HTTP/2 upstream that closes its connection with no GOAWAY (a FIN, or a reset) just as the
// proxy's next request goes out on it: the request was sent, got nothing, and the guest got 502
// "no response from upstream …" (fuzzer, h2guest seed 10 case 1153), where the same request to
// an HTTP/1.1 upstream whose keep-alive connection closed under it goes once more (README, "A
// request that crossed an upstream's keep-alive close is sent once more"). Servers and load
// balancers do end idle HTTP/2 connections with a bare FIN.

/** How the upstream ends its connection as a request's HEADERS arrive on it. */
const closeKinds = {
  "a FIN after its close_notify": (socket: TLSSocket) => void socket.end(),
  "a FIN without close_notify": (socket: TLSSocket) => void socket.destroy(),
  // The TLS socket's own TCP socket: a reset on the wire.
  "a reset": (socket: TLSSocket) => void (socket as TLSSocket & { _parent: Socket })._parent.resetAndDestroy(),
} as const;
type CloseKind = keyof typeof closeKinds;

interface Received {
  readonly connection: number;
  readonly method: string;
  readonly path: string;
}

interface UpstreamOptions {
  readonly kind: CloseKind;
  /** How many requests for /target it closes its connection under (any later one gets 200). */
  readonly times?: number;
  /** Sent on the stream before the close, once its bytes are on the wire. */
  readonly before?: (stream: ServerHttp2Stream, session: Http2Session) => void;
}

/**
 * An h2-only upstream (node:http2, ALPN `h2`): /warm answers 200 "warm"; the first `times`
 * requests for /target close their connection as their HEADERS arrive (before any body), and
 * later ones are answered 200 "done" once their body is in. `received` lists every request's
 * method and path with the number of the connection it came on (from 1).
 */
async function closingUpstream({ kind, times = 1, before }: UpstreamOptions): Promise<{ port: number; received: Received[] }> {
  const ca = await testCa();
  const context = (await ca.serverContexts(["api.test"])).get("api.test")!;
  const server = createSecureServer({ allowHTTP1: false, SNICallback: (_name: string, cb: (error: Error | null, ctx: typeof context) => void) => cb(null, context) } as Parameters<typeof createSecureServer>[0]);
  const received: Received[] = [];
  const sockets = new Map<Http2Session, TLSSocket>();
  const numbers = new Map<Http2Session, number>();
  /** TLS sockets by their peer's port: a session's own socket is a proxy that refuses end() and destroy(). */
  const byPeer = new Map<number, TLSSocket>();
  let closed = 0;
  server.on("secureConnection", (socket: TLSSocket) => {
    socket.on("error", () => undefined);
    byPeer.set(socket.remotePort!, socket);
  });
  server.on("stream", (stream: ServerHttp2Stream) => {
    const session = stream.session!;
    if (numbers.has(session)) return;
    session.on("error", () => undefined);
    sockets.set(session, byPeer.get(session.socket.remotePort!)!);
    numbers.set(session, numbers.size + 1);
  });
  server.on("stream", (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => {
    stream.on("error", () => undefined);
    const session = stream.session!;
    const method = String(headers[":method"]);
    const path = String(headers[":path"]);
    received.push({ connection: numbers.get(session)!, method, path });
    if (path === "/target" && closed < times) {
      closed += 1;
      const socket = sockets.get(session)!;
      if (before === undefined) {
        closeKinds[kind](socket);
        return;
      }
      before(stream, session);
      // What it sent must be on the wire before the close, or the close takes it along.
      const flushed = (): void => {
        if ((session.state.outboundQueueSize ?? 0) > 0 || socket.writableLength > 0) setImmediate(flushed);
        else closeKinds[kind](socket);
      };
      setImmediate(flushed);
      return;
    }
    stream.resume();
    stream.once("end", () => {
      stream.respond({ ":status": 200, "content-type": "text/plain" });
      stream.end(method === "HEAD" ? undefined : path === "/warm" ? "warm" : "done");
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(async () => {
    for (const session of sockets.keys()) session.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { port: (server.address() as AddressInfo).port, received };
}

/** A hook that rebuilds /target's request with its body as bytes: a body the proxy can send again. */
const rebuildBody: HttpHooksOptions["onRequest"] = async (request) =>
  new URL(request.url).pathname === "/target" ? new Request(request.url, { method: request.method, headers: request.headers, body: `${await request.text()}, rebuilt` }) : undefined;

type BodyShape = "no body" | "a body a hook built (bytes)" | "a body streamed through";

const rows: readonly (readonly [method: string, body: BodyShape, resent: boolean])[] = [
  ["GET", "no body", true],
  ["HEAD", "no body", true],
  ["OPTIONS", "no body", true],
  ["DELETE", "no body", true],
  ["PUT", "a body a hook built (bytes)", true],
  ["DELETE", "a body a hook built (bytes)", true],
  // It cannot be sent again: its bytes went to the upstream as they came.
  ["PUT", "a body streamed through", false],
  // Not idempotent: the upstream may have acted on it before its connection went.
  ["POST", "no body", false],
  ["POST", "a body a hook built (bytes)", false],
  ["PATCH", "a body a hook built (bytes)", false],
];

describe("a request whose h2 upstream connection closed under it, no GOAWAY, on a reused session", () => {
  for (const kind of Object.keys(closeKinds) as CloseKind[]) {
    it.each(rows)(`${kind}: %s with %s: resent %s`, async (method, body, resent) => {
      const upstream = await closingUpstream({ kind });
      const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], ...(body === "a body a hook built (bytes)" ? { onRequest: rebuildBody } : {}) });
      const origin = `https://api.test:${upstream.port}`;
      // The session the next request goes out on has carried this one.
      expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
      const res = await fetchVia(proxy, `${origin}/target`, body === "no body" ? { method } : { method, body: "payload" });
      expect(res.status, res.text).toBe(resent ? 200 : 502);
      if (resent) expect(res.text).toBe(method === "HEAD" ? "" : "done");
      else expect(res.text).toMatch(/upstream api\.test:\d+/);
      const sent = upstream.received.filter((r) => r.path === "/target");
      expect(sent).toEqual(resent ? [{ connection: 1, method, path: "/target" }, { connection: 2, method, path: "/target" }] : [{ connection: 1, method, path: "/target" }]);
      const lines = (): Record<string, unknown>[] => proxy.logs.filter((l) => l["msg"] === "request" && String(l["target"]).endsWith("/target"));
      await vi.waitFor(() => expect(lines()).toHaveLength(1));
      expect(lines()[0]).toMatchObject({ method, status: resent ? 200 : 502 });
      if (resent) expect(lines()[0]).toMatchObject({ resent: true });
      else expect(lines()[0]).not.toHaveProperty("resent");
      // The proxy serves on: the origin on a live connection, and nothing is sent twice more.
      expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
      expect(upstream.received.filter((r) => r.path === "/target")).toHaveLength(sent.length);
    });
  }
});

describe("a request whose h2 upstream may have acted on it is sent to it once", () => {
  it.each(Object.keys(closeKinds) as CloseKind[])("the first request on a new connection, closed under it by %s: 502, sent once", async (kind) => {
    const upstream = await closingUpstream({ kind });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const origin = `https://api.test:${upstream.port}`;
    const res = await fetchVia(proxy, `${origin}/target`);
    expect(res.status, res.text).toBe(502);
    expect(upstream.received).toEqual([{ connection: 1, method: "GET", path: "/target" }]);
    expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
  });

  // A reset may take the 103 with it before the proxy reads it: FINs only.
  it.each(["a FIN after its close_notify", "a FIN without close_notify"] as const)("a GET answered 103 and then closed by %s: 502, sent once", async (kind) => {
    const upstream = await closingUpstream({ kind, before: (stream) => stream.additionalHeaders({ ":status": 103, link: "</a>" }) });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const origin = `https://api.test:${upstream.port}`;
    expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
    const res = await fetchVia(proxy, `${origin}/target`);
    expect(res.status, res.text).toBe(502);
    expect(upstream.received.filter((r) => r.path === "/target")).toHaveLength(1);
    expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
  });

  // A GOAWAY whose last stream id is this stream's says the upstream may have processed it (RFC
  // 9113 §6.8); the close after it is no crossed idle close.
  it.each(["a FIN after its close_notify", "a FIN without close_notify"] as const)("a GET under a GOAWAY that covers it, then %s: 502, sent once", async (kind) => {
    const upstream = await closingUpstream({ kind, before: (stream, session) => session.goaway(constants.NGHTTP2_NO_ERROR, stream.id!) });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const origin = `https://api.test:${upstream.port}`;
    expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
    const res = await fetchVia(proxy, `${origin}/target`);
    expect(res.status, res.text).toBe(502);
    expect(upstream.received.filter((r) => r.path === "/target")).toHaveLength(1);
    expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
  });

  it.each(Object.keys(closeKinds) as CloseKind[])("a GET whose resend is closed under too (%s): sent twice, never a third time, 502, and the line says resent", async (kind) => {
    const upstream = await closingUpstream({ kind, times: 2 });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const origin = `https://api.test:${upstream.port}`;
    expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
    const res = await fetchVia(proxy, `${origin}/target`);
    expect(res.status, res.text).toBe(502);
    expect(upstream.received.filter((r) => r.path === "/target").map((r) => r.connection)).toEqual([1, 2]);
    await vi.waitFor(() => expect(proxy.logs.filter((l) => l["msg"] === "request" && String(l["target"]).endsWith("/target"))).toEqual([expect.objectContaining({ status: 502, resent: true })]));
    expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
  });
});
