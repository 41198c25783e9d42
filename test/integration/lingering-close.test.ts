import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { Socket } from "node:net";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { describe, expect, it, onTestFinished } from "vitest";
import type { HttpHooksOptions, ProxyOptions } from "../../src/index.js";
import { latch } from "../helpers/latch.js";
import { startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { openRaw, parseResponse, type RawResponse } from "../helpers/raw.js";
import { testCa } from "../helpers/test-ca.js";
import { listenForTest } from "../helpers/upstream.js";

// The answers the proxy writes as bytes on a socket (a CONNECT or an upgrade refused, a parse
// error, the connection limit, a body that failed before its first byte) closed the connection
// as soon as they were flushed, whether or not the guest was still sending: the proxy's kernel
// answered the guest's next bytes (or the ones it had not read) with a reset, and a guest that
// sends its request before it reads (Python's http.client, curl until a send fails) lost the
// answer to EPIPE. Each row below is a guest still sending when its answer comes.

const MiB = 1024 * 1024;
/** More than the guest's send buffer and the proxy's receive buffer take (4 MiB and some), and less than the linger's byte bound. */
const uploadBytes = 8 * MiB;

/** On the listener itself, or inside a CONNECT tunnel, plain or TLS. */
type Way = "absolute-form" | "plain tunnel" | "TLS tunnel";

interface Upstream {
  readonly port: number;
  /** `api.test:port`: the CONNECT target and the Host. */
  readonly host: string;
  /** Settles once a request for `path` has its head at the upstream. */
  arrived(path: string): Promise<void>;
  /** Destroys the connection of the request for `/held-head`, whose head alone went out. */
  cutHeldHead(): void;
}

/**
 * `/upload` never answers (its body is the guest's to break); `/held-head` gets a head
 * announcing 100 bytes and nothing more, its body unread, until {@link Upstream.cutHeldHead};
 * anything else gets 200 "ok" after its body.
 */
async function startUpstream(secure: boolean): Promise<Upstream> {
  const arrivals = new Map<string, [Promise<void>, () => void]>();
  const arrival = (path: string): [Promise<void>, () => void] => {
    let entry = arrivals.get(path);
    if (entry === undefined) arrivals.set(path, (entry = latch()));
    return entry;
  };
  let heldHead: ServerResponse | undefined;
  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    const path = req.url ?? "";
    req.on("error", () => undefined);
    arrival(path)[1]();
    if (path === "/held-head") {
      res.writeHead(200, { "content-type": "text/plain", "content-length": 100 });
      res.flushHeaders();
      heldHead = res;
      return;
    }
    req.resume();
    if (path !== "/upload") req.on("end", () => res.end("ok"));
  };
  let port: number;
  if (secure) {
    const credentials = (await (await testCa()).serverCredentials(["api.test"])).get("api.test")!;
    port = await listenForTest(createHttpsServer({ key: credentials.key, cert: credentials.cert }, handler));
  } else port = await listenForTest(createHttpServer(handler));
  return { port, host: `api.test:${port}`, arrived: (path) => arrival(path)[0], cutHeldHead: () => heldHead?.socket?.destroy() };
}

interface Setup {
  readonly way: Way;
  readonly proxy: TestProxy;
  readonly upstream: Upstream;
}

async function setup(way: Way, hooks: (upstream: Upstream) => HttpHooksOptions = () => ({}), options: Omit<ProxyOptions, "httpHooks"> = {}): Promise<Setup> {
  const upstream = await startUpstream(way === "TLS tunnel");
  const proxy = await startTestProxy({ allowedHosts: ["api.test"], allowedInternalHosts: ["api.test"], ...hooks(upstream) }, options);
  return { way, proxy, upstream };
}

/**
 * A guest connection of the way, from 127.0.0.1 unless `localAddress` says otherwise: on the
 * listener, or inside a tunnel (TLS or not). It is not read until the guest says so.
 */
async function open(s: Setup, localAddress?: string): Promise<Socket | TLSSocket> {
  const client = await openRaw(s.proxy.port, localAddress === undefined ? {} : { localAddress });
  if (s.way !== "absolute-form") {
    client.write(`CONNECT ${s.upstream.host} HTTP/1.1\r\nHost: ${s.upstream.host}\r\n\r\n`);
    expect((await client.readResponse({ forConnect: true })).status).toBe(200);
  }
  const plain = client.detach();
  if (s.way !== "TLS tunnel") return plain;
  const socket = tlsConnect({ socket: plain, servername: "api.test", ca: s.proxy.caCertPem, ALPNProtocols: ["http/1.1"] });
  onTestFinished(() => void socket.destroy());
  await new Promise<void>((resolve, reject) => {
    socket.once("secureConnect", resolve);
    socket.once("error", reject);
  });
  return socket;
}

/** A request head of the way: absolute-form on the listener, origin-form inside a tunnel. */
function head(s: Setup, method: string, path: string, fields = ""): string {
  const target = s.way === "absolute-form" ? `http://${s.upstream.host}${path}` : path;
  return `${method} ${target} HTTP/1.1\r\nHost: ${s.upstream.host}\r\n${fields}\r\n`;
}

/** What a guest that sent everything before it read got: its send's failure, if any, and every response it then read. */
interface Outcome {
  readonly sendError: string | undefined;
  readonly responses: readonly RawResponse[];
  /** Bytes after the last whole response. */
  readonly rest: string;
}

/**
 * Writes `first`, then `uploadBytes` of filler 64 KiB at a time, each write once the last was
 * taken, without reading: a client that sends its whole request before it reads. Then reads
 * until the proxy ends the connection, and ends its own side.
 */
async function sendThenRead(socket: Socket | TLSSocket, first: string): Promise<Outcome> {
  socket.pause();
  let sendError: string | undefined;
  socket.on("error", (error: NodeJS.ErrnoException) => (sendError ??= error.code ?? error.message));
  const chunk = Buffer.alloc(64 * 1024, 0x61);
  const written = (data: string | Buffer): Promise<boolean> =>
    new Promise((resolve) => {
      if (socket.destroyed) return resolve(false);
      socket.write(data, (error) => resolve(error == null));
    });
  let ok = await written(Buffer.from(first, "latin1"));
  for (let sent = 0; ok && sent < uploadBytes; sent += chunk.length) ok = await written(chunk);
  const received: Buffer[] = [];
  await new Promise<void>((resolve) => {
    socket.on("data", (data: Buffer) => received.push(data));
    socket.once("end", () => resolve());
    socket.once("close", () => resolve());
    socket.resume();
  });
  socket.end();
  let bytes = Buffer.concat(received);
  const responses: RawResponse[] = [];
  for (;;) {
    const parsed = parseResponse(bytes, false, false);
    if (parsed === undefined) break;
    responses.push(parsed.response);
    bytes = bytes.subarray(parsed.consumed);
  }
  return { sendError, responses, rest: bytes.toString("latin1") };
}

/** The guest read `expected` (status and body), each answer closing the connection unless it is not the last. */
function expectAnswered(outcome: Outcome, expected: readonly { readonly status: number; readonly body: string | RegExp }[]): void {
  expect(outcome.sendError).toBeUndefined();
  expect(outcome.responses.map((res) => res.status)).toEqual(expected.map((answer) => answer.status));
  expected.forEach((answer, i) => expect(outcome.responses[i]!.body).toMatch(answer.body));
  expect(outcome.responses.at(-1)!.headers["connection"]).toBe("close");
  expect(outcome.rest).toBe("");
}

/** A new connection of the way (from 127.0.0.1) is served. */
async function expectServesOn(s: Setup): Promise<void> {
  const socket = await open(s);
  socket.write(head(s, "GET", "/ok"));
  const outcome = await new Promise<string>((resolve) => {
    let text = "";
    socket.on("data", (data: Buffer) => {
      text += data.toString("latin1");
      if (text.endsWith("\r\n\r\nok")) resolve(text);
    });
    socket.once("close", () => resolve(text));
    socket.resume();
  });
  expect(outcome).toMatch(/^HTTP\/1\.1 200 [^]*\r\n\r\nok$/);
  socket.destroy();
}

/** Too many header fields for the proxy (it takes 256). */
const manyFields = Array.from({ length: 300 }, (_, i) => `X-Field-${i}: ${i}\r\n`).join("");

/** One raw-socket answer: the way(s) it is reached, and what the guest is doing when it comes. */
interface Row {
  readonly name: string;
  readonly ways: readonly Way[];
  readonly hooks?: (upstream: Upstream) => HttpHooksOptions;
  readonly options?: Omit<ProxyOptions, "httpHooks">;
  /** Opens the guest's connection, writes what comes before the upload, and returns the upload's first bytes. */
  start(s: Setup): Promise<{ socket: Socket | TLSSocket; first: string }>;
  readonly answers: (s: Setup) => readonly { readonly status: number; readonly body: string | RegExp }[];
}

const rows: readonly Row[] = [
  {
    name: "a malformed head, the bytes after it still coming (400, the parser's)",
    ways: ["absolute-form", "TLS tunnel"],
    start: async (s) => ({ socket: await open(s), first: head(s, "POST", "/ok", `Bad Field: x\r\nContent-Length: ${uploadBytes}\r\n`) }),
    answers: () => [{ status: 400, body: /^400 Bad Request: malformed request \(invalid header token\)/ }],
  },
  {
    name: "a head past 64 KiB, still arriving (431, the parser's)",
    ways: ["absolute-form", "TLS tunnel"],
    start: async (s) => ({ socket: await open(s), first: head(s, "GET", "/ok").slice(0, -2) + "X-Long: " }),
    answers: () => [{ status: 431, body: /^431 Request Header Fields Too Large: request head is larger than/ }],
  },
  {
    name: "a chunked upload that breaks while it is served, before its response (400 in its place)",
    ways: ["absolute-form", "TLS tunnel"],
    start: async (s) => {
      const socket = await open(s);
      socket.write(`${head(s, "POST", "/upload", "Transfer-Encoding: chunked\r\n")}3\r\nabc\r\n`);
      await s.upstream.arrived("/upload");
      return { socket, first: "zz\r\n" };
    },
    answers: () => [{ status: 400, body: "400 Bad Request: malformed request (invalid chunk size)\n" }],
  },
  {
    name: "a malformed head pipelined behind a request, the bytes after it still coming (400 after that request's 200)",
    ways: ["absolute-form", "TLS tunnel"],
    start: async (s) => ({ socket: await open(s), first: `${head(s, "GET", "/ok")}${head(s, "POST", "/ok", `Bad Field: x\r\nContent-Length: ${uploadBytes}\r\n`)}` }),
    answers: () => [
      { status: 200, body: "ok" },
      { status: 400, body: /^400 Bad Request: malformed request \(invalid header token\)/ },
    ],
  },
  {
    // The hook holds the response, a read of a clone under way, when the upstream goes; it then
    // passes the response on, whose body fails before its first byte after Node stored the head
    // (sendResponse's `unsent`).
    name: "an upload whose upstream body fails before its first byte (502 in the response's place)",
    ways: ["absolute-form", "TLS tunnel"],
    hooks: (upstream) => ({
      onResponse: async (response, request) => {
        if (new URL(request.url).pathname !== "/held-head") return undefined;
        const reading = response.clone().text();
        upstream.cutHeldHead();
        await reading.catch(() => undefined);
        return undefined;
      },
    }),
    start: async (s) => ({ socket: await open(s), first: head(s, "POST", "/held-head", `Content-Length: ${uploadBytes}\r\n`) }),
    answers: (s) => [{ status: 502, body: `502 Bad Gateway: the upstream response body from ${s.upstream.host} failed before it could be sent\n` }],
  },
  {
    name: "a CONNECT to a host the allowlist refuses, bytes sent behind it (403)",
    ways: ["absolute-form"],
    start: async (s) => ({ socket: await open(s), first: "CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n" }),
    answers: () => [{ status: 403, body: /^403 Forbidden: host "denied\.test" is not in allowedHosts/ }],
  },
  {
    name: "a CONNECT inside a tunnel, bytes sent behind it (405)",
    ways: ["plain tunnel", "TLS tunnel"],
    start: async (s) => ({ socket: await open(s), first: `CONNECT ${s.upstream.host} HTTP/1.1\r\nHost: ${s.upstream.host}\r\n\r\n` }),
    answers: () => [{ status: 405, body: /^405 Method Not Allowed: CONNECT/ }],
  },
  {
    name: "an upgrade with more header fields than the proxy takes, frames sent behind it (431)",
    ways: ["absolute-form", "TLS tunnel"],
    start: async (s) => ({ socket: await open(s), first: head(s, "GET", "/ok", `Connection: Upgrade\r\nUpgrade: websocket\r\n${manyFields}`) }),
    answers: () => [{ status: 431, body: "431 Request Header Fields Too Large: request head has more than 256 header fields\n" }],
  },
  {
    name: "an upgrade to another protocol than WebSocket, frames sent behind it (400)",
    ways: ["absolute-form", "TLS tunnel"],
    start: async (s) => ({ socket: await open(s), first: head(s, "GET", "/ok", "Connection: Upgrade\r\nUpgrade: h2c\r\n") }),
    answers: () => [{ status: 400, body: /^400 Bad Request: only WebSocket upgrades are relayed/ }],
  },
  {
    name: "a connection past limits.connectionsPerSource, its first request an upload (503 at accept)",
    ways: ["absolute-form"],
    options: { limits: { connectionsPerSource: 1 } },
    start: async (s) => {
      // The source's one connection, held open; the other guest connections come from 127.0.0.1.
      await openRaw(s.proxy.port, { localAddress: "127.0.0.2" });
      return { socket: await open(s, "127.0.0.2"), first: head(s, "POST", "/ok", `Content-Length: ${uploadBytes}\r\n`) };
    },
    answers: () => [{ status: 503, body: /^503 Service Unavailable: too many connections: 127\.0\.0\.2 already has 1 connections open/ }],
  },
];

describe("an answer written on the raw socket while the guest still sends: the proxy reads and drops the rest before it closes, so the guest's send never fails and it reads the answer", () => {
  for (const row of rows) {
    for (const way of row.ways) {
      it(`${row.name}, ${way}`, async () => {
        const s = await setup(way, row.hooks, row.options);
        const { socket, first } = await row.start(s);
        expectAnswered(await sendThenRead(socket, first), row.answers(s));
        await expectServesOn(s);
      });
    }
  }
});
