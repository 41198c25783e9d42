import { createHash } from "node:crypto";
import { createServer as createNetServer, type AddressInfo, type Server, type Socket } from "node:net";
import { createServer as createTlsServer } from "node:tls";
import { parseUpstreamRequest, type UpstreamRequest } from "./wire.js";

/**
 * A loopback upstream that records exactly the bytes each connection brought (decrypted, for
 * TLS) and reads them with the fuzzer's strict parser: a request it cannot read, or one read two
 * ways, is a finding, and so is any byte at all for an upstream the allowlist refuses. Each
 * complete request is answered 200 with a short body naming the upstream.
 */
export interface Recorder {
  readonly label: string;
  readonly port: number;
  /** Connections accepted so far. */
  connections: number;
  /** Bytes received so far, over all connections. */
  bytes: number;
  /** Complete requests read so far. */
  requests: number;
  /** Of those, the ones answered with a redirect (each may bring the proxy's next hop). */
  redirects: number;
  /** Everything received since the harness last took it (`take()`), in order. */
  readonly received: Buffer[];
  /** Strict-parse failures: `reason` and the connection's bytes up to the failure. */
  readonly malformed: { reason: string; bytes: Buffer }[];
  /** Called for each request read, and whether it was answered with a redirect. */
  onRequest?: (request: UpstreamRequest, redirected: boolean) => void;
  close(): Promise<void>;
}

export interface RecorderOptions {
  readonly label: string;
  readonly host: string;
  /** Key and certificate for TLS; plain TCP without. */
  readonly tls?: { readonly key: string; readonly cert: string };
  /** A redirect for a request target (the proxy follows them itself); undefined answers 200. */
  readonly redirect?: (target: string) => { readonly status: number; readonly location: string } | undefined;
}

export async function startRecorder(options: RecorderOptions): Promise<Recorder> {
  const sockets = new Set<Socket>();
  const recorder: Recorder = {
    label: options.label,
    port: 0,
    connections: 0,
    bytes: 0,
    requests: 0,
    redirects: 0,
    received: [],
    malformed: [],
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const serve = (socket: Socket): void => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    socket.on("error", () => undefined);
    recorder.connections += 1;
    // The connection's last bytes, for a report: a pooled connection lives for many cases.
    let recent = Buffer.alloc(0);
    let pending: Buffer = Buffer.alloc(0);
    let sentContinue = false;
    // After a 101, the connection is the new protocol's: echoed, not parsed.
    let switched = false;
    socket.on("data", (chunk: Buffer) => {
      recorder.received.push(chunk);
      recent = Buffer.concat([recent, chunk]).subarray(-64 * 1024);
      recorder.bytes += chunk.length;
      if (switched) {
        socket.write(chunk);
        return;
      }
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
      for (;;) {
        const parsed = parseUpstreamRequest(pending);
        if (parsed.kind === "more") {
          // `Expect: 100-continue` forwarded: the proxy waits for our 100 before the body.
          const headEnd = pending.indexOf("\r\n\r\n");
          if (!sentContinue && headEnd >= 0 && /\r\nexpect:[ \t]*100-continue/i.test(pending.subarray(0, headEnd).toString("latin1"))) {
            sentContinue = true;
            socket.write("HTTP/1.1 100 Continue\r\n\r\n");
          }
          return;
        }
        if (parsed.kind === "bad") {
          recorder.malformed.push({ reason: parsed.reason, bytes: recent });
          socket.destroy();
          return;
        }
        pending = pending.subarray(parsed.consumed);
        sentContinue = false;
        recorder.requests += 1;
        // The path comes back (never a field): the guest matches answers to its requests by it.
        const body = `upstream ${options.label} ${recorder.requests} ${parsed.value.target.slice(0, 200)}\n`;
        const location = options.redirect?.(parsed.value.target);
        if (location !== undefined) recorder.redirects += 1;
        recorder.onRequest?.(parsed.value, location !== undefined);
        const field = (name: string): string => parsed.value.fields.filter(([n]) => n.toLowerCase() === name).map(([, v]) => v).join(",");
        if (/\bupgrade\b/i.test(field("connection")) && field("upgrade").toLowerCase() === "websocket" && field("sec-websocket-key") !== "") {
          // RFC 6455 §4.2.2: the accept value for the key.
          const accept = createHash("sha1").update(`${field("sec-websocket-key")}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest("base64");
          socket.write(`HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: ${accept}\r\n\r\n`);
          switched = true;
          if (pending.length > 0) socket.write(pending);
          return;
        }
        const status = location === undefined ? "200 OK" : `${location.status} Redirect`;
        const fields = location === undefined ? "" : `location: ${location.location}\r\n`;
        socket.write(`HTTP/1.1 ${status}\r\ncontent-type: text/plain\r\n${fields}content-length: ${body.length}\r\n\r\n${parsed.value.method === "HEAD" ? "" : body}`);
      }
    });
  };
  const { server, port } = await listenRaw(serve, options, ["http/1.1"], sockets);
  (recorder as { port: number }).port = port;
  return recorder;
}

/**
 * A raw server for the fuzz upstreams: plain TCP, or TLS offering `alpn`, on port 0 of `host`.
 * Every TCP connection, a TLS one still in its handshake included, is kept in `sockets` while
 * open, so that the caller's close() ends them all.
 */
export async function listenRaw(
  serve: (socket: Socket) => void,
  options: { readonly tls?: { readonly key: string; readonly cert: string }; readonly host: string },
  alpn: readonly string[],
  sockets: Set<Socket>,
): Promise<{ readonly server: Server; readonly port: number }> {
  const server: Server = options.tls === undefined ? createNetServer(serve) : createTlsServer({ ...options.tls, ALPNProtocols: [...alpn] }, serve);
  server.on("error", () => undefined);
  server.on("connection", (socket: Socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, options.host, () => resolve());
  });
  return { server, port: (server.address() as AddressInfo).port };
}
