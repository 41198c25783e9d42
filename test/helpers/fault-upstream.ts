import { createHash } from "node:crypto";
import { createServer as createHttpsServer } from "node:https";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { createServer as createTlsServer, type SecureContext } from "node:tls";
import { gzipSync } from "node:zlib";
import { patternChunk } from "./upstream.js";
import { testCa } from "./test-ca.js";

/** How an upstream may answer, each a route of {@link startFaultUpstream}. */
export const upstreamBehaviours = ["cl", "chunked", "close", "gzip", "reset", "stall", "info", "redirect"] as const;
export type UpstreamBehaviour = (typeof upstreamBehaviours)[number];

/** Behaviours whose body never arrives whole. */
export const brokenBehaviours: ReadonlySet<UpstreamBehaviour> = new Set(["reset", "stall"]);

export interface FaultUpstream {
  /** Port of the HTTPS server with every route but `close`. */
  readonly port: number;
  /** Port of the raw TLS server whose bodies end at the close (HTTP/1.0, no Content-Length). */
  readonly closePort: number;
  /** The URL path (and port) that gives `behaviour`. */
  url(host: string, behaviour: UpstreamBehaviour | "big" | "upload"): string;
  /** sha256 of the bytes the guest must receive for a behaviour that completes. */
  sha256(behaviour: UpstreamBehaviour | "big" | "gunzipped"): string;
  close(): Promise<void>;
}

const body = Buffer.concat([patternChunk(48 * 1024), Buffer.from("end of body\n")]);
const json = Buffer.from(JSON.stringify({ hello: "world", fill: "x".repeat(20_000) }));
const gzipped = gzipSync(json);
const big = Buffer.concat(Array.from({ length: 32 }, () => patternChunk(64 * 1024)));
const partial = patternChunk(16 * 1024);

const sha = (bytes: Buffer): string => createHash("sha256").update(bytes).digest("hex");

/**
 * An upstream for the reliability tests: one HTTPS server whose routes answer with every framing
 * and every failure (Content-Length, chunked, gzip, a reset or a stall mid-body, 1xx first, a
 * redirect with a body), plus a raw TLS server whose bodies end at the connection's close.
 */
export async function startFaultUpstream(names: readonly string[]): Promise<FaultUpstream> {
  const ca = await testCa();
  const contexts = await ca.serverContexts(names);
  const fallback = contexts.get(names[0]!)!;
  const tlsOptions = {
    secureContext: fallback,
    SNICallback: (name: string, cb: (error: Error | null, context?: SecureContext) => void) => cb(null, contexts.get(name) ?? fallback),
  };
  const sockets = new Set<Socket>();
  const track = (socket: Socket): void => {
    sockets.add(socket);
    socket.on("error", () => undefined);
    socket.once("close", () => sockets.delete(socket));
  };
  const routes: Record<string, (req: IncomingMessage, res: ServerResponse) => void> = {
    "/cl": (_req, res) => {
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": body.length });
      res.end(body);
    },
    "/chunked": (_req, res) => {
      res.writeHead(200, { "content-type": "application/octet-stream" });
      for (let at = 0; at < body.length; at += 10_000) res.write(body.subarray(at, at + 10_000));
      res.end();
    },
    "/gzip": (_req, res) => {
      res.writeHead(200, { "content-type": "application/json", "content-encoding": "gzip", "content-length": gzipped.length });
      res.end(gzipped);
    },
    "/reset": (_req, res) => {
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": body.length * 4 });
      // A TLS socket cannot send a TCP reset; destroyed without close_notify it is cut all the same.
      res.write(partial, () => setTimeout(() => res.socket?.destroy(), 20));
    },
    "/stall": (_req, res) => {
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": body.length * 4 });
      res.write(partial);
    },
    "/info": (_req, res) => {
      res.writeEarlyHints({ link: "</style.css>; rel=preload; as=style" });
      routes["/cl"]!(_req, res);
    },
    "/redirect": (_req, res) => {
      res.writeHead(302, { location: "/cl", "content-type": "text/plain" });
      res.end("moved to /cl\n".repeat(100));
    },
    "/big": (_req, res) => {
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": big.length });
      res.end(big);
    },
    "/upload": (req, res) => {
      const hash = createHash("sha256");
      req.on("data", (chunk: Buffer) => hash.update(chunk));
      req.on("end", () => res.end(hash.digest("hex")));
    },
  };
  const server = createHttpsServer(tlsOptions as never, (req, res) => {
    const route = routes[new URL(req.url ?? "/", "https://upstream").pathname];
    if (route === undefined) {
      res.writeHead(404);
      res.end();
      return;
    }
    route(req, res);
  });
  server.on("connection", track);
  server.on("secureConnection", track);
  const closeServer = createTlsServer(tlsOptions, (socket) => {
    track(socket);
    socket.once("data", () => {
      socket.write("HTTP/1.0 200 OK\r\ncontent-type: application/octet-stream\r\n\r\n");
      socket.end(body);
    });
  });
  closeServer.on("connection", track);
  await Promise.all([server, closeServer].map((s) => new Promise<void>((resolve) => s.listen(0, "127.0.0.1", resolve))));
  const port = (server.address() as AddressInfo).port;
  const closePort = (closeServer.address() as AddressInfo).port;
  return {
    port,
    closePort,
    url: (host, behaviour) => (behaviour === "close" ? `https://${host}:${closePort}/close` : `https://${host}:${port}/${behaviour}`),
    sha256: (behaviour) => sha(behaviour === "gzip" ? gzipped : behaviour === "gunzipped" ? json : behaviour === "big" ? big : body),
    async close() {
      for (const socket of sockets) socket.destroy();
      await Promise.all([server, closeServer].map((s) => new Promise<void>((resolve) => s.close(() => resolve()))));
    },
  };
}
