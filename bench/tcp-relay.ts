/**
 * The bench's baseline hop: a plain CONNECT relay that pipes bytes both ways and never looks
 * inside the TLS. Whatever it costs over `direct` is the price of any proxy hop; whatever
 * egressgate costs over it is the price of terminating TLS and handling each request.
 *
 * Forked by bench/run.ts with an IPC channel: reports `{ kind: "ready", port }`, answers `stats`
 * with its CONNECT count, and exits when the parent disconnects. It tunnels only to `bench.test`
 * names (`bench.test` and any subdomain) on the ports the bench names, and it dials those on
 * 127.0.0.1 without resolving anything, so it cannot be used to reach anything else.
 */
import { createServer, type IncomingMessage } from "node:http";
import { connect, type Socket } from "node:net";

export interface RelaySetup {
  readonly kind: "setup";
  /** The upstream ports the relay will tunnel to, for any bench.test name (dialled on 127.0.0.1). */
  readonly allowedPorts: readonly number[];
}

export type RelayMessage = { readonly kind: "ready"; readonly port: number } | { readonly kind: "stats"; readonly connects: number };

function send(message: RelayMessage): void {
  process.send?.(message);
}

function start(setup: RelaySetup): void {
  const ports = new Set(setup.allowedPorts);
  /** The port of a `bench.test` (or `*.bench.test`) authority on an allowed port, else undefined. */
  const allowedPort = (authority: string | undefined): number | undefined => {
    const match = /^([a-z0-9.-]+):(\d+)$/i.exec(authority ?? "");
    if (match === null) return undefined;
    const host = match[1]!.toLowerCase();
    const port = Number(match[2]);
    return (host === "bench.test" || host.endsWith(".bench.test")) && ports.has(port) ? port : undefined;
  };
  let connects = 0;
  const server = createServer((_req, res) => {
    res.writeHead(405, { "content-length": "0" });
    res.end();
  });
  server.keepAliveTimeout = 120_000;
  server.on("connect", (req: IncomingMessage, guest: Socket, head: Buffer) => {
    guest.on("error", () => undefined);
    const port = allowedPort(req.url);
    if (port === undefined) {
      guest.end("HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n");
      return;
    }
    connects += 1;
    const upstream = connect({ host: "127.0.0.1", port, noDelay: true }, () => {
      guest.write("HTTP/1.1 200 Connection Established\r\n\r\n");
      if (head.length > 0) upstream.write(head);
      guest.pipe(upstream);
      upstream.pipe(guest);
    });
    guest.setNoDelay(true);
    upstream.on("error", () => guest.destroy());
    guest.on("close", () => upstream.destroy());
    upstream.on("close", () => guest.destroy());
  });
  server.on("clientError", (_error, socket: Socket) => socket.destroy());
  server.listen(0, "127.0.0.1", () => {
    const address = server.address();
    if (address === null || typeof address === "string") throw new Error("unexpected listen address");
    send({ kind: "ready", port: address.port });
  });
  process.on("message", (message: { kind?: string }) => {
    if (message.kind === "stats") send({ kind: "stats", connects });
  });
}

if (process.send === undefined) {
  process.stderr.write("bench/tcp-relay.ts is started by bench/run.ts (it needs an IPC channel)\n");
  process.exit(2);
}
process.on("disconnect", () => process.exit(0));
process.once("message", (message: RelaySetup) => start(message));
