import { createHash } from "node:crypto";
import { createServer as createHttpServer, request as createHttpRequest, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo, Socket } from "node:net";
import { Readable } from "node:stream";
import type { SecureContext } from "node:tls";
import { onTestFinished } from "vitest";
import { testCa } from "./test-ca.js";

/** What the upstream's `/echo` route answers: the request as it arrived. */
export interface Echo {
  method: string;
  path: string;
  headers: Record<string, string | undefined>;
  bodyBytes: number;
  bodySha256: string;
}

export interface SeenRequest {
  readonly method: string;
  readonly url: string;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly rawHeaders: string[];
  readonly bodyBytes: number;
  readonly bodySha256: string;
}

export interface Upstream {
  readonly port: number;
  readonly protocol: "http:" | "https:";
  /** Every request the upstream received, in order. */
  readonly seen: SeenRequest[];
  readonly hits: () => number;
}

/** `body` holds at most the first MiB; `bodyBytes` and `bodySha256` always cover all of it. */
export type Route = (req: IncomingMessage, res: ServerResponse, body: Buffer, url: URL, seen: SeenRequest) => void;

/** A route answering `gzipped` (gzip-encoded JSON) with its Content-Encoding and exact length. */
export function gzipJsonRoute(gzipped: Buffer): Route {
  return (_req, res) => {
    res.writeHead(200, { "content-type": "application/json", "content-encoding": "gzip", "content-length": gzipped.length });
    res.end(gzipped);
  };
}

/** Deterministic bytes so both ends can hash without holding the whole transfer. */
export function patternChunk(size: number): Buffer {
  const chunk = Buffer.alloc(size);
  for (let i = 0; i < size; i++) chunk[i] = (i * 31 + 7) & 0xff;
  return chunk;
}

const patternUnit = 64 * 1024;

/** The sha256 of `size` bytes (a multiple of 64 KiB) of the pattern `/bytes` serves. */
export function patternSha256(size: number): string {
  const chunk = patternChunk(patternUnit);
  const hash = createHash("sha256");
  for (let n = 0; n < size; n += chunk.length) hash.update(chunk);
  return hash.digest("hex");
}

/** An upload body of `size` pattern bytes (a multiple of 64 KiB), produced on demand. */
export function patternBody(size: number): Readable {
  const chunk = patternChunk(patternUnit);
  let sent = 0;
  return new Readable({
    read() {
      if (sent >= size) this.push(null);
      else {
        sent += chunk.length;
        this.push(chunk);
      }
    },
  });
}

const defaultRoutes: Record<string, Route> = {
  "/echo": (req, res, _body, url, seen) => {
    const payload = JSON.stringify({
      method: req.method,
      path: url.pathname + url.search,
      headers: req.headers,
      bodyBytes: seen.bodyBytes,
      bodySha256: seen.bodySha256,
    });
    res.writeHead(200, { "content-type": "application/json" });
    res.end(payload);
  },
  "/redirect": (_req, res, _body, url) => {
    res.writeHead(Number(url.searchParams.get("status") ?? 302), { location: url.searchParams.get("to") ?? "/echo" });
    res.end();
  },
  "/loop": (_req, res) => {
    res.writeHead(302, { location: "/loop" });
    res.end();
  },
  "/cookies": (_req, res) => {
    res.writeHead(200, [
      ["set-cookie", "a=1; Path=/"],
      ["set-cookie", "b=2; Path=/"],
      ["content-type", "text/plain"],
    ] as unknown as Record<string, string>);
    res.end("cookies");
  },
  "/bytes": (_req, res, _body, url) => {
    const total = Number(url.searchParams.get("n") ?? 0);
    const chunk = patternChunk(64 * 1024);
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": total });
    let sent = 0;
    const pump = (): void => {
      while (sent < total) {
        const n = Math.min(chunk.length, total - sent);
        sent += n;
        if (!res.write(n === chunk.length ? chunk : chunk.subarray(0, n))) {
          res.once("drain", pump);
          return;
        }
      }
      res.end();
    };
    pump();
  },
};

/** Starts an upstream on 127.0.0.1:0 that records requests; closed when the test finishes. */
export async function startUpstream(
  options: { tls?: boolean; names?: readonly string[]; routes?: Record<string, Route>; hashOnly?: boolean } = {},
): Promise<Upstream> {
  const seen: SeenRequest[] = [];
  const routes = { ...defaultRoutes, ...options.routes };
  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    const hash = createHash("sha256");
    const chunks: Buffer[] = [];
    let bytes = 0;
    req.on("data", (c: Buffer) => {
      hash.update(c);
      bytes += c.length;
      // Large uploads are only hashed, never held.
      if (bytes <= 1024 * 1024) chunks.push(c);
    });
    req.on("end", () => {
      const body = bytes <= 1024 * 1024 ? Buffer.concat(chunks) : Buffer.alloc(0);
      const url = new URL(req.url ?? "/", "http://upstream");
      const record: SeenRequest = {
        method: req.method ?? "",
        url: req.url ?? "",
        headers: req.headers,
        rawHeaders: req.rawHeaders,
        bodyBytes: bytes,
        bodySha256: hash.digest("hex"),
      };
      seen.push(record);
      const route = routes[url.pathname];
      if (route === undefined) {
        res.writeHead(404, { "content-type": "text/plain" });
        res.end("no such route");
        return;
      }
      route(req, res, body, url, record);
    });
  };
  let server: Server;
  if (options.tls === false) server = createHttpServer(handler);
  else {
    const ca = await testCa();
    const names = options.names ?? ["api.test"];
    const contexts = await ca.serverContexts(names);
    const fallback = contexts.get(names[0]!)!;
    // A connection without SNI (to an IP literal) gets the first name's key and certificate.
    const defaults = (await ca.serverCredentials([names[0]!])).get(names[0]!)!;
    server = createHttpsServer(
      {
        SNICallback: (name: string, cb: (err: Error | null, ctx?: SecureContext) => void) => cb(null, contexts.get(name) ?? fallback),
        key: defaults.key,
        cert: defaults.cert,
      },
      handler,
    );
  }
  return {
    port: await listenForTest(server),
    protocol: options.tls === false ? "http:" : "https:",
    seen,
    hits: () => seen.length,
  };
}

/**
 * Listens on 127.0.0.1:0 and, when the test finishes, destroys every connection the server still
 * holds and closes it. Resolves with the port.
 */
export async function listenForTest(server: Server): Promise<number> {
  const sockets = new Set<Socket>();
  server.on("connection", (s: Socket) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return (server.address() as AddressInfo).port;
}

/**
 * A plain HTTP upstream that holds every request until `release()` answers it with "late":
 * `arrived` settles when the first request is in; `paths` lists every request's target, in order.
 * For requests in flight across a close or a drain.
 */
export async function heldHttpUpstream(): Promise<{ port: number; arrived: Promise<void>; release: () => void; paths: readonly string[] }> {
  let answer: (() => void) | undefined;
  let arrive: (() => void) | undefined;
  const arrived = new Promise<void>((resolve) => (arrive = resolve));
  const paths: string[] = [];
  const port = await listenForTest(
    createHttpServer((req, res) => {
      paths.push(req.url ?? "");
      answer = () => res.end("late");
      arrive?.();
    }),
  );
  return { port, arrived, release: () => answer?.(), paths };
}

/** GET over plain HTTP (no proxy): the status and the body as text. */
export function plainGet(url: string): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    createHttpRequest(url, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (text += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, text }));
    })
      .on("error", reject)
      .end();
  });
}
