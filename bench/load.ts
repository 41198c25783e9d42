/**
 * The bench's load generator: undici in its own process, so its CPU is not counted against the
 * proxy's. One generator serves every target; it measures and reports, and never judges.
 *
 * Forked by bench/run.ts with an IPC channel. It runs one window at a time, of three kinds:
 *
 * - `rate`: requests at a fixed concurrency for a fixed time. One dispatcher per lane (scenario,
 *   target and concurrency) lives for the whole run, so keep-alive connections and JIT state carry
 *   over from round to round. `connections` caps it at the concurrency: undici's ProxyAgent
 *   otherwise opens a tunnel per request it cannot place. With `newConnections`, every request
 *   is sent with `reset: true`, so its connection (for a proxy, the CONNECT tunnel and the TLS
 *   inside it) closes after the response and the next request opens a new one. The count of
 *   CONNECTs (or of direct TLS dials) is reported either way.
 * - `hosts`: the first request to each of a list of new hostnames, one at a time, each over a
 *   dispatcher of its own that is destroyed afterwards. Every `controlEvery`-th hostname is
 *   followed by one request to an already-seen hostname, also over a fresh dispatcher: the same
 *   new connection without the new certificate, so the difference is the certificate's cost.
 * - `bulk`: `count` downloads (GET, body counted and dropped) or uploads (POST of `bytes` zero
 *   bytes, streamed; the upstream answers the length it read), one at a time, each timed.
 * - `h2rate` and `h2bulk`: the same over HTTP/2 inside a CONNECT tunnel (bench/h2-load.ts).
 * - `rawrate`: small GETs from minimal HTTP/1.1 and HTTP/2 clients (bench/raw-load.ts).
 *
 * Every hostname is a bench.test name, dialled on 127.0.0.1; any other name is refused.
 */
import type { LookupAddress } from "node:dns";
import { createHistogram, performance, type RecordableHistogram } from "node:perf_hooks";
import { Readable } from "node:stream";
import { Agent, buildConnector, Pool, ProxyAgent, request, type Dispatcher } from "undici";
import { closeH2, h2Summary, pacer, runH2Bulk, runH2Rate, type H2BulkRun, type H2RateRun, type H2Result } from "./h2-load.js";
import { closeRaw, rawSummary, runRawRate, type RawRateRun } from "./raw-load.js";

/**
 * `egressgate` is the built CLI; `egressgate-api` and `egressgate+hooks` are bench/hooked-proxy.ts
 * (startProxy from the package), without and with a no-op onRequest/onResponse pair. The last
 * three are the peers, each configured to do the same MITM work (bench/peers/).
 */
export type TargetName =
  | "direct"
  | "tcp-relay"
  | "egressgate"
  | "egressgate-w2"
  | "egressgate+metrics"
  | "egressgate-api"
  | "egressgate+hooks"
  | "egressgate+djs"
  | "egressgate+djs-allowlist"
  | "egressgate+webhook"
  | "egressgate+command"
  | "mockttp"
  | "http-mitm-proxy"
  | "mitmdump";

export interface LoadSetup {
  readonly kind: "setup";
  readonly upstreamCaPem: string;
  /**
   * Proxy URL per proxied target, and the one CA the client trusts through it: the proxy's own
   * (so a proxy that did not terminate TLS would fail), or the upstream's for tcp-relay.
   */
  readonly proxies: Readonly<Record<string, { readonly url: string; readonly caPem: string }>>;
  /** The longest a client keeps an idle keep-alive socket, whatever the target's `Keep-Alive` hint says. */
  readonly keepAliveMs: number;
}

interface RunBase {
  readonly id: number;
  /** Dispatchers and histograms are kept per lane, e.g. `small/egressgate/32`. */
  readonly lane: string;
  /** A key of `proxies`, or anything else (`direct`) for TLS straight to the upstream. */
  readonly target: string;
}

export interface RateRun extends RunBase {
  readonly kind: "rate";
  readonly url: string;
  readonly expectedBytes: number;
  readonly concurrency: number;
  readonly durationMs: number;
  /** false for a warm-up window: nothing goes into the lane's histogram. */
  readonly record: boolean;
  readonly newConnections: boolean;
  /** Offered load: at most this many requests a second (undefined: as fast as they complete). */
  readonly ratePerSecond?: number | undefined;
}

export interface HostsRun extends RunBase {
  readonly kind: "hosts";
  readonly urls: readonly string[];
  readonly controlUrl: string;
  readonly controlEvery: number;
  readonly expectedBytes: number;
  /** Stops early (with fewer hostnames done) once this much time has passed. */
  readonly maxMs: number;
}

export interface BulkRun extends RunBase {
  readonly kind: "bulk";
  readonly direction: "download" | "upload";
  readonly url: string;
  readonly bytes: number;
  readonly count: number;
  readonly maxMs: number;
}

/** Several rate runs at once, on their own lanes: targets measured side by side, in the same seconds. */
export interface RatesRun {
  readonly kind: "rates";
  readonly id: number;
  readonly runs: readonly RateRun[];
}

export interface RatesResult {
  readonly kind: "rates-result";
  readonly id: number;
  readonly results: readonly RateResult[];
}

export type LoadRequest = RateRun | RatesRun | HostsRun | BulkRun | H2RateRun | H2BulkRun | RawRateRun | { readonly kind: "summary" } | { readonly kind: "close" };

interface ResultBase {
  readonly kind: "result";
  readonly id: number;
  readonly ok: number;
  readonly errors: number;
  readonly firstError: string | undefined;
  readonly elapsedMs: number;
  /** New connections this window made: CONNECTs, or TLS dials for direct. */
  readonly connects: number;
}

export interface RateResult extends ResultBase {
  readonly p50Ms: number;
  readonly p99Ms: number;
}

export interface HostsResult extends ResultBase {
  /** Latency of each first request to a new hostname, in the order sent. */
  readonly newHostMs: readonly number[];
  /** Latency of each new-connection request to an already-seen hostname. */
  readonly controlMs: readonly number[];
}

export interface BulkResult extends ResultBase {
  readonly transfers: readonly { readonly ms: number; readonly bytes: number }[];
}

export interface LoadSummaryEntry {
  readonly lane: string;
  readonly count: number;
  readonly p50Ms: number;
  readonly p90Ms: number;
  readonly p99Ms: number;
  readonly maxMs: number;
  readonly connects: number;
}

export type LoadReply = RateResult | HostsResult | BulkResult | H2Result | { readonly kind: "summary"; readonly entries: LoadSummaryEntry[] } | { readonly kind: "ready" } | RatesResult;

/** Per window, whatever its duration: a safety stop if the target answers errors very fast. */
const maxRequestsPerWindow = 2_000_000;
const maxErrorsPerWindow = 1_000;
const maxWindowMs = 120_000;
const chunk = Buffer.alloc(64 * 1024);

/**
 * A lane idle longer than this starts its next window on new connections. Targets close idle
 * connections after 5 s (egressgate) or 6 s (mockttp), and undici's own 4 s idle timer runs late
 * when the cores are busy (its ticks count 499 ms each, however long they took), so a connection
 * reused after a long turn-taking gap could meet the target's close (ECONNRESET, "other side
 * closed"): an error of the client's timing, not of the target. Measured by the clock at the
 * window's start, so no timer's lateness matters.
 */
const maxIdleReuseMs = 2_000;

/** One target and concurrency's client, kept across windows, and the histogram of its measured windows. */
class Lane {
  readonly histogram = createHistogram({ lowest: 1, highest: 600e9, figures: 3 });
  /** Connections made over the lane's life, whichever dispatcher made them. */
  readonly counter = { connects: 0 };
  #dispatcher: Dispatcher;
  #lastUsed = performance.now();

  constructor(private readonly make: (counter: { connects: number }) => Dispatcher) {
    this.#dispatcher = make(this.counter);
  }

  get dispatcher(): Dispatcher {
    return this.#dispatcher;
  }

  get connects(): number {
    return this.counter.connects;
  }

  /** Before a window: new connections if the lane sat idle past `maxIdleReuseMs`. */
  startWindow(): void {
    if (performance.now() - this.#lastUsed <= maxIdleReuseMs) return;
    void this.#dispatcher.close().catch(() => undefined);
    this.#dispatcher = this.make(this.counter);
  }

  /** After a window: its connections were in use until now. */
  endWindow(): void {
    this.#lastUsed = performance.now();
  }
}

function send(reply: LoadReply): void {
  process.send?.(reply);
}

function isBenchName(hostname: string): boolean {
  return hostname === "bench.test" || hostname.endsWith(".bench.test");
}

/** bench.test and its subdomains are 127.0.0.1; any other name is refused, never resolved. */
function lookup(
  hostname: string,
  options: { readonly all?: boolean },
  callback: (error: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void,
): void {
  if (!isBenchName(hostname)) {
    callback(Object.assign(new Error(`bench lookup: ${hostname} is not a bench.test name`), { code: "ENOTFOUND" }), "", 4);
    return;
  }
  if (options.all === true) callback(null, [{ address: "127.0.0.1", family: 4 }]);
  else callback(null, "127.0.0.1", 4);
}

/**
 * The address the load generator connects to mockttp from. mockttp refuses a request as a
 * "passthrough loop" (500) when the client's address and port equal the local address and port
 * of one of its own upstream sockets. On loopback both are 127.0.0.1, and Linux gives two
 * connections to different destinations the same ephemeral port, so under connection churn an
 * ordinary request was sometimes refused (4 in one window of `bench.test.ts` here). From
 * another loopback address the check can never match.
 */
const mockttpClientAddress = "127.0.0.2";

/** An Agent (direct) or ProxyAgent for `target`, counting the connections it opens into `counter`. */
function createDispatcher(setup: LoadSetup, target: string, connections: number, counter: { connects: number }): Dispatcher {
  const common = {
    connections,
    pipelining: 1,
    keepAliveTimeout: setup.keepAliveMs,
    keepAliveMaxTimeout: setup.keepAliveMs,
    headersTimeout: 60_000,
    bodyTimeout: 60_000,
  };
  const proxy = setup.proxies[target];
  if (proxy === undefined) {
    const base = buildConnector({ ca: setup.upstreamCaPem, lookup } as buildConnector.BuildOptions);
    return new Agent({
      ...common,
      connect: (opts, callback) => {
        counter.connects += 1;
        base(opts, callback);
      },
    });
  }
  return new ProxyAgent({
    ...common,
    uri: proxy.url,
    requestTls: { ca: proxy.caPem },
    // Every tunnel starts as one CONNECT on this client; counting here counts them all.
    clientFactory: (origin, opts) => {
      const pool = new Pool(origin, target === "mockttp" ? { ...opts, localAddress: mockttpClientAddress } : opts);
      const connect = pool.connect.bind(pool) as (options: Dispatcher.ConnectOptions) => Promise<Dispatcher.ConnectData>;
      (pool as unknown as { connect: typeof connect }).connect = (options) => {
        counter.connects += 1;
        return connect(options);
      };
      return pool;
    },
  });
}

function describe(error: unknown): string {
  const cause = (error as { cause?: { message?: string } }).cause?.message;
  return `${(error as { code?: string }).code ?? "error"}: ${(error as Error).message}${cause !== undefined ? ` (${cause})` : ""}`;
}

/** One GET, body read in full; throws unless it is a 200 with `expectedBytes` bytes. */
async function getSmall(url: string, dispatcher: Dispatcher, expectedBytes: number, reset: boolean): Promise<void> {
  const res = await request(url, { dispatcher, reset });
  const body = await res.body.arrayBuffer();
  if (res.statusCode !== 200 || body.byteLength !== expectedBytes) {
    throw new Error(`status ${res.statusCode}, ${body.byteLength} bytes: ${Buffer.from(body).subarray(0, 200).toString()}`);
  }
}

function percentiles(histogram: RecordableHistogram, count: number): { p50Ms: number; p99Ms: number } {
  return count > 0 ? { p50Ms: histogram.percentile(50) / 1e6, p99Ms: histogram.percentile(99) / 1e6 } : { p50Ms: Number.NaN, p99Ms: Number.NaN };
}

async function runRate(lane: Lane, run: RateRun): Promise<RateResult> {
  const window = createHistogram({ lowest: 1, highest: 60e9, figures: 3 });
  const connectsBefore = lane.connects;
  const started = performance.now();
  const deadline = started + Math.min(run.durationMs, maxWindowMs);
  let issued = 0;
  let ok = 0;
  let errors = 0;
  let firstError: string | undefined;
  const pace = pacer(run.ratePerSecond, started);
  const worker = async (): Promise<void> => {
    while (issued < maxRequestsPerWindow && errors < maxErrorsPerWindow && performance.now() < deadline) {
      await pace();
      if (performance.now() >= deadline) break;
      issued += 1;
      const t0 = performance.now();
      try {
        await getSmall(run.url, lane.dispatcher, run.expectedBytes, run.newConnections);
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
  await Promise.all(Array.from({ length: run.concurrency }, worker));
  lane.endWindow();
  return {
    kind: "result",
    id: run.id,
    ok,
    errors,
    firstError,
    elapsedMs: performance.now() - started,
    ...percentiles(window, ok),
    connects: lane.connects - connectsBefore,
  };
}

async function runHosts(setup: LoadSetup, run: HostsRun): Promise<HostsResult> {
  const counter = { connects: 0 };
  const started = performance.now();
  const deadline = started + Math.min(run.maxMs, maxWindowMs);
  const newHostMs: number[] = [];
  const controlMs: number[] = [];
  let errors = 0;
  let firstError: string | undefined;
  const once = async (url: string, into: number[]): Promise<void> => {
    const dispatcher = createDispatcher(setup, run.target, 1, counter);
    const t0 = performance.now();
    try {
      await getSmall(url, dispatcher, run.expectedBytes, false);
      into.push(performance.now() - t0);
    } catch (error) {
      errors += 1;
      firstError ??= `${new URL(url).hostname}: ${describe(error)}`;
    } finally {
      await dispatcher.destroy().catch(() => undefined);
    }
  };
  for (let i = 0; i < run.urls.length && errors < maxErrorsPerWindow && performance.now() < deadline; i++) {
    await once(run.urls[i]!, newHostMs);
    if ((i + 1) % run.controlEvery === 0) await once(run.controlUrl, controlMs);
  }
  return {
    kind: "result",
    id: run.id,
    ok: newHostMs.length,
    errors,
    firstError,
    elapsedMs: performance.now() - started,
    connects: counter.connects,
    newHostMs,
    controlMs,
  };
}

async function* zeros(bytes: number): AsyncGenerator<Buffer> {
  for (let sent = 0; sent < bytes; sent += chunk.length) yield bytes - sent >= chunk.length ? chunk : chunk.subarray(0, bytes - sent);
}

async function runBulk(lane: Lane, run: BulkRun): Promise<BulkResult> {
  const connectsBefore = lane.connects;
  const started = performance.now();
  const deadline = started + Math.min(run.maxMs, maxWindowMs);
  const transfers: { ms: number; bytes: number }[] = [];
  let errors = 0;
  let firstError: string | undefined;
  for (let i = 0; i < run.count && performance.now() < deadline; i++) {
    const t0 = performance.now();
    try {
      let bytes = 0;
      if (run.direction === "download") {
        const res = await request(run.url, { dispatcher: lane.dispatcher });
        for await (const data of res.body) bytes += (data as Buffer).length;
        if (res.statusCode !== 200 || bytes !== run.bytes) throw new Error(`status ${res.statusCode}, ${bytes} of ${run.bytes} bytes`);
      } else {
        const res = await request(run.url, {
          dispatcher: lane.dispatcher,
          method: "POST",
          headers: { "content-type": "application/octet-stream", "content-length": String(run.bytes) },
          body: Readable.from(zeros(run.bytes), { objectMode: false }),
        });
        const answer = await res.body.text();
        bytes = Number(answer);
        if (res.statusCode !== 200 || bytes !== run.bytes) throw new Error(`status ${res.statusCode}, upstream read ${answer.slice(0, 200)} of ${run.bytes} bytes`);
      }
      const ms = performance.now() - t0;
      transfers.push({ ms, bytes });
      lane.histogram.record(Math.max(1, Math.round(ms * 1e6)));
    } catch (error) {
      errors += 1;
      firstError ??= describe(error);
    }
  }
  lane.endWindow();
  return { kind: "result", id: run.id, ok: transfers.length, errors, firstError, elapsedMs: performance.now() - started, connects: lane.connects - connectsBefore, transfers };
}

function main(setup: LoadSetup): void {
  const lanes = new Map<string, Lane>();
  const laneFor = (run: RateRun | BulkRun): Lane => {
    const connections = run.kind === "rate" ? run.concurrency : 1;
    let lane = lanes.get(run.lane);
    if (lane === undefined) {
      lane = new Lane((counter) => createDispatcher(setup, run.target, connections, counter));
      lanes.set(run.lane, lane);
    }
    lane.startWindow();
    return lane;
  };
  let queue = Promise.resolve();
  process.on("message", (message: LoadRequest) => {
    // One window at a time: the orchestrator waits for each result, but a queue makes sure.
    queue = queue.then(async () => {
      if (message.kind === "rate") send(await runRate(laneFor(message), message));
      else if (message.kind === "rates") send({ kind: "rates-result", id: message.id, results: await Promise.all(message.runs.map((run) => runRate(laneFor(run), run))) } satisfies RatesResult);
      else if (message.kind === "bulk") send(await runBulk(laneFor(message), message));
      else if (message.kind === "hosts") send(await runHosts(setup, message));
      else if (message.kind === "h2rate") send(await runH2Rate(setup, message));
      else if (message.kind === "h2bulk") send(await runH2Bulk(setup, message));
      else if (message.kind === "rawrate") send(await runRawRate(setup, message));
      else if (message.kind === "summary") {
        const entries = [...lanes].map(([key, lane]): LoadSummaryEntry => {
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
        send({ kind: "summary", entries: [...entries, ...h2Summary(), ...rawSummary()] });
      } else if (message.kind === "close") {
        await Promise.all([...[...lanes.values()].map((lane) => lane.dispatcher.close().catch(() => undefined)), closeH2()]);
        closeRaw();
        process.exit(0);
      }
    });
  });
  send({ kind: "ready" });
}

if (process.send === undefined) {
  process.stderr.write("bench/load.ts is started by bench/run.ts (it needs an IPC channel)\n");
  process.exit(2);
}
process.on("disconnect", () => process.exit(0));
process.once("message", (message: LoadSetup) => main(message));
