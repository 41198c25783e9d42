import type { ClientHttp2Session, IncomingHttpHeaders } from "node:http2";
import { describe, expect, it, vi } from "vitest";
import type { HttpHooksOptions } from "../../src/index.js";
import { loadPolicy } from "../helpers/djs.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { startTestProxy } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";

interface ContinuedAnswer {
  /** How many `100 Continue` heads came. */
  readonly continues: number;
  /** Whether a 100 came after the final head. */
  readonly continueAfterFinal: boolean;
  /** The body went out only after this long without a 100 (a client's give-up, as curl's 1 s). */
  readonly gaveUp: boolean;
  readonly status: number;
  readonly headers: IncomingHttpHeaders;
  readonly body: string;
}

/**
 * A POST whose guest waits for `100 Continue` before its body, as RFC 9110 §10.1.1 lets it. Like
 * curl, it sends the body anyway after `waitMs` without one, so a proxy that never answers 100
 * shows as `gaveUp` instead of a deadlock that only the hook's or the idle timeout ends.
 */
function continuedPost(session: ClientHttp2Session, path: string, body: string, declared = Buffer.byteLength(body), waitMs = 1_000): Promise<ContinuedAnswer> {
  return new Promise((resolve, reject) => {
    const stream = session.request({ ":method": "POST", ":path": path, "content-length": String(declared), expect: "100-Continue" }, { endStream: false });
    let continues = 0;
    let continueAfterFinal = false;
    let gaveUp = false;
    let head: IncomingHttpHeaders | undefined;
    let sent = false;
    const send = (): void => {
      if (sent || stream.destroyed) return;
      sent = true;
      stream.end(body);
    };
    const giveUp = setTimeout(() => {
      if (head !== undefined || sent) return;
      gaveUp = true;
      send();
    }, waitMs);
    stream.on("continue", () => {
      continues += 1;
      if (head !== undefined) continueAfterFinal = true;
      send();
    });
    const chunks: Buffer[] = [];
    stream.on("response", (h) => (head = h));
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("error", () => undefined);
    stream.on("close", () => {
      clearTimeout(giveUp);
      // A refusal ends the stream with RST_STREAM(NO_ERROR) once it is out: the guest stops sending.
      if (head === undefined) reject(new Error(`stream closed without a response (code ${stream.rstCode})`));
      else resolve({ continues, continueAfterFinal, gaveUp, status: Number(head[":status"]), headers: head, body: Buffer.concat(chunks).toString() });
    });
  });
}

// An HTTP/2 guest never got `100 Continue`: over HTTP/1.1 the proxy sends it when it starts
// reading the body, over HTTP/2 nothing did and `expect` was dropped. A guest waiting for the 100
// and a proxy waiting for the body deadlocked: 504 "onRequest hook did not settle" at hookMs with
// a hook reading the body, a reset at idleMs logged as "the guest sent nothing of its request body"
// without one (black-box finding).
describe("HTTP/2 guests and Expect: 100-continue", () => {
  const cases: Record<string, { hooks: () => HttpHooksOptions; refuseInTunnel?: boolean; declared?: number; status: number; continues: number }> = {
    "no hook": { hooks: () => ({}), status: 200, continues: 1 },
    "a tier-3 onRequest reading the body": { hooks: () => ({ onRequest: async (request) => void (await request.clone().text()) }), status: 200, continues: 1 },
    "a tier-2 onRequest reading the body": { hooks: () => ({ djsHooks: loadPolicy("export async function onRequest(request) { await request.clone().text(); }") }), status: 200, continues: 1 },
    "a host the allowlist refuses": { hooks: () => ({}), refuseInTunnel: true, status: 403, continues: 0 },
    "a tier-3 onRequest answering without reading the body": {
      hooks: () => ({ onRequest: (request) => (request.method === "POST" ? new Response("answered by the hook", { status: 403 }) : undefined) }),
      status: 403,
      continues: 0,
    },
    // Its Content-Length is past maxHttpBodyBytes: refused as the hook starts reading, before any 100.
    "an upload announced over maxHttpBodyBytes that a tier-3 onRequest reads": {
      hooks: () => ({ onRequest: async (request) => void (await request.clone().text()) }),
      declared: 1 << 30,
      status: 413,
      continues: 0,
    },
  };
  for (const [name, c] of Object.entries(cases)) {
    it(`${name}: ${c.continues === 1 ? "one 100 before the final answer" : "the final answer and no 100"} (${c.status}), and the connection serves on`, async () => {
      const upstream = await startUpstream();
      const proxy = await startTestProxy(
        { allowedInternalHosts: [c.refuseInTunnel === true ? "other.test" : "api.test"], ...c.hooks() },
        { timeouts: { hookMs: 10_000, idleMs: 10_000 }, maxHttpBodyBytes: 1024, ...(c.refuseInTunnel === true ? { refuseInTunnel: true } : {}) },
      );
      const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
      const answer = await continuedPost(session, "/echo", "hello", c.declared);
      expect(answer).toMatchObject({ status: c.status, continues: c.continues, continueAfterFinal: false, gaveUp: false });
      if (c.status === 200) {
        const echo = JSON.parse(answer.body) as { method: string; bodyBytes: number; headers: Record<string, string> };
        expect(echo).toMatchObject({ method: "POST", bodyBytes: 5 });
        // The proxy answers Expect itself: it never reaches the upstream.
        expect(echo.headers["expect"]).toBeUndefined();
        expect(upstream.hits()).toBe(1);
      } else {
        expect(upstream.hits()).toBe(0);
      }
      await vi.waitFor(() => expect(proxy.logs.filter((l) => l["msg"] === "request").map((l) => l["status"])).toEqual([c.status]));
      // Another stream on the same connection, and another upload that waits, are served as before.
      expect((await h2Request(session, { ":path": "/echo" })).status).toBe(c.refuseInTunnel === true ? 403 : 200);
      expect(await continuedPost(session, "/echo", "again", c.declared)).toMatchObject({ status: c.status, continues: c.continues, gaveUp: false });
    });
  }

  it("an Expect other than 100-continue gets 417 on its stream, as over HTTP/1.1, and the connection serves on", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const [foo, fooWithBody] = await Promise.all([
      h2Request(session, { ":path": "/echo", expect: "foo" }),
      h2Request(session, { ":method": "POST", ":path": "/echo", expect: "foo" }, "hello"),
    ]);
    expect([foo.status, fooWithBody.status]).toEqual([417, 417]);
    expect(foo.body.toString()).toContain('unsupported Expect: "foo"');
    expect(upstream.hits()).toBe(0);
    expect((await h2Request(session, { ":path": "/echo" })).status).toBe(200);
    expect(upstream.hits()).toBe(1);
  });

  // The upload's stall clock started with the stream, so a guest waiting for its 100 behind
  // hooks slower than idleMs was cut as "sent nothing of its request body" (last session's
  // "left alone"). Its silence counts from the 100 now.
  it("hooks slower than idleMs before the 100: the upload is not cut as stalled, and one stalled after its 100 still is", async () => {
    const upstream = await startUpstream();
    const slowMs = 2_000;
    const idleMs = 700;
    const proxy = await startTestProxy(
      { allowedInternalHosts: ["api.test"], isRequestAllowed: async () => (await new Promise((resolve) => setTimeout(resolve, slowMs)), true) },
      { timeouts: { hookMs: 10_000, idleMs } },
    );
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    const started = performance.now();
    const answer = await continuedPost(session, "/echo", "hello", undefined, 20_000);
    expect(performance.now() - started).toBeGreaterThanOrEqual(slowMs - 50);
    expect(answer).toMatchObject({ status: 200, continues: 1, gaveUp: false });
    expect(JSON.parse(answer.body)).toMatchObject({ method: "POST", bodyBytes: 5 });

    // A guest that gets its 100 and then sends nothing is still cut, idleMs after the 100.
    const silent = session.request({ ":method": "POST", ":path": "/echo", "content-length": "5", expect: "100-continue" }, { endStream: false });
    silent.on("error", () => undefined);
    let continuedAt: number | undefined;
    silent.on("continue", () => (continuedAt = performance.now()));
    await new Promise((resolve) => silent.on("close", resolve));
    expect(continuedAt).toBeDefined();
    expect(performance.now() - continuedAt!).toBeGreaterThanOrEqual(idleMs - 50);
    const cut = await vi.waitFor(() => {
      const line = proxy.logs.find((l) => l["msg"] === "request" && l["id"] === 2);
      expect(line).toBeDefined();
      return line!;
    });
    expect(cut).toMatchObject({ status: 499, reason: `the guest sent nothing of its request body for timeouts.idleMs (${idleMs} ms)` });
    expect(cut["ms"]).toBeGreaterThanOrEqual(slowMs + idleMs - 50);
    expect((await h2Request(session, { ":path": "/echo" })).status).toBe(200);
  });

  it("a request with Expect: 100-continue and no body gets its answer and no 100", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    let continues = 0;
    const stream = session.request({ ":method": "GET", ":path": "/echo", expect: "100-continue" });
    stream.on("continue", () => (continues += 1));
    const status = await new Promise<number>((resolve) => stream.on("response", (h) => resolve(Number(h[":status"]))));
    stream.resume();
    await new Promise((resolve) => stream.on("close", resolve));
    expect(status).toBe(200);
    expect(continues).toBe(0);
  });
});
