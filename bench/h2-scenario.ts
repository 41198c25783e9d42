/**
 * The `h2` scenario (issue 20): small GETs over HTTP/2 against the same GETs over HTTP/1.1, in
 * interleaved rounds of one run, and 1 GiB downloads on one HTTP/2 stream with the proxy's RSS.
 *
 * Variants, each a lane of the load generator (bench/load.ts, bench/h2-load.ts):
 *
 *   h1, 32 conns -> h1 upstream    undici's ProxyAgent at concurrency 32: the `small` scenario's path,
 *                                  the figure HTTP/2 is compared with
 *   h2, 1 conn -> h1 upstream      32 streams in flight on one guest connection
 *   h2, 8 conns -> h1 upstream     32 streams over 8 guest connections
 *   h2, 1 and 8 conns -> h2-only upstream  the Node upstream's port whose ALPN is `h2` alone (a gRPC server's shape)
 *   h1, 32 conns -> h2-only upstream  an HTTP/1.1 guest reaching an h2-only upstream
 *
 * for egressgate; mitmdump (its `http2` option is on by default) runs its HTTP/1.1 row and the
 * h2-only upstream rows, the only way its default configuration speaks h2 to a guest (see
 * variantsOf); `direct` runs the one-connection h2 row, the load generator's ceiling. The h2 lanes' streams
 * all go to `origin.bench.test`, dialled on 127.0.0.1 like every other scenario's.
 */
import { ask, hasExited, statusKb, stderrError, stopChild, track } from "./children.js";
import type { TargetName } from "./load.js";
import type { H2BulkRun, H2RateRun, H2Result } from "./h2-load.js";
import type { RawRateRun } from "./raw-load.js";
import type { Harness, RateWindow, RoundTiming, Sample } from "./scenarios.js";
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { freePort, hasCommand, originHost, smallBodyBytes, waitForPort } from "./targets.js";

export type H2Variant =
  | "h1-32-h1up"
  | "h2-1-h1up"
  | "h2-8-h1up"
  | "h2-1-h2up"
  | "h2-8-h2up"
  | "h1-32-h2up"
  | "h2load-h1-32-h1up"
  | "h2load-1-h1up"
  | "h2load-8-h1up"
  | "raw-h1-32-h1up"
  | "raw-h2-1-h1up"
  | "raw-h2-8-h1up"
  | "raw-h2-1-h2up"
  | "raw-h2-8-h2up";

export interface H2VariantInfo {
  readonly guest: "h1" | "h2";
  readonly connections: number;
  readonly upstream: "h1" | "h2";
  readonly label: string;
  /**
   * Who loads the lane: the load generator (undici for HTTP/1.1, node:http2 for h2), its
   * minimal clients (bench/raw-load.ts), or h2load through a socat relay.
   */
  readonly client?: "h2load" | "raw";
}

export const h2Variants: Readonly<Record<H2Variant, H2VariantInfo>> = {
  "h1-32-h1up": { guest: "h1", connections: 32, upstream: "h1", label: "HTTP/1.1, 32 connections -> h1 upstream" },
  "h2-1-h1up": { guest: "h2", connections: 1, upstream: "h1", label: "HTTP/2, 1 connection -> h1 upstream" },
  "h2-8-h1up": { guest: "h2", connections: 8, upstream: "h1", label: "HTTP/2, 8 connections -> h1 upstream" },
  "h2-1-h2up": { guest: "h2", connections: 1, upstream: "h2", label: "HTTP/2, 1 connection -> h2-only upstream" },
  "h2-8-h2up": { guest: "h2", connections: 8, upstream: "h2", label: "HTTP/2, 8 connections -> h2-only upstream" },
  "h1-32-h2up": { guest: "h1", connections: 32, upstream: "h2", label: "HTTP/1.1, 32 connections -> h2-only upstream" },
  "h2load-h1-32-h1up": { guest: "h1", connections: 32, upstream: "h1", label: "HTTP/1.1 from h2load via socat, 32 connections -> h1 upstream", client: "h2load" },
  "h2load-1-h1up": { guest: "h2", connections: 1, upstream: "h1", label: "HTTP/2 from h2load via socat, 1 connection -> h1 upstream", client: "h2load" },
  "h2load-8-h1up": { guest: "h2", connections: 8, upstream: "h1", label: "HTTP/2 from h2load via socat, 8 connections -> h1 upstream", client: "h2load" },
  "raw-h1-32-h1up": { guest: "h1", connections: 32, upstream: "h1", label: "HTTP/1.1 from the minimal client, 32 connections -> h1 upstream", client: "raw" },
  "raw-h2-1-h1up": { guest: "h2", connections: 1, upstream: "h1", label: "HTTP/2 from the minimal client, 1 connection -> h1 upstream", client: "raw" },
  "raw-h2-8-h1up": { guest: "h2", connections: 8, upstream: "h1", label: "HTTP/2 from the minimal client, 8 connections -> h1 upstream", client: "raw" },
  "raw-h2-1-h2up": { guest: "h2", connections: 1, upstream: "h2", label: "HTTP/2 from the minimal client, 1 connection -> h2-only upstream", client: "raw" },
  "raw-h2-8-h2up": { guest: "h2", connections: 8, upstream: "h2", label: "HTTP/2 from the minimal client, 8 connections -> h2-only upstream", client: "raw" },
};

/**
 * The HTTP/1.1 row a variant is compared with: the one its kind of client drives, so the client's
 * own cost per request (and for h2load, its relays') is on both sides of the ratio.
 */
export function h1Baseline(variant: H2Variant): H2Variant {
  const client = h2Variants[variant].client;
  return client === "raw" ? "raw-h1-32-h1up" : client === "h2load" ? "h2load-h1-32-h1up" : "h1-32-h1up";
}

/**
 * h2load (Debian's nghttp2-client) cannot use a proxy; each of its connections goes through
 * `socat TCP-LISTEN:P,fork,nodelay PROXY:…,nodelay`, which opens the CONNECT tunnel (the issue's recipe). The
 * relay's work (a process per connection, a read and a write per direction) takes CPU from the
 * proxy on the same cores, so h2load's h2 rows are compared with h2load's own HTTP/1.1 row
 * (`--h1`, 32 connections, through the same relay): the client and the relay on both sides.
 * Against undici's HTTP/1.1 row, which goes straight to the proxy, the relays count against h2
 * alone (the `× undici h1` goal line shows that reading too).
 */
export const h2loadAvailable = hasCommand("h2load") && hasCommand("socat");

/** The targets that take part in the h2 scenario, and the variants each runs. */
export const h2Targets: readonly TargetName[] = ["direct", "egressgate", "mitmdump"];
export function variantsOf(target: TargetName): H2Variant[] {
  if (target === "direct") return ["h2-1-h2up"];
  // mitmproxy (its default connection_strategy, eager) connects upstream before the guest's TLS
  // handshake and gives the guest the protocol the upstream chose: h2 on both sides takes an h2
  // upstream, and an HTTP/1.1 guest cannot reach an h2-only one through it.
  if (target === "mitmdump") return ["h1-32-h1up", "h2-1-h2up", "h2-8-h2up"];
  return [
    "h1-32-h1up",
    "h2-1-h1up",
    "h2-8-h1up",
    "h2-1-h2up",
    "h2-8-h2up",
    "h1-32-h2up",
    "raw-h1-32-h1up",
    "raw-h2-1-h1up",
    "raw-h2-8-h1up",
    "raw-h2-1-h2up",
    "raw-h2-8-h2up",
    ...(h2loadAvailable ? (["h2load-h1-32-h1up", "h2load-1-h1up", "h2load-8-h1up"] as const) : []),
  ];
}

export interface H2Window extends RateWindow {
  readonly variant: H2Variant;
  /** The offered load of a paced window (req/s); undefined for as-fast-as-possible. */
  readonly pacedRate?: number | undefined;
}

export interface H2Spec extends RoundTiming {
  readonly targets: readonly TargetName[];
  readonly concurrency: number;
  /**
   * Then egressgate's HTTP/1.1 row and its h2 rows to the h1 upstream again, each offered the
   * same fixed load: their proxy CPU per request at equal throughput (CPU per request otherwise
   * falls as throughput rises, more for HTTP/2, whose streams then share frames and TLS records).
   */
  readonly pacedRate: number | undefined;
  /** Only these rows (and at the fixed load, only these of pacedVariants); all when undefined. */
  readonly variants?: readonly H2Variant[] | undefined;
}

/** The variants run at the fixed offered load. */
export const pacedVariants: readonly H2Variant[] = ["h1-32-h1up", "h2-1-h1up", "h2-8-h1up"];

const fmt = (n: number | undefined, digits = 0): string => (n === undefined || Number.isNaN(n) ? "–" : n.toFixed(digits));

function rotated<T>(items: readonly T[], round: number): T[] {
  return items.map((_, i) => items[(i + round) % items.length]!);
}

interface H2Lane {
  readonly target: TargetName;
  readonly variant: H2Variant;
  readonly pacedRate: number | undefined;
}

/** The load generator's lane name: its connections and latency histogram. */
export function laneName(lane: H2Lane): string {
  return `h2/${lane.target}/${lane.variant}${lane.pacedRate !== undefined ? `@${lane.pacedRate}` : ""}`;
}

/** One window of a lane; `record` false for a warm-up. */
async function window(h: Harness, lane: H2Lane, spec: H2Spec, durationMs: number, record: boolean): Promise<{ ok: number; errors: number; firstError: string | undefined; elapsedMs: number; connects: number; p50Ms: number; p99Ms: number }> {
  const { target, variant, pacedRate } = lane;
  const info = h2Variants[variant];
  const port = info.upstream === "h2" ? h.started.upstreamH2Port : h.started.upstreamPort;
  const url = `https://${originHost}:${port}/small`;
  const name = laneName(lane);
  if (info.client === "h2load") return h2loadWindow(h, target, port, info.guest, info.connections, spec.concurrency, durationMs);
  if (info.client === "raw") {
    const raw: RawRateRun = { kind: "rawrate", id: h.nextId(), lane: name, target, protocol: info.guest, url, expectedBytes: smallBodyBytes, concurrency: spec.concurrency, connections: info.connections, durationMs, record };
    return ask<H2Result>(h.load, "result", raw, durationMs + 60_000);
  }
  if (info.guest === "h1") {
    return h.rate({ lane: name, target, url, expectedBytes: smallBodyBytes, concurrency: spec.concurrency, newConnections: false, durationMs, record, ratePerSecond: pacedRate });
  }
  const run: H2RateRun = { kind: "h2rate", id: h.nextId(), lane: name, target, url, expectedBytes: smallBodyBytes, concurrency: spec.concurrency, connections: info.connections, durationMs, record, ratePerSecond: pacedRate };
  return ask<H2Result>(h.load, "result", run, durationMs + 60_000);
}

/** One socat relay per target and upstream port, for the h2load lanes; stopped when the scenario ends. */
const relays = new Map<string, Promise<{ readonly child: ChildProcess; readonly port: number }>>();

function relayFor(h: Harness, target: TargetName, upstreamPort: number): Promise<{ readonly child: ChildProcess; readonly port: number }> {
  const key = `${target}/${upstreamPort}`;
  let relay = relays.get(key);
  if (relay === undefined) {
    relay = (async () => {
      const proxy = h.started.proxies.get(target);
      if (proxy === undefined) throw new Error(`${target} is not running`);
      const proxyUrl = new URL(proxy.url);
      const port = await freePort();
      const child = track(
        // `nodelay` on both addresses, as the README's recipe says: without it Nagle's algorithm
        // holds a relay's small writes (a few streams' frames) until the peer's ACK.
        spawn("socat", [`TCP-LISTEN:${port},fork,reuseaddr,bind=127.0.0.1,nodelay`, `PROXY:${proxyUrl.hostname}:${originHost}:${upstreamPort},proxyport=${proxyUrl.port},nodelay`], { stdio: ["ignore", "ignore", "pipe"] }),
        "socat",
      );
      child.stderr?.resume();
      try {
        await waitForPort(port, 10_000, "socat", child);
      } catch (error) {
        await stopChild(child);
        throw error;
      }
      return { child, port };
    })();
    relays.set(key, relay);
  }
  return relay;
}

/**
 * One h2load run of about `durationMs` (a request count at 6000 req/s: its `-D` mode waits on
 * after its clients stop), `connections` connections with `concurrency` streams in flight in all.
 */
async function h2loadWindow(
  h: Harness,
  target: TargetName,
  upstreamPort: number,
  guest: "h1" | "h2",
  connections: number,
  concurrency: number,
  durationMs: number,
): Promise<{ ok: number; errors: number; firstError: string | undefined; elapsedMs: number; connects: number; p50Ms: number; p99Ms: number }> {
  const relay = await relayFor(h, target, upstreamPort);
  const requests = Math.max(500, Math.round((durationMs / 1000) * 6000));
  // `--h1`: HTTP/1.1 (ALPN http/1.1), one request in flight a connection (-m 1: no pipelining).
  const args = [
    ...(guest === "h1" ? ["--h1"] : []),
    "-n",
    String(requests),
    "-c",
    String(connections),
    "-m",
    String(Math.ceil(concurrency / connections)),
    `--connect-to=127.0.0.1:${relay.port}`,
    `https://${originHost}:${upstreamPort}/small`,
  ];
  const out = await new Promise<string>((resolve) => {
    execFile("h2load", args, { timeout: durationMs + 60_000, maxBuffer: 4 * 1024 * 1024 }, (error, stdout, stderr) => resolve(`${stdout}${stderr}${error !== null ? `\n(h2load: ${error.message})` : ""}`));
  });
  const finished = /finished in ([0-9.]+)(ms|s),/.exec(out);
  const counts = /requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored/.exec(out);
  const codes = /status codes: (\d+) 2xx/.exec(out);
  if (finished === null || counts === null || codes === null) return { ok: 0, errors: requests, firstError: `h2load: ${out.slice(-300)}`, elapsedMs: durationMs, connects: connections, p50Ms: Number.NaN, p99Ms: Number.NaN };
  const ok = Number(codes[1]);
  const errors = Number(counts[1]) - ok;
  return {
    ok,
    errors,
    firstError: errors > 0 ? `h2load: ${counts[0]}` : undefined,
    elapsedMs: Number(finished[1]) * (finished[2] === "ms" ? 1 : 1000),
    connects: connections,
    p50Ms: Number.NaN,
    p99Ms: Number.NaN,
  };
}

export async function runH2(h: Harness, spec: H2Spec): Promise<H2Window[]> {
  try {
    return await runH2Lanes(h, spec);
  } finally {
    const started = [...relays.values()];
    relays.clear();
    await Promise.all(
      started.map(async (relay) => {
        const running = await relay.catch(() => undefined);
        if (running !== undefined) await stopChild(running.child);
      }),
    );
  }
}

async function runH2Lanes(h: Harness, spec: H2Spec): Promise<H2Window[]> {
  const windows: H2Window[] = [];
  const wanted = (variant: H2Variant): boolean => spec.variants === undefined || spec.variants.includes(variant);
  const free = spec.targets.flatMap((target) => variantsOf(target).filter(wanted).map((variant): H2Lane => ({ target, variant, pacedRate: undefined })));
  await runLanes(h, spec, free, windows);
  const pacedWanted = pacedVariants.filter(wanted);
  if (spec.pacedRate !== undefined && spec.targets.includes("egressgate") && pacedWanted.length > 0) {
    const paced = pacedWanted.map((variant): H2Lane => ({ target: "egressgate", variant, pacedRate: spec.pacedRate }));
    await runLanes(h, spec, paced, windows);
  }
  return windows;
}

async function runLanes(h: Harness, spec: H2Spec, lanes: readonly H2Lane[], windows: H2Window[]): Promise<void> {
  for (const lane of lanes) {
    if (!h.available(lane.target)) continue;
    const warm = await window(h, lane, spec, spec.initialWarmupMs, false);
    await h.noteFailure("h2", lane.target, warm.ok, warm.errors, warm.firstError);
  }
  for (let round = 0; round < spec.rounds; round++) {
    for (const lane of rotated(lanes, round)) {
      const { target, variant, pacedRate } = lane;
      if (!h.available(target)) continue;
      const upstreamBefore = await h.upstreamStats();
      const warm = spec.warmupMs > 0 ? await window(h, lane, spec, spec.warmupMs, false) : undefined;
      const { value: result, sample } = await h.measure(h.pidOf(target), () => window(h, lane, spec, spec.measureMs, true));
      const upstreamAfter = await h.upstreamStats();
      const w: H2Window = {
        ...sample,
        round: round + 1,
        target,
        variant,
        pacedRate,
        concurrency: spec.concurrency,
        requestsPerSecond: result.ok / (result.elapsedMs / 1000),
        ok: result.ok,
        errors: result.errors + (warm?.errors ?? 0),
        firstError: result.firstError ?? warm?.firstError,
        p50Ms: result.p50Ms,
        p99Ms: result.p99Ms,
        clientConnects: (warm?.connects ?? 0) + result.connects,
        upstreamConnects: upstreamAfter.tlsConnections - upstreamBefore.tlsConnections + (upstreamAfter.h2Sessions - upstreamBefore.h2Sessions),
      };
      windows.push(w);
      await h.noteFailure("h2", target, w.ok, w.errors, w.firstError);
      const cpuPerRequest = sample.proxyCpuPercent === undefined || w.requestsPerSecond === 0 ? undefined : (sample.proxyCpuPercent / 100 / w.requestsPerSecond) * 1e6;
      h.log(
        `  h2 round ${round + 1}/${spec.rounds} ${target.padEnd(11)} ${variant.padEnd(11)}${pacedRate !== undefined ? ` @${pacedRate}` : ""} ${fmt(w.requestsPerSecond).padStart(6)} req/s  ` +
          `p50 ${fmt(w.p50Ms, 2)} ms  proxy CPU ${fmt(sample.proxyCpuPercent)}% (${fmt(cpuPerRequest)} µs/req)  load ${fmt(sample.loadCpuPercent)}%  machine ${fmt(sample.machineCpuPercent)}%  conns ${w.clientConnects}/${w.upstreamConnects}`,
      );
    }
  }
}

export interface H2DownloadResult extends Sample {
  readonly upstream: "h1" | "h2";
  readonly bytes: number;
  readonly ms: number | undefined;
  readonly errors: number;
  readonly failure: string | undefined;
  /** RSS of the proxy before this download (the first one finds a process that has served nothing). */
  readonly idleRssKb: number | undefined;
  readonly endRssKb: number | undefined;
}

/**
 * One download of `bytes` on one HTTP/2 stream through the fresh egressgate child, from the h1
 * upstream (s_server, or the Node upstream with --bulk-upstream node) and then from the h2-only
 * port, the proxy's peak RSS reset before each.
 */
export async function runH2Downloads(h: Harness, bytes: number): Promise<H2DownloadResult[]> {
  const fresh = h.started.freshEgressgateH2;
  if (fresh === undefined) return [];
  const pid = fresh.child.pid;
  const results: H2DownloadResult[] = [];
  for (const upstream of ["h1", "h2"] as const) {
    if (hasExited(fresh.child)) break;
    const url = upstream === "h1" ? h.started.downloadUrl(bytes) : `https://${originHost}:${h.started.upstreamH2Port}/download?bytes=${bytes}`;
    const idleRssKb = statusKb(pid, "VmRSS");
    const run: H2BulkRun = { kind: "h2bulk", id: h.nextId(), lane: `h2-big/${upstream}`, target: "egressgate-fresh-h2", url, bytes, maxMs: 120_000 };
    const { value: result, sample } = await h.measure(pid, () => ask<H2Result>(h.load, "result", run, 240_000));
    const endRssKb = statusKb(pid, "VmRSS");
    const crash = hasExited(fresh.child) ? `exited (${fresh.child.exitCode ?? fresh.child.signalCode}): ${stderrError(fresh.child) ?? "no error printed"}` : undefined;
    const failure = result.errors > 0 ? (crash ?? result.firstError) : undefined;
    const ms = result.transfers[0]?.ms;
    results.push({ ...sample, upstream, bytes, ms, errors: result.errors, failure, idleRssKb, endRssKb });
    h.log(
      `  h2 download ${fmt(bytes / 2 ** 20)} MiB from the ${upstream} upstream in ${fmt((ms ?? Number.NaN) / 1000, 1)} s  RSS before ${fmt((idleRssKb ?? Number.NaN) / 1024)} MiB, ` +
        `peak ${fmt((sample.peakRssKb ?? Number.NaN) / 1024)} MiB, after ${fmt((endRssKb ?? Number.NaN) / 1024)} MiB${failure !== undefined ? `; failed: ${failure}` : ""}`,
    );
  }
  return results;
}
