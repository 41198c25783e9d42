/**
 * The bench's scenarios. Each runs against each of its targets in turn, in rounds whose order
 * rotates, so drift and the machine's other work fall on all the targets alike. Around every
 * measured window the harness reads the proxy's CPU time and resets and reads its peak RSS.
 *
 *   small    small HTTPS GETs over keep-alive connections, concurrency 1 and 32
 *   newconn  the same GETs, each over a new connection (a new CONNECT and two new TLS sessions)
 *   hosts    the first request to each of N new hostnames, one at a time: a new leaf each
 *   bulk     a 32 MiB upload (to the Node upstream) and a 32 MiB download (from openssl s_server,
 *            or the Node upstream with --bulk-upstream node)
 *   big      a 1 GiB download through a fresh egressgate process: its RSS growth
 *   h2       small GETs over HTTP/2 against HTTP/1.1, and 1 GiB on one h2 stream (bench/h2-scenario.ts)
 *   calls    tier-2 call costs, measured by bench/djs-calls.ts in its own process (no proxy)
 *
 * Nothing here judges a figure; bench/report.ts turns the windows into tables and ratios.
 */
import type { ChildProcess } from "node:child_process";
import { performance } from "node:perf_hooks";
import { ask, cpuSeconds, hasExited, machineBusySeconds, mainThreadCpuSeconds, resetPeak, statusKb, stderrError, waitExit } from "./children.js";
import type { BulkResult, BulkRun, HostsResult, HostsRun, RateResult, RateRun, RatesResult, TargetName } from "./load.js";
import { newHostname, originHost, smallBodyBytes, type StartedTargets } from "./targets.js";
import type { UpstreamStats } from "./upstream.js";

export type ScenarioName = "small" | "side" | "newconn" | "hosts" | "bulk" | "big" | "h2" | "calls";
export const scenarioNames: readonly ScenarioName[] = ["small", "side", "newconn", "hosts", "bulk", "big", "h2", "calls"];

/** What every measured window records about the processes around it. */
export interface Sample {
  readonly seconds: number;
  /** The proxy's peak RSS over the window (VmHWM, reset before it); undefined for direct. */
  readonly peakRssKb: number | undefined;
  readonly proxyCpuPercent: number | undefined;
  /** The proxy's main thread alone (its event loop); the rest is worker and helper threads. */
  readonly proxyMainThreadCpuPercent: number | undefined;
  readonly upstreamCpuPercent: number | undefined;
  readonly loadCpuPercent: number | undefined;
  /** Every process on the machine, the kernel's softirq work included: 100 per busy core. */
  readonly machineCpuPercent?: number | undefined;
}

export interface RateWindow extends Sample {
  readonly round: number;
  readonly target: TargetName;
  readonly concurrency: number;
  readonly requestsPerSecond: number;
  readonly ok: number;
  readonly errors: number;
  readonly firstError: string | undefined;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** New client-side connections in the warm-up and measured windows (CONNECTs or TLS dials). */
  readonly clientConnects: number;
  readonly upstreamConnects: number;
}

export interface HostsWindow extends Sample {
  readonly round: number;
  readonly target: TargetName;
  readonly asked: number;
  readonly errors: number;
  readonly firstError: string | undefined;
  readonly newHostMs: readonly number[];
  readonly controlMs: readonly number[];
  readonly elapsedMs: number;
  /** New TLS connections the Node upstream saw in the window, and how many resumed a session. */
  readonly upstreamConnects: number;
  readonly upstreamResumed: number;
}

export interface BulkWindow extends Sample {
  readonly round: number;
  readonly target: TargetName;
  readonly direction: "download" | "upload";
  readonly transfers: readonly { readonly ms: number; readonly bytes: number }[];
  readonly errors: number;
  readonly firstError: string | undefined;
}

export interface BigResult {
  /** Through the child with an onResponse-only tier-2 policy. */
  readonly withPolicy: boolean;
  readonly bytes: number;
  readonly ms: number | undefined;
  readonly errors: number;
  readonly firstError: string | undefined;
  /** Why the download failed: egressgate's crash when it exited, else the client's error. */
  readonly failure: string | undefined;
  /** RSS of the fresh egressgate process before the download (it has served nothing yet). */
  readonly idleRssKb: number | undefined;
  readonly peakRssKb: number | undefined;
  readonly endRssKb: number | undefined;
  readonly proxyCpuPercent: number | undefined;
}

/** The load generator, the started targets, and bookkeeping shared by the scenarios. */
export class Harness {
  private runId = 0;
  /** False when VmHWM could not be reset (then a peak is the process lifetime's). */
  peakResettable = true;
  /** Targets that stopped answering or exited mid-run, with why; they sit out the rest. */
  readonly dropped = new Map<TargetName, string>();

  constructor(
    readonly load: ChildProcess,
    readonly started: StartedTargets,
    readonly log: (line: string) => void,
  ) {}

  pidOf(target: TargetName): number | undefined {
    if (target === "direct") return undefined;
    if (target === "tcp-relay") return this.started.relay?.pid;
    return this.started.proxies.get(target)?.child.pid;
  }

  /** Whether `target` can take its turn: started, not dropped, still running. */
  available(target: TargetName): boolean {
    if (this.dropped.has(target)) return false;
    if (target === "direct") return true;
    if (target === "tcp-relay") return this.started.relay !== undefined && !hasExited(this.started.relay);
    const proxy = this.started.proxies.get(target);
    if (proxy === undefined) return false;
    if (hasExited(proxy.child)) {
      const why = stderrError(proxy.child);
      this.dropped.set(target, `exited (${proxy.child.exitCode ?? proxy.child.signalCode}) during the run${why !== undefined ? `: ${why}` : ""}`);
      this.log(`bench: ${target} exited; it sits out the rest of the run`);
      return false;
    }
    return true;
  }

  nextId(): number {
    return ++this.runId;
  }

  upstreamStats(): Promise<UpstreamStats> {
    return ask<UpstreamStats>(this.started.upstream, "stats", { kind: "stats" }, 10_000);
  }

  /** Runs `fn` with the proxy's (pid's) peak RSS reset before and CPU time read around it. */
  async measure<T>(pid: number | undefined, fn: () => Promise<T>): Promise<{ value: T; sample: Sample }> {
    if (pid !== undefined) this.peakResettable = resetPeak(pid) && this.peakResettable;
    const upstreamPid = this.started.upstream.pid;
    const before = [cpuSeconds(pid), cpuSeconds(upstreamPid), cpuSeconds(this.load.pid), mainThreadCpuSeconds(pid), machineBusySeconds()];
    const t0 = performance.now();
    const value = await fn();
    const seconds = (performance.now() - t0) / 1000;
    const after = [cpuSeconds(pid), cpuSeconds(upstreamPid), cpuSeconds(this.load.pid), mainThreadCpuSeconds(pid), machineBusySeconds()];
    const percent = (i: number): number | undefined => {
      const [a, b] = [before[i], after[i]];
      return a === undefined || b === undefined || seconds <= 0 ? undefined : ((b - a) / seconds) * 100;
    };
    return { value, sample: { seconds, peakRssKb: statusKb(pid, "VmHWM"), proxyCpuPercent: percent(0), proxyMainThreadCpuPercent: percent(3), upstreamCpuPercent: percent(1), loadCpuPercent: percent(2), machineCpuPercent: percent(4) } };
  }

  rate(run: Omit<RateRun, "kind" | "id">): Promise<RateResult> {
    return ask<RateResult>(this.load, "result", { kind: "rate", id: this.nextId(), ...run }, run.durationMs + 60_000);
  }

  /** Rate runs at once, each on its own lane: the load generator answers when all have ended. */
  rates(runs: readonly Omit<RateRun, "kind" | "id">[]): Promise<RatesResult> {
    const longest = Math.max(...runs.map((run) => run.durationMs));
    return ask<RatesResult>(this.load, "rates-result", { kind: "rates", id: this.nextId(), runs: runs.map((run) => ({ kind: "rate", id: this.nextId(), ...run })) }, longest + 60_000);
  }

  hosts(run: Omit<HostsRun, "kind" | "id">): Promise<HostsResult> {
    return ask<HostsResult>(this.load, "result", { kind: "hosts", id: this.nextId(), ...run }, run.maxMs + 120_000);
  }

  bulk(run: Omit<BulkRun, "kind" | "id">): Promise<BulkResult> {
    return ask<BulkResult>(this.load, "result", { kind: "bulk", id: this.nextId(), ...run }, run.maxMs + 120_000);
  }

  /** After a window with no success at all, the target sits out the rest of the scenario's rounds. */
  async noteFailure(scenario: ScenarioName, target: TargetName, ok: number, errors: number, firstError: string | undefined): Promise<void> {
    if (errors > 0) this.log(`bench: ${scenario} ${target}: ${errors} errors; first: ${firstError}`);
    // A crashed proxy's exit can trail its clients' socket errors by a moment.
    const child = this.started.proxies.get(target)?.child;
    if (errors > 0 && child !== undefined) await waitExit(child, 500);
    // A proxy that exited is dropped by available(), with the error it printed.
    if (!this.available(target)) return;
    if (ok === 0 && errors > 0) {
      this.dropped.set(target, `${scenario}: no request succeeded (${firstError})`);
      this.log(`bench: ${target} sits out the rest of the run`);
    }
  }
}

/** `targets` rotated by `round`, so no target always follows the same other one. */
function rotated<T>(targets: readonly T[], round: number): T[] {
  return targets.map((_, i) => targets[(i + round) % targets.length]!);
}

const fmt = (n: number | undefined, digits = 0): string => (n === undefined || Number.isNaN(n) ? "–" : n.toFixed(digits));

// ---------------------------------------------------------------------------------------------

export interface RateSpec {
  readonly scenario: "small" | "newconn";
  readonly targets: readonly TargetName[];
  readonly concurrencies: readonly number[];
  readonly newConnections: boolean;
  readonly rounds: number;
  /** Once per target and concurrency before round 1: JIT, TLS sessions, leaf certificate. */
  readonly initialWarmupMs: number;
  /** Before every measured window, unrecorded: re-opens connections a target closed while idle. */
  readonly warmupMs: number;
  readonly measureMs: number;
}

export async function runRate(h: Harness, spec: RateSpec): Promise<RateWindow[]> {
  const url = `https://${originHost}:${h.started.upstreamPort}/small`;
  const base = (target: TargetName, concurrency: number) => ({
    lane: `${spec.scenario}/${target}/${concurrency}`,
    target,
    url,
    expectedBytes: smallBodyBytes,
    concurrency,
    newConnections: spec.newConnections,
  });
  for (const concurrency of spec.concurrencies) {
    for (const target of spec.targets) {
      if (!h.available(target)) continue;
      const warm = await h.rate({ ...base(target, concurrency), durationMs: spec.initialWarmupMs, record: false });
      await h.noteFailure(spec.scenario, target, warm.ok, warm.errors, warm.firstError);
    }
  }
  const windows: RateWindow[] = [];
  for (let round = 0; round < spec.rounds; round++) {
    for (const concurrency of spec.concurrencies) {
      for (const target of rotated(spec.targets, round)) {
        if (!h.available(target)) continue;
        const upstreamBefore = await h.upstreamStats();
        const warm = spec.warmupMs > 0 ? await h.rate({ ...base(target, concurrency), durationMs: spec.warmupMs, record: false }) : undefined;
        const { value: result, sample } = await h.measure(h.pidOf(target), () => h.rate({ ...base(target, concurrency), durationMs: spec.measureMs, record: true }));
        const upstreamAfter = await h.upstreamStats();
        const window: RateWindow = {
          ...sample,
          round: round + 1,
          target,
          concurrency,
          requestsPerSecond: result.ok / (result.elapsedMs / 1000),
          ok: result.ok,
          errors: result.errors + (warm?.errors ?? 0),
          firstError: result.firstError ?? warm?.firstError,
          p50Ms: result.p50Ms,
          p99Ms: result.p99Ms,
          clientConnects: (warm?.connects ?? 0) + result.connects,
          upstreamConnects: upstreamAfter.tlsConnections - upstreamBefore.tlsConnections,
        };
        windows.push(window);
        await h.noteFailure(spec.scenario, target, window.ok, window.errors, window.firstError);
        h.log(
          `  ${spec.scenario} round ${round + 1}/${spec.rounds} c=${concurrency} ${target.padEnd(16)} ${fmt(window.requestsPerSecond).padStart(6)} req/s  ` +
            `p50 ${fmt(result.p50Ms, 2)} ms  p99 ${fmt(result.p99Ms, 2)} ms  proxy CPU ${fmt(sample.proxyCpuPercent)}%  ` +
            `load CPU ${fmt(sample.loadCpuPercent)}%  conns ${window.clientConnects}/${window.upstreamConnects}`,
        );
      }
    }
  }
  return windows;
}

// ---------------------------------------------------------------------------------------------

/** One window of the side-by-side scenario: the base and one compared target, loaded at once. */
export interface SideWindow {
  readonly round: number;
  readonly base: TargetName;
  readonly target: TargetName;
  readonly concurrency: number;
  readonly seconds: number;
  readonly baseRequestsPerSecond: number;
  readonly targetRequestsPerSecond: number;
  /** Each proxy's CPU time over the window (all its threads), per request it served. */
  readonly baseCpuMicrosPerRequest: number | undefined;
  readonly targetCpuMicrosPerRequest: number | undefined;
  readonly errors: number;
  readonly firstError: string | undefined;
}

/** How a rate scenario's rounds are timed: warm-ups once and before each window, then the window. */
export interface RoundTiming {
  readonly rounds: number;
  /** Once per lane before round 1: JIT, TLS sessions, leaf certificate. */
  readonly initialWarmupMs: number;
  /** Before every measured window, unrecorded. */
  readonly warmupMs: number;
  readonly measureMs: number;
}

export interface SideSpec extends RoundTiming {
  readonly base: TargetName;
  readonly targets: readonly TargetName[];
  readonly concurrency: number;
}

/**
 * Small GETs to the base and a compared target in the same seconds, `concurrency` each, from one
 * load generator: whatever else takes the machine's cores in a window falls on both alike, which
 * back-to-back windows cannot promise on a machine whose speed drifts by 2× within a minute. Each
 * window's ratios (req/s and each proxy's CPU per request) are paired, and their median is the
 * figure (report.ts, sideRows).
 */
export async function runSideBySide(h: Harness, spec: SideSpec): Promise<SideWindow[]> {
  const url = `https://${originHost}:${h.started.upstreamPort}/small`;
  const run = (target: TargetName, durationMs: number, record: boolean): Omit<RateRun, "kind" | "id"> => ({
    lane: `side/${target}/${spec.concurrency}`,
    target,
    url,
    expectedBytes: smallBodyBytes,
    concurrency: spec.concurrency,
    newConnections: false,
    durationMs,
    record,
  });
  const windows: SideWindow[] = [];
  for (const target of spec.targets) {
    if (!h.available(spec.base) || !h.available(target)) continue;
    await h.rates([run(spec.base, spec.initialWarmupMs, false), run(target, spec.initialWarmupMs, false)]);
    for (let round = 0; round < spec.rounds; round++) {
      if (!h.available(spec.base) || !h.available(target)) break;
      if (spec.warmupMs > 0) await h.rates([run(spec.base, spec.warmupMs, false), run(target, spec.warmupMs, false)]);
      const pids = [h.pidOf(spec.base), h.pidOf(target)];
      const before = pids.map(cpuSeconds);
      const t0 = performance.now();
      const { results } = await h.rates([run(spec.base, spec.measureMs, true), run(target, spec.measureMs, true)]);
      const seconds = (performance.now() - t0) / 1000;
      const after = pids.map(cpuSeconds);
      const [a, b] = [results[0]!, results[1]!];
      const perRequest = (i: number, result: RateResult): number | undefined => {
        const [x, y] = [before[i], after[i]];
        return x === undefined || y === undefined || result.ok === 0 ? undefined : ((y - x) / result.ok) * 1e6;
      };
      const window: SideWindow = {
        round: round + 1,
        base: spec.base,
        target,
        concurrency: spec.concurrency,
        seconds,
        baseRequestsPerSecond: a.ok / (a.elapsedMs / 1000),
        targetRequestsPerSecond: b.ok / (b.elapsedMs / 1000),
        baseCpuMicrosPerRequest: perRequest(0, a),
        targetCpuMicrosPerRequest: perRequest(1, b),
        errors: a.errors + b.errors,
        firstError: a.firstError ?? b.firstError,
      };
      windows.push(window);
      await h.noteFailure("side", spec.base, a.ok, a.errors, a.firstError);
      await h.noteFailure("side", target, b.ok, b.errors, b.firstError);
      h.log(
        `  side round ${round + 1}/${spec.rounds} c=${spec.concurrency} each: ${spec.base} ${fmt(window.baseRequestsPerSecond)} req/s ${fmt(window.baseCpuMicrosPerRequest)} µs/req, ` +
          `${target} ${fmt(window.targetRequestsPerSecond)} req/s ${fmt(window.targetCpuMicrosPerRequest)} µs/req`,
      );
    }
  }
  return windows;
}

// ---------------------------------------------------------------------------------------------

export interface HostsSpec {
  readonly targets: readonly TargetName[];
  readonly rounds: number;
  readonly perRound: number;
  /** New hostnames per target before round 1, unrecorded (JIT, the first leaf, the key pair). */
  readonly warmup: number;
  /** Each window stops after this long, with fewer hostnames done (http-mitm-proxy's key generation). */
  readonly windowMaxMs: number;
  readonly controlEvery: number;
}

/** Every hostname the scenario will ask `target` for, warm-up ones included. */
export function hostsFor(spec: Pick<HostsSpec, "rounds" | "perRound" | "warmup">, target: TargetName): string[] {
  return [
    ...Array.from({ length: spec.warmup }, (_, i) => newHostname(target, i, "w")),
    ...Array.from({ length: spec.rounds * spec.perRound }, (_, i) => newHostname(target, i, "n")),
  ];
}

export async function runHosts(h: Harness, spec: HostsSpec): Promise<HostsWindow[]> {
  // The upstream closes every connection after its response and never resumes a TLS session, so
  // a proxy pays the same full upstream handshake for a known hostname as for a new one, and the
  // difference is the new hostname's own cost: its certificate and whatever per-host state it needs.
  const port = h.started.upstreamNoResumePort;
  const urlOf = (host: string): string => `https://${host}:${port}/small-close`;
  const controlUrl = urlOf(originHost);
  // The names egressgate was given `--resolve` for: the warm-up ones first, then each round's.
  const urlsOf = (target: TargetName, from: number, count: number): string[] => hostsFor(spec, target).slice(from, from + count).map(urlOf);
  const visit = (target: TargetName, urls: string[], controlEvery: number): ReturnType<Harness["hosts"]> =>
    h.hosts({ lane: `hosts/${target}`, target, urls, controlUrl, controlEvery, expectedBytes: smallBodyBytes, maxMs: spec.windowMaxMs });
  for (const target of spec.targets) {
    if (!h.available(target) || spec.warmup === 0) continue;
    const warm = await visit(target, urlsOf(target, 0, spec.warmup), 1);
    await h.noteFailure("hosts", target, warm.ok, warm.errors, warm.firstError);
  }
  const windows: HostsWindow[] = [];
  for (let round = 0; round < spec.rounds; round++) {
    for (const target of rotated(spec.targets, round)) {
      if (!h.available(target)) continue;
      const urls = urlsOf(target, spec.warmup + round * spec.perRound, spec.perRound);
      const upstreamBefore = await h.upstreamStats();
      const { value: result, sample } = await h.measure(h.pidOf(target), () => visit(target, urls, spec.controlEvery));
      windows.push({
        ...sample,
        round: round + 1,
        target,
        asked: urls.length,
        errors: result.errors,
        firstError: result.firstError,
        newHostMs: result.newHostMs,
        controlMs: result.controlMs,
        elapsedMs: result.elapsedMs,
        ...(await h.upstreamStats().then((after) => ({
          upstreamConnects: after.tlsConnections - upstreamBefore.tlsConnections,
          upstreamResumed: after.resumedSessions - upstreamBefore.resumedSessions,
        }))),
      });
      await h.noteFailure("hosts", target, result.ok, result.errors, result.firstError);
      const sorted = [...result.newHostMs].sort((a, b) => a - b);
      h.log(
        `  hosts round ${round + 1}/${spec.rounds} ${target.padEnd(16)} ${result.ok}/${urls.length} new hostnames in ${fmt(result.elapsedMs / 1000, 1)} s  ` +
          `p50 ${fmt(sorted[Math.floor(sorted.length / 2)], 2)} ms  proxy CPU ${fmt(sample.proxyCpuPercent)}%  peak RSS ${fmt((sample.peakRssKb ?? Number.NaN) / 1024)} MiB`,
      );
    }
  }
  return windows;
}

// ---------------------------------------------------------------------------------------------

export interface BulkSpec {
  readonly targets: readonly TargetName[];
  readonly rounds: number;
  /** Transfers per direction, target and round. */
  readonly count: number;
  readonly bytes: number;
  readonly windowMaxMs: number;
}

export async function runBulk(h: Harness, spec: BulkSpec): Promise<BulkWindow[]> {
  const urls = {
    download: h.started.downloadUrl(spec.bytes),
    upload: `https://${originHost}:${h.started.upstreamPort}/upload`,
  };
  const windows: BulkWindow[] = [];
  for (let round = 0; round < spec.rounds; round++) {
    for (const target of rotated(spec.targets, round)) {
      // Upload first: a proxy that crashes on a download then still has its upload measured.
      for (const direction of ["upload", "download"] as const) {
        if (!h.available(target)) continue;
        const { value: result, sample } = await h.measure(h.pidOf(target), () =>
          h.bulk({ lane: `bulk-${direction}/${target}`, target, direction, url: urls[direction], bytes: spec.bytes, count: spec.count, maxMs: spec.windowMaxMs }),
        );
        windows.push({ ...sample, round: round + 1, target, direction, transfers: result.transfers, errors: result.errors, firstError: result.firstError });
        await h.noteFailure("bulk", target, result.ok, result.errors, result.firstError);
        const rates = result.transfers.map((t) => (t.bytes / t.ms / 1000).toFixed(0));
        h.log(
          `  bulk round ${round + 1}/${spec.rounds} ${direction.padEnd(8)} ${target.padEnd(16)} ${rates.join(", ")} MB/s  ` +
            `proxy CPU ${fmt(sample.proxyCpuPercent)}%  peak RSS ${fmt((sample.peakRssKb ?? Number.NaN) / 1024)} MiB`,
        );
      }
    }
  }
  return windows;
}

// ---------------------------------------------------------------------------------------------

/** One download of `bytes` through the fresh egressgate child, its RSS read around it. */
export async function runBig(h: Harness, bytes: number, withPolicy = false): Promise<BigResult> {
  const fresh = withPolicy ? h.started.freshEgressgateDjs : h.started.freshEgressgate;
  if (fresh === undefined) throw new Error("1 GiB scenario without its egressgate child");
  const name = withPolicy ? "egressgate-fresh-djs" : "egressgate-fresh";
  const pid = fresh.child.pid;
  const idleRssKb = statusKb(pid, "VmRSS");
  const { value: result, sample } = await h.measure(pid, () =>
    h.bulk({ lane: `big/${name}`, target: name, direction: "download", url: h.started.downloadUrl(bytes), bytes, count: 1, maxMs: 120_000 }),
  );
  const endRssKb = statusKb(pid, "VmRSS");
  let failure: string | undefined;
  if (result.errors > 0) {
    const crash = hasExited(fresh.child) ? `exited (${fresh.child.exitCode ?? fresh.child.signalCode}): ${stderrError(fresh.child) ?? "no error printed"}` : undefined;
    failure = crash ?? result.firstError;
    h.log(`bench: big: ${result.firstError}${crash !== undefined ? `; egressgate ${crash}` : ""}`);
  }
  const ms = result.transfers[0]?.ms;
  h.log(
    `  big egressgate ${fmt(bytes / 2 ** 20)} MiB in ${fmt((ms ?? Number.NaN) / 1000, 1)} s  RSS idle ${fmt((idleRssKb ?? Number.NaN) / 1024)} MiB, ` +
      `peak ${fmt((sample.peakRssKb ?? Number.NaN) / 1024)} MiB, after ${fmt((endRssKb ?? Number.NaN) / 1024)} MiB`,
  );
  return {
    withPolicy,
    bytes,
    ms,
    errors: result.errors,
    firstError: result.firstError,
    failure,
    idleRssKb,
    peakRssKb: sample.peakRssKb,
    endRssKb,
    proxyCpuPercent: sample.proxyCpuPercent,
  };
}
