import type { Server as HttpServer } from "node:http";
import { createServer as createNetServer, type Server, type Socket } from "node:net";
import { createServer as createTlsServer } from "node:tls";
import { describe, expect, it, vi } from "vitest";
import type { AuditRecord } from "../../src/index.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { fetchVia, startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { openRaw, openTlsTunnel } from "../helpers/raw.js";
import { testCa } from "../helpers/test-ca.js";
import { listenForTest } from "../helpers/upstream.js";

// A request the proxy resends reaches the upstream twice: the proxy may do so only when the
// connection it went out on had carried an earlier request (a pooled keep-alive connection) and
// not one byte came back on it for this request, so the upstream cannot have acted on it: its
// idle close crossed the request on the wire (README, "A request that crossed an upstream's
// keep-alive close is sent once more"). Every undici socket error counted: a DELETE went out twice
// after the upstream had answered (an unasked 100 or 101, a 103 or half a head then a close), and
// after a brand-new connection closed unanswered (black-box finding).

/** What the upstream does with the first request to /account/42 it gets; later ones get 200. */
const behaviours = {
  "answers 100 Continue (unasked), then 200": (s: Socket) => s.write("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone"),
  "answers an unasked 101": (s: Socket) => s.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"),
  "answers 103, then closes": (s: Socket) => s.end("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"),
  "sends half a head, then closes": (s: Socket) => s.end("HTTP/1.1 200 OK\r\nContent-Le"),
  "closes without answering": (s: Socket) => s.end(),
  "resets without answering": (s: Socket) => s.resetAndDestroy(),
} as const;
type Behaviour = keyof typeof behaviours;
/** Only these, and only on a reused connection, leave the upstream nothing it could have acted on. */
const unanswered: ReadonlySet<Behaviour> = new Set(["closes without answering", "resets without answering"]);

interface Received {
  readonly connection: number;
  readonly method: string;
  readonly path: string;
}

/**
 * A raw HTTP/1.1 upstream: /warm is answered 200 on a kept-alive connection; the first `times`
 * requests for /account/42 get `behaviour`, any later one 200. `received` lists every request
 * head, with the number of the connection it came on.
 */
async function rawUpstream(behaviour: Behaviour | "takes it and never answers", tls = false, times = 1): Promise<{ port: number; received: Received[] }> {
  const received: Received[] = [];
  let connections = 0;
  let misbehaved = 0;
  const serve = (socket: Socket): void => {
    const connection = ++connections;
    socket.on("error", () => undefined);
    let pending = "";
    socket.on("data", (chunk: Buffer) => {
      pending += chunk.toString("latin1");
      // Bodiless requests only: a head ends each one.
      for (let end = pending.indexOf("\r\n\r\n"); end !== -1 && !socket.destroyed; end = pending.indexOf("\r\n\r\n")) {
        const [method = "", path = ""] = pending.slice(0, end).split(" ");
        pending = pending.slice(end + 4);
        received.push({ connection, method, path });
        if (path === "/account/42" && misbehaved < times) {
          misbehaved += 1;
          if (behaviour !== "takes it and never answers") behaviours[behaviour](socket);
        } else {
          const body = path === "/warm" ? "warm" : "done";
          socket.write(`HTTP/1.1 200 OK\r\nContent-Length: ${body.length}\r\nKeep-Alive: timeout=60\r\n\r\n${body}`);
        }
      }
    });
  };
  let server: Server;
  if (tls) {
    const credentials = (await (await testCa()).serverCredentials(["api.test"])).get("api.test")!;
    server = createTlsServer(credentials, serve);
  } else {
    server = createNetServer(serve);
  }
  // listenForTest takes any net.Server: it only listens, tracks sockets and closes.
  return { port: await listenForTest(server as unknown as HttpServer), received };
}

describe("a request the upstream may have acted on is sent to it once", () => {
  for (const method of ["DELETE", "GET"] as const) {
    for (const behaviour of Object.keys(behaviours) as Behaviour[]) {
      for (const connection of ["a new connection", "a reused connection"] as const) {
        const resent = connection === "a reused connection" && unanswered.has(behaviour);
        it(`${method}, an upstream that ${behaviour} on ${connection}: ${resent ? "resent once, 200" : "sent once, 502"}, and the proxy serves on`, async () => {
          const upstream = await rawUpstream(behaviour);
          const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
          const origin = `http://api.test:${upstream.port}`;
          if (connection === "a reused connection") expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
          const res = await fetchVia(proxy, `${origin}/account/42`, { method });
          const sent = upstream.received.filter((r) => r.path === "/account/42");
          expect(sent.map((r) => r.method)).toEqual(resent ? [method, method] : [method]);
          expect(res.status, res.text).toBe(resent ? 200 : 502);
          if (resent) expect(res.text).toBe("done");
          // The first went out on the connection /warm came back on, or on the origin's first.
          expect(sent[0]!.connection).toBe(1);
          if (resent) expect(sent[1]!.connection).toBe(2);
          expect(proxy.logs.filter((l) => l["msg"] === "request" && String(l["target"]).endsWith("/account/42"))).toEqual([
            expect.objectContaining({ method, status: resent ? 200 : 502 }),
          ]);
          expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
        });
      }
    }
  }

  // A TLS connection's bytes are counted as cleartext: the close_notify before the upstream's
  // close is no answer, a 103 is.
  for (const behaviour of ["closes without answering", "answers 103, then closes"] as const) {
    it(`over TLS, a GET on a reused connection whose upstream ${behaviour}: ${unanswered.has(behaviour) ? "resent once, 200" : "sent once, 502"}`, async () => {
      const upstream = await rawUpstream(behaviour, true);
      const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
      const origin = `https://api.test:${upstream.port}`;
      expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
      const res = await fetchVia(proxy, `${origin}/account/42`);
      const resent = unanswered.has(behaviour);
      expect(upstream.received.filter((r) => r.path === "/account/42").map((r) => r.connection)).toEqual(resent ? [1, 2] : [1]);
      expect(res.status, res.text).toBe(resent ? 200 : 502);
      expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
    });
  }
});

// An upstream that took the request on a reused connection and is slow to answer is there, and
// may be acting on it: undici's headers timeout read as a crossed close (a reused connection,
// no byte back), and the request went to the upstream again on a new connection, the guest
// waiting for the second's answer where upstreamHeadersMs owed it a 504 (review finding).
describe("a request whose upstream timed out on a reused connection is not sent again", () => {
  for (const method of ["DELETE", "GET"] as const) {
    it(`${method}: sent once, 504, and the proxy serves on`, async () => {
      const upstream = await rawUpstream("takes it and never answers");
      const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamHeadersMs: 300 } });
      const origin = `http://api.test:${upstream.port}`;
      expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
      const res = await fetchVia(proxy, `${origin}/account/42`, { method });
      expect(res.status, res.text).toBe(504);
      expect(res.headers["x-egressgate-error"]).toBe("EG_UPSTREAM_TIMEOUT");
      expect(upstream.received.filter((r) => r.path === "/account/42")).toEqual([{ connection: 1, method, path: "/account/42" }]);
      const line = proxy.logs.find((l) => l["msg"] === "request" && String(l["target"]).endsWith("/account/42"));
      expect(line).toMatchObject({ method, status: 504, code: "EG_UPSTREAM_TIMEOUT" });
      expect(line).not.toHaveProperty("resent");
      expect((await fetchVia(proxy, `${origin}/warm`)).text).toBe("warm");
    });
  }
});

// A request sent once more on a fresh connection said nothing of it: its line read as any
// other's, though the upstream had had it twice on the wire. Every line of such a request (and
// its audit record) now carries `resent: true`, whatever came of the resend.
const ways = ["HTTP/1.1 absolute-form", "HTTP/1.1 TLS tunnel", "HTTP/2"] as const;
type Way = (typeof ways)[number];

/** A GET of `path` from a new guest connection of the way: the status and the body. */
async function getVia(way: Way, proxy: TestProxy, port: number, path: string): Promise<[number, string]> {
  const authority = `api.test:${port}`;
  if (way === "HTTP/2") {
    const answer = await h2Request(await h2Session(proxy.port, authority, proxy.caCertPem), { ":path": path });
    return [answer.status, answer.body.toString()];
  }
  const client = way === "HTTP/1.1 absolute-form" ? await openRaw(proxy.port) : await openTlsTunnel(proxy.port, authority, { ca: proxy.caCertPem });
  client.write(`GET ${way === "HTTP/1.1 absolute-form" ? `http://${authority}${path}` : path} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
  const res = await client.readResponse();
  return [res.status, res.body];
}

describe("a request resent on a fresh connection says so in its decision line and audit record", () => {
  const cases = [
    ["closes without answering", 1, 200],
    ["resets without answering", 1, 200],
    // The fresh connection closes unanswered too: no crossed idle close, so its 502 stands, resent all the same.
    ["closes without answering", 2, 502],
  ] as const;
  for (const way of ways) {
    // A reset of the raw upstream's TLS socket is not one on the wire (resetAndDestroy takes a TCP handle).
    it.each(way === "HTTP/1.1 absolute-form" ? cases : cases.filter(([behaviour]) => behaviour !== "resets without answering"))(`${way}: an upstream whose pooled connection %s (%i times): %i, and the line says resent`, async (behaviour, times, status) => {
      const upstream = await rawUpstream(behaviour, way !== "HTTP/1.1 absolute-form", times);
      const records: AuditRecord[] = [];
      const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { onDecision: (record) => void records.push(record) });
      expect(await getVia(way, proxy, upstream.port, "/warm")).toEqual([200, "warm"]);
      const [answered] = await getVia(way, proxy, upstream.port, "/account/42");
      expect(answered).toBe(status);
      expect(upstream.received.filter((r) => r.path === "/account/42").map((r) => r.connection)).toEqual([1, 2]);
      const lines = (): Record<string, unknown>[] => proxy.logs.filter((l) => l["msg"] === "request");
      await vi.waitFor(() => expect(lines()).toHaveLength(2), { timeout: 10_000 });
      expect(lines()[0]).not.toHaveProperty("resent");
      expect(lines()[1]).toMatchObject({ status, resent: true });
      expect(records.map((record) => [record.url.slice(record.url.lastIndexOf("/")), record.status, record.resent])).toEqual([
        ["/warm", 200, undefined],
        ["/42", status, true],
      ]);
      // The proxy serves on, on the fresh connection's pool.
      expect(await getVia(way, proxy, upstream.port, "/warm")).toEqual([200, "warm"]);
      await vi.waitFor(() => expect(lines()).toHaveLength(3), { timeout: 10_000 });
      expect(lines()[2]).not.toHaveProperty("resent");
    });
  }
});
