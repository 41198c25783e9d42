/**
 * The bench's Node upstream: HTTPS on 127.0.0.1 (two ports, see UpstreamMessage) with a `*.bench.test` certificate, so
 * it answers any bench hostname, in its own process so its CPU is never the proxy's.
 * `GET /small` answers 100 bytes (`/small-close` too, then closes the connection); `POST /upload`
 * reads the body, discards it and answers its length in bytes; `POST /hold` reads nothing and
 * never answers (an upstream that takes none of an upload: bench/h2-held.ts); `GET /download?bytes=N` sends N
 * zero bytes with backpressure (bulk downloads come from `openssl s_server` unless the bench is
 * run with `--bulk-upstream node`); anything else is a 404. A third port speaks only HTTP/2 (no
 * `http/1.1` in its ALPN, as a gRPC server), with Node's default flow-control windows:
 * `GET /small`, `GET /download?bytes=N` and `POST /upload` there too. The HTTP/1.1 ports also
 * take a WebSocket upgrade (bench/h1-held.ts): `GET /ws-hold` answers 101 and reads nothing
 * after it; `GET /ws-flood` answers 101 and writes zeros with backpressure until the connection
 * goes (counted in `downloadBytes`). No WebSocket framing: the proxy relays opaque bytes.
 *
 * Forked by bench/run.ts with an IPC channel. It reads its key and certificate from the `setup`
 * message, reports `{ kind: "ready", port }`, answers `stats` with connection and request
 * counts, and exits when the parent disconnects, so it cannot outlive a killed bench.
 */
import { constants } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { createSecureServer, type ServerHttp2Stream } from "node:http2";
import { createServer } from "node:https";
import type { TLSSocket } from "node:tls";

export interface UpstreamSetup {
  readonly kind: "setup";
  readonly keyPem: string;
  readonly certPem: string;
  readonly bodyBytes: number;
}

export interface UpstreamStats {
  readonly kind: "stats";
  /** TLS handshakes completed: each is one new upstream connection. */
  readonly tlsConnections: number;
  /** Of those, the ones that resumed an earlier session (cheaper than a full handshake). */
  readonly resumedSessions: number;
  readonly requests: number;
  /** HTTP/2 sessions the h2-only port accepted, and the streams it answered. */
  readonly h2Sessions: number;
  readonly h2Streams: number;
  /** Bytes of `/download` bodies handed to the sockets (both protocols): still while every reader has stopped. */
  readonly downloadBytes: number;
}

/**
 * `port` resumes TLS sessions like any server; `noResumePort` (the same handler) never does, so
 * every handshake to it is a full one whoever the client is and whatever it cached.
 */
export type UpstreamMessage = { readonly kind: "ready"; readonly port: number; readonly noResumePort: number; readonly h2Port: number } | UpstreamStats;

function send(message: UpstreamMessage): void {
  process.send?.(message);
}

function start(setup: UpstreamSetup): void {
  const body = Buffer.alloc(setup.bodyBytes, "x");
  const headers = { "content-type": "text/plain", "content-length": String(body.length) };
  const zeros = Buffer.alloc(64 * 1024);
  let tlsConnections = 0;
  let resumedSessions = 0;
  let requests = 0;
  let h2Sessions = 0;
  let h2Streams = 0;
  let downloadBytes = 0;
  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    requests += 1;
    if (req.method === "GET" && (req.url === "/small" || req.url === "/small-close")) {
      // `/small-close` makes a proxy open a new upstream connection for its next request, so a
      // new hostname and a known one cost it the same upstream handshake (on `noResumePort`, a full one).
      res.writeHead(200, req.url === "/small" ? headers : { ...headers, connection: "close" });
      res.end(body);
      return;
    }
    const download = req.method === "GET" ? /^\/download\?bytes=(\d+)$/.exec(req.url ?? "") : null;
    if (download !== null) {
      let left = Number(download[1]);
      res.writeHead(200, { "content-type": "application/octet-stream", "content-length": String(left) });
      const pump = (): void => {
        while (left > 0) {
          const piece = left >= zeros.length ? zeros : zeros.subarray(0, left);
          left -= piece.length;
          downloadBytes += piece.length;
          if (!res.write(piece)) {
            res.once("drain", pump);
            return;
          }
        }
        res.end();
      };
      pump();
      return;
    }
    if (req.method === "POST" && req.url === "/hold") {
      // Nothing read and no answer: the socket's buffers fill, and the proxy holds the rest.
      return;
    }
    if (req.method === "POST" && req.url === "/upload") {
      let received = 0;
      req.on("data", (chunk: Buffer) => (received += chunk.length));
      req.on("end", () => {
        const answer = String(received);
        res.writeHead(200, { "content-type": "text/plain", "content-length": String(answer.length) });
        res.end(answer);
      });
      req.on("error", () => res.destroy());
      return;
    }
    res.writeHead(404, { "content-length": "0" });
    res.end();
  };
  const listen = (secureOptions: number): Promise<number> => {
    const server = createServer({ key: setup.keyPem, cert: setup.certPem, secureOptions }, handler);
    // Targets take turns, so a target's connections sit idle for a whole round between its windows;
    // Node's 5 s default would close them and put reconnects into the next window's figures.
    server.keepAliveTimeout = 120_000;
    server.headersTimeout = 30_000;
    server.on("secureConnection", (socket: TLSSocket) => {
      tlsConnections += 1;
      if (socket.isSessionReused()) resumedSessions += 1;
      socket.on("error", () => undefined);
    });
    server.on("tlsClientError", () => undefined);
    server.on("upgrade", (req: IncomingMessage, socket: TLSSocket) => {
      requests += 1;
      socket.on("error", () => undefined);
      if (req.url !== "/ws-hold" && req.url !== "/ws-flood") return void socket.destroy();
      socket.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
      // What the guest sends is never read: the socket's buffers fill, and the proxy holds the rest.
      socket.pause();
      if (req.url === "/ws-hold") return;
      const pump = (): void => {
        while (!socket.destroyed) {
          downloadBytes += zeros.length;
          if (!socket.write(zeros)) {
            socket.once("drain", pump);
            return;
          }
        }
      };
      pump();
    });
    return new Promise((resolve) =>
      server.listen(0, "127.0.0.1", () => {
        const address = server.address();
        if (address === null || typeof address === "string") throw new Error("unexpected listen address");
        resolve(address.port);
      }),
    );
  };
  // Only h2 in its ALPN: an HTTP/1.1-only client fails the handshake, as with a gRPC server.
  const listenH2 = (): Promise<number> => {
    // Node's maxSessionMemory (10 MiB) counts the DATA its streams have queued: 3,200 downloads on
    // one connection, a chunk queued each, made the upstream itself end the connection (bench/h2-held.ts
    // with one source's many connections). An upstream in Go or Envoy queues no such sum; so neither does this one.
    const server = createSecureServer({ key: setup.keyPem, cert: setup.certPem, allowHTTP1: false, maxSessionMemory: 4096 });
    server.on("session", (session) => {
      h2Sessions += 1;
      session.on("error", () => undefined);
    });
    server.on("stream", (stream: ServerHttp2Stream, head) => {
      h2Streams += 1;
      stream.on("error", () => undefined);
      const path = String(head[":path"] ?? "");
      const download = head[":method"] === "GET" ? /^\/download\?bytes=(\d+)$/.exec(path) : null;
      if (head[":method"] === "GET" && path === "/small") {
        stream.respond({ ":status": 200, ...headers });
        stream.end(body);
      } else if (download !== null) {
        let left = Number(download[1]);
        stream.respond({ ":status": 200, "content-type": "application/octet-stream", "content-length": String(left) });
        // Paced by the stream's flow-control window: write returns false once it is full.
        const pump = (): void => {
          while (left > 0) {
            const piece = left >= zeros.length ? zeros : zeros.subarray(0, left);
            left -= piece.length;
            downloadBytes += piece.length;
            if (!stream.write(piece)) {
              stream.once("drain", pump);
              return;
            }
          }
          stream.end();
        };
        pump();
      } else if (head[":method"] === "POST" && path === "/hold") {
        // Nothing read: its window (Node's 65,535 bytes) fills, and the proxy holds the rest.
      } else if (head[":method"] === "POST" && path === "/upload") {
        let received = 0;
        stream.on("data", (chunk: Buffer) => (received += chunk.length));
        stream.on("end", () => {
          const answer = String(received);
          stream.respond({ ":status": 200, "content-type": "text/plain", "content-length": String(answer.length) });
          stream.end(answer);
        });
      } else {
        stream.respond({ ":status": 404, "content-length": "0" });
        stream.end();
      }
    });
    server.on("tlsClientError", () => undefined);
    server.on("sessionError", () => undefined);
    return new Promise((resolve) =>
      server.listen(0, "127.0.0.1", () => {
        const address = server.address();
        if (address === null || typeof address === "string") throw new Error("unexpected listen address");
        resolve(address.port);
      }),
    );
  };
  // Without tickets (and with no session cache, Node's default), TLS 1.3 cannot resume.
  void Promise.all([listen(0), listen(constants.SSL_OP_NO_TICKET), listenH2()]).then(([port, noResumePort, h2Port]) => send({ kind: "ready", port, noResumePort, h2Port }));
  process.on("message", (message: { kind?: string }) => {
    if (message.kind === "stats") send({ kind: "stats", tlsConnections, resumedSessions, requests, h2Sessions, h2Streams, downloadBytes });
  });
}

if (process.send === undefined) {
  process.stderr.write("bench/upstream.ts is started by bench/run.ts (it needs an IPC channel)\n");
  process.exit(2);
}
process.on("disconnect", () => process.exit(0));
process.once("message", (message: UpstreamSetup) => start(message));
