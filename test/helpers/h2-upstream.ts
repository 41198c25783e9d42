import { createSecureServer, type Http2SecureServer, type IncomingHttpHeaders, type ServerHttp2Session, type ServerHttp2Stream } from "node:http2";
import type { AddressInfo } from "node:net";
import { createServer as createTlsServer, type SecureContext, type TLSSocket } from "node:tls";
import { onTestFinished } from "vitest";
import { clientPreface, flag, frame, frameType, settings } from "./h2-frames.js";
import { testCa } from "./test-ca.js";

export type H2Route = (stream: ServerHttp2Stream, headers: IncomingHttpHeaders, body: Buffer) => void;

export interface H2Upstream {
  readonly port: number;
  readonly server: Http2SecureServer;
  /** Every request's headers, in arrival order. */
  readonly seen: IncomingHttpHeaders[];
  /** TLS connections accepted. */
  readonly connections: () => number;
  /** Destroys every TLS connection at once, with no GOAWAY: a crashed or restarted upstream. */
  readonly cut: () => void;
  /**
   * Ends every TLS connection with a FIN and no GOAWAY (what some servers do after their last
   * response); resolves once the FINs are sent.
   */
  readonly end: () => Promise<void>;
}

/**
 * An upstream that speaks only HTTP/2 (ALPN `h2`, no HTTP/1.1 fallback), like a gRPC server.
 * `/echo` answers the request head as JSON; `/trailers` answers a body and trailers. It listens
 * on `port` (0: any free one).
 */
export async function startH2Upstream(routes: Record<string, H2Route> = {}, names: readonly string[] = ["api.test"], port = 0): Promise<H2Upstream> {
  const ca = await testCa();
  const contexts = await ca.serverContexts(names);
  const fallback = contexts.get(names[0]!)!;
  const server = createSecureServer({
    allowHTTP1: false,
    SNICallback: (name: string, cb: (err: Error | null, ctx?: SecureContext) => void) => cb(null, contexts.get(name) ?? fallback),
    secureContext: fallback,
  } as Parameters<typeof createSecureServer>[0]);
  const seen: IncomingHttpHeaders[] = [];
  let connections = 0;
  const sessions = new Set<ServerHttp2Session>();
  const sockets = new Set<TLSSocket>();
  server.on("secureConnection", (socket: TLSSocket) => {
    connections += 1;
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  });
  server.on("session", (session: ServerHttp2Session) => {
    sessions.add(session);
    session.on("error", () => undefined);
    session.once("close", () => sessions.delete(session));
  });
  const all: Record<string, H2Route> = {
    "/echo": (stream, headers, body) => {
      stream.respond({ ":status": 200, "content-type": "application/json" });
      stream.end(JSON.stringify({ headers, bodyBytes: body.length }));
    },
    "/trailers": (stream) => {
      stream.respond({ ":status": 200, "content-type": "text/plain" }, { waitForTrailers: true });
      stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0", "x-checksum": "abc123" }));
      stream.end("body before trailers");
    },
    ...routes,
  };
  server.on("stream", (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => {
    stream.on("error", () => undefined);
    seen.push(headers);
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () => {
      const path = new URL(String(headers[":path"]), "https://x").pathname;
      const route = all[path];
      if (route === undefined) {
        stream.respond({ ":status": 404 });
        stream.end("no such route");
        return;
      }
      route(stream, headers, Buffer.concat(chunks));
    });
  });
  await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
  onTestFinished(async () => {
    for (const session of sessions) session.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const cut = (): void => {
    for (const socket of sockets) socket.destroy();
  };
  const end = async (): Promise<void> => {
    // Frames a session has yet to write would otherwise go after the FIN, and be lost.
    while ([...sessions].some((session) => !session.destroyed && (session.state.outboundQueueSize ?? 0) > 0)) await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setImmediate(resolve));
    await Promise.all([...sockets].map((socket) => new Promise<void>((resolve) => socket.end(resolve))));
  };
  return { port: (server.address() as AddressInfo).port, server, seen, connections: () => connections, cut, end };
}

export interface RawH2UpstreamOptions {
  /** Written once each TLS connection is up: by default an empty SETTINGS frame. */
  readonly greet?: (socket: TLSSocket) => void;
  /** Whether PINGs are answered (by default they are), or a connection's (by its number) are now: a peer that stops answering. */
  readonly answerPings?: boolean | ((connection: number) => boolean);
  /**
   * Whether a connection's `nth` SETTINGS from the proxy (from 1: its first, in the preface) is
   * acknowledged; by default every one is. An upstream whose acknowledgement never comes.
   */
  readonly ackSettings?: (connection: number, nth: number) => boolean;
  /** Each HEADERS frame's stream id and its connection's number (from 1): the answer is written here, if any. */
  readonly onHeaders?: (socket: TLSSocket, stream: number, connection: number) => void;
  /** Every frame the proxy sends after its preface, in order, before the upstream acts on it (SETTINGS, WINDOW_UPDATE, …). */
  readonly onFrame?: (type: number, flags: number, stream: number, payload: Buffer, connection: number) => void;
}

/**
 * An h2-only upstream (ALPN `h2`) written frame by frame, for what no well-behaved server sends:
 * it acknowledges SETTINGS (unless `ackSettings` says not), answers PINGs, and hands each request's HEADERS to `onHeaders`. It
 * never sends WINDOW_UPDATE, so an upload stops at the initial window (65,535 bytes).
 */
export async function startRawH2Upstream(options: RawH2UpstreamOptions = {}): Promise<{ port: number; connections: () => number }> {
  const ca = await testCa();
  const context = (await ca.serverContexts(["api.test"])).get("api.test")!;
  let connections = 0;
  const sockets = new Set<TLSSocket>();
  const server = createTlsServer({ SNICallback: (_name, cb) => cb(null, context), ALPNProtocols: ["h2"] }, (socket) => {
    const index = ++connections;
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    socket.on("error", () => undefined);
    if (options.greet === undefined) socket.write(settings());
    else options.greet(socket);
    let buffered = Buffer.alloc(0);
    let prefaceSeen = false;
    let settingsSeen = 0;
    socket.on("data", (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      if (!prefaceSeen) {
        if (buffered.length < clientPreface.length) return;
        buffered = buffered.subarray(clientPreface.length);
        prefaceSeen = true;
      }
      while (buffered.length >= 9 && !socket.writableEnded) {
        const length = buffered.readUIntBE(0, 3);
        if (buffered.length < 9 + length) return;
        const type = buffered[3]!;
        const flags = buffered[4]!;
        const stream = buffered.readUInt32BE(5) & 0x7fffffff;
        const payload = buffered.subarray(9, 9 + length);
        buffered = buffered.subarray(9 + length);
        options.onFrame?.(type, flags, stream, payload, index);
        if (type === frameType.settings && (flags & flag.ack) === 0 && (options.ackSettings?.(index, ++settingsSeen) ?? true)) socket.write(frame(frameType.settings, flag.ack, 0));
        const answerPings = typeof options.answerPings === "function" ? options.answerPings(index) : options.answerPings !== false;
        if (type === frameType.ping && (flags & flag.ack) === 0 && answerPings) socket.write(frame(frameType.ping, flag.ack, 0, payload));
        if (type === frameType.headers) options.onHeaders?.(socket, stream, index);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { port: (server.address() as AddressInfo).port, connections: () => connections };
}
