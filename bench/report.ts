/**
 * From the scenarios' windows to rows, ratios, markdown tables and the goals of issue 6 /
 * DESIGN.md §8. Every ratio is taken between rows of the same scenario and condition (the same
 * concurrency, or the same transfer direction): `× direct`, `× tcp-relay`, and `× best peer`,
 * the best of mockttp, http-mitm-proxy and mitmdump on that row's own figure.
 */
import type { LoadSummaryEntry, TargetName } from "./load.js";
import type { BigResult, BulkWindow, HostsWindow, RateWindow, SideWindow } from "./scenarios.js";
import { peerTargets } from "./targets.js";

export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** A median with its distribution-free 95% interval (order statistics of the binomial), and the sample size. */
export interface MedianInterval {
  readonly n: number;
  readonly median: number;
  readonly low: number;
  readonly high: number;
}

/**
 * The median of `values` and a 95% confidence interval for it that assumes nothing about their
 * distribution: [x(k), x(n−k+1)], with k the largest rank whose binomial tail P(B(n, ½) < k) is at
 * most 2.5%. With fewer than 6 values no such k exists, and the interval is the whole range.
 */
export function medianInterval(values: readonly number[]): MedianInterval {
  // A window where a target served nothing gives 0/0 or x/0: not a ratio to rank.
  const sorted = values.filter((v) => Number.isFinite(v)).sort((a, b) => a - b);
  const n = sorted.length;
  if (n === 0) return { n, median: Number.NaN, low: Number.NaN, high: Number.NaN };
  // P(B < k) for k = 0.. : add C(n, i)/2^n until the next term would pass 2.5%.
  let k = 0;
  let tail = 0;
  let term = 0.5 ** n;
  // k stays below n/2 (the interval never crosses the median), which also ends the loop where 0.5^n underflows to 0.
  while (k < n / 2 - 1 && tail + term <= 0.025) {
    tail += term;
    k += 1;
    term = (term * (n - k + 1)) / k;
  }
  const lowIndex = Math.max(0, k - 1);
  return { n, median: median(sorted), low: sorted[k === 0 ? 0 : lowIndex]!, high: sorted[k === 0 ? n - 1 : n - k]! };
}

/** `0.97× (0.95–0.99×, 40 windows)`. */
export function intervalText(m: MedianInterval, digits = 3): string {
  return `${fixed(m.median, digits)}× (${fixed(m.low, digits)}–${fixed(m.high, digits)}×, ${m.n} windows)`;
}

/** Nearest-rank percentile of a small sample. */
function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

function definedOnly(values: readonly (number | undefined)[]): number[] {
  return values.filter((v): v is number => v !== undefined && !Number.isNaN(v));
}

const maxOf = (values: readonly number[]): number | undefined => (values.length > 0 ? Math.max(...values) : undefined);
const medianOf = (values: readonly number[]): number | undefined => (values.length > 0 ? median(values) : undefined);

export const fixed = (n: number | undefined, digits: number): string => (n === undefined || Number.isNaN(n) ? "–" : n.toFixed(digits));
/** A ratio such as `0.42×`, or `–` when its reference was not measured. */
export const times = (n: number | undefined): string => (n === undefined || !Number.isFinite(n) ? "–" : `${n.toFixed(2)}×`);
const mib = (kb: number | undefined): number | undefined => (kb === undefined ? undefined : kb / 1024);

export interface Ratios {
  readonly ratioToDirect: number | undefined;
  readonly ratioToTcpRelay: number | undefined;
  readonly ratioToBestPeer: number | undefined;
  /** Which peer was best on this row's condition. */
  readonly bestPeer: TargetName | undefined;
}

/** Adds the three ratios to rows that share a condition, on the figure `value` (higher is better). */
function withRatios<R extends { readonly target: TargetName }>(rows: readonly R[], condition: (row: R) => string, value: (row: R) => number): (R & Ratios)[] {
  return rows.map((row) => {
    const same = rows.filter((r) => condition(r) === condition(row) && Number.isFinite(value(r)) && value(r) > 0);
    const of = (target: TargetName): number | undefined => {
      const found = same.find((r) => r.target === target);
      return found === undefined ? undefined : value(found);
    };
    const peers = same.filter((r) => peerTargets.includes(r.target)).sort((a, b) => value(b) - value(a));
    const best = peers[0];
    const own = value(row);
    const ratio = (ref: number | undefined): number | undefined => (ref === undefined || !Number.isFinite(own) ? undefined : own / ref);
    return { ...row, ratioToDirect: ratio(of("direct")), ratioToTcpRelay: ratio(of("tcp-relay")), ratioToBestPeer: ratio(best === undefined ? undefined : value(best)), bestPeer: best?.target };
  });
}

/** A markdown table from a header and rows of cells. */
export function table(header: readonly string[], align: readonly ("l" | "r")[], rows: readonly (readonly string[])[]): string {
  return [`| ${header.join(" | ")} |`, `|${align.map((a) => (a === "l" ? "---" : "---:")).join("|")}|`, ...rows.map((r) => `| ${r.join(" | ")} |`)].join("\n");
}

const bestPeerCell = (r: Ratios): string => (r.ratioToBestPeer === undefined ? "–" : `${times(r.ratioToBestPeer)}${r.bestPeer !== undefined ? ` (${r.bestPeer})` : ""}`);

// ---------------------------------------------------------------------------------------------
// small GETs, keep-alive or a new connection each

export interface RateRow extends Ratios {
  readonly scenario: string;
  readonly target: TargetName;
  readonly concurrency: number;
  readonly requestsPerSecond: number;
  readonly requestsPerSecondMin: number;
  readonly requestsPerSecondMax: number;
  readonly p50Ms: number;
  readonly p90Ms: number;
  readonly p99Ms: number;
  readonly maxMs: number;
  readonly requests: number;
  readonly errors: number;
  /** The first error of the first window that had one, so a row with errors says what they were. */
  readonly firstError: string | undefined;
  readonly proxyPeakRssMiB: number | undefined;
  readonly proxyCpuPercent: number | undefined;
  /** Proxy CPU time per request: unlike req/s, it barely moves when other work takes the cores. */
  readonly proxyCpuMicrosPerRequest: number | undefined;
  /** The same for the proxy's main thread (its event loop) alone. */
  readonly proxyMainThreadMicrosPerRequest: number | undefined;
  readonly loadCpuPercent: number | undefined;
  readonly upstreamCpuPercent: number | undefined;
  /** New connections over the measured rounds' windows, warm-ups included: CONNECTs (or TLS dials) and upstream TLS handshakes. */
  readonly clientConnects: number;
  readonly upstreamConnects: number;
}

/** CPU time per request over windows: the median of each window's CPU ÷ requests. */
function microsPerRequest(windows: readonly RateWindow[], percent: (w: RateWindow) => number | undefined): number | undefined {
  return medianOf(
    definedOnly(
      windows.map((w) => {
        const p = percent(w);
        return p === undefined || w.requestsPerSecond === 0 ? undefined : (p / 100 / w.requestsPerSecond) * 1e6;
      }),
    ),
  );
}

export function rateRows(scenario: string, targets: readonly TargetName[], windows: readonly RateWindow[], summary: readonly LoadSummaryEntry[]): RateRow[] {
  const rows: Omit<RateRow, keyof Ratios>[] = [];
  for (const concurrency of new Set(windows.map((w) => w.concurrency))) {
    for (const target of targets) {
      const mine = windows.filter((w) => w.target === target && w.concurrency === concurrency);
      if (mine.length === 0) continue;
      const hist = summary.find((s) => s.lane === `${scenario}/${target}/${concurrency}`);
      const rps = mine.map((w) => w.requestsPerSecond);
      const cpu = definedOnly(mine.map((w) => w.proxyCpuPercent));
      rows.push({
        scenario,
        target,
        concurrency,
        requestsPerSecond: median(rps),
        requestsPerSecondMin: Math.min(...rps),
        requestsPerSecondMax: Math.max(...rps),
        p50Ms: hist?.p50Ms ?? Number.NaN,
        p90Ms: hist?.p90Ms ?? Number.NaN,
        p99Ms: hist?.p99Ms ?? Number.NaN,
        maxMs: hist?.maxMs ?? Number.NaN,
        requests: hist?.count ?? 0,
        errors: mine.reduce((n, w) => n + w.errors, 0),
        firstError: mine.find((w) => w.firstError !== undefined)?.firstError,
        proxyPeakRssMiB: mib(maxOf(definedOnly(mine.map((w) => w.peakRssKb)))),
        proxyCpuPercent: medianOf(cpu),
        proxyCpuMicrosPerRequest: microsPerRequest(mine, (w) => w.proxyCpuPercent),
        proxyMainThreadMicrosPerRequest: microsPerRequest(mine, (w) => w.proxyMainThreadCpuPercent),
        loadCpuPercent: medianOf(definedOnly(mine.map((w) => w.loadCpuPercent))),
        upstreamCpuPercent: medianOf(definedOnly(mine.map((w) => w.upstreamCpuPercent))),
        clientConnects: mine.reduce((n, w) => n + w.clientConnects, 0),
        upstreamConnects: mine.reduce((n, w) => n + w.upstreamConnects, 0),
      });
    }
  }
  return withRatios(rows, (r) => String(r.concurrency), (r) => r.requestsPerSecond);
}

export function rateTable(rows: readonly RateRow[]): string {
  return table(
    ["target", "conc.", "req/s", "req/s range", "p50 ms", "p99 ms", "peak RSS MiB", "proxy CPU %", "proxy CPU µs/req", "× direct", "× tcp-relay", "× best peer", "errors", "new conns (client / upstream)"],
    ["l", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r", "l", "r", "r"],
    rows.map((r) => [
      r.target,
      String(r.concurrency),
      fixed(r.requestsPerSecond, 0),
      `${fixed(r.requestsPerSecondMin, 0)}–${fixed(r.requestsPerSecondMax, 0)}`,
      fixed(r.p50Ms, 2),
      fixed(r.p99Ms, 2),
      fixed(r.proxyPeakRssMiB, 0),
      fixed(r.proxyCpuPercent, 0),
      fixed(r.proxyCpuMicrosPerRequest, 0),
      times(r.ratioToDirect),
      times(r.ratioToTcpRelay),
      bestPeerCell(r),
      String(r.errors),
      `${r.clientConnects} / ${r.upstreamConnects}`,
    ]),
  );
}

// ---------------------------------------------------------------------------------------------
// new hostnames

export interface HostsRow extends Ratios {
  readonly target: TargetName;
  readonly asked: number;
  readonly hostnames: number;
  readonly errors: number;
  /** New hostnames per second of request time, one at a time. */
  readonly hostsPerSecond: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** A new connection to an already-seen hostname, over a fresh dispatcher like the others. */
  readonly knownHostP50Ms: number;
  /** p50 new hostname − p50 known hostname: what the new certificate costs. */
  readonly certificateExtraMs: number;
  readonly proxyPeakRssMiB: number | undefined;
  readonly proxyCpuPercent: number | undefined;
  /** Upstream TLS connections in the windows, and how many resumed a session (a proxy's cache at work). */
  readonly upstreamConnects: number;
  readonly upstreamResumed: number;
}

export function hostsRows(targets: readonly TargetName[], windows: readonly HostsWindow[]): HostsRow[] {
  const rows: Omit<HostsRow, keyof Ratios>[] = [];
  for (const target of targets) {
    const mine = windows.filter((w) => w.target === target);
    if (mine.length === 0) continue;
    const latencies = mine.flatMap((w) => w.newHostMs);
    const control = mine.flatMap((w) => w.controlMs);
    const total = latencies.reduce((a, b) => a + b, 0);
    rows.push({
      target,
      asked: mine.reduce((n, w) => n + w.asked, 0),
      hostnames: latencies.length,
      errors: mine.reduce((n, w) => n + w.errors, 0),
      hostsPerSecond: total > 0 ? latencies.length / (total / 1000) : Number.NaN,
      p50Ms: percentile(latencies, 50),
      p99Ms: percentile(latencies, 99),
      knownHostP50Ms: percentile(control, 50),
      certificateExtraMs: percentile(latencies, 50) - percentile(control, 50),
      proxyPeakRssMiB: mib(maxOf(definedOnly(mine.map((w) => w.peakRssKb)))),
      proxyCpuPercent: medianOf(definedOnly(mine.map((w) => w.proxyCpuPercent))),
      upstreamConnects: mine.reduce((n, w) => n + w.upstreamConnects, 0),
      upstreamResumed: mine.reduce((n, w) => n + w.upstreamResumed, 0),
    });
  }
  return withRatios(rows, () => "", (r) => r.hostsPerSecond);
}

export function hostsTable(rows: readonly HostsRow[]): string {
  return table(
    ["target", "new hostnames done", "hostnames/s", "p50 ms", "p99 ms", "known-host new-conn p50 ms", "certificate extra ms (p50)", "peak RSS MiB", "proxy CPU %", "× direct", "× best peer", "upstream conns (resumed)", "errors"],
    ["l", "r", "r", "r", "r", "r", "r", "r", "r", "r", "l", "r", "r"],
    rows.map((r) => [
      r.target,
      `${r.hostnames} / ${r.asked}`,
      fixed(r.hostsPerSecond, 0),
      fixed(r.p50Ms, 2),
      fixed(r.p99Ms, 2),
      fixed(r.knownHostP50Ms, 2),
      fixed(r.certificateExtraMs, 2),
      fixed(r.proxyPeakRssMiB, 0),
      fixed(r.proxyCpuPercent, 0),
      times(r.ratioToDirect),
      bestPeerCell(r),
      `${r.upstreamConnects} (${r.upstreamResumed})`,
      String(r.errors),
    ]),
  );
}

// ---------------------------------------------------------------------------------------------
// bulk transfers

export interface BulkRow extends Ratios {
  readonly target: TargetName;
  readonly direction: "download" | "upload";
  readonly transfers: number;
  readonly errors: number;
  /** Median of the transfers' rates, in MB/s (10^6 bytes). */
  readonly mbPerSecond: number;
  readonly mbPerSecondMin: number;
  readonly mbPerSecondMax: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly proxyPeakRssMiB: number | undefined;
  readonly proxyCpuPercent: number | undefined;
}

export function bulkRows(targets: readonly TargetName[], windows: readonly BulkWindow[]): BulkRow[] {
  const rows: Omit<BulkRow, keyof Ratios>[] = [];
  for (const direction of ["download", "upload"] as const) {
    for (const target of targets) {
      const mine = windows.filter((w) => w.target === target && w.direction === direction);
      if (mine.length === 0) continue;
      const transfers = mine.flatMap((w) => w.transfers);
      const rates = transfers.map((t) => t.bytes / t.ms / 1000);
      const ms = transfers.map((t) => t.ms);
      rows.push({
        target,
        direction,
        transfers: transfers.length,
        errors: mine.reduce((n, w) => n + w.errors, 0),
        mbPerSecond: median(rates),
        mbPerSecondMin: rates.length > 0 ? Math.min(...rates) : Number.NaN,
        mbPerSecondMax: rates.length > 0 ? Math.max(...rates) : Number.NaN,
        p50Ms: percentile(ms, 50),
        p99Ms: percentile(ms, 99),
        proxyPeakRssMiB: mib(maxOf(definedOnly(mine.map((w) => w.peakRssKb)))),
        proxyCpuPercent: medianOf(definedOnly(mine.map((w) => w.proxyCpuPercent))),
      });
    }
  }
  return withRatios(rows, (r) => r.direction, (r) => r.mbPerSecond);
}

export function bulkTable(rows: readonly BulkRow[]): string {
  return table(
    ["target", "direction", "MB/s", "MB/s range", "p50 ms", "p99 ms", "peak RSS MiB", "proxy CPU %", "× direct", "× tcp-relay", "× best peer", "transfers", "errors"],
    ["l", "l", "r", "r", "r", "r", "r", "r", "r", "r", "l", "r", "r"],
    rows.map((r) => [
      r.target,
      r.direction,
      fixed(r.mbPerSecond, 0),
      `${fixed(r.mbPerSecondMin, 0)}–${fixed(r.mbPerSecondMax, 0)}`,
      fixed(r.p50Ms, 0),
      fixed(r.p99Ms, 0),
      fixed(r.proxyPeakRssMiB, 0),
      fixed(r.proxyCpuPercent, 0),
      times(r.ratioToDirect),
      times(r.ratioToTcpRelay),
      bestPeerCell(r),
      String(r.transfers),
      String(r.errors),
    ]),
  );
}

// ---------------------------------------------------------------------------------------------
// 1 GiB download

export interface BigRow {
  readonly target: "egressgate" | "egressgate + onResponse-only tier-2 policy";
  readonly mib: number;
  readonly mbPerSecond: number | undefined;
  readonly idleRssMiB: number | undefined;
  readonly peakRssMiB: number | undefined;
  readonly growthMiB: number | undefined;
  readonly afterRssMiB: number | undefined;
  readonly proxyCpuPercent: number | undefined;
  readonly errors: number;
  readonly failure: string | undefined;
}

export function bigRow(result: BigResult): BigRow {
  const idle = mib(result.idleRssKb);
  const peak = mib(result.peakRssKb);
  return {
    target: result.withPolicy ? "egressgate + onResponse-only tier-2 policy" : "egressgate",
    mib: result.bytes / 2 ** 20,
    mbPerSecond: result.ms === undefined ? undefined : result.bytes / result.ms / 1000,
    idleRssMiB: idle,
    peakRssMiB: peak,
    growthMiB: idle === undefined || peak === undefined ? undefined : peak - idle,
    afterRssMiB: mib(result.endRssKb),
    proxyCpuPercent: result.proxyCpuPercent,
    errors: result.errors,
    failure: result.failure,
  };
}

export function bigTable(rows: readonly BigRow[]): string {
  return table(
    ["target", "download", "MB/s", "idle RSS MiB", "peak RSS MiB", "RSS growth MiB (goal < 64)", "RSS after MiB", "proxy CPU %", "errors"],
    ["l", "r", "r", "r", "r", "r", "r", "r", "r"],
    rows.map((row) => [
        `${row.target} (fresh process)`,
        `${fixed(row.mib, 0)} MiB`,
        fixed(row.mbPerSecond, 0),
        fixed(row.idleRssMiB, 0),
        fixed(row.peakRssMiB, 0),
        fixed(row.growthMiB, 1),
        fixed(row.afterRssMiB, 0),
        fixed(row.proxyCpuPercent, 0),
        String(row.errors),
      ]),
  );
}

// ---------------------------------------------------------------------------------------------
// hooks: egressgate+hooks (tier 3), egressgate+djs and egressgate+djs-allowlist (tier 2) against egressgate-api

/** A hooked target against egressgate-api at one concurrency: the cost of its hooks. */
export interface HooksComparison {
  readonly target: string;
  readonly concurrency: number;
  /** hooks ÷ no hooks, req/s medians. */
  readonly requestsPerSecondRatio: number;
  readonly p50Ms: { readonly noHooks: number; readonly hooks: number; readonly ratio: number };
  readonly p99Ms: { readonly noHooks: number; readonly hooks: number; readonly ratio: number };
  readonly proxyCpuMicrosPerRequest: { readonly noHooks: number; readonly hooks: number; readonly ratio: number; readonly added: number } | undefined;
  /** The same for the event-loop thread alone: what the hooks cost the thread that serves every connection. */
  readonly proxyMainThreadMicrosPerRequest: { readonly noHooks: number; readonly hooks: number; readonly ratio: number; readonly added: number } | undefined;
  readonly proxyPeakRssMiB: { readonly noHooks: number; readonly hooks: number } | undefined;
}

export function compareHooks(
  rows: readonly RateRow[],
  targets: readonly string[] = ["egressgate+hooks", "egressgate+djs", "egressgate+djs-allowlist"],
  /** What each target is compared with: the same script without hooks, or (for metrics) the CLI without metrics. */
  baseTarget = "egressgate-api",
): HooksComparison[] {
  const out: HooksComparison[] = [];
  for (const target of targets)
  for (const concurrency of new Set(rows.map((r) => r.concurrency))) {
    const base = rows.find((r) => r.target === baseTarget && r.concurrency === concurrency);
    const hooked = rows.find((r) => r.target === target && r.concurrency === concurrency);
    if (base === undefined || hooked === undefined) continue;
    const pair = (a: number, b: number): { noHooks: number; hooks: number; ratio: number } => ({ noHooks: a, hooks: b, ratio: b / a });
    const [cpuA, cpuB] = [base.proxyCpuMicrosPerRequest, hooked.proxyCpuMicrosPerRequest];
    const [mainA, mainB] = [base.proxyMainThreadMicrosPerRequest, hooked.proxyMainThreadMicrosPerRequest];
    const [rssA, rssB] = [base.proxyPeakRssMiB, hooked.proxyPeakRssMiB];
    out.push({
      target,
      concurrency,
      requestsPerSecondRatio: hooked.requestsPerSecond / base.requestsPerSecond,
      p50Ms: pair(base.p50Ms, hooked.p50Ms),
      p99Ms: pair(base.p99Ms, hooked.p99Ms),
      proxyCpuMicrosPerRequest: cpuA === undefined || cpuB === undefined ? undefined : { ...pair(cpuA, cpuB), added: cpuB - cpuA },
      proxyMainThreadMicrosPerRequest: mainA === undefined || mainB === undefined ? undefined : { ...pair(mainA, mainB), added: mainB - mainA },
      proxyPeakRssMiB: rssA === undefined || rssB === undefined ? undefined : { noHooks: rssA, hooks: rssB },
    });
  }
  return out;
}

/** The side-by-side scenario, per compared target: each window's ratios to the base, paired. */
export interface SideRow {
  readonly target: string;
  readonly base: string;
  readonly concurrency: number;
  readonly baseRequestsPerSecond: number;
  readonly targetRequestsPerSecond: number;
  /** target ÷ base, per window. */
  readonly requestsPerSecondRatio: MedianInterval;
  readonly cpuPerRequestRatio: MedianInterval | undefined;
  readonly baseCpuMicrosPerRequest: number | undefined;
  readonly targetCpuMicrosPerRequest: number | undefined;
  readonly errors: number;
}

export function sideRows(windows: readonly SideWindow[]): SideRow[] {
  const rows: SideRow[] = [];
  for (const target of new Set(windows.map((w) => w.target))) {
    const mine = windows.filter((w) => w.target === target);
    const cpu = mine.filter((w) => w.baseCpuMicrosPerRequest !== undefined && w.targetCpuMicrosPerRequest !== undefined);
    rows.push({
      target,
      base: mine[0]!.base,
      concurrency: mine[0]!.concurrency,
      baseRequestsPerSecond: median(mine.map((w) => w.baseRequestsPerSecond)),
      targetRequestsPerSecond: median(mine.map((w) => w.targetRequestsPerSecond)),
      requestsPerSecondRatio: medianInterval(mine.map((w) => w.targetRequestsPerSecond / w.baseRequestsPerSecond)),
      cpuPerRequestRatio: cpu.length > 0 ? medianInterval(cpu.map((w) => w.targetCpuMicrosPerRequest! / w.baseCpuMicrosPerRequest!)) : undefined,
      baseCpuMicrosPerRequest: medianOf(definedOnly(mine.map((w) => w.baseCpuMicrosPerRequest))),
      targetCpuMicrosPerRequest: medianOf(definedOnly(mine.map((w) => w.targetCpuMicrosPerRequest))),
      errors: mine.reduce((n, w) => n + w.errors, 0),
    });
  }
  return rows;
}

export function sideTable(rows: readonly SideRow[]): string {
  return table(
    ["target ÷ base", "conc. each", "req/s (median window)", "req/s ratio, median of windows (95% interval)", "proxy CPU µs/req", "CPU per request ratio (95% interval)", "errors"],
    ["l", "r", "r", "r", "r", "r", "r"],
    rows.map((r) => [
      `${r.target} ÷ ${r.base}`,
      String(r.concurrency),
      `${fixed(r.baseRequestsPerSecond, 0)} → ${fixed(r.targetRequestsPerSecond, 0)}`,
      intervalText(r.requestsPerSecondRatio),
      `${r.baseCpuMicrosPerRequest === undefined ? "–" : fixed(r.baseCpuMicrosPerRequest, 0)} → ${r.targetCpuMicrosPerRequest === undefined ? "–" : fixed(r.targetCpuMicrosPerRequest, 0)}`,
      r.cpuPerRequestRatio === undefined ? "–" : intervalText(r.cpuPerRequestRatio),
      String(r.errors),
    ]),
  );
}

const hookLabels: Record<string, string> = {
  "egressgate+hooks": "no-op tier-3 pair",
  "egressgate+djs": "no-op tier-2 pair",
  "egressgate+djs-allowlist": "tier-2 header allowlist",
  "egressgate+metrics": "--metrics-listen, scraped every 1 s",
};

export function hooksTable(comparisons: readonly HooksComparison[]): string {
  return table(
    ["hooks", "conc.", "req/s", "p50 ms", "p99 ms", "proxy CPU µs/req", "event-loop thread µs/req", "peak RSS MiB"],
    ["l", "r", "r", "r", "r", "r", "r", "r"],
    comparisons.map((c) => {
      const cpu = c.proxyCpuMicrosPerRequest;
      const main = c.proxyMainThreadMicrosPerRequest;
      return [
        hookLabels[c.target] ?? c.target,
        String(c.concurrency),
        times(c.requestsPerSecondRatio),
        `${fixed(c.p50Ms.noHooks, 2)} → ${fixed(c.p50Ms.hooks, 2)} (${times(c.p50Ms.ratio)})`,
        `${fixed(c.p99Ms.noHooks, 2)} → ${fixed(c.p99Ms.hooks, 2)} (${times(c.p99Ms.ratio)})`,
        cpu === undefined ? "–" : `${fixed(cpu.noHooks, 0)} → ${fixed(cpu.hooks, 0)} (${cpu.added >= 0 ? "+" : ""}${fixed(cpu.added, 0)}, ${times(cpu.ratio)})`,
        main === undefined ? "–" : `${fixed(main.noHooks, 0)} → ${fixed(main.hooks, 0)} (${main.added >= 0 ? "+" : ""}${fixed(main.added, 0)})`,
        c.proxyPeakRssMiB === undefined ? "–" : `${fixed(c.proxyPeakRssMiB.noHooks, 0)} → ${fixed(c.proxyPeakRssMiB.hooks, 0)}`,
      ];
    }),
  );
}

/**
 * DESIGN §8: metrics cost under 3% of small-GET throughput, from the concurrency-32 comparison of
 * egressgate+metrics with egressgate. req/s moves with whatever else takes the cores; the proxy
 * CPU per request is given beside it, and decides when the two disagree on a loaded machine.
 */
export function metricsGoal(comparisons: readonly HooksComparison[], side: readonly SideRow[] = []): Goal | undefined {
  const goal = "Metrics cost under 3% of small-GET throughput (concurrency 32, egressgate+metrics ÷ egressgate)";
  // Side by side (both loaded in the same seconds) when the run has it: the machine's drift falls on both alike.
  const paired = side.find((r) => r.target === "egressgate+metrics" && r.base === "egressgate");
  if (paired !== undefined) {
    const cpu = paired.cpuPerRequestRatio;
    return {
      goal,
      measured: `side by side: ${intervalText(paired.requestsPerSecondRatio)} req/s${cpu === undefined ? "" : `; CPU per request ${intervalText(cpu)}`}`,
      met: paired.requestsPerSecondRatio.median >= 0.97,
    };
  }
  const c = comparisons.find((x) => x.target === "egressgate+metrics" && x.concurrency === 32);
  if (c === undefined) return undefined;
  const cpu = c.proxyCpuMicrosPerRequest;
  const cpuText = cpu === undefined ? "" : `; proxy CPU ${fixed(cpu.noHooks, 0)} → ${fixed(cpu.hooks, 0)} µs/req (${cpu.added >= 0 ? "+" : ""}${fixed(((cpu.hooks - cpu.noHooks) / cpu.noHooks) * 100, 1)}%)`;
  return {
    goal,
    measured: `back to back: ${fixed(c.requestsPerSecondRatio, 3)}× req/s${cpuText}`,
    met: c.requestsPerSecondRatio >= 0.97,
  };
}

// ---------------------------------------------------------------------------------------------
// goals

export interface Goal {
  readonly goal: string;
  readonly measured: string;
  /** undefined when the run did not measure what the goal needs. */
  readonly met: boolean | undefined;
}

export function goals(results: {
  readonly small: readonly RateRow[];
  readonly newconn: readonly RateRow[];
  readonly hosts: readonly HostsRow[];
  readonly bulk: readonly BulkRow[];
  readonly big: BigRow | undefined;
  /** Why egressgate dropped out of the run, if it did: a goal of a scenario that ran is then missed. */
  readonly egressgateFailure: string | undefined;
}): Goal[] {
  const out: Goal[] = [];
  const eg = <R extends { readonly target: TargetName }>(rows: readonly R[], match: (r: R) => boolean = () => true): R | undefined => rows.find((r) => r.target === "egressgate" && match(r));
  /** `ran`: the scenario ran, so a missing figure is egressgate's failure rather than not measured. */
  /** `failure`: why egressgate could not be measured here, when it is more specific than its having dropped out. */
  const check = (goal: string, ran: boolean, value: number | undefined, met: (v: number) => boolean, show: (v: number) => string, failure?: string): void => {
    if (value !== undefined && !Number.isNaN(value)) out.push({ goal, measured: show(value), met: met(value) });
    else if (ran && failure !== undefined) out.push({ goal, measured: `egressgate failed: ${failure}`, met: false });
    else if (ran && results.egressgateFailure !== undefined) out.push({ goal, measured: "egressgate dropped out (see above)", met: false });
    else out.push({ goal, measured: "not measured", met: undefined });
  };
  const ran = {
    small: results.small.length > 0,
    newconn: results.newconn.length > 0,
    hosts: results.hosts.length > 0,
    bulk: results.bulk.length > 0,
  };
  const small32 = eg(results.small, (r) => r.concurrency === 32);
  check("small GETs c=32: ≥ 1.5× the best peer", ran.small, small32?.ratioToBestPeer, (v) => v >= 1.5, (v) => `${times(v)} ${small32?.bestPeer ?? ""}`.trim());
  check("small GETs c=32: ≥ 0.5× tcp-relay", ran.small, small32?.ratioToTcpRelay, (v) => v >= 0.5, times);
  const beats: [string, boolean, Ratios | undefined][] = [
    ...[1, 32].map((c): [string, boolean, Ratios | undefined] => [`small GETs c=${c}`, ran.small, eg(results.small, (r) => r.concurrency === c)]),
    ...[...new Set([...results.newconn.map((r) => r.concurrency), 8])].map((c): [string, boolean, Ratios | undefined] => [`new connection per request c=${c}`, ran.newconn, eg(results.newconn, (r) => r.concurrency === c)]),
    ["new hostnames", ran.hosts, eg(results.hosts)],
    ...(["upload", "download"] as const).map((d): [string, boolean, Ratios | undefined] => [`32 MiB ${d}`, ran.bulk, eg(results.bulk, (r) => r.direction === d)]),
  ];
  for (const [label, didRun, r] of beats) {
    check(`${label}: beats every peer (> 1× the best)`, didRun, r?.ratioToBestPeer, (v) => v > 1, (v) => `${times(v)} ${r?.bestPeer ?? ""}`.trim());
  }
  for (const direction of ["upload", "download"] as const) {
    check(`32 MiB ${direction}: ≥ 0.5× direct`, ran.bulk, eg(results.bulk, (r) => r.direction === direction)?.ratioToDirect, (v) => v >= 0.5, times);
  }
  const big = results.big;
  check("1 GiB download: RSS growth < 64 MiB", big !== undefined, big !== undefined && big.errors === 0 ? big.growthMiB : undefined, (v) => v < 64, (v) => `${v.toFixed(1)} MiB`, big?.failure);
  const hostsEg = eg(results.hosts);
  const hostsHmp = results.hosts.find((r) => r.target === "http-mitm-proxy");
  check("new hostname: certificate costs < 2 ms extra", ran.hosts, hostsEg?.certificateExtraMs, (v) => v < 2, (v) => `${v.toFixed(2)} ms`);
  const certRatio = hostsEg !== undefined && hostsHmp !== undefined ? hostsHmp.certificateExtraMs / Math.max(hostsEg.certificateExtraMs, 0.01) : undefined;
  check(
    "new hostname: certificate ≥ 20× faster than http-mitm-proxy's per-host key generation",
    ran.hosts,
    certRatio,
    (v) => v >= 20,
    (v) => `${v.toFixed(0)}× (${fixed(hostsHmp?.certificateExtraMs, 1)} ms against ${fixed(hostsEg?.certificateExtraMs, 2)} ms)`,
  );
  return out;
}

export function goalsTable(list: readonly Goal[]): string {
  return table(
    ["goal", "measured", "met"],
    ["l", "l", "l"],
    list.map((g) => [g.goal, g.measured, g.met === undefined ? "not measured" : g.met ? "yes" : "**no**"]),
  );
}

/** One external decider against no source at all, at one concurrency (DESIGN §8: a local webhook adds under 0.3 ms p50). */
export interface DeciderComparison {
  readonly target: string;
  readonly concurrency: number;
  readonly requestsPerSecond: { readonly none: number; readonly decider: number };
  readonly p50Ms: { readonly none: number; readonly decider: number; readonly added: number };
}

/** Each decider target against `egressgate-api`, the same script with no source, per concurrency. */
export function compareDeciders(rows: readonly RateRow[], targets: readonly string[] = ["egressgate+webhook", "egressgate+command"]): DeciderComparison[] {
  const out: DeciderComparison[] = [];
  for (const target of targets) {
    for (const concurrency of new Set(rows.map((r) => r.concurrency))) {
      const none = rows.find((r) => r.target === "egressgate-api" && r.concurrency === concurrency);
      const decided = rows.find((r) => r.target === target && r.concurrency === concurrency);
      if (none === undefined || decided === undefined) continue;
      out.push({
        target,
        concurrency,
        requestsPerSecond: { none: none.requestsPerSecond, decider: decided.requestsPerSecond },
        p50Ms: { none: none.p50Ms, decider: decided.p50Ms, added: decided.p50Ms - none.p50Ms },
      });
    }
  }
  return out;
}

const deciderLabels: Record<string, string> = {
  "egressgate+webhook": "local webhook (cacheMs off)",
  "egressgate+command": "command (/bin/sh reading stdin)",
};

export function decidersTable(comparisons: readonly DeciderComparison[]): string {
  return table(
    ["source", "conc.", "req/s: none → source", "p50 ms: none → source", "added p50 ms"],
    ["l", "r", "r", "r", "r"],
    comparisons.map((c) => [
      deciderLabels[c.target] ?? c.target,
      String(c.concurrency),
      `${fixed(c.requestsPerSecond.none, 0)} → ${fixed(c.requestsPerSecond.decider, 0)} (${times(c.requestsPerSecond.decider / c.requestsPerSecond.none)})`,
      `${fixed(c.p50Ms.none, 3)} → ${fixed(c.p50Ms.decider, 3)}`,
      `${c.p50Ms.added >= 0 ? "+" : ""}${fixed(c.p50Ms.added, 3)}`,
    ]),
  );
}

/** DESIGN §8's decider goal, from the concurrency-1 comparison: undefined when the webhook did not run. */
export function deciderGoal(comparisons: readonly DeciderComparison[]): Goal | undefined {
  const one = comparisons.find((c) => c.target === "egressgate+webhook" && c.concurrency === 1);
  if (one === undefined) return undefined;
  return { goal: "External deciders: a local webhook adds under 0.3 ms p50 (concurrency 1)", measured: `+${fixed(one.p50Ms.added, 3)} ms`, met: one.p50Ms.added < 0.3 };
}
