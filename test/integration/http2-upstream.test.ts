import { describe, expect, it } from "vitest";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { startH2Upstream } from "../helpers/h2-upstream.js";
import { fetchVia, startTestProxy } from "../helpers/proxy.js";
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
});
