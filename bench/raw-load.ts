/**
 * The load generator's minimal clients (bench/load.ts runs them; the h2 scenario asks for them):
 * HTTP/1.1 and HTTP/2 small GETs written as fixed bytes and read back with no more parsing than
 * a status, a length and the frame boundaries, over CONNECT tunnels opened by hand.
 *
 * Why: the load generator shares two cores with the proxy and the upstream, and a client's own
 * cost per request decides how much of a core the proxy gets. undici is cheap per request;
 * `node:http2`'s client is not (a ClientHttp2Stream, its async resource and its listeners per
 * request), so in the node:http2 rows the proxy idled 10–20% while the HTTP/1.1 row kept it busy.
 * These two clients cost about the same per request on either protocol, so rows driven by them
 * compare the proxy's HTTP/2 with its HTTP/1.1, not two clients.
 *
 * - HTTP/1.1: one request in flight per connection (`concurrency` connections), the request
 *   head written whole, the response framed by its Content-Length.
 * - HTTP/2: `concurrency` streams over `connections` connections. A request is one HEADERS
 *   frame from a header block encoded once (static-table names, no Huffman, no dynamic table);
 *   the requests of one tick go out in one write. A response is judged by the first field of
 *   its header block, which must be the static entry for `:status: 200` (HPACK is otherwise not
 *   decoded: the decoder's table matters only to a reader of the other fields), and by its DATA
 *   bytes up to END_STREAM. SETTINGS and PING are acknowledged; the stream and connection
 *   windows are opened wide and the connection's is topped up as DATA arrives.
 */
import { createHistogram, performance, type RecordableHistogram } from "node:perf_hooks";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { connectThrough, laneSummaries, openShared, runLaneWindow, type H2Result, type H2Setup, type LaneSummary } from "./h2-load.js";

export interface RawRateRun {
  readonly kind: "rawrate";
  readonly id: number;
  readonly lane: string;
  /** A key of the load setup's `proxies`. */
  readonly target: string;
  readonly protocol: "h1" | "h2";
  readonly url: string;
  readonly expectedBytes: number;
  /** Requests in flight at once: HTTP/1.1 connections, or HTTP/2 streams over all connections. */
  readonly concurrency: number;
  /** HTTP/2 connections (HTTP/1.1 has one per request in flight). */
  readonly connections: number;
  readonly durationMs: number;
  /** At most this many requests, then the window ends (bench/h2-counts.ts's callgrind mode). */
  readonly requests?: number;
  readonly record: boolean;
}

interface Connection {
  readonly closed: boolean;
  /** performance.now() when it last had nothing in flight (or opened). */
  readonly idleSince: number;
  readonly inFlight: number;
  get(): Promise<void>;
  close(): void;
}

interface RawLane {
  readonly connections: (Connection | undefined)[];
  readonly histogram: RecordableHistogram;
  connects: number;
}

const lanes = new Map<string, RawLane>();
/** As the undici lanes: the client, never the target (egressgate closes at 5 s), ends an idle connection. */
const maxIdleMs = 4_000;
/** A handshake, or a connection with requests in flight and no bytes, past this fails. */
const stallMs = 30_000;

async function tunnelTls(setup: H2Setup, target: string, url: URL, alpn: string): Promise<TLSSocket> {
  if (url.hostname !== "bench.test" && !url.hostname.endsWith(".bench.test")) throw new Error(`${url.hostname} is not a bench.test name`);
  const proxy = setup.proxies[target];
  if (proxy === undefined) throw new Error(`no proxy ${target}`);
  const tunnel = await connectThrough(proxy.url, `${url.hostname}:${url.port}`);
  return new Promise((resolve, reject) => {
    const socket = tlsConnect({ socket: tunnel, servername: url.hostname, ca: proxy.caPem, ALPNProtocols: [alpn] });
    const timer = setTimeout(() => socket.destroy(new Error(`TLS handshake over ${stallMs} ms`)), stallMs);
    socket.once("error", (error) => {
      clearTimeout(timer);
      socket.destroy();
      reject(error);
    });
    socket.once("secureConnect", () => {
      clearTimeout(timer);
      socket.removeAllListeners("error");
      socket.on("error", () => undefined);
      if (socket.alpnProtocol !== alpn) {
        socket.destroy();
        reject(new Error(`ALPN gave ${JSON.stringify(socket.alpnProtocol)}, not ${alpn}`));
      } else resolve(socket);
    });
  });
}

/** HTTP/1.1 keep-alive: one request at a time, its response framed by Content-Length. */
class RawH1 implements Connection {
  closed = false;
  idleSince = performance.now();
  private readonly request: Buffer;
  private buffer: Buffer = Buffer.alloc(0);
  private waiting: { resolve: () => void; reject: (error: Error) => void } | undefined;

  get inFlight(): number {
    return this.waiting === undefined ? 0 : 1;
  }

  constructor(
    private readonly socket: TLSSocket,
    url: URL,
    private readonly expectedBytes: number,
  ) {
    this.request = Buffer.from(`GET ${url.pathname}${url.search} HTTP/1.1\r\nhost: ${url.host}\r\n\r\n`, "latin1");
    socket.on("data", (chunk: Buffer) => this.read(chunk));
    socket.on("close", () => this.fail(new Error("connection closed")));
    stallWatch(socket, () => this.waiting !== undefined);
  }

  get(): Promise<void> {
    if (this.closed) return Promise.reject(new Error("connection closed"));
    return new Promise((resolve, reject) => {
      this.waiting = { resolve, reject };
      this.socket.write(this.request);
    });
  }

  close(): void {
    this.socket.destroy();
  }

  private read(chunk: Buffer): void {
    this.buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk]);
    const end = this.buffer.indexOf("\r\n\r\n");
    if (end < 0) return;
    const head = this.buffer.toString("latin1", 0, end);
    const declared = /\r\ncontent-length: *(\d+)/i.exec(head)?.[1];
    if (declared === undefined) {
      // Framed some other way (chunked, or up to the close): not a small GET's answer, and the
      // connection's next response could not be found. The lane opens a new one.
      this.fail(new Error(`${head.split("\r\n")[0]} without Content-Length`));
      this.socket.destroy();
      return;
    }
    const length = Number(declared);
    if (this.buffer.length < end + 4 + length) return;
    const waiting = this.waiting;
    this.waiting = undefined;
    this.idleSince = performance.now();
    this.buffer = this.buffer.subarray(end + 4 + length);
    if (head.startsWith("HTTP/1.1 200 ") && length === this.expectedBytes) waiting?.resolve();
    else waiting?.reject(new Error(`${head.split("\r\n")[0]}, content-length ${length}`));
  }

  private fail(error: Error): void {
    this.closed = true;
    const waiting = this.waiting;
    this.waiting = undefined;
    waiting?.reject(error);
  }
}

const frameTypes = { data: 0, headers: 1, rstStream: 3, settings: 4, ping: 6, goaway: 7 } as const;
const endStream = 0x1;
const ack = 0x1;
const endHeaders = 0x4;
const padded = 0x8;
const priority = 0x20;
const wideWindow = 0x7fffffff;

function frame(type: number, flags: number, streamId: number, payload: Buffer): Buffer {
  const out = Buffer.alloc(9 + payload.length);
  out.writeUIntBE(payload.length, 0, 3);
  out[3] = type;
  out[4] = flags;
  out.writeUInt32BE(streamId, 5);
  payload.copy(out, 9);
  return out;
}

/** A literal field without indexing whose name is static-table entry `index` (RFC 7541 §6.2.2); values under 127 bytes. */
function staticNameLiteral(index: number, value: string): Buffer {
  const bytes = Buffer.from(value, "latin1");
  if (bytes.length >= 127) throw new RangeError("value too long for a one-byte length");
  return Buffer.concat([Buffer.from([index, bytes.length]), bytes]);
}

interface Pending {
  ok: boolean;
  bytes: number;
  readonly resolve: () => void;
  readonly reject: (error: Error) => void;
}

/** HTTP/2 over one TLS connection, many streams in flight. */
class RawH2 implements Connection {
  closed = false;
  idleSince = performance.now();
  private readonly block: Buffer;
  private nextStream = 1;
  private readonly pending = new Map<number, Pending>();
  private buffer: Buffer = Buffer.alloc(0);
  private unacknowledgedData = 0;
  private corked = false;

  get inFlight(): number {
    return this.pending.size;
  }

  constructor(
    private readonly socket: TLSSocket,
    url: URL,
    private readonly expectedBytes: number,
  ) {
    // :method GET (static 2), :scheme https (static 7), :authority (name 1), :path (name 4).
    this.block = Buffer.concat([Buffer.from([0x82, 0x87]), staticNameLiteral(1, url.host), staticNameLiteral(4, `${url.pathname}${url.search}`)]);
    const settings = Buffer.alloc(12);
    settings.writeUInt16BE(0x2, 0); // ENABLE_PUSH 0
    settings.writeUInt32BE(0, 2);
    settings.writeUInt16BE(0x4, 6); // INITIAL_WINDOW_SIZE
    settings.writeUInt32BE(wideWindow, 8);
    socket.write(Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1"), frame(frameTypes.settings, 0, 0, settings), this.windowUpdate(wideWindow - 65_535)]));
    socket.on("data", (chunk: Buffer) => this.read(chunk));
    socket.on("close", () => this.fail(new Error("connection closed")));
    stallWatch(socket, () => this.pending.size > 0);
  }

  get(): Promise<void> {
    if (this.closed) return Promise.reject(new Error("connection closed"));
    const id = this.nextStream;
    this.nextStream += 2;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { ok: false, bytes: 0, resolve, reject });
      // The requests started in one tick leave in one write (one TLS record), as h2load's do.
      if (!this.corked) {
        this.corked = true;
        this.socket.cork();
        process.nextTick(() => {
          this.corked = false;
          this.socket.uncork();
        });
      }
      this.socket.write(frame(frameTypes.headers, endStream | endHeaders, id, this.block));
    });
  }

  close(): void {
    this.socket.destroy();
  }

  private windowUpdate(increment: number): Buffer {
    const payload = Buffer.alloc(4);
    payload.writeUInt32BE(increment, 0);
    return frame(8, 0, 0, payload);
  }

  private read(chunk: Buffer): void {
    let buffer = this.buffer.length === 0 ? chunk : Buffer.concat([this.buffer, chunk]);
    let at = 0;
    while (buffer.length - at >= 9) {
      const length = buffer.readUIntBE(at, 3);
      if (buffer.length - at < 9 + length) break;
      const type = buffer[at + 3]!;
      const flags = buffer[at + 4]!;
      const id = buffer.readUInt32BE(at + 5) & 0x7fffffff;
      this.onFrame(type, flags, id, buffer.subarray(at + 9, at + 9 + length));
      at += 9 + length;
    }
    buffer = buffer.subarray(at);
    this.buffer = buffer;
  }

  private onFrame(type: number, flags: number, id: number, payload: Buffer): void {
    if (type === frameTypes.data) {
      const stream = this.pending.get(id);
      const pad = (flags & padded) !== 0 ? payload[0]! + 1 : 0;
      if (stream !== undefined) stream.bytes += payload.length - pad;
      this.unacknowledgedData += payload.length;
      if (this.unacknowledgedData > 256 * 1024 * 1024) {
        this.socket.write(this.windowUpdate(this.unacknowledgedData));
        this.unacknowledgedData = 0;
      }
      if ((flags & endStream) !== 0) this.finish(id);
    } else if (type === frameTypes.headers) {
      const stream = this.pending.get(id);
      if (stream !== undefined && stream.bytes === 0 && !stream.ok) {
        let at = ((flags & padded) !== 0 ? 1 : 0) + ((flags & priority) !== 0 ? 5 : 0);
        // Dynamic table size updates (001xxxxx) may open a block; then `:status: 200` is static entry 8.
        while (at < payload.length && (payload[at]! & 0xe0) === 0x20) {
          const multiByte = (payload[at]! & 0x1f) === 0x1f;
          at += 1;
          if (multiByte) while (at < payload.length && (payload[at++]! & 0x80) !== 0);
        }
        stream.ok = payload[at] === 0x88;
      }
      if ((flags & endStream) !== 0) this.finish(id);
    } else if (type === frameTypes.rstStream) {
      const stream = this.pending.get(id);
      this.pending.delete(id);
      if (this.pending.size === 0) this.idleSince = performance.now();
      stream?.reject(new Error(`RST_STREAM code ${payload.length >= 4 ? payload.readUInt32BE(0) : "(short frame)"}`));
    } else if (type === frameTypes.settings) {
      if ((flags & ack) === 0) this.socket.write(frame(frameTypes.settings, ack, 0, Buffer.alloc(0)));
    } else if (type === frameTypes.ping) {
      if ((flags & ack) === 0) this.socket.write(frame(frameTypes.ping, ack, 0, payload));
    } else if (type === frameTypes.goaway) {
      // Streams up to the last one the server names still get their answers; later ones never will.
      const last = payload.length >= 8 ? payload.readUInt32BE(0) & 0x7fffffff : 0;
      const error = new Error(`GOAWAY code ${payload.length >= 8 ? payload.readUInt32BE(4) : "(short frame)"}`);
      this.closed = true;
      for (const [stream, waiting] of this.pending) {
        if (stream <= last) continue;
        this.pending.delete(stream);
        waiting.reject(error);
      }
      if (this.pending.size === 0) this.socket.end();
    }
  }

  private finish(id: number): void {
    const stream = this.pending.get(id);
    if (stream === undefined) return;
    this.pending.delete(id);
    if (this.pending.size === 0) {
      this.idleSince = performance.now();
      if (this.closed) this.socket.end();
    }
    if (stream.ok && stream.bytes === this.expectedBytes) stream.resolve();
    else stream.reject(new Error(`stream ${id}: ${stream.ok ? "200" : "not 200"}, ${stream.bytes} bytes`));
  }

  private fail(error: Error): void {
    this.closed = true;
    for (const stream of this.pending.values()) stream.reject(error);
    this.pending.clear();
  }
}

/** Ends a connection that has requests in flight and has received nothing for `stallMs`. */
function stallWatch(socket: TLSSocket, busy: () => boolean): void {
  socket.setTimeout(stallMs, () => {
    if (busy()) socket.destroy(new Error(`no answer in ${stallMs} ms`));
  });
}

function laneFor(run: RawRateRun): RawLane {
  let lane = lanes.get(run.lane);
  if (lane === undefined) {
    const count = run.protocol === "h1" ? run.concurrency : run.connections;
    lane = { connections: Array.from({ length: count }, () => undefined), histogram: createHistogram({ lowest: 1, highest: 600e9, figures: 3 }), connects: 0 };
    lanes.set(run.lane, lane);
  }
  return lane;
}

/** The lane's i-th connection, opened (again) when missing or closed; concurrent callers share one opening. */
function connectionOf(setup: H2Setup, run: RawRateRun, lane: RawLane, i: number, opening: Map<number, Promise<Connection>>): Promise<Connection> {
  const current = lane.connections[i];
  if (current !== undefined && !current.closed) {
    if (current.inFlight > 0 || performance.now() - current.idleSince <= maxIdleMs) return Promise.resolve(current);
    current.close();
  }
  return openShared(lane.connections, i, opening, lane, async () => {
    const url = new URL(run.url);
    const socket = await tunnelTls(setup, run.target, url, run.protocol === "h1" ? "http/1.1" : "h2");
    return run.protocol === "h1" ? new RawH1(socket, url, run.expectedBytes) : new RawH2(socket, url, run.expectedBytes);
  });
}

export async function runRawRate(setup: H2Setup, run: RawRateRun): Promise<H2Result> {
  const lane = laneFor(run);
  const opening = new Map<number, Promise<Connection>>();
  return runLaneWindow(run, lane, async (w) => (await connectionOf(setup, run, lane, w % lane.connections.length, opening)).get());
}

/** Per lane, for the summary at the end of the run. */
export function rawSummary(): LaneSummary[] {
  return laneSummaries(lanes);
}

/** Closes every raw lane's connections. */
export function closeRaw(): void {
  for (const lane of lanes.values()) for (const connection of lane.connections) connection?.close();
  lanes.clear();
}
