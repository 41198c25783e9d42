import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { ClientHttp2Session } from "node:http2";
import { describe, expect, it, vi } from "vitest";
import type { AuditRecord, HttpHooksOptions, ProxyOptions } from "../../src/index.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { startRawH2Upstream } from "../helpers/h2-upstream.js";
import { latch } from "../helpers/latch.js";
import { startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { openRaw, openTlsTunnel, type RawClient } from "../helpers/raw.js";
import { testCa } from "../helpers/test-ca.js";
import { listenForTest } from "../helpers/upstream.js";

// What a guest gets, and what its decision line, audit record and metrics say, when a body fails
// (black-box findings). A Response a tier-3 hook made whose body failed before its first byte
// went out as a 200 head and a cut connection (an HTTP/2 stream reset), logged 200 with an
// `error`; a cut after the head named no side (`boom`, `UND_ERR_SOCKET: other side closed`).
// An HTTP/1.1 request body that broke after the upstream's answer had begun was logged "guest
// closed the connection", and an HTTP/2 one that nghttp2 reset "guest reset the stream". An
// HTTP/1.1 guest that left while the upstream took no more of its upload (an HTTP/2 window shut)
// was not seen leaving: the upstream's timer later answered 504 into the closed connection, and
// the line said 504.

const ways = ["HTTP/1.1 absolute-form", "HTTP/1.1 TLS tunnel", "HTTP/2"] as const;
type Way = (typeof ways)[number];

/** What the upstream saw of one request: its body bytes, and whether the body ended or was aborted. */
interface Seen {
  readonly bytes: number;
  readonly ended: boolean;
}

interface Upstream {
  readonly port: number;
  /** Settles when a request for `path` has its head at the upstream. */
  arrived(path: string): Promise<void>;
  /** Settles with what the upstream saw of `/early`'s body once its request closed. */
  readonly early: Promise<Seen>;
  /** Destroys the connection of the request for `/held-head`, whose head alone went out. */
  cutHeldHead(): void;
}

/**
 * `/ok`: 200 "ok" after the body. `/partial`: a head announcing 100 bytes, 3 of them, then the
 * connection is destroyed. `/early`: a head and "first" as soon as the request arrives, while
 * its body still comes; the response stays open. `/held-head`: a head announcing 100 bytes, and
 * nothing more until {@link Upstream.cutHeldHead} destroys the connection.
 */
async function startHoldingUpstream(secure: boolean): Promise<Upstream> {
  const arrivals = new Map<string, [Promise<void>, () => void]>();
  const arrival = (path: string): [Promise<void>, () => void] => {
    let entry = arrivals.get(path);
    if (entry === undefined) arrivals.set(path, (entry = latch()));
    return entry;
  };
  const [early, earlyClosed] = latch<Seen>();
  let heldHead: ServerResponse | undefined;
  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    const path = req.url ?? "";
    req.on("error", () => undefined);
    let bytes = 0;
    let ended = false;
    req.on("data", (chunk: Buffer) => (bytes += chunk.length));
    req.on("end", () => (ended = true));
    if (path === "/partial") {
      res.writeHead(200, { "content-type": "text/plain", "content-length": 100 });
      res.write("abc", () => res.socket?.destroy());
    } else if (path === "/held-head") {
      res.writeHead(200, { "content-type": "text/plain", "content-length": 100 });
      res.flushHeaders();
      heldHead = res;
    } else if (path === "/early") {
      req.once("close", () => earlyClosed({ bytes, ended }));
      res.writeHead(200, { "content-type": "text/plain" });
      res.write("first");
    } else {
      req.on("end", () => res.end("ok"));
    }
    arrival(path)[1]();
  };
  let port: number;
  if (secure) {
    const credentials = (await (await testCa()).serverCredentials(["api.test"])).get("api.test")!;
    port = await listenForTest(createHttpsServer({ key: credentials.key, cert: credentials.cert }, handler));
  } else port = await listenForTest(createHttpServer(handler));
  return { port, arrived: (path) => arrival(path)[0], early, cutHeldHead: () => heldHead?.socket?.destroy() };
}

interface Setup {
  readonly way: Way;
  readonly proxy: TestProxy;
  readonly records: AuditRecord[];
  readonly upstream: Upstream;
}

async function setup(way: Way, hooks: Omit<HttpHooksOptions, "allowedInternalHosts"> = {}, options: Omit<ProxyOptions, "httpHooks"> = {}): Promise<Setup> {
  const upstream = await startHoldingUpstream(way !== "HTTP/1.1 absolute-form");
  const records: AuditRecord[] = [];
  const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], ...hooks }, { metrics: true, onDecision: (record) => void records.push(record), ...options });
  return { way, proxy, records, upstream };
}

/** One HTTP/1.1 guest connection of the way, to `api.test:port`: on the listener, or inside a TLS tunnel. */
async function openH1(s: Setup, port = s.upstream.port): Promise<RawClient> {
  return s.way === "HTTP/1.1 absolute-form" ? openRaw(s.proxy.port) : openTlsTunnel(s.proxy.port, `api.test:${port}`, { ca: s.proxy.caCertPem });
}

/** An HTTP/1.1 request head of the way; in absolute form, to the holding upstream over http, or to `port` over https. */
function h1Head(s: Setup, method: string, path: string, fields = "", port = s.upstream.port): string {
  const target = s.way === "HTTP/1.1 absolute-form" ? `${port === s.upstream.port ? "http" : "https"}://api.test:${port}${path}` : path;
  return `${method} ${target} HTTP/1.1\r\nHost: api.test:${port}\r\n${fields}\r\n`;
}

function openH2(s: Setup, port = s.upstream.port): Promise<ClientHttp2Session> {
  return h2Session(s.proxy.port, `api.test:${port}`, s.proxy.caCertPem);
}

/** A GET of `path` on a new guest connection: the answer, or why there was none ("cut"). */
async function get(s: Setup, path: string): Promise<{ status: number; body: string; code: string | undefined } | "cut"> {
  if (s.way === "HTTP/2") {
    try {
      const answer = await h2Request(await openH2(s), { ":path": path });
      return { status: answer.status, body: answer.body.toString(), code: answer.headers["x-egressgate-error"] as string | undefined };
    } catch (error) {
      expect(String(error)).toMatch(/reset|closed without a response|NGHTTP2_INTERNAL_ERROR/);
      return "cut";
    }
  }
  const client = await openH1(s);
  client.write(h1Head(s, "GET", path));
  try {
    const res = await client.readResponse();
    return { status: res.status, body: res.body, code: res.headers["x-egressgate-error"] };
  } catch (error) {
    expect(String(error)).toMatch(/connection closed before a complete response/);
    return "cut";
  }
}

/** The decision line of the request for `path`, once written. */
async function lineOf(s: Setup, path: string): Promise<Record<string, unknown>> {
  const find = (): Record<string, unknown> | undefined => s.proxy.logs.find((line) => line["msg"] === "request" && String(line["target"]).endsWith(path));
  await vi.waitFor(() => expect(find()).toBeDefined(), { timeout: 10_000 });
  return find()!;
}

function recordOf(s: Setup, path: string): AuditRecord {
  const record = s.records.find((seen) => seen.url.endsWith(path));
  expect(record).toBeDefined();
  return record!;
}

/** The value of one series line, `name{labels} value`; undefined when no line has every label. */
function sample(text: string, name: string, labels: Record<string, string>): number | undefined {
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`)) continue;
    if (Object.entries(labels).every(([key, value]) => line.includes(`${key}="${value}"`))) return Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return undefined;
}

/** A new connection of the way is served `/ok`, and its line says 200. */
async function expectServesOn(s: Setup): Promise<void> {
  expect(await get(s, "/ok")).toEqual({ status: 200, body: "ok", code: undefined });
  expect(await lineOf(s, "/ok")).toMatchObject({ status: 200 });
}

const pathOf = (request: Request): string => new URL(request.url).pathname;

/** A body that fails before its first byte, in two ways a hook's stream can. */
const failingBodies = {
  "errors in its first pull": (): ReadableStream<Uint8Array> =>
    new ReadableStream({
      pull(controller) {
        controller.error(new Error("the feed broke"));
      },
    }),
  "rejects its first pull a turn later": (): ReadableStream<Uint8Array> =>
    new ReadableStream({
      async pull() {
        await new Promise((resolve) => setImmediate(resolve));
        throw new Error("the feed broke");
      },
    }),
} as const;
type FailingBody = keyof typeof failingBodies;

/** A body whose first chunk comes, and which then fails. */
const failsAfterFirstChunk = (): ReadableStream<Uint8Array> =>
  new ReadableStream({
    start(controller) {
      controller.enqueue(new TextEncoder().encode("part"));
    },
    async pull() {
      await new Promise((resolve) => setImmediate(resolve));
      throw new Error("the feed broke later");
    },
  });

/**
 * Bodies whose first chunk comes, and which then fail before any of it can reach the guest: the
 * pull for the next chunk errors at once, or rejects a few microtasks later, in the turn the
 * head's wait for the first chunk ends. The stream is destroyed with that chunk still unsent.
 */
const failsRightAfterFirstChunk = {
  "errors in the pull right after its first chunk": (): ReadableStream<Uint8Array> =>
    new ReadableStream({
      start(controller) {
        controller.enqueue(new TextEncoder().encode("part"));
      },
      pull(controller) {
        controller.error(new Error("the feed broke"));
      },
    }),
  "rejects the pull right after its first chunk a microtask later": (): ReadableStream<Uint8Array> =>
    new ReadableStream({
      start(controller) {
        controller.enqueue(new TextEncoder().encode("part"));
      },
      async pull() {
        await Promise.resolve();
        throw new Error("the feed broke");
      },
    }),
} as const;
type FailsRightAfter = keyof typeof failsRightAfterFirstChunk;

/** Hooks that answer `/fail` with a Response of `body()`, made by `maker`; every other path goes on as usual. */
const makers = {
  onRequest: (body: () => ReadableStream<Uint8Array>): HttpHooksOptions => ({ onRequest: (request) => (pathOf(request) === "/fail" ? new Response(body()) : undefined) }),
  onResponse: (body: () => ReadableStream<Uint8Array>): HttpHooksOptions => ({ onResponse: (_response, request) => (pathOf(request) === "/fail" ? new Response(body()) : undefined) }),
  handle: (body: () => ReadableStream<Uint8Array>): HttpHooksOptions => ({ layers: [async (request, next) => (pathOf(request) === "/fail" ? new Response(body()) : next(request))] }),
} as const;
type Maker = keyof typeof makers;

const rows = (Object.keys(makers) as Maker[]).flatMap((maker) => (Object.keys(failingBodies) as FailingBody[]).map((body) => [maker, body] as const));
const rightAfterRows = (Object.keys(makers) as Maker[]).flatMap((maker) => (Object.keys(failsRightAfterFirstChunk) as FailsRightAfter[]).map((body) => [maker, body] as const));

for (const way of ways) {
  describe(way, () => {
    it.each(rows)("the body of a Response %s made %s: the guest gets 502 with the reason, and the line, record and metrics say the hook failed", async (maker, body) => {
      const s = await setup(way, makers[maker](failingBodies[body]));
      const reason = `the body of the Response ${maker} returned failed before its first byte (see the proxy log)`;
      expect(await get(s, "/fail")).toEqual({ status: 502, body: `502 Bad Gateway: ${reason}\n`, code: "EG_HOOK_FAILED" });
      expect(await lineOf(s, "/fail")).toMatchObject({ status: 502, reason, code: "EG_HOOK_FAILED", source: "hooks", detail: "Error: the feed broke" });
      const record = recordOf(s, "/fail");
      expect(record).toMatchObject({ status: 502, reason, code: "EG_HOOK_FAILED", source: "hooks", bytesDown: Buffer.byteLength(`502 Bad Gateway: ${reason}\n`) });
      // The call that made it is the failure, as a throw in the hook is.
      expect(record.sources.filter((source) => source.source === "hooks")).toEqual([expect.objectContaining({ phase: maker, decision: "error", status: 502, failure: "throw" })]);
      const metrics = await s.proxy.metrics();
      expect(sample(metrics, "egressgate_requests_total", { decision: "error", status_class: "5xx", rule: `hooks:${maker}` })).toBe(1);
      expect(sample(metrics, "egressgate_hook_failures_total", { source: "hooks", kind: "throw" })).toBe(1);
      expect(sample(metrics, "egressgate_requests_total", { status_class: "2xx" })).toBeUndefined();
      await expectServesOn(s);
    });

    // Black-box finding: answered 502 EG_UPSTREAM "the upstream response body from api.test
    // failed before it could be sent", with no source, though the hook made the body (and for
    // onRequest and a layer no upstream was contacted); the record said the hook had answered.
    it.each(rightAfterRows)("the body of a Response %s made %s: nothing was sent, so the guest gets 502 and the line, record and metrics say the hook failed", async (maker, body) => {
      const s = await setup(way, makers[maker](failsRightAfterFirstChunk[body]));
      const reason = `the body of the Response ${maker} returned failed before any of it was sent (see the proxy log)`;
      expect(await get(s, "/fail")).toEqual({ status: 502, body: `502 Bad Gateway: ${reason}\n`, code: "EG_HOOK_FAILED" });
      expect(await lineOf(s, "/fail")).toMatchObject({ status: 502, reason, code: "EG_HOOK_FAILED", source: "hooks", detail: "Error: the feed broke" });
      const record = recordOf(s, "/fail");
      expect(record).toMatchObject({ status: 502, reason, code: "EG_HOOK_FAILED", source: "hooks" });
      expect(record.sources.filter((source) => source.source === "hooks")).toEqual([expect.objectContaining({ phase: maker, decision: "error", status: 502, failure: "throw" })]);
      const metrics = await s.proxy.metrics();
      expect(sample(metrics, "egressgate_hook_failures_total", { source: "hooks", kind: "throw" })).toBe(1);
      expect(sample(metrics, "egressgate_requests_total", { status_class: "2xx" })).toBeUndefined();
      await expectServesOn(s);
    });

    it.each(Object.keys(makers) as Maker[])("the body of a Response %s made fails after its first chunk: the response is cut, and the line says whose body failed", async (maker) => {
      const s = await setup(way, makers[maker](failsAfterFirstChunk));
      expect(await get(s, "/fail")).toBe("cut");
      const error = `the body of the Response ${maker} returned (hooks) failed after the response head was sent (Error: the feed broke later); the guest's response was cut`;
      expect(await lineOf(s, "/fail")).toMatchObject({ status: 200, error });
      expect(recordOf(s, "/fail")).toMatchObject({ status: 200, error });
      await expectServesOn(s);
    });

    it("an upstream body that fails after the head stays a cut, and the line says it was the upstream's body", async () => {
      const s = await setup(way);
      expect(await get(s, "/partial")).toBe("cut");
      const error = /^the upstream response body failed after the response head was sent \(.+\); the guest's response was cut$/;
      expect(await lineOf(s, "/partial")).toMatchObject({ status: 200, error: expect.stringMatching(error) });
      expect(recordOf(s, "/partial")).toMatchObject({ status: 200, error: expect.stringMatching(error) });
      await expectServesOn(s);
    });

    it("a request body that breaks after the upstream's answer began: the line says how it broke and that the proxy cut the response, not that the guest left", async () => {
      const s = await setup(way);
      if (way === "HTTP/2") {
        const session = await openH2(s);
        // DATA past the content-length the head declared: nghttp2 resets the stream (RFC 9113 §8.1.1).
        const stream = session.request({ ":method": "POST", ":path": "/early", "content-length": "5" }, { endStream: false });
        stream.on("error", () => undefined);
        let received = "";
        stream.on("data", (chunk: Buffer) => (received += chunk.toString()));
        stream.write("abc");
        await s.upstream.arrived("/early");
        await vi.waitFor(() => expect(received).toBe("first"), { timeout: 10_000 });
        stream.write("defghij");
        await new Promise((resolve) => stream.once("close", resolve));
        expect(stream.rstCode).toBe(1);
        const error = "the stream was reset (PROTOCOL_ERROR, code 1): a protocol error on it, nghttp2's answer to a frame that broke HTTP/2 or the guest's own reset before the response was complete";
        expect(await lineOf(s, "/early")).toMatchObject({ status: 200, http: "2", error });
        expect(recordOf(s, "/early")).toMatchObject({ status: 200, error });
      } else {
        const client = await openH1(s);
        client.write(`${h1Head(s, "POST", "/early", "Transfer-Encoding: chunked\r\n")}3\r\nabc\r\n`);
        await s.upstream.arrived("/early");
        await vi.waitFor(() => expect(client.pending()).toContain("first"), { timeout: 10_000 });
        client.write("zz\r\n");
        expect(await client.closesWithin(10_000)).toBe(true);
        const error = "the proxy closed the connection: the guest's request body broke mid-upload (malformed request (invalid chunk size)) before the response was complete";
        expect(await lineOf(s, "/early")).toMatchObject({ status: 200, error });
        expect(recordOf(s, "/early")).toMatchObject({ status: 200, error });
        // The parser's own line says what it saw, as for a body that broke before the response.
        expect(s.proxy.logs.filter((line) => line["msg"] === "bad request")).toEqual([expect.objectContaining({ error: expect.stringMatching(/^HPE_INVALID_CHUNK_SIZE/) })]);
      }
      // What the upstream got: the body up to the break, never ended as if whole.
      expect(await s.upstream.early).toEqual({ bytes: 3, ended: false });
      await expectServesOn(s);
    });

    if (way === "HTTP/2") {
      // An upstream that reset while an onResponse hook read its body, the hook passing the
      // response on (it returns nothing): the README's "upstream body that breaks while a hook
      // holds the response (before anything was sent)", owed a 502. An HTTP/1.1 guest got it
      // (hooks.test.ts: Node sends the head with the first body bytes, and none came); an HTTP/2
      // guest's HEADERS went at once, and it got a 200 and its stream reset, logged 200 (review finding).
      const readers = {
        "reads a clone of the body": (response: Response) => response.clone().text(),
        "reads the body itself": (response: Response) => response.text(),
      } as const;
      it.each(Object.keys(readers) as (keyof typeof readers)[])("an upstream body that fails while onResponse %s, the hook then passing the response on: 502 EG_UPSTREAM, not a 200 and a reset stream", async (reader) => {
        let read: string | undefined;
        const s: Setup = await setup(way, {
          onResponse: async (response, request) => {
            if (pathOf(request) !== "/held-head") return undefined;
            // The hook holds the response, and its read is under way, when the upstream goes.
            const reading = readers[reader](response);
            s.upstream.cutHeldHead();
            read = await reading.then(() => "whole", () => "failed");
            return undefined;
          },
        });
        const reason = `the upstream response body from api.test:${s.upstream.port} failed before it could be sent`;
        expect(await get(s, "/held-head")).toEqual({ status: 502, body: `502 Bad Gateway: ${reason}\n`, code: "EG_UPSTREAM" });
        expect(read).toBe("failed");
        expect(await lineOf(s, "/held-head")).toMatchObject({ status: 502, reason, code: "EG_UPSTREAM", http: "2" });
        const record = recordOf(s, "/held-head");
        expect(record).toMatchObject({ status: 502, reason, code: "EG_UPSTREAM", bytesDown: Buffer.byteLength(`502 Bad Gateway: ${reason}\n`) });
        expect(record).not.toHaveProperty("error");
        // The hook passed the response on: it did not fail.
        expect(record.sources.filter((source) => source.source === "hooks")).toEqual([expect.objectContaining({ phase: "onResponse", decision: "allow" })]);
        const metrics = await s.proxy.metrics();
        expect(sample(metrics, "egressgate_requests_total", { status_class: "2xx" })).toBeUndefined();
        expect(sample(metrics, "egressgate_hook_failures_total", { source: "hooks" })).toBeUndefined();
        await expectServesOn(s);
      });
    }

    if (way !== "HTTP/2") {
      it("a guest that leaves mid-upload while the HTTP/2 upstream takes no more of it (its window shut) is logged 499, not the 504 its upstream's timer later answered", async () => {
        // Written frame by frame: it never answers, and never opens the stream's window past 65,535 bytes.
        const [arrived, headersArrived] = latch();
        const stuck = await startRawH2Upstream({ onHeaders: () => headersArrived() });
        const s = await setup(way, {}, { timeouts: { upstreamHeadersMs: 300 } });
        const client = await openH1(s, stuck.port);
        client.write(h1Head(s, "POST", "/stuck", "Content-Length: 8000000\r\n", stuck.port));
        // More than the window and the proxy's buffers take: the proxy stops reading the
        // connection, and the guest's end waits unread behind what the kernel still holds.
        client.write(Buffer.alloc(1_000_000, 0x75));
        await arrived;
        client.socket.destroy();
        expect(await lineOf(s, "/stuck")).toMatchObject({ status: 499, reason: "guest closed the connection" });
        expect(recordOf(s, "/stuck")).toMatchObject({ status: 499, reason: "guest closed the connection" });
        const metrics = await s.proxy.metrics();
        expect(sample(metrics, "egressgate_requests_total", { decision: "gone" })).toBe(1);
        expect(sample(metrics, "egressgate_requests_total", { status_class: "5xx" })).toBeUndefined();
        await expectServesOn(s);
      });
    }
  });
}
