import { randomBytes } from "node:crypto";
import { constants as h2constants, type ServerHttp2Session } from "node:http2";
import { createServer as createHttpsServer } from "node:https";
import { connect as netConnect, createServer as createNetServer, type AddressInfo, type Socket } from "node:net";
import { createServer as createTlsServer, type SecureContext, type TLSSocket } from "node:tls";
import { request } from "undici";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { latch } from "../helpers/latch.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { flag, frame, frameType, indexed, literal, RawH2, requestBlock, rstStream, settings } from "../helpers/h2-frames.js";
import { startH2Upstream, startRawH2Upstream, type H2Route, type RawH2UpstreamOptions } from "../helpers/h2-upstream.js";
import { fetchVia, proxyAgent, startTestProxy } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { openTlsTunnel } from "../helpers/raw.js";
import { startUpstream, type Route } from "../helpers/upstream.js";

/** An HTTP/1.1 chunked response ending in a trailer section. */
const h1Trailers: Route = (_req, res) => {
  res.writeHead(200, { "content-type": "text/plain", trailer: "x-checksum" });
  res.write("chunked body");
  res.addTrailers({ "x-checksum": "h1-sum" });
  res.end();
};

/** An HTTP/1.1 guest's raw exchange inside a TLS tunnel, read to the connection's close. */
async function rawH1(proxyPort: number, authority: string, ca: string, path: string): Promise<string> {
  const client = await openTlsTunnel(proxyPort, authority, { ca });
  client.write(`GET ${path} HTTP/1.1\r\nHost: ${authority}\r\nTE: trailers\r\nConnection: close\r\n\r\n`);
  await client.closed;
  return client.pending();
}

describe("HTTP/2 upstreams", () => {
  it("an upstream that speaks only h2 answers HTTP/1.1 guests and HTTP/2 guests", async () => {
    const upstream = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const viaH1 = await fetchVia(proxy, `https://api.test:${upstream.port}/echo?from=h1`, { headers: { "x-guest": "one" } });
    expect(viaH1.status).toBe(200);
    const echo = JSON.parse(viaH1.text) as { headers: Record<string, string> };
    expect(echo.headers[":authority"]).toBe(`api.test:${upstream.port}`);
    expect(echo.headers[":path"]).toBe("/echo?from=h1");
    expect(echo.headers["x-guest"]).toBe("one");
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const viaH2 = await h2Request(session, { ":path": "/echo?from=h2", cookie: ["a=1", "b=2"], te: "trailers" });
    expect(viaH2.status).toBe(200);
    const echo2 = JSON.parse(viaH2.body.toString()) as { headers: Record<string, string> };
    expect(echo2.headers[":path"]).toBe("/echo?from=h2");
    expect(echo2.headers["te"]).toBe("trailers");
    // One upstream connection carried both guests' requests.
    expect(upstream.connections()).toBe(1);
  });

  it("the proxy follows an h2 upstream's redirect itself, checking the next hop again", async () => {
    const upstream = await startH2Upstream({
      "/go": (stream) => {
        stream.respond({ ":status": 302, location: "/echo?redirected=1" });
        stream.end();
      },
      "/away": (stream) => {
        stream.respond({ ":status": 302, location: "https://blocked.test/" });
        stream.end();
      },
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/go`);
    expect(res.status).toBe(200);
    expect((JSON.parse(res.text) as { headers: Record<string, string> }).headers[":path"]).toBe("/echo?redirected=1");
    const away = await fetchVia(proxy, `https://api.test:${upstream.port}/away`);
    expect(away.status).toBe(403);
    expect(away.text).toContain("blocked.test");
  });

  it("request bodies reach an h2 upstream, and 20 concurrent requests share its session", async () => {
    const upstream = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const answers = await Promise.all(
      Array.from({ length: 20 }, (_, i) => h2Request(session, { ":method": "POST", ":path": `/echo?i=${i}` }, Buffer.alloc(100_000 + i, 1))),
    );
    answers.forEach((answer, i) => expect((JSON.parse(answer.body.toString()) as { bodyBytes: number }).bodyBytes).toBe(100_000 + i));
    expect(upstream.connections()).toBe(1);
  });

  it("an upstream that ends its session after every stream (GOAWAY) keeps being served on new ones", async () => {
    const upstream = await startH2Upstream({
      "/once": (stream) => {
        const session = stream.session;
        stream.respond({ ":status": 200 });
        stream.end("once", () => session?.close());
      },
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    for (let i = 0; i < 4; i++) {
      const res = await fetchVia(proxy, `https://api.test:${upstream.port}/once`);
      expect(res.status).toBe(200);
      expect(res.text).toBe("once");
    }
    expect(upstream.connections()).toBeGreaterThan(1);
  });

  it("an HTTP/1.1 upstream keeps the connection that asked its ALPN: one TLS connection for three requests", async () => {
    const upstream = await startUpstream({
      routes: {
        "/port": (req, res) => {
          res.writeHead(200, { "content-type": "text/plain" });
          res.end(String(req.socket.remotePort));
        },
      },
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const ports = new Set<string>();
    for (let i = 0; i < 3; i++) {
      const res = await fetchVia(proxy, `https://api.test:${upstream.port}/port`);
      expect(res.status).toBe(200);
      ports.add(res.text);
    }
    expect(ports.size).toBe(1);
  });
});

/** An HTTPS server answering "h1" that offers only HTTP/1.1; close() takes it off its port. */
async function startHttp1Only(): Promise<{ port: number; close: () => Promise<void> }> {
  const context = (await (await testCa()).serverContexts(["api.test"])).get("api.test")!;
  const server = createHttpsServer({ SNICallback: (_name: string, cb: (err: Error | null, ctx?: SecureContext) => void) => cb(null, context) }, (_req, res) => res.end("h1"));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const close = async (): Promise<void> => {
    server.closeAllConnections();
    if (server.listening) await new Promise<void>((resolve) => server.close(() => resolve()));
  };
  onTestFinished(close);
  return { port: (server.address() as AddressInfo).port, close };
}

describe("an origin whose protocol changes", () => {
  it("an HTTP/1.1 origin replaced on its port by an h2-only server is asked ALPN again: 200, not 502 until a reload", async () => {
    const { port, close } = await startHttp1Only();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const before = await fetchVia(proxy, `https://api.test:${port}/`);
    expect(before.text).toBe("h1");
    await close();
    const h2 = await startH2Upstream({}, ["api.test"], port);
    // The "HTTP/1.1" answer was kept for good, and the pool offers only http/1.1 in ALPN: the
    // h2-only server refused every handshake (no_application_protocol) until a reload.
    const after = await fetchVia(proxy, `https://api.test:${port}/echo`);
    expect(after.status).toBe(200);
    expect((JSON.parse(after.text) as { headers: Record<string, string> }).headers[":path"]).toBe("/echo");
    expect(h2.connections()).toBe(1);
  });

  it("an upload streamed to an HTTP/1.1 origin now speaking only h2 fails once, with the TLS alert's name; the next request reaches it", async () => {
    const { port, close } = await startHttp1Only();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    expect((await fetchVia(proxy, `https://api.test:${port}/`)).text).toBe("h1");
    await close();
    await startH2Upstream({}, ["api.test"], port);
    // undici destroys a streamed body when its connection fails, so this one cannot go again.
    const upload = await fetchVia(proxy, `https://api.test:${port}/echo`, { method: "POST", body: "payload" });
    expect(upload.status).toBe(502);
    // OpenSSL's whole text ended in its source path and a newline.
    expect(upload.text).toMatch(/^502 Bad Gateway: upstream TLS failed for api\.test:\d+: ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL: tlsv1 alert no application protocol\n$/);
    const line = proxy.logs.find((l) => l["msg"] === "request" && l["status"] === 502);
    expect(line?.["reason"]).toMatch(/: tlsv1 alert no application protocol$/);
    const next = await fetchVia(proxy, `https://api.test:${port}/echo`, { method: "POST", body: "payload" });
    expect(next.status).toBe(200);
    expect((JSON.parse(next.text) as { bodyBytes: number }).bodyBytes).toBe(7);
  });
});

describe("streams an upstream holds", () => {
  // Downloads nobody reads hold their streams; with 4 sessions a guest's other requests to the
  // origin waited behind them (as the HTTP/1.1 pool's did when its cap was 64).
  it("past 4 sessions' worth of held streams, the next request opens another session rather than wait", async () => {
    const held: (() => void)[] = [];
    const upstream = await startH2Upstream({
      "/hold": (stream) => {
        stream.respond({ ":status": 200 });
        stream.write("part");
        held.push(() => stream.end());
      },
    });
    upstream.server.updateSettings({ maxConcurrentStreams: 5 });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const base = `https://api.test:${upstream.port}`;
    // One at a time, so each session has the upstream's SETTINGS before it is filled.
    const holding: Promise<{ text: string }>[] = [];
    for (let i = 1; i <= 20; i++) {
      holding.push(fetchVia(proxy, `${base}/hold`));
      await vi.waitFor(() => expect(held.length).toBe(i), { timeout: 10_000 });
    }
    expect(upstream.connections()).toBe(4);
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(200);
    expect(upstream.connections()).toBe(5);
    for (const release of held) release();
    for (const done of await Promise.all(holding)) expect(done.text).toBe("part");
  });
});

describe("an upstream that allows no streams", () => {
  // RFC 9113 §5.1.2: SETTINGS_MAX_CONCURRENT_STREAMS 0 lets no stream open. Each request opened a
  // connection of its own (three, with the two goes a refused stream gets), to 1,024 of them.
  it("SETTINGS_MAX_CONCURRENT_STREAMS 0: 4 connections at most, 502 past them, and served on them once the limit rises", async () => {
    const upstream = await startH2Upstream();
    upstream.server.updateSettings({ maxConcurrentStreams: 0 });
    const sessions: ServerHttp2Session[] = [];
    upstream.server.on("session", (session: ServerHttp2Session) => sessions.push(session));
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const url = `https://api.test:${upstream.port}/echo`;
    let last = { status: 0, text: "" };
    for (let i = 0; i < 8; i++) {
      last = await fetchVia(proxy, url);
      expect(last.status).toBe(502);
    }
    expect(upstream.connections()).toBeLessThanOrEqual(4);
    expect(last.text).toBe(`502 Bad Gateway: upstream api.test:${upstream.port} accepts no streams: its HTTP/2 connections say SETTINGS_MAX_CONCURRENT_STREAMS 0\n`);
    const opened = upstream.connections();
    await Promise.all(sessions.filter((session) => !session.closed).map((session) => new Promise<void>((resolve) => session.settings({ maxConcurrentStreams: 100 }, () => resolve()))));
    const served = await fetchVia(proxy, url);
    expect(served.status).toBe(200);
    expect(upstream.connections()).toBe(opened);
  });
});

describe("trailers", () => {
  it("h2 upstream to h2 guest: the trailers (grpc-status) arrive after the body", async () => {
    const upstream = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const res = await h2Request(session, { ":path": "/trailers", te: "trailers" });
    expect(res.body.toString()).toBe("body before trailers");
    expect(res.trailers?.["grpc-status"]).toBe("0");
    expect(res.trailers?.["x-checksum"]).toBe("abc123");
  });

  // Audit of issue 20: Node's HTTP/2 client takes te only as the one value "trailers". Two TE
  // lines naming it went as two fields, and the HTTP/1.1 guest got 502 ("HTTP/1 Connection
  // specific headers are forbidden"); a TE list naming it among others lost it.
  it("TE lines that name trailers, repeated or in a list, reach an h2 upstream as one te: trailers, from either guest", async () => {
    const upstream = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const authority = `api.test:${upstream.port}`;
    for (const fields of ["TE: trailers\r\nTE: trailers\r\n", "TE: gzip, trailers\r\n"]) {
      const client = await openTlsTunnel(proxy.port, authority, { ca: proxy.caCertPem });
      client.write(`GET /echo HTTP/1.1\r\nHost: ${authority}\r\n${fields}Connection: close\r\n\r\n`);
      await client.closed;
      const answer = client.pending();
      expect(answer.split("\r\n")[0], `${fields}: ${answer}`).toBe("HTTP/1.1 200 OK");
      expect(upstream.seen.at(-1)?.["te"]).toBe("trailers");
    }
    const guest = await RawH2.open(proxy.port, authority, proxy.caCertPem);
    guest.write(frame(frameType.headers, flag.endHeaders | flag.endStream, 1, requestBlock(authority, "/echo?h2", [literal("te", "trailers"), literal("te", "trailers")])));
    await guest.until((c) => c.answered(1) || c.resetCode(1) !== undefined);
    expect(upstream.seen.at(-1)?.[":path"]).toBe("/echo?h2");
    expect(upstream.seen.at(-1)?.["te"]).toBe("trailers");
    expect(upstream.seen).toHaveLength(3);
  });

  it("h2 upstream to an HTTP/1.1 guest: the trailers follow the last chunk", async () => {
    const upstream = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const raw = await rawH1(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem, "/trailers");
    expect(raw).toMatch(/transfer-encoding: chunked/i);
    expect(raw).toMatch(/\r\n0\r\n(?:[^\r\n]+\r\n)*grpc-status: 0\r\n/i);
    expect(raw).toMatch(/x-checksum: abc123\r\n/i);
  });

  it("HTTP/1.1 chunked upstream to HTTP/1.1 and HTTP/2 guests: the trailer section passes", async () => {
    const upstream = await startUpstream({ routes: { "/h1-trailers": h1Trailers } });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const raw = await rawH1(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem, "/h1-trailers");
    expect(raw).toMatch(/\r\n0\r\nx-checksum: h1-sum\r\n\r\n$/i);
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const res = await h2Request(session, { ":path": "/h1-trailers" });
    expect(res.body.toString()).toBe("chunked body");
    expect(res.trailers?.["x-checksum"]).toBe("h1-sum");
  });

  it("an onResponse hook that replaces the response drops the trailers; one that returns undefined keeps them", async () => {
    const upstream = await startH2Upstream();
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      onResponse: (response, request) => (new URL(request.url).searchParams.has("replace") ? new Response("replaced", response) : undefined),
    });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const kept = await h2Request(session, { ":path": "/trailers" });
    expect(kept.trailers?.["grpc-status"]).toBe("0");
    const replaced = await h2Request(session, { ":path": "/trailers?replace" });
    expect(replaced.body.toString()).toBe("replaced");
    expect(replaced.trailers?.["grpc-status"]).toBeUndefined();
  });

  // A trailer section that does not come through whole cuts the response after its head, and the
  // decision line says so; one that does reaches both guests whole. From an HTTP/1.1 upstream,
  // 20,000 bytes are over undici's 16 KiB (UND_ERR_HEADERS_OVERFLOW). From an HTTP/2 upstream,
  // 70,000 bytes are more than a Node upstream's nghttp2 sends in one header block (64 KiB): the
  // upstream fails to send them and resets its stream with FRAME_SIZE_ERROR, and the proxy never
  // sees them. The proxy's HTTP/2 server has the same bound towards its guests, so a section that
  // does arrive over 64 KiB (as RFC 9113 §6.5.2 counts it) is refused in
  // src/upstream/h2-exchange.ts (maxTrailerListBytes; http2-upstream-hostile.test.ts, "an h2
  // upstream's trailer section over 64 KiB"): a trailer section is never lost on the guest side
  // with a clean line.
  const sizes = [
    { upstream: "h1", bytes: 12_000, passes: true },
    { upstream: "h1", bytes: 20_000, passes: false },
    { upstream: "h2", bytes: 60_000, passes: true },
    { upstream: "h2", bytes: 70_000, passes: false },
  ] as const;
  for (const { upstream: kind, bytes, passes } of sizes) {
    it(`a ${bytes}-byte trailer from an ${kind === "h1" ? "HTTP/1.1" : "HTTP/2"} upstream ${passes ? "reaches" : "is refused for"} both guests, and the line says so`, async () => {
      const value = "t".repeat(bytes);
      const upstream =
        kind === "h1"
          ? await startUpstream({
              routes: {
                "/big": (_req, res) => {
                  res.writeHead(200, { "content-type": "text/plain", trailer: "x-big" });
                  res.write("body");
                  res.addTrailers({ "x-big": value });
                  res.end();
                },
              },
            })
          : await startH2Upstream({
              "/big": (stream) => {
                stream.respond({ ":status": 200 }, { waitForTrailers: true });
                stream.once("wantTrailers", () => stream.sendTrailers({ "x-big": value }));
                stream.end("body");
              },
            });
      const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
      const authority = `api.test:${upstream.port}`;
      const session = await h2Session(proxy.port, authority, proxy.caCertPem, { maxHeaderListSize: 128 * 1024 });
      // Settled either way before the HTTP/1.1 guest's turn, so a reset is not an unhandled rejection meanwhile.
      const viaH2 = h2Request(session, { ":path": "/big", te: "trailers" }).then((answer) => ({ answer }), (error: Error) => ({ error }));
      const raw = await rawH1(proxy.port, authority, proxy.caCertPem, "/big");
      const lines = (): Record<string, unknown>[] => proxy.logs.filter((line) => line["msg"] === "request");
      if (passes) {
        const got = await viaH2;
        expect("answer" in got && got.answer.trailers?.["x-big"]).toBe(value);
        expect(raw).toContain(`\r\n0\r\nx-big: ${value}\r\n\r\n`);
        await vi.waitFor(() => expect(lines()).toHaveLength(2));
        for (const line of lines()) {
          expect(line["status"]).toBe(200);
          expect(line["error"]).toBeUndefined();
        }
      } else {
        const got = await viaH2;
        expect("error" in got && got.error.message).toMatch(/reset with code|NGHTTP2_INTERNAL_ERROR/);
        expect(raw).not.toContain("x-big");
        expect(raw).not.toMatch(/\r\n0\r\n\r\n$/);
        await vi.waitFor(() => expect(lines()).toHaveLength(2));
        for (const line of lines()) expect(String(line["error"])).toMatch(kind === "h1" ? /UND_ERR_HEADERS_OVERFLOW/ : /FRAME_SIZE_ERROR/);
      }
      // The proxy serves on.
      expect((await fetchVia(proxy, `https://${authority}/`)).status).toBeLessThan(500);
    });
  }
});

/**
 * A TLS server that speaks just enough HTTP/2 by hand: on its first connection it answers the
 * first request with GOAWAY(last stream 0) and closes, so that request was never processed
 * (RFC 9113 §6.8); on later connections it answers `:status 200` with no body.
 */
/**
 * A TCP relay to 127.0.0.1:`port`. After `hold()`, the upstream's bytes are kept until its FIN,
 * then sent with the FIN in one burst, and what the proxy writes after that is dropped (an
 * upstream that tolerates the half-close); `release()` ends holding for new connections.
 */
async function burstRelay(port: number): Promise<{ port: number; hold: () => void; release: () => void }> {
  let holding = false;
  const sockets = new Set<Socket>();
  const server = createNetServer({ allowHalfOpen: true }, (client) => {
    const up = netConnect({ port, host: "127.0.0.1", allowHalfOpen: true });
    for (const s of [client, up]) {
      sockets.add(s);
      s.once("close", () => sockets.delete(s));
    }
    const held: Buffer[] = [];
    let holds = false;
    let finished = false;
    client.on("data", (data: Buffer) => {
      if (!finished) up.write(data);
    });
    up.on("data", (data: Buffer) => {
      holds ||= holding;
      if (holds) held.push(data);
      else client.write(data);
    });
    up.on("end", () => {
      finished = true;
      client.end(Buffer.concat(held));
    });
    client.on("end", () => up.end());
    const cut = (): void => {
      client.destroy();
      up.destroy();
    };
    client.on("error", cut);
    up.on("error", cut);
    client.on("close", () => up.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return {
    port: (server.address() as AddressInfo).port,
    hold: () => (holding = true),
    release: () => (holding = false),
  };
}

/** An h2-only upstream written frame by frame, each request's HEADERS answered by `onHeaders`. */
function rawH2Upstream(onHeaders: NonNullable<RawH2UpstreamOptions["onHeaders"]>): Promise<{ port: number; connections: () => number }> {
  return startRawH2Upstream({ onHeaders });
}

/**
 * Answers each stream with a 200 head and 1000 bytes, then RST_STREAM with `code` and no
 * END_STREAM: a body cut by the upstream, the way Node's client ends quietly.
 */
function resetMidBody(code: number): Promise<{ port: number }> {
  return rawH2Upstream((socket, stream) => {
    const rst = Buffer.alloc(4);
    rst.writeUInt32BE(code);
    // HPACK static table entry 8 is `:status: 200`.
    socket.write(Buffer.concat([frame(frameType.headers, flag.endHeaders, stream, indexed(8)), frame(frameType.data, 0, stream, Buffer.alloc(1000, 120)), frame(frameType.rstStream, 0, stream, rst)]));
  });
}

/** The first connection gets GOAWAY before any stream is processed; later ones a 200 per stream. */
function goAwayFirst(): Promise<{ port: number; connections: () => number }> {
  return rawH2Upstream((socket, stream, connection) => {
    if (connection === 1) {
      // Last stream id 0, INTERNAL_ERROR: with NO_ERROR nghttp2 itself would close the stream
      // REFUSED_STREAM; with an error code only the last stream id says it was not processed.
      const payload = Buffer.alloc(8);
      payload.writeUInt32BE(0x2, 4);
      socket.end(frame(frameType.goaway, 0, 0, payload));
      return;
    }
    // HPACK static table entry 8 is `:status: 200`.
    socket.write(frame(frameType.headers, flag.endStream | flag.endHeaders, stream, indexed(8)));
  });
}

// Once nghttp2 finds a frame it cannot take, it sends GOAWAY and stops reading, and Node never
// learns: the response under way waited for upstreamBodyMs, and every request to the origin went
// to the same dead session and got 504 (black-box finding). A PING now finds it out.
describe("an h2 upstream that sends a frame the proxy cannot take", () => {
  const ok = (socket: TLSSocket, stream: number): void => void socket.write(frame(frameType.headers, flag.endStream | flag.endHeaders, stream, indexed(8)));
  const shapes: Record<string, (socket: TLSSocket, stream: number) => void> = {
    "a DATA frame over the frame size": (socket, stream) => {
      socket.write(Buffer.concat([frame(frameType.headers, flag.endHeaders, stream, indexed(8)), frame(frameType.data, 0, stream, Buffer.from("part-"))]));
      setTimeout(() => socket.write(frame(frameType.data, flag.endStream, stream, Buffer.alloc(20_000, 97))), 50);
    },
    "DATA before HEADERS": (socket, stream) => void socket.write(frame(frameType.data, flag.endStream, stream, Buffer.from("before"))),
    "a broken header block": (socket, stream) => void socket.write(frame(frameType.headers, flag.endHeaders, stream, Buffer.from([0xff, 0xff, 0xff, 0xff, 0x0f]))),
  };
  for (const [shape, bad] of Object.entries(shapes)) {
    it(`${shape}: that request fails, and the requests sent on the dead session meanwhile are answered, each within the 4 s keep-alive plus h2PingMs`, async () => {
      const upstream = await rawH2Upstream((socket, stream, connection) => (connection === 1 && stream === 1 ? bad(socket, stream) : ok(socket, stream)));
      // Far above what the test waits for: a 504 here would mean the dead session was not found out.
      const timeouts = { upstreamHeadersMs: 30_000, upstreamBodyMs: 30_000, h2PingMs: 300 };
      const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
      const base = `https://api.test:${upstream.port}`;
      const first = fetchVia(proxy, `${base}/first`).then(
        (res) => res.status,
        () => "cut",
      );
      // Requests keep coming for longer than the keep-alive: a liveness check timed by the
      // session's own timer, which what the proxy sends refreshes, never asked (review finding).
      const answers: Promise<{ status: number; ms: number }>[] = [];
      for (let i = 0; i < 8; i++) {
        await new Promise((resolve) => setTimeout(resolve, 600));
        const sent = performance.now();
        // Never sent on the dead session (nghttp2 sends nothing after its GOAWAY): a GET goes once
        // more on a new connection, as after a stale keep-alive connection.
        answers.push(fetchVia(proxy, `${base}/next-${i}`).then((res) => ({ status: res.status, ms: performance.now() - sent })));
      }
      for (const answer of await Promise.all(answers)) {
        expect(answer.status).toBe(200);
        expect(answer.ms).toBeLessThan(7_500);
      }
      expect(["cut", 502]).toContain(await first);
      expect(upstream.connections()).toBe(2);
    }, 40_000);
  }
});

// After such a frame nghttp2 holds every frame the proxy queues (no error, no close, no FIN seen),
// so a stream put on the dead session sat unsent until the PING sent every 4 s went unanswered for
// h2PingMs (fuzzer finding). A PING now goes out as a session is reused, and one nghttp2 holds
// unsent gives the session up at once. h2PingMs is 30 s and upstreamHeadersMs 60 s, above the
// test's own timeout: only the held PING can answer these requests in time.
describe("an h2 session nghttp2 ended on a bad frame, reused", () => {
  const timeouts = { upstreamHeadersMs: 60_000, upstreamBodyMs: 60_000, h2PingMs: 30_000 };
  const ok = (socket: TLSSocket, stream: number): void => void socket.write(frame(frameType.headers, flag.endStream | flag.endHeaders, stream, indexed(8)));
  const bad: Record<string, (stream: number) => Buffer> = {
    "padding longer than its DATA frame": (stream) => frame(frameType.data, 0x8, stream, Buffer.from([200, 1, 2])),
    "DATA where CONTINUATION was due": (stream) => Buffer.concat([frame(frameType.headers, 0, stream, indexed(8)), frame(frameType.data, flag.endStream, stream, Buffer.from("x"))]),
    "a broken header block": (stream) => frame(frameType.headers, flag.endHeaders, stream, Buffer.from([0xff, 0xff, 0xff, 0xff, 0x0f])),
    "a PING of 5 bytes": () => frame(frameType.ping, 0, 0, Buffer.alloc(5)),
    "DATA on stream 0": () => frame(frameType.data, 0, 0, Buffer.alloc(5)),
  };
  /** The upstream's first connection answers its first stream with `badFrame` (after a 200 when `answered`). */
  async function deadAfter(badFrame: (stream: number) => Buffer, answered: boolean): Promise<{ port: number; connections: () => number; goaway: Promise<number> }> {
    const [goaway, sawGoaway] = latch<number>();
    const upstream = await startRawH2Upstream({
      onHeaders: (socket, stream, connection) => {
        if (connection !== 1 || stream !== 1) return ok(socket, stream);
        socket.write(answered ? Buffer.concat([frame(frameType.headers, flag.endStream | flag.endHeaders, stream, indexed(8)), badFrame(stream)]) : badFrame(stream));
      },
      // The proxy's GOAWAY with an error code: its HTTP/2 client has refused the frame and ended the session.
      onFrame: (type, _flags, _stream, payload, connection) => {
        if (type === frameType.goaway && connection === 1) sawGoaway(payload.readUInt32BE(4));
      },
    });
    return { ...upstream, goaway };
  }
  for (const [shape, badFrame] of Object.entries(bad)) {
    it(`${shape} under a request: it fails with 502, and the next request is answered on a new connection`, async () => {
      const upstream = await deadAfter(badFrame, false);
      const other = await startUpstream();
      const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
      const base = `https://api.test:${upstream.port}`;
      const first = fetchVia(proxy, `${base}/first`);
      expect(await upstream.goaway).not.toBe(0);
      // Another origin is served while the dead session is in the pool.
      expect((await fetchVia(proxy, `https://api.test:${other.port}/echo`)).status).toBe(200);
      const second = await fetchVia(proxy, `${base}/second`);
      expect(second.status).toBe(200);
      const failed = await first;
      expect(failed.status).toBe(502);
      expect(failed.text).toContain("could not take (its PING stayed unsent)");
      expect(upstream.connections()).toBe(2);
    }, 20_000);
  }
  it("a bad frame after the last answer: a request on the idle session is answered on a new connection", async () => {
    const upstream = await deadAfter(bad["a PING of 5 bytes"]!, true);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
    const base = `https://api.test:${upstream.port}`;
    expect((await fetchVia(proxy, `${base}/first`)).status).toBe(200);
    expect(await upstream.goaway).not.toBe(0);
    // Its HEADERS never left: the request goes again, on a new connection.
    const second = await fetchVia(proxy, `${base}/second`);
    expect(second.status).toBe(200);
    expect(upstream.connections()).toBe(2);
  }, 20_000);

  it("a slow upstream keeps its session: the PING at reuse is answered, and both requests are answered on one connection", async () => {
    let held: { socket: TLSSocket; stream: number } | undefined;
    const pingsBeforeSecond: number[] = [];
    let pings = 0;
    const upstream = await startRawH2Upstream({
      onFrame: (type, flags) => {
        if (type === frameType.ping && (flags & flag.ack) === 0) pings += 1;
      },
      onHeaders: (socket, stream) => {
        // The first request is answered only once the second has come.
        if (held === undefined) {
          held = { socket, stream };
          return;
        }
        pingsBeforeSecond.push(pings);
        ok(held.socket, held.stream);
        ok(socket, stream);
      },
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
    const base = `https://api.test:${upstream.port}`;
    const first = fetchVia(proxy, `${base}/first`);
    await vi.waitFor(() => expect(held).toBeDefined());
    expect((await fetchVia(proxy, `${base}/second`)).status).toBe(200);
    expect((await first).status).toBe(200);
    // The PING at reuse went out ahead of the second request's HEADERS, and was answered.
    expect(pingsBeforeSecond).toHaveLength(1);
    expect(pingsBeforeSecond[0]).toBeGreaterThan(0);
    expect(upstream.connections()).toBe(1);
  }, 20_000);

  it("an upload the upstream stops reading keeps its session: the PING at reuse waits behind the write, and both requests are answered", async () => {
    const upload = 32 * 1024 * 1024;
    let paused: TLSSocket | undefined;
    let bodyBytes = 0;
    const waiting: { socket: TLSSocket; stream: number }[] = [];
    const upstream = await startRawH2Upstream({
      // Windows of 2^31-1: nothing but the upstream's unread socket holds the upload back.
      greet: (socket) => {
        const increment = Buffer.alloc(4);
        increment.writeUInt32BE(0x7fffffff - 65_535);
        socket.write(Buffer.concat([settings([[0x4, 0x7fffffff]]), frame(frameType.windowUpdate, 0, 0, increment)]));
      },
      onFrame: (type, flags, stream, payload) => {
        if (type !== frameType.data) return;
        bodyBytes += payload.length;
        if ((flags & flag.endStream) !== 0) waiting.push({ socket: paused!, stream });
      },
      onHeaders: (socket, stream) => {
        if (paused === undefined) {
          paused = socket;
          socket.pause();
          return;
        }
        ok(socket, stream);
      },
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
    const base = `https://api.test:${upstream.port}`;
    const post = fetchVia(proxy, `${base}/upload`, { method: "POST", body: Buffer.alloc(upload, 97) });
    // The 32 MiB upload's first HEADERS comes after a CONNECT, two TLS handshakes and an ALPN answer:
    // on a loaded machine that took longer than waitFor's default second (on the tree before too).
    await vi.waitFor(() => expect(paused).toBeDefined(), { timeout: 10_000 });
    // The proxy's writes to the upstream fill the kernel's buffers, then wait.
    await new Promise((resolve) => setTimeout(resolve, 500));
    const get = fetchVia(proxy, `${base}/after`);
    await new Promise((resolve) => setTimeout(resolve, 200));
    paused!.resume();
    expect((await get).status).toBe(200);
    await vi.waitFor(() => expect(waiting).toHaveLength(1), { timeout: 10_000 });
    ok(waiting[0]!.socket, waiting[0]!.stream);
    expect((await post).status).toBe(200);
    expect(bodyBytes).toBe(upload);
    expect(upstream.connections()).toBe(1);
  }, 20_000);
});

// A status under 100 was not refused: HTTP/2 guests had their stream reset and HTTP/1.1 guests got
// "internal error"; from an HTTP/1.1 upstream, the 502 quoted undici's assertion (black-box finding).
// RFC 9113 §8.1: a server may answer before the request body is done, ending the stream and
// then resetting it with NO_ERROR to stop the upload.
describe("an h2 upstream that answers before the upload is done", () => {
  it("a 413 with END_STREAM and RST_STREAM(NO_ERROR) in one write reaches an HTTP/1.1 guest whole, and its log line records no error", async () => {
    const answer = "complete response body\n";
    const upstream = await rawH2Upstream((socket, stream) => {
      const head = Buffer.concat([literal(":status", "413"), literal("content-length", String(answer.length))]);
      // No WINDOW_UPDATE is ever sent: the upload is still under way when the answer comes.
      socket.write(Buffer.concat([frame(frameType.headers, flag.endHeaders, stream, head), frame(frameType.data, flag.endStream, stream, Buffer.from(answer)), rstStream(stream, 0)]));
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const authority = `api.test:${upstream.port}`;
    const client = await openTlsTunnel(proxy.port, authority, { ca: proxy.caCertPem });
    const upload = 1024 * 1024;
    client.write(`POST /upload HTTP/1.1\r\nHost: ${authority}\r\nContent-Length: ${upload}\r\n\r\n`);
    client.write(Buffer.alloc(upload, 97));
    const res = await client.readResponse();
    expect(res.status).toBe(413);
    expect(res.body).toBe(answer);
    // The request body was still piped into the stream Node had ended: "write after end", on the
    // stream that is also the response body, logged as the response's error.
    const line = await vi.waitFor(() => {
      const found = proxy.logs.find((l) => l["msg"] === "request");
      expect(found).toBeDefined();
      return found!;
    });
    expect(line["status"]).toBe(413);
    expect(line["error"]).toBeUndefined();
  });
});

describe("an upstream status under 100", () => {
  async function rawH1Upstream(status: string): Promise<{ port: number }> {
    const ca = await testCa();
    const context = (await ca.serverContexts(["api.test"])).get("api.test")!;
    const server = createTlsServer({ SNICallback: (_name, cb) => cb(null, context), ALPNProtocols: ["http/1.1"] }, (socket) => {
      socket.on("error", () => undefined);
      socket.once("data", () => socket.end(`HTTP/1.1 ${status} Odd\r\ncontent-length: 2\r\n\r\nok`));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    onTestFinished(() => new Promise<void>((resolve) => server.close(() => resolve())));
    return { port: (server.address() as AddressInfo).port };
  }
  for (const status of ["099", "001"]) {
    for (const upstreamProtocol of ["HTTP/1.1", "HTTP/2"] as const) {
      for (const guest of ["HTTP/1.1", "HTTP/2"] as const) {
        it(`${status} from an ${upstreamProtocol} upstream: a plain 502 to the ${guest} guest, and the proxy keeps serving`, async () => {
          const upstream =
            upstreamProtocol === "HTTP/2"
              ? await rawH2Upstream((socket, stream) => void socket.write(frame(frameType.headers, flag.endStream | flag.endHeaders, stream, literal(":status", status))))
              : await rawH1Upstream(status);
          const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
          const authority = `api.test:${upstream.port}`;
          let answer: { status: number; text: string };
          if (guest === "HTTP/1.1") answer = await fetchVia(proxy, `https://${authority}/odd`);
          else {
            const res = await h2Request(await h2Session(proxy.port, authority, proxy.caCertPem), { ":path": "/odd" });
            answer = { status: res.status, text: res.body.toString() };
          }
          expect(answer.status).toBe(502);
          expect(answer.text).toMatch(upstreamProtocol === "HTTP/2" ? /answered status \d+, which is not an HTTP status/ : /sent a response the proxy could not read/);
          expect(answer.text).not.toMatch(/assert|internal error/i);
          expect(proxy.logs.some((l) => l["level"] === "error")).toBe(false);
          const good = await startUpstream();
          expect((await fetchVia(proxy, `https://api.test:${good.port}/echo`)).status).toBe(200);
        });
      }
    }
  }
});

describe("an upstream connection that ends under the proxy", () => {
  // Far above anything the tests wait for: a 504 here would mean the proxy missed the close.
  const timeouts = { upstreamHeadersMs: 20_000, upstreamBodyMs: 20_000 };

  it("cut while a request waits for its head (no GOAWAY): 502 at once, and the origin is served on a new connection", async () => {
    const [arrived, waiting] = latch();
    const upstream = await startH2Upstream({ "/wait": () => waiting() });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
    const started = performance.now();
    const pending = fetchVia(proxy, `https://api.test:${upstream.port}/wait`);
    await arrived;
    upstream.cut();
    const res = await pending;
    expect(res.status).toBe(502);
    expect(performance.now() - started).toBeLessThan(timeouts.upstreamHeadersMs / 2);
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
    expect(upstream.connections()).toBe(2);
  });

  it("cut while the session is idle: the next requests reach the origin on a new connection, none waits for a timeout", async () => {
    const upstream = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
    upstream.cut();
    const started = performance.now();
    // The close reaches the proxy a moment after the cut: a request sent on the session in that
    // moment fails (502), and the next one must get through.
    const statuses: number[] = [];
    for (let i = 0; i < 3 && !statuses.includes(200); i++) statuses.push((await fetchVia(proxy, `https://api.test:${upstream.port}/echo`)).status);
    expect(statuses.at(-1)).toBe(200);
    for (const status of statuses.slice(0, -1)) expect(status).toBe(502);
    expect(performance.now() - started).toBeLessThan(timeouts.upstreamHeadersMs / 2);
    expect(upstream.connections()).toBe(2);
    // And the proxy keeps serving.
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
  });

  // The h2 path opened the upstream stream after the hooks without looking at the guest: a
  // request a hook held went to the upstream (HEADERS with END_STREAM) after the guest had left,
  // and only then was reset (black-box finding). undici refuses an aborted request itself.
  it.each(["its HTTP/1.1 connection closed", "its HTTP/2 stream reset"] as const)("a guest that left (%s) while a hook held its request: the h2 upstream never sees it", async (how) => {
    const upstream = await startH2Upstream();
    const [inHook, hookHas] = latch();
    const [released, release] = latch();
    const proxy = await startTestProxy(
      {
        allowedInternalHosts: ["api.test"],
        onRequest: async (request) => {
          if (new URL(request.url).pathname !== "/held") return;
          hookHas();
          await released;
        },
      },
      { timeouts, metrics: true },
    );
    const authority = `api.test:${upstream.port}`;
    if (how === "its HTTP/1.1 connection closed") {
      const client = await openTlsTunnel(proxy.port, authority, { ca: proxy.caCertPem });
      client.write(`GET /held HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
      await inHook;
      client.socket.destroy();
      // The proxy has seen the close once the tunnel is gone.
      await vi.waitFor(async () => expect(await proxy.metrics()).toMatch(/^egressgate_open_tunnels 0$/m), { timeout: 10_000 });
    } else {
      const session = await h2Session(proxy.port, authority, proxy.caCertPem);
      const stream = session.request({ ":method": "GET", ":path": "/held" });
      stream.on("error", () => undefined);
      await inHook;
      stream.close(8);
      // A PING's answer comes after the proxy has read the RST_STREAM before it.
      await new Promise<void>((resolve, reject) => session.ping((error) => (error ? reject(error) : resolve())));
    }
    release();
    await vi.waitFor(() => expect(proxy.logs.find((line) => line["msg"] === "request" && String(line["target"]).includes("/held"))?.["status"]).toBe(499), { timeout: 10_000 });
    expect(upstream.seen.map((headers) => headers[":path"])).not.toContain("/held");
    expect((await fetchVia(proxy, `https://${authority}/echo`)).status).toBe(200);
    expect(upstream.seen.map((headers) => headers[":path"])).toEqual(["/echo"]);
  });

  // Node's client ends the body of a stream the upstream reset with NO_ERROR or CANCEL as if it
  // were whole: guests got a clean end (END_STREAM, or the last chunk) and a 200 in the log
  // (black-box finding).
  for (const [codeName, code] of [["NO_ERROR", 0], ["CANCEL", 8]] as const) {
    for (const hook of ["no hook", "a tier-3 pass-through"] as const) {
      it.each(["HTTP/1.1", "HTTP/2"] as const)(`a body the h2 upstream resets with ${codeName} mid-way (${hook}) never reaches the %s guest as whole`, async (guest) => {
        const upstream = await resetMidBody(code);
        const proxy = await startTestProxy(
          { allowedInternalHosts: ["api.test"], ...(hook === "no hook" ? {} : { onResponse: (response: Response) => new Response(response.body, response) }) },
          { timeouts },
        );
        const url = `https://api.test:${upstream.port}/cut`;
        let outcome: string;
        if (guest === "HTTP/1.1") {
          const res = await request(url, { dispatcher: proxyAgent(proxy) });
          outcome = await res.body.text().then(
            (text) => `${res.statusCode} whole (${text.length} bytes)`,
            () => `${res.statusCode} cut`,
          );
        } else {
          const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
          outcome = await h2Request(session, { ":path": "/cut" }).then(
            (res) => `${res.status} whole (${res.body.length} bytes)`,
            () => "cut",
          );
        }
        expect(outcome).not.toMatch(/^200 whole/);
        expect(proxy.logs.filter((line) => line["msg"] === "request" && line["status"] === 200 && line["error"] === undefined)).toHaveLength(0);
      });
    }
  }

  // Node's http2 server closes a stream with RST_STREAM(NO_ERROR) and no END_STREAM when a handler
  // calls stream.close() after writing its body: curl takes the response as whole once the bytes
  // its Content-Length announced are in, and so does the proxy now. Without a Content-Length, or
  // short of it, the body is still cut (the tests above, and `/short` here).
  it.each(["HTTP/1.1", "HTTP/2"] as const)("a body whole by its Content-Length that the h2 upstream closes with NO_ERROR before END_STREAM reaches the %s guest whole; one short of it is cut", async (guest) => {
    const body = Buffer.alloc(5000, "b");
    const closeAfter = (announced: number): H2Route => (stream) => {
      stream.respond({ ":status": 200, "content-type": "text/plain", "content-length": String(announced) });
      stream.write(body);
      stream.close(h2constants.NGHTTP2_NO_ERROR);
    };
    const upstream = await startH2Upstream({ "/whole": closeAfter(body.length), "/short": closeAfter(body.length + 1) });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamHeadersMs: 20_000, upstreamBodyMs: 20_000 } });
    const outcome = async (path: string): Promise<string> => {
      if (guest === "HTTP/1.1") {
        const res = await request(`https://api.test:${upstream.port}${path}`, { dispatcher: proxyAgent(proxy) });
        return res.body.text().then(
          (text) => `${res.statusCode} whole (${text === body.toString() ? "the body" : `${text.length} bytes`})`,
          () => `${res.statusCode} cut`,
        );
      }
      const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
      return h2Request(session, { ":path": path }).then(
        (res) => `${res.status} whole (${res.body.equals(body) ? "the body" : `${res.body.length} bytes`})`,
        () => "cut",
      );
    };
    expect(await outcome("/whole")).toBe("200 whole (the body)");
    expect(await outcome("/short")).toMatch(/cut$/);
    await vi.waitFor(() => expect(proxy.logs.filter((line) => line["msg"] === "request")).toHaveLength(2), { timeout: 10_000 });
    const logged = (path: string) => proxy.logs.find((line) => line["msg"] === "request" && String(line["target"]).endsWith(path));
    expect(logged("/whole")?.["error"]).toBeUndefined();
    expect(logged("/short")?.["error"]).toBeDefined();
  });

  it.each(["HTTP/1.1", "HTTP/2"] as const)("a body whose trailers were to follow (announced in Trailer, gRPC's, or asked for with te: trailers) that the h2 upstream closes with NO_ERROR at its Content-Length is cut for the %s guest", async (guest) => {
    const body = Buffer.alloc(5000, "b");
    const closeAfter = (head: Record<string, string>): H2Route => (stream) => {
      stream.respond({ ":status": 200, "content-type": "text/plain", "content-length": String(body.length), ...head });
      stream.write(body);
      stream.close(h2constants.NGHTTP2_NO_ERROR);
    };
    const upstream = await startH2Upstream({
      "/announced": closeAfter({ trailer: "x-checksum" }),
      "/grpc": closeAfter({ "content-type": "application/grpc+proto" }),
      "/plain": closeAfter({}),
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamHeadersMs: 20_000, upstreamBodyMs: 20_000 } });
    const outcome = async (path: string, headers: Record<string, string> = {}): Promise<string> => {
      if (guest === "HTTP/1.1") {
        const res = await request(`https://api.test:${upstream.port}${path}`, { dispatcher: proxyAgent(proxy), headers });
        return res.body.text().then(
          (text) => `${res.statusCode} whole (${text.length} bytes)`,
          () => `${res.statusCode} cut`,
        );
      }
      const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
      return h2Request(session, { ":path": path, ...headers }).then(
        (res) => `${res.status} whole (${res.body.length} bytes)`,
        () => "cut",
      );
    };
    // An HTTP/1.1 guest had every byte by the Content-Length before (the trailers could not have
    // reached it), the cut seen only in the log line's error: the last byte now waits for the
    // body's end (respond.ts, holdLastByte), so it is cut one byte short as well.
    const cut = /cut$/;
    expect(await outcome("/announced")).toMatch(cut);
    expect(await outcome("/grpc")).toMatch(cut);
    expect(await outcome("/plain", { te: "trailers" })).toMatch(cut);
    // Without any of them the same close is a whole body, as the test above has it.
    expect(await outcome("/plain")).toBe("200 whole (5000 bytes)");
    await vi.waitFor(() => expect(proxy.logs.filter((line) => line["msg"] === "request")).toHaveLength(4), { timeout: 10_000 });
    const errors = proxy.logs.filter((line) => line["msg"] === "request").map((line) => `${String(line["target"]).replace(/^.*\//, "/")} ${line["error"] === undefined ? "ok" : "error"}`);
    expect(errors.sort()).toEqual(["/announced error", "/grpc error", "/plain error", "/plain ok"]);
  });

  // Node's stream.close(code) sends END_STREAM before its RST_STREAM once what was written has
  // been flushed: an upload the guest abandoned reached the upstream as a whole, shorter body.
  it.each(["h1 connection closed", "h2 stream reset with CANCEL", "h2 stream reset with INTERNAL_ERROR"] as const)("an upload abandoned midway (%s) is reset at the h2 upstream, never ended as a whole body", async (guest) => {
    const [arrived, headArrived] = latch();
    let routed = 0;
    const upstream = await startH2Upstream({ "/upload": () => (routed += 1) });
    const upstreamSaw = new Promise<{ bytes: number; ended: boolean }>((resolve) => {
      upstream.server.on("stream", (stream) => {
        let bytes = 0;
        let ended = false;
        stream.on("data", (chunk: Buffer) => {
          bytes += chunk.length;
          if (bytes >= 1000) headArrived();
        });
        stream.on("end", () => (ended = true));
        stream.once("close", () => resolve({ bytes, ended }));
      });
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
    const authority = `api.test:${upstream.port}`;
    if (guest === "h1 connection closed") {
      const client = await openTlsTunnel(proxy.port, authority, { ca: proxy.caCertPem });
      client.write(`POST /upload HTTP/1.1\r\nHost: ${authority}\r\nTransfer-Encoding: chunked\r\n\r\n3e8\r\n${"u".repeat(1000)}\r\n`);
      await arrived;
      client.socket.destroy();
    } else {
      const session = await h2Session(proxy.port, authority, proxy.caCertPem);
      // An aborted signal resets with CANCEL; destroy(error) with INTERNAL_ERROR. Neither sends
      // END_STREAM (close(code) would, as the proxy's own resets used to).
      const abort = new AbortController();
      const stream = session.request({ ":method": "POST", ":path": "/upload" }, { endStream: false, signal: abort.signal });
      stream.on("error", () => undefined);
      stream.write("u".repeat(1000));
      await arrived;
      if (guest === "h2 stream reset with CANCEL") abort.abort();
      else stream.destroy(new Error("the guest gave up"));
    }
    const saw = await upstreamSaw;
    expect(saw.bytes).toBe(1000);
    expect(saw.ended).toBe(false);
    expect(routed).toBe(0);
    expect((await fetchVia(proxy, `https://${authority}/echo`)).status).toBe(200);
  });

  it.each(["h1", "h2"] as const)("cut mid-body: the %s guest's response is cut, never ended as if whole", async (guest) => {
    const [writing, started] = latch();
    const upstream = await startH2Upstream({
      "/partial": (stream) => {
        stream.respond({ ":status": 200, "content-type": "text/plain" });
        stream.write("x".repeat(1000), () => started());
      },
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
    const url = `https://api.test:${upstream.port}/partial`;
    if (guest === "h1") {
      const res = await request(url, { dispatcher: proxyAgent(proxy) });
      expect(res.statusCode).toBe(200);
      await writing;
      upstream.cut();
      await expect(res.body.text()).rejects.toThrow();
    } else {
      const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
      const answer = h2Request(session, { ":path": "/partial" });
      await writing;
      upstream.cut();
      await expect(answer).rejects.toThrow(/reset|NGHTTP2_/);
    }
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
  });

  // Some servers end the connection right after their last response (a restart, a connection
  // limit). A response that had arrived whole was lost with it (502) while a hook still held it.
  // In a burst (the body, END_STREAM and the FIN read together), Node has not yet handed the
  // whole body to the stream when the FIN is seen.
  const arrivals = ["the body before the FIN", "the body and the FIN in one burst"] as const;
  it.each((["h1", "h2"] as const).flatMap((guest) => arrivals.map((arrival) => [guest, arrival] as const)))(
    "ended (FIN, no GOAWAY) right after a whole 60,000-byte response that an onResponse hook still holds: the %s guest gets it whole (%s)",
    async (guest, arrival) => {
      const body = "w".repeat(60_000);
      const upstream = await startH2Upstream({
        "/whole": (stream) => {
          stream.respond({ ":status": 200, "content-type": "text/plain" });
          // Once the whole body is sent (it fits the stream's window), the connection ends.
          stream.once("close", () => void upstream.end());
          stream.end(body);
        },
      });
      const burst = arrival === "the body and the FIN in one burst";
      const relay = await burstRelay(upstream.port);
      const port = burst ? relay.port : upstream.port;
      const proxy = await startTestProxy(
        {
          allowedInternalHosts: ["api.test"],
          onResponse: async (_response, request) => {
            // onResponse runs once the head is in: it holds the response while the FIN arrives.
            if (new URL(request.url).pathname === "/whole") await new Promise((resolve) => setTimeout(resolve, 300));
            return undefined;
          },
        },
        { timeouts },
      );
      // The session is open before the relay holds anything.
      expect((await fetchVia(proxy, `https://api.test:${port}/echo`)).status).toBe(200);
      if (burst) relay.hold();
      if (guest === "h1") {
        const res = await fetchVia(proxy, `https://api.test:${port}/whole`);
        expect(res.status, res.text.slice(0, 200)).toBe(200);
        expect(res.text).toBe(body);
      } else {
        const session = await h2Session(proxy.port, `api.test:${port}`, proxy.caCertPem);
        const answer = await h2Request(session, { ":path": "/whole" });
        expect(answer.headers[":status"]).toBe(200);
        expect(answer.body.toString()).toBe(body);
      }
      // The next request finds the session gone and opens a new connection.
      relay.release();
      expect((await fetchVia(proxy, `https://api.test:${port}/echo`)).status).toBe(200);
      expect(upstream.connections()).toBe(2);
    },
  );

  it("a request past a GOAWAY's last stream id, never processed, is sent again on a new connection", async () => {
    const upstream = await goAwayFirst();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/again`);
    expect(res.status, res.text).toBe(200);
    expect(upstream.connections()).toBe(2);
  });
});

describe("a guest that stops reading a download for a while", () => {
  // The upstream is not silent while the proxy holds its body: it waits for the proxy's
  // WINDOW_UPDATE, which goes only when the guest reads on. timeouts.upstreamBodyMs counted that
  // wait as the upstream's silence, so a guest (or a hook) behind for longer than it had its
  // download from an h2 upstream cut ("upstream body timed out after N ms of silence"), when the
  // same guest got the whole body from an HTTP/1.1 upstream (undici runs no body timer while its
  // reader holds the body). Found by the soak's HTTP/2 kinds (docs/reliability.md).
  const size = 1024 * 1024;
  const upstreamBodyMs = 200;

  /** Writes `body` in 16 KiB pieces as the window allows; `blocked` the first time a write has to wait. */
  function pump(write: (piece: Buffer) => boolean, waitDrain: (next: () => void) => void, end: () => void, body: Buffer, blocked: () => void): void {
    let at = 0;
    const next = (): void => {
      while (at < body.length) {
        const piece = body.subarray(at, at + 16_384);
        at += piece.length;
        if (!write(piece)) {
          blocked();
          waitDrain(next);
          return;
        }
      }
      end();
    };
    next();
  }

  it.each(["h2", "HTTP/1.1"] as const)("one that holds it for several times upstreamBodyMs, then reads on, gets all of it from an %s upstream", async (protocol) => {
    const body = randomBytes(size);
    const [writeWaited, blocked] = latch();
    const upstream =
      protocol === "h2"
        ? await startH2Upstream({
            "/big": (stream) => {
              stream.respond({ ":status": 200, "content-length": size });
              pump((piece) => stream.write(piece), (next) => stream.once("drain", next), () => stream.end(), body, blocked);
            },
          })
        : await startUpstream({
            tls: true,
            routes: {
              "/big": (_req, res) => {
                res.writeHead(200, { "content-length": size });
                pump((piece) => res.write(piece), (next) => res.once("drain", next), () => res.end(), body, blocked);
              },
            },
          });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamBodyMs } });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const stream = session.request({ ":path": "/big" });
    const received: Buffer[] = [];
    let status = 0;
    const closed = new Promise<void>((resolve) => stream.once("close", resolve));
    stream.on("error", () => undefined);
    stream.once("response", (head) => {
      status = Number(head[":status"]);
      // The guest reads nothing: its window, then the proxy's buffers, then the upstream's window fill.
      stream.pause();
    });
    // Once the upstream has had to wait, the guest stays away for 5 × upstreamBodyMs, then reads.
    await writeWaited;
    await new Promise((resolve) => setTimeout(resolve, 5 * upstreamBodyMs));
    stream.on("data", (chunk: Buffer) => received.push(chunk));
    stream.resume();
    await closed;
    expect(status).toBe(200);
    expect(stream.rstCode).toBe(0);
    expect(Buffer.concat(received).equals(body)).toBe(true);
    const line = proxy.logs.find((l) => l["msg"] === "request");
    expect(line?.["error"]).toBeUndefined();
  });

  it("an h2 upstream that falls silent mid-body after such a guest reads on is still cut at upstreamBodyMs", async () => {
    const sent = 256 * 1024;
    const body = randomBytes(sent);
    const [writeWaited, blocked] = latch();
    const upstream = await startH2Upstream({
      "/big": (stream) => {
        stream.respond({ ":status": 200, "content-length": size });
        // Part of the body, then nothing more: the stream stays open.
        pump((piece) => stream.write(piece), (next) => stream.once("drain", next), () => undefined, body, blocked);
      },
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamBodyMs } });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const stream = session.request({ ":path": "/big" });
    let received = 0;
    let ended = false;
    const closed = new Promise<void>((resolve) => stream.once("close", resolve));
    stream.on("error", () => undefined);
    stream.once("response", () => stream.pause());
    await writeWaited;
    await new Promise((resolve) => setTimeout(resolve, 5 * upstreamBodyMs));
    stream.on("data", (chunk: Buffer) => (received += chunk.length));
    stream.on("end", () => (ended = true));
    stream.resume();
    await closed;
    expect(received).toBe(sent);
    expect(ended).toBe(false);
    expect(stream.rstCode).toBe(2); // INTERNAL_ERROR: the proxy cut it
    const line = proxy.logs.find((l) => l["msg"] === "request");
    expect(line?.["error"]).toBe(`upstream body timed out after ${upstreamBodyMs} ms of silence; the guest connection was cut`);
  });
});
