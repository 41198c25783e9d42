/**
 * The soak's upstreams, in their own process: HTTPS on 127.0.0.1 and 127.0.0.2 (one port), plain
 * HTTP, and two raw servers (TLS and plain) that answer HTTP/1.0 with a close-delimited body.
 * Bodies are slices of the shared pool (bench/soak-plan.ts):
 *
 *   GET  /bytes?o=OFF&n=N[&te=chunked][&gz=1]   the slice, with Content-Length unless chunked
 *   POST /upload                                {"bytes":N,"sha256":"…"} of what arrived
 *   GET  /reset?o&n&at=K                        head with Content-Length N, K bytes, then a TCP RST
 *   GET  /reset-head                            the connection closes before any response
 *   GET  /stall?o&n&at=K                        head, K bytes, then silence until the peer closes
 *   GET  /redirect?o&n                          302 with a body, to /bytes?o&n
 *   GET  /close?o&n  (raw servers)              HTTP/1.0 200, no Content-Length, body, close
 *
 * and two HTTP/2-only servers (bench/soak-h2-upstream.ts has their routes), one of which ends
 * its sessions with GOAWAY now and then.
 *
 * Every request must carry the marks of both hook tiers (bench/soak-plan.ts `headers`): the
 * upstream counts those that do not, so a request that slipped past the hooks shows up.
 *
 * Forked by bench/soak.ts with an IPC channel: `setup` → `ready` with the ports; `stats` →
 * counts, and how many stalled responses the proxy still holds open.
 */
import { createHash } from "node:crypto";
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { createServer as createNetServer, type AddressInfo, type Server as NetServer, type Socket } from "node:net";
import { createServer as createTlsServer } from "node:tls";
import { startH2Upstream, type H2UpstreamCounts } from "./soak-h2-upstream.js";
import { bodyPool, digestTrailer, headers, sliceBody } from "./soak-plan.js";

export interface SoakUpstreamSetup {
  readonly kind: "setup";
  readonly keyPem: string;
  readonly certPem: string;
}

export interface SoakUpstreamPorts {
  readonly kind: "ready";
  readonly https: number;
  readonly http: number;
  readonly closeTls: number;
  readonly closePlain: number;
  /** The HTTP/2-only server, and the one that sends GOAWAY now and then. */
  readonly h2: number;
  readonly h2Goaway: number;
}

export interface SoakUpstreamStats {
  readonly kind: "stats";
  readonly requests: number;
  /** Requests that arrived without both tiers' marks. */
  readonly unhooked: number;
  readonly firstUnhooked: string | undefined;
  /** Stalled responses whose connection is still open: the proxy never gave up on them. */
  readonly stalledOpen: number;
  readonly uploadsAborted: number;
  /** Connections currently open on every server together. */
  readonly openConnections: number;
  /** The HTTP/2 servers' counts: GOAWAYs sent, streams reset mid-body, streams the proxy reset. */
  readonly h2: H2UpstreamCounts;
}

const pool = bodyPool();
const gzipCache = new Map<string, Buffer>();
let requests = 0;
let unhooked = 0;
let firstUnhooked: string | undefined;
let uploadsAborted = 0;
const h2Counts: H2UpstreamCounts = { goaways: 0, resets: 0, cancelled: 0 };
const stalled = new Set<Socket>();
const open = new Set<Socket>();

function track(socket: Socket): void {
  open.add(socket);
  socket.on("close", () => open.delete(socket));
  socket.on("error", () => undefined);
}

function checkMarks(target: string, get: (name: string) => string | undefined): void {
  requests += 1;
  if (get(headers.seen2) === "seen" && get(headers.seen3) === "seen") return;
  unhooked += 1;
  firstUnhooked ??= `${target} (tier 2: ${get(headers.seen2) ?? "-"}, tier 3: ${get(headers.seen3) ?? "-"})`;
}

function slice(url: URL): Buffer {
  const offset = Number(url.searchParams.get("o"));
  const bytes = Number(url.searchParams.get("n"));
  if (url.searchParams.get("gz") !== "1") return sliceBody(pool, offset, bytes);
  const key = `${offset}:${bytes}`;
  let gz = gzipCache.get(key);
  if (gz === undefined) {
    gz = sliceBody(pool, offset, bytes, true);
    gzipCache.set(key, gz);
  }
  return gz;
}

/** Writes `body` in 16 KiB pieces, honouring backpressure, then `done`. */
function pump(res: ServerResponse | Socket, body: Buffer, done: () => void): void {
  let at = 0;
  const next = (): void => {
    while (at < body.length) {
      const piece = body.subarray(at, at + 16_384);
      at += piece.length;
      if (!res.write(piece)) {
        res.once("drain", next);
        return;
      }
    }
    done();
  };
  next();
}

function handle(req: IncomingMessage, res: ServerResponse): void {
  const url = new URL(req.url ?? "/", "http://upstream");
  checkMarks(`${req.method} ${url.pathname}`, (name) => req.headers[name] as string | undefined);
  req.socket.on("error", () => undefined);
  res.on("error", () => undefined);
  switch (url.pathname) {
    case "/bytes": {
      const body = slice(url);
      const gz = url.searchParams.get("gz") === "1" ? { "content-encoding": "gzip" } : {};
      if (url.searchParams.get("te") === "chunked") res.writeHead(200, { "content-type": "application/octet-stream", ...gz });
      else res.writeHead(200, { "content-type": "application/octet-stream", "content-length": body.length, ...gz });
      pump(res, body, () => res.end());
      return;
    }
    case "/upload": {
      const hash = createHash("sha256");
      let bytes = 0;
      req.on("data", (chunk: Buffer) => {
        hash.update(chunk);
        bytes += chunk.length;
      });
      req.on("end", () => {
        const answer = JSON.stringify({ bytes, sha256: hash.digest("hex") });
        res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(answer) });
        res.end(answer);
      });
      req.on("aborted", () => (uploadsAborted += 1));
      req.on("error", () => res.destroy());
      return;
    }
    case "/reset":
    case "/stall": {
      const body = slice(url);
      const at = Number(url.searchParams.get("at"));
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": body.length });
      res.write(body.subarray(0, at));
      const socket = req.socket;
      if (url.pathname === "/stall") {
        stalled.add(socket);
        socket.once("close", () => stalled.delete(socket));
        return;
      }
      // After the bytes are on the wire: a RST, not a FIN, so the proxy sees ECONNRESET.
      setTimeout(() => resetSocket(socket), 5);
      return;
    }
    case "/reset-head":
      resetSocket(req.socket);
      return;
    case "/redirect": {
      const to = `/bytes?o=${url.searchParams.get("o")}&n=${url.searchParams.get("n")}`;
      const text = `moved to ${to}\n`;
      res.writeHead(302, { location: to, "content-type": "text/plain", "content-length": Buffer.byteLength(text) });
      res.end(text);
      return;
    }
    default:
      res.writeHead(404, { "content-length": "0" });
      res.end();
  }
}

/** A TCP reset where the socket allows one (a TLS socket's handle is not a TCP handle). */
function resetSocket(socket: Socket): void {
  const raw = ((socket as { _parent?: Socket })._parent ?? socket) as Socket & { resetAndDestroy?: () => void };
  try {
    raw.resetAndDestroy?.();
  } catch {
    // Falls through to a plain close.
  }
  socket.destroy();
}

/** An HTTP/1.0-style server: reads one request head, answers without a length, ends at close. */
function onRawConnection(socket: Socket): void {
  track(socket);
  let head = "";
  const onData = (chunk: Buffer): void => {
    head += chunk.toString("latin1");
    const end = head.indexOf("\r\n\r\n");
    if (end < 0) {
      if (head.length > 65_536) socket.destroy();
      return;
    }
    socket.off("data", onData);
    const [requestLine = "", ...lines] = head.slice(0, end).split("\r\n");
    const fields = new Map(lines.map((line) => [line.slice(0, line.indexOf(":")).trim().toLowerCase(), line.slice(line.indexOf(":") + 1).trim()]));
    const target = requestLine.split(" ")[1] ?? "/";
    const url = new URL(target, "http://upstream");
    checkMarks(`raw ${url.pathname}`, (name) => fields.get(name));
    if (url.pathname !== "/close") {
      socket.end("HTTP/1.0 404 Not Found\r\n\r\n");
      return;
    }
    socket.write("HTTP/1.0 200 OK\r\ncontent-type: application/octet-stream\r\n\r\n");
    pump(socket, slice(url), () => socket.end());
  };
  socket.on("data", onData);
}

function listen(server: NetServer, host: string, port = 0): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve((server.address() as AddressInfo).port);
    });
  });
}

async function start(setup: SoakUpstreamSetup): Promise<SoakUpstreamPorts> {
  const tls = { key: setup.keyPem, cert: setup.certPem };
  const httpsServer = (): NetServer => {
    const server = createHttpsServer(tls, handle);
    // Idle keep-alive connections go well within the soak's 10 s settle, so the proxy's pooled
    // upstream sockets are not counted as held.
    server.keepAliveTimeout = 2_000;
    server.on("connection", track);
    server.on("tlsClientError", () => undefined);
    return server;
  };
  const https = await listen(httpsServer(), "127.0.0.1");
  await listen(httpsServer(), "127.0.0.2", https);
  const httpServer = createHttpServer(handle);
  httpServer.keepAliveTimeout = 2_000;
  httpServer.on("connection", track);
  const http = await listen(httpServer, "127.0.0.1");
  const closeTlsServer = createTlsServer(tls, onRawConnection);
  closeTlsServer.on("tlsClientError", () => undefined);
  const closeTls = await listen(closeTlsServer, "127.0.0.1");
  const closePlain = await listen(createNetServer(onRawConnection), "127.0.0.1");
  const h2Deps = { tls, checkMarks, slice, track, digestTrailer, uploadAborted: () => void (uploadsAborted += 1) };
  const h2 = await listen(startH2Upstream(h2Deps, false, h2Counts), "127.0.0.1");
  const h2Goaway = await listen(startH2Upstream(h2Deps, true, h2Counts), "127.0.0.1");
  return { kind: "ready", https, http, closeTls, closePlain, h2, h2Goaway };
}

if (process.send === undefined) {
  process.stderr.write("bench/soak-upstream.ts is started by bench/soak.ts (it needs an IPC channel)\n");
  process.exit(2);
}
process.on("disconnect", () => process.exit(0));
process.on("message", (message: { kind?: string }) => {
  if (message.kind === "setup") {
    void start(message as SoakUpstreamSetup).then((ports) => process.send?.(ports));
  } else if (message.kind === "stats") {
    const stats: SoakUpstreamStats = { kind: "stats", requests, unhooked, firstUnhooked, stalledOpen: stalled.size, uploadsAborted, openConnections: open.size, h2: { ...h2Counts } };
    process.send?.(stats);
  }
});
