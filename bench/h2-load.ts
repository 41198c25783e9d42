/**
 * The load generator's HTTP/2 client (bench/load.ts runs it; the h2 scenario in bench/h2-scenario.ts
 * asks for it). undici's ProxyAgent speaks only HTTP/1.1 inside a tunnel, so this is `node:http2`
 * over a CONNECT tunnel opened by hand, the way curl --http2 or grpc-js reach a proxy:
 *
 * - `h2rate`: requests at a fixed concurrency (streams in flight) for a fixed time, spread over
 *   `connections` guest connections, stream i on connection i mod N. The sessions of a lane live
 *   for the whole run, like the HTTP/1.1 lanes' dispatchers; one that closed (an idle timeout
 *   between rounds) is opened again and counted.
 * - `h2bulk`: one download on one stream of a new connection, body counted and dropped.
 *
 * Every name it asks for is a bench.test name; the proxy is dialled on its 127.0.0.1 URL, and
 * `direct` dials 127.0.0.1 itself, with the name only as SNI and :authority.
 */
import { connect as h2Connect, type ClientHttp2Session } from "node:http2";
import { connect as netConnect, type Socket } from "node:net";
import { createHistogram, performance, type RecordableHistogram } from "node:perf_hooks";
import { connect as tlsConnect, type TLSSocket } from "node:tls";

export interface H2RateRun {
  readonly kind: "h2rate";
  readonly id: number;
  readonly lane: string;
  /** A key of the load setup's `proxies`, or `direct`. */
  readonly target: string;
  readonly url: string;
  readonly expectedBytes: number;
  /** Streams in flight at once, over all the lane's connections. */
  readonly concurrency: number;
  readonly connections: number;
  readonly durationMs: number;
  readonly record: boolean;
  /** Offered load: at most this many requests a second (undefined: as fast as they complete). */
  readonly ratePerSecond?: number | undefined;
}

export interface H2BulkRun {
  readonly kind: "h2bulk";
  readonly id: number;
  readonly lane: string;
  readonly target: string;
  readonly url: string;
  readonly bytes: number;
  readonly maxMs: number;
}

export interface H2Setup {
  readonly upstreamCaPem: string;
  readonly proxies: Readonly<Record<string, { readonly url: string; readonly caPem: string }>>;
}

export interface H2Result {
  readonly kind: "result";
  readonly id: number;
  readonly ok: number;
  readonly errors: number;
  readonly firstError: string | undefined;
  readonly elapsedMs: number;
  /** Guest connections (CONNECT tunnels, or TLS dials for direct) this window opened. */
  readonly connects: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** h2bulk: the one transfer. */
  readonly transfers: readonly { readonly ms: number; readonly bytes: number }[];
}

const maxErrorsPerWindow = 1_000;
const maxWindowMs = 120_000;

interface H2Lane {
  readonly sessions: (ClientHttp2Session | undefined)[];
  readonly histogram: RecordableHistogram;
  connects: number;
}

const lanes = new Map<string, H2Lane>();

function isBenchName(hostname: string): boolean {
  return hostname === "bench.test" || hostname.endsWith(".bench.test");
}

function describe(error: unknown): string {
  return `${(error as { code?: string }).code ?? "error"}: ${(error as Error).message ?? String(error)}`;
}

/** Reads the proxy's answer to CONNECT up to the end of its head; anything but 2xx throws. */
export function connectThrough(proxyUrl: string, authority: string): Promise<Socket> {
  const proxy = new URL(proxyUrl);
  return new Promise((resolve, reject) => {
    // TCP_NODELAY, as curl, Go and Node's own clients set it: Nagle's algorithm would otherwise
    // hold a small write (a stream's HEADERS) while an earlier one waits for its ACK.
    const socket = netConnect({ host: proxy.hostname, port: Number(proxy.port), noDelay: true });
    let head = Buffer.alloc(0);
    const fail = (error: Error): void => {
      socket.destroy();
      reject(error);
    };
    socket.once("error", fail);
    socket.once("close", () => reject(new Error("proxy closed the connection during CONNECT")));
    socket.setTimeout(30_000, () => fail(new Error(`CONNECT ${authority} not answered in 30 s`)));
    socket.once("connect", () => socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`));
    const onData = (data: Buffer): void => {
      head = Buffer.concat([head, data]);
      const end = head.indexOf("\r\n\r\n");
      if (end < 0) {
        if (head.length > 16_384) fail(new Error("CONNECT answer head over 16 KiB"));
        return;
      }
      socket.off("data", onData);
      socket.setTimeout(0);
      const status = /^HTTP\/1\.[01] (\d{3})/.exec(head.toString("latin1"))?.[1];
      if (status === undefined || !status.startsWith("2")) {
        fail(new Error(`CONNECT ${authority}: ${head.subarray(0, end).toString("latin1").split("\r\n")[0]}`));
        return;
      }
      socket.removeAllListeners("close");
      // The TLS socket on top reports the connection's failures; this one must still never throw.
      socket.off("error", fail);
      socket.on("error", () => undefined);
      // A proxy sends nothing after its 200 until the guest speaks TLS; keep any byte anyway.
      if (head.length > end + 4) socket.unshift(head.subarray(end + 4));
      resolve(socket);
    };
    socket.on("data", onData);
  });
}

/** A new HTTP/2 guest connection to `url`'s origin: through the target's proxy, or direct. */
async function openSession(setup: H2Setup, target: string, url: URL): Promise<ClientHttp2Session> {
  if (!isBenchName(url.hostname)) throw new Error(`${url.hostname} is not a bench.test name`);
  const proxy = setup.proxies[target];
  const authority = `${url.hostname}:${url.port}`;
  const tunnel = proxy === undefined ? undefined : await connectThrough(proxy.url, authority);
  const tls: TLSSocket = await new Promise((resolve, reject) => {
    // Both, as curl --http2 offers them: mitmproxy offers the upstream what its guest offered, so a
    // guest offering only h2 would make it fail against an HTTP/1.1 upstream (no_application_protocol).
    const options = { servername: url.hostname, ca: proxy?.caPem ?? setup.upstreamCaPem, ALPNProtocols: ["h2", "http/1.1"] };
    const socket = tunnel !== undefined ? tlsConnect({ ...options, socket: tunnel }) : tlsConnect({ ...options, host: "127.0.0.1", port: Number(url.port) });
    socket.once("error", (error) => {
      socket.destroy();
      reject(error);
    });
    socket.once("secureConnect", () => {
      socket.removeAllListeners("error");
      socket.on("error", () => undefined);
      if (socket.alpnProtocol !== "h2") {
        socket.destroy();
        reject(new Error(`ALPN gave ${JSON.stringify(socket.alpnProtocol)}, not h2`));
      } else resolve(socket);
    });
  });
  const session = h2Connect(url.origin, { createConnection: () => tls });
  session.on("error", () => undefined);
  await new Promise<void>((resolve, reject) => {
    session.once("remoteSettings", () => resolve());
    session.once("close", () => reject(new Error("session closed before its SETTINGS")));
  });
  return session;
}

/** One GET on `session`, body read in full; throws unless it is a 200 with `expectedBytes` bytes. */
function get(session: ClientHttp2Session, path: string, expectedBytes: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const stream = session.request({ ":path": path });
    let status = 0;
    let bytes = 0;
    let start = "";
    stream.on("response", (headers) => (status = Number(headers[":status"])));
    stream.on("data", (data: Buffer) => {
      if (bytes === 0 && status !== 200) start = data.subarray(0, 200).toString();
      bytes += data.length;
    });
    stream.on("error", reject);
    stream.on("end", () => (status === 200 && bytes === expectedBytes ? resolve() : reject(new Error(`status ${status}, ${bytes} bytes: ${start}`))));
    // A stream reset with NO_ERROR or CANCEL closes without 'error' or 'end' (a no-op once settled).
    stream.on("close", () => reject(new Error(`stream closed (code ${stream.rstCode}), status ${status}, ${bytes} bytes`)));
  });
}

/**
 * A schedule of request start times at `ratePerSecond` from `started`, shared by a window's
 * workers: each call waits for the next free slot (a worker behind schedule starts at once, so
 * a target that cannot keep up runs as fast as it can). With no rate it never waits.
 */
export function pacer(ratePerSecond: number | undefined, started: number): () => Promise<void> {
  if (ratePerSecond === undefined) return () => Promise.resolve();
  let slot = 0;
  return async () => {
    const wait = started + (slot++ * 1000) / ratePerSecond - performance.now();
    if (wait > 1) await new Promise((resolve) => setTimeout(resolve, wait));
  };
}

function laneFor(run: H2RateRun): H2Lane {
  let lane = lanes.get(run.lane);
  if (lane === undefined) {
    lane = { sessions: Array.from({ length: run.connections }, () => undefined), histogram: createHistogram({ lowest: 1, highest: 600e9, figures: 3 }), connects: 0 };
    lanes.set(run.lane, lane);
  }
  return lane;
}

/** The lane's i-th session, opened (again) when it is missing or closed; concurrent callers share one opening. */
function sessionOf(setup: H2Setup, run: H2RateRun, lane: H2Lane, i: number, opening: Map<number, Promise<ClientHttp2Session>>): Promise<ClientHttp2Session> {
  const current = lane.sessions[i];
  if (current !== undefined && !current.closed && !current.destroyed) return Promise.resolve(current);
  return openShared(lane.sessions, i, opening, lane, () => openSession(setup, run.target, new URL(run.url)));
}

/**
 * Opens slot `i` of a lane once for all its concurrent callers: `open()` is called by the first,
 * counted as a connect, and its result stored in `slots[i]`; a failure reaches every caller and
 * lets the next call try again.
 */
export function openShared<T>(slots: (T | undefined)[], i: number, opening: Map<number, Promise<T>>, lane: { connects: number }, open: () => Promise<T>): Promise<T> {
  let pending = opening.get(i);
  if (pending === undefined) {
    lane.connects += 1;
    pending = open().then(
      (made) => {
        slots[i] = made;
        opening.delete(i);
        return made;
      },
      (error: unknown) => {
        opening.delete(i);
        throw error;
      },
    );
    opening.set(i, pending);
  }
  return pending;
}

export async function runH2Rate(setup: H2Setup, run: H2RateRun): Promise<H2Result> {
  const lane = laneFor(run);
  const opening = new Map<number, Promise<ClientHttp2Session>>();
  const path = new URL(run.url).pathname;
  return runLaneWindow(run, lane, async (w) => get(await sessionOf(setup, run, lane, w % run.connections, opening), path, run.expectedBytes), run.ratePerSecond);
}

/**
 * One window of a lane: `run.concurrency` workers each sending one request after another with
 * `one(worker)` until the window's time is up (or too many errors), every success timed. Shared
 * by the node:http2 lanes and the minimal clients' (bench/raw-load.ts).
 */
export async function runLaneWindow(
  run: { readonly id: number; readonly concurrency: number; readonly durationMs: number; readonly record: boolean; readonly requests?: number },
  lane: { readonly histogram: RecordableHistogram; readonly connects: number },
  one: (worker: number) => Promise<void>,
  ratePerSecond?: number,
): Promise<H2Result> {
  const window = createHistogram({ lowest: 1, highest: 60e9, figures: 3 });
  const connectsBefore = lane.connects;
  const started = performance.now();
  const deadline = started + Math.min(run.durationMs, maxWindowMs);
  const pace = pacer(ratePerSecond, started);
  let ok = 0;
  let errors = 0;
  let firstError: string | undefined;
  // With `requests`, the window ends once that many have been started (bench/h2-counts.ts's
  // callgrind mode counts instructions over a fixed number), or at its deadline.
  let left = run.requests ?? Number.POSITIVE_INFINITY;
  const worker = async (w: number): Promise<void> => {
    while (errors < maxErrorsPerWindow && performance.now() < deadline && left > 0) {
      await pace();
      if (performance.now() >= deadline) break;
      left -= 1;
      const t0 = performance.now();
      try {
        await one(w);
      } catch (error) {
        errors += 1;
        firstError ??= describe(error);
        continue;
      }
      const ns = Math.max(1, Math.round((performance.now() - t0) * 1e6));
      ok += 1;
      window.record(ns);
      if (run.record) lane.histogram.record(ns);
    }
  };
  await Promise.all(Array.from({ length: run.concurrency }, (_, w) => worker(w)));
  const has = ok > 0;
  return {
    kind: "result",
    id: run.id,
    ok,
    errors,
    firstError,
    elapsedMs: performance.now() - started,
    connects: lane.connects - connectsBefore,
    p50Ms: has ? window.percentile(50) / 1e6 : Number.NaN,
    p99Ms: has ? window.percentile(99) / 1e6 : Number.NaN,
    transfers: [],
  };
}

export async function runH2Bulk(setup: H2Setup, run: H2BulkRun): Promise<H2Result> {
  const started = performance.now();
  const url = new URL(run.url);
  let session: ClientHttp2Session | undefined;
  try {
    session = await openSession(setup, run.target, url);
    const open = session;
    const bytes = await new Promise<number>((resolve, reject) => {
      const stream = open.request({ ":path": `${url.pathname}${url.search}` });
      let status = 0;
      let received = 0;
      const timer = setTimeout(() => stream.close(), run.maxMs);
      stream.on("response", (headers) => (status = Number(headers[":status"])));
      stream.on("data", (data: Buffer) => (received += data.length));
      stream.on("error", (error) => {
        clearTimeout(timer);
        reject(error);
      });
      stream.on("close", () => {
        clearTimeout(timer);
        if (status === 200 && received === run.bytes) resolve(received);
        else reject(new Error(`status ${status}, ${received} of ${run.bytes} bytes`));
      });
    });
    const ms = performance.now() - started;
    return { kind: "result", id: run.id, ok: 1, errors: 0, firstError: undefined, elapsedMs: ms, connects: 1, p50Ms: ms, p99Ms: ms, transfers: [{ ms, bytes }] };
  } catch (error) {
    return { kind: "result", id: run.id, ok: 0, errors: 1, firstError: describe(error), elapsedMs: performance.now() - started, connects: 1, p50Ms: Number.NaN, p99Ms: Number.NaN, transfers: [] };
  } finally {
    session?.destroy();
  }
}

/** Per lane, for the summary at the end of the run: every recorded request's latency. */
export function h2Summary(): LaneSummary[] {
  return laneSummaries(lanes);
}

export interface LaneSummary {
  lane: string;
  count: number;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  maxMs: number;
  connects: number;
}

/** The summary rows of lanes that keep a histogram of recorded latencies and a count of connections. */
export function laneSummaries(of: ReadonlyMap<string, { readonly histogram: RecordableHistogram; readonly connects: number }>): LaneSummary[] {
  return [...of].map(([key, lane]) => {
    const h = lane.histogram;
    const has = h.count > 0;
    return {
      lane: key,
      count: h.count,
      p50Ms: has ? h.percentile(50) / 1e6 : Number.NaN,
      p90Ms: has ? h.percentile(90) / 1e6 : Number.NaN,
      p99Ms: has ? h.percentile(99) / 1e6 : Number.NaN,
      maxMs: has ? h.max / 1e6 : Number.NaN,
      connects: lane.connects,
    };
  });
}

/** Closes every lane's sessions (GOAWAY), waiting at most `ms`. */
export async function closeH2(ms = 2_000): Promise<void> {
  const sessions = [...lanes.values()].flatMap((lane) => lane.sessions).filter((s): s is ClientHttp2Session => s !== undefined && !s.closed);
  await Promise.race([Promise.all(sessions.map((s) => new Promise<void>((resolve) => s.close(resolve)))), new Promise((resolve) => setTimeout(resolve, ms).unref())]);
  for (const s of sessions) s.destroy();
}
