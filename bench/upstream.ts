/**
 * The bench's upstream: an HTTPS server for `bench.test` on 127.0.0.1, in its own process so its
 * CPU is never the proxy's. `GET /small` answers 100 bytes; anything else is a 404.
 *
 * Forked by bench/run.ts with an IPC channel. It reads its key and certificate from the `setup`
 * message, reports `{ kind: "ready", port }`, answers `stats` with connection and request
 * counts, and exits when the parent disconnects, so it cannot outlive a killed bench.
 */
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
  readonly requests: number;
}

export type UpstreamMessage = { readonly kind: "ready"; readonly port: number } | UpstreamStats;

function send(message: UpstreamMessage): void {
  process.send?.(message);
}

function start(setup: UpstreamSetup): void {
  const body = Buffer.alloc(setup.bodyBytes, "x");
  const headers = { "content-type": "text/plain", "content-length": String(body.length) };
  let tlsConnections = 0;
  let requests = 0;
  const server = createServer({ key: setup.keyPem, cert: setup.certPem }, (req, res) => {
    requests += 1;
    if (req.method === "GET" && req.url === "/small") {
      res.writeHead(200, headers);
      res.end(body);
      return;
    }
    res.writeHead(404, { "content-length": "0" });
    res.end();
  });
  // Targets take turns, so a target's connections sit idle for a whole round between its windows;
  // Node's 5 s default would close them and put reconnects into the next window's figures.
  server.keepAliveTimeout = 120_000;
  server.headersTimeout = 30_000;
  server.on("secureConnection", (socket: TLSSocket) => {
    tlsConnections += 1;
    socket.on("error", () => undefined);
  });
  server.on("tlsClientError", () => undefined);
  server.listen(0, "127.0.0.1", () => {
    const address = server.address();
    if (address === null || typeof address === "string") throw new Error("unexpected listen address");
    send({ kind: "ready", port: address.port });
  });
  process.on("message", (message: { kind?: string }) => {
    if (message.kind === "stats") send({ kind: "stats", tlsConnections, requests });
  });
}

if (process.send === undefined) {
  process.stderr.write("bench/upstream.ts is started by bench/run.ts (it needs an IPC channel)\n");
  process.exit(2);
}
process.on("disconnect", () => process.exit(0));
process.once("message", (message: UpstreamSetup) => start(message));
