/**
 * The bench's load generator: undici `request` at a fixed concurrency with keep-alive, in its
 * own process so its CPU is not counted against the proxy's.
 *
 * Forked by bench/run.ts with an IPC channel. One dispatcher per target and concurrency lives
 * for the whole run, so keep-alive connections and JIT state carry over from round to round.
 * `connections` caps each dispatcher at the concurrency: undici's ProxyAgent otherwise opens a
 * tunnel per request it cannot place, and the count of CONNECTs (or of direct TLS dials) is
 * reported so a reconnect storm cannot hide inside the figures.
 */
import type { LookupAddress } from "node:dns";
import { createHistogram, performance, type RecordableHistogram } from "node:perf_hooks";
import { Agent, buildConnector, Pool, ProxyAgent, request, type Dispatcher } from "undici";

/**
 * `egressgate` is the built CLI; `egressgate-api` and `egressgate+hooks` are bench/hooked-proxy.ts
 * (startProxy from the package), without and with a no-op onRequest/onResponse pair.
 */
export type TargetName = "direct" | "tcp-relay" | "egressgate" | "egressgate-api" | "egressgate+hooks";

export interface LoadSetup {
  readonly kind: "setup";
  /** e.g. `https://bench.test:PORT/small`; bench.test is dialled on 127.0.0.1 only. */
  readonly url: string;
  readonly expectedBytes: number;
  readonly upstreamCaPem: string;
  readonly proxyCaPem: string;
  /** Proxy URL per proxied target; `direct` has none. */
  readonly proxies: Readonly<Partial<Record<TargetName, string>>>;
  /** Idle keep-alive sockets are kept this long, so a target's turn-taking does not close them. */
  readonly keepAliveMs: number;
}

export interface LoadRun {
  readonly kind: "run";
  readonly id: number;
  readonly target: TargetName;
  readonly concurrency: number;
  readonly durationMs: number;
  /** false for a warm-up window: nothing goes into the latency histogram. */
  readonly record: boolean;
}

export interface LoadResult {
  readonly kind: "result";
  readonly id: number;
  readonly ok: number;
  readonly errors: number;
  readonly firstError: string | undefined;
  readonly elapsedMs: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** New connections this dispatcher made during the window: CONNECTs, or TLS dials for direct. */
  readonly connects: number;
}

export interface LoadSummaryEntry {
  readonly target: TargetName;
  readonly concurrency: number;
  readonly count: number;
  readonly p50Ms: number;
  readonly p90Ms: number;
  readonly p99Ms: number;
  readonly maxMs: number;
  readonly connects: number;
}

export type LoadReply = LoadResult | { readonly kind: "summary"; readonly entries: LoadSummaryEntry[] } | { readonly kind: "ready" };

/** Per window, whatever its duration: a safety stop if the target answers errors very fast. */
const maxRequestsPerWindow = 2_000_000;
const maxErrorsPerWindow = 1_000;
const maxWindowMs = 60_000;

interface Lane {
  readonly target: TargetName;
  readonly concurrency: number;
  readonly dispatcher: Dispatcher;
  readonly histogram: RecordableHistogram;
  connects: number;
}

function send(reply: LoadReply): void {
  process.send?.(reply);
}

/** bench.test (the only name used) is 127.0.0.1; any other name is refused, never resolved. */
function lookup(
  hostname: string,
  options: { readonly all?: boolean },
  callback: (error: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void,
): void {
  if (hostname !== "bench.test") {
    callback(Object.assign(new Error(`bench lookup: ${hostname} is not bench.test`), { code: "ENOTFOUND" }), "", 4);
    return;
  }
  if (options.all === true) callback(null, [{ address: "127.0.0.1", family: 4 }]);
  else callback(null, "127.0.0.1", 4);
}

function createLane(setup: LoadSetup, target: TargetName, concurrency: number): Lane {
  const common = {
    connections: concurrency,
    pipelining: 1,
    keepAliveTimeout: setup.keepAliveMs,
    keepAliveMaxTimeout: setup.keepAliveMs,
  };
  const lane: Omit<Lane, "dispatcher"> & { dispatcher?: Dispatcher } = {
    target,
    concurrency,
    histogram: createHistogram({ lowest: 1, highest: 60e9, figures: 3 }),
    connects: 0,
  };
  const proxy = setup.proxies[target];
  if (proxy === undefined) {
    const base = buildConnector({ ca: setup.upstreamCaPem, lookup } as buildConnector.BuildOptions);
    lane.dispatcher = new Agent({
      ...common,
      connect: (opts, callback) => {
        lane.connects += 1;
        base(opts, callback);
      },
    });
  } else {
    lane.dispatcher = new ProxyAgent({
      ...common,
      uri: proxy,
      requestTls: { ca: [setup.proxyCaPem, setup.upstreamCaPem] },
      // Every tunnel starts as one CONNECT on this client; counting here counts them all.
      clientFactory: (origin, opts) => {
        const pool = new Pool(origin, opts);
        const connect = pool.connect.bind(pool) as (options: Dispatcher.ConnectOptions) => Promise<Dispatcher.ConnectData>;
        (pool as unknown as { connect: typeof connect }).connect = (options) => {
          lane.connects += 1;
          return connect(options);
        };
        return pool;
      },
    });
  }
  return lane as Lane;
}

async function runWindow(setup: LoadSetup, lane: Lane, run: LoadRun): Promise<LoadResult> {
  const window = createHistogram({ lowest: 1, highest: 60e9, figures: 3 });
  const connectsBefore = lane.connects;
  const started = performance.now();
  const deadline = started + Math.min(run.durationMs, maxWindowMs);
  let issued = 0;
  let ok = 0;
  let errors = 0;
  let firstError: string | undefined;
  const fail = (message: string): void => {
    errors += 1;
    firstError ??= message;
  };
  const worker = async (): Promise<void> => {
    while (issued < maxRequestsPerWindow && errors < maxErrorsPerWindow && performance.now() < deadline) {
      issued += 1;
      const t0 = performance.now();
      try {
        const res = await request(setup.url, { dispatcher: lane.dispatcher });
        const body = await res.body.arrayBuffer();
        if (res.statusCode !== 200 || body.byteLength !== setup.expectedBytes) {
          fail(`status ${res.statusCode}, ${body.byteLength} bytes: ${Buffer.from(body).subarray(0, 200).toString()}`);
          continue;
        }
      } catch (error) {
        fail(`${(error as { code?: string }).code ?? "error"}: ${(error as Error).message}`);
        continue;
      }
      const ns = Math.max(1, Math.round((performance.now() - t0) * 1e6));
      ok += 1;
      window.record(ns);
      if (run.record) lane.histogram.record(ns);
    }
  };
  await Promise.all(Array.from({ length: run.concurrency }, worker));
  const elapsedMs = performance.now() - started;
  return {
    kind: "result",
    id: run.id,
    ok,
    errors,
    firstError,
    elapsedMs,
    p50Ms: ok > 0 ? window.percentile(50) / 1e6 : Number.NaN,
    p99Ms: ok > 0 ? window.percentile(99) / 1e6 : Number.NaN,
    connects: lane.connects - connectsBefore,
  };
}

function main(setup: LoadSetup): void {
  const lanes = new Map<string, Lane>();
  const laneFor = (target: TargetName, concurrency: number): Lane => {
    const key = `${target}/${concurrency}`;
    let lane = lanes.get(key);
    if (lane === undefined) {
      lane = createLane(setup, target, concurrency);
      lanes.set(key, lane);
    }
    return lane;
  };
  let queue = Promise.resolve();
  process.on("message", (message: LoadRun | { kind: "summary" } | { kind: "close" }) => {
    // One window at a time: the orchestrator waits for each result, but a queue makes sure.
    queue = queue.then(async () => {
      if (message.kind === "run") {
        send(await runWindow(setup, laneFor(message.target, message.concurrency), message));
      } else if (message.kind === "summary") {
        const entries = [...lanes.values()].map(
          (lane): LoadSummaryEntry => ({
            target: lane.target,
            concurrency: lane.concurrency,
            count: lane.histogram.count,
            p50Ms: lane.histogram.count > 0 ? lane.histogram.percentile(50) / 1e6 : Number.NaN,
            p90Ms: lane.histogram.count > 0 ? lane.histogram.percentile(90) / 1e6 : Number.NaN,
            p99Ms: lane.histogram.count > 0 ? lane.histogram.percentile(99) / 1e6 : Number.NaN,
            maxMs: lane.histogram.count > 0 ? lane.histogram.max / 1e6 : Number.NaN,
            connects: lane.connects,
          }),
        );
        send({ kind: "summary", entries });
      } else if (message.kind === "close") {
        await Promise.all([...lanes.values()].map((lane) => lane.dispatcher.close().catch(() => undefined)));
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
