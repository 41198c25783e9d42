/**
 * The h2 scenario's windows as rows, ratios and tables (bench/h2-scenario.ts), and its goal:
 * small GETs over HTTP/2 at least 1.2× the HTTP/1.1 figure of the same run (DESIGN.md §8).
 *
 * Each row's `× h1` divides its req/s by the same target's HTTP/1.1 row (32 connections, h1
 * upstream; for the minimal clients' rows, their own HTTP/1.1 row) and `h1 CPU ÷` divides that
 * row's proxy CPU per request by this one's, so both read "how many times better than
 * HTTP/1.1"; the CPU ratio is the steadier one on a shared machine.
 */
import type { LoadSummaryEntry, TargetName } from "./load.js";
import type { H2DownloadResult, H2Variant, H2Window } from "./h2-scenario.js";
import { h1Baseline, h2Variants } from "./h2-scenario.js";
import { fixed, intervalText, median, medianInterval, table, times, type Goal, type MedianInterval } from "./report.js";

export interface H2Row {
  readonly target: TargetName;
  readonly variant: H2Variant;
  readonly label: string;
  readonly concurrency: number;
  readonly requestsPerSecond: number;
  readonly requestsPerSecondMin: number;
  readonly requestsPerSecondMax: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly requests: number;
  readonly errors: number;
  readonly firstError: string | undefined;
  readonly proxyPeakRssMiB: number | undefined;
  readonly proxyCpuPercent: number | undefined;
  readonly proxyCpuMicrosPerRequest: number | undefined;
  /** The load generator's process (undefined for h2load, whose client and relays are not it). */
  readonly loadCpuMicrosPerRequest: number | undefined;
  /** The machine's busy CPU over the row's windows, median: near 100 × cores, the row was CPU-bound. */
  readonly machineCpuPercent: number | undefined;
  readonly clientConnects: number;
  readonly upstreamConnects: number;
  /** req/s ÷ the same target's HTTP/1.1 row (32 connections, h1 upstream) driven by the same kind of client (h1Baseline). */
  readonly ratioToH1: number | undefined;
  /** That row's proxy CPU per request ÷ this row's. */
  readonly cpuRatioToH1: number | undefined;
  /** req/s ÷ the HTTP/1.1 row's window of the same round, per round: the machine's drift cancels within a round. */
  readonly pairedRatioToH1: MedianInterval | undefined;
  /** req/s ÷ mitmdump's row of the same variant. */
  readonly ratioToMitmdump: number | undefined;
}

const defined = (values: readonly (number | undefined)[]): number[] => values.filter((v): v is number => v !== undefined && Number.isFinite(v));
/** CPU µs a request, from a process's CPU % over a window and the window's req/s. */
const microsPerRequest = (percent: number | undefined, requestsPerSecond: number): number | undefined =>
  percent === undefined || requestsPerSecond === 0 ? undefined : (percent / 100 / requestsPerSecond) * 1e6;
const medianOf = (values: readonly number[]): number | undefined => (values.length > 0 ? median(values) : undefined);

export function h2Rows(all: readonly H2Window[], summary: readonly LoadSummaryEntry[]): H2Row[] {
  const windows = all.filter((w) => w.pacedRate === undefined);
  const keys = [...new Map(windows.map((w) => [`${w.target}/${w.variant}`, { target: w.target, variant: w.variant }])).values()];
  const base = keys.map(({ target, variant }) => {
    const mine = windows.filter((w) => w.target === target && w.variant === variant);
    const rps = mine.map((w) => w.requestsPerSecond);
    const hist = summary.find((s) => s.lane === `h2/${target}/${variant}`);
    const perRequest = (percent: (w: H2Window) => number | undefined): number[] =>
      defined(mine.map((w) => microsPerRequest(percent(w), w.requestsPerSecond)));
    const cpuPerRequest = perRequest((w) => w.proxyCpuPercent);
    return {
      target,
      variant,
      label: h2Variants[variant].label,
      concurrency: mine[0]?.concurrency ?? 0,
      requestsPerSecond: median(rps),
      requestsPerSecondMin: Math.min(...rps),
      requestsPerSecondMax: Math.max(...rps),
      p50Ms: hist?.p50Ms ?? Number.NaN,
      p99Ms: hist?.p99Ms ?? Number.NaN,
      // h2load lanes keep no histogram in the load generator: their windows' counts.
      requests: hist?.count ?? mine.reduce((n, w) => n + w.ok, 0),
      errors: mine.reduce((n, w) => n + w.errors, 0),
      firstError: mine.find((w) => w.firstError !== undefined)?.firstError,
      proxyPeakRssMiB: ((): number | undefined => {
        const peaks = defined(mine.map((w) => w.peakRssKb));
        return peaks.length > 0 ? Math.max(...peaks) / 1024 : undefined;
      })(),
      proxyCpuPercent: medianOf(defined(mine.map((w) => w.proxyCpuPercent))),
      proxyCpuMicrosPerRequest: medianOf(cpuPerRequest),
      loadCpuMicrosPerRequest: h2Variants[variant].client === "h2load" ? undefined : medianOf(perRequest((w) => w.loadCpuPercent)),
      machineCpuPercent: medianOf(defined(mine.map((w) => w.machineCpuPercent))),
      clientConnects: mine.reduce((n, w) => n + w.clientConnects, 0),
      upstreamConnects: mine.reduce((n, w) => n + w.upstreamConnects, 0),
    };
  });
  return base.map((row) => {
    const baseline = h1Baseline(row.variant);
    const h1 = base.find((r) => r.target === row.target && r.variant === baseline);
    const mitm = base.find((r) => r.target === "mitmdump" && r.variant === row.variant);
    const ratio = (a: number | undefined, b: number | undefined): number | undefined => (a === undefined || b === undefined || !(b > 0) ? undefined : a / b);
    const paired = windows
      .filter((w) => w.target === row.target && w.variant === row.variant)
      .map((w) => ratio(w.requestsPerSecond, windows.find((x) => x.target === row.target && x.variant === baseline && x.round === w.round)?.requestsPerSecond))
      .filter((r): r is number => r !== undefined);
    return {
      ...row,
      pairedRatioToH1: row.variant === baseline || paired.length === 0 ? undefined : medianInterval(paired),
      ratioToH1: ratio(row.requestsPerSecond, h1?.requestsPerSecond),
      cpuRatioToH1: ratio(h1?.proxyCpuMicrosPerRequest, row.proxyCpuMicrosPerRequest),
      ratioToMitmdump: row.target === "mitmdump" ? undefined : ratio(row.requestsPerSecond, mitm?.requestsPerSecond),
    };
  });
}

export function h2Table(rows: readonly H2Row[]): string {
  return table(
    ["target", "guest -> upstream", "req/s", "req/s range", "p50 ms", "p99 ms", "peak RSS MiB", "proxy CPU %", "proxy CPU µs/req", "load gen CPU µs/req", "machine CPU %", "× h1 (req/s)", "h1 CPU ÷ this", "× mitmdump", "errors", "new conns (client / upstream)"],
    ["l", "l", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r", "r"],
    rows.map((r) => [
      r.target,
      r.label,
      fixed(r.requestsPerSecond, 0),
      `${fixed(r.requestsPerSecondMin, 0)}–${fixed(r.requestsPerSecondMax, 0)}`,
      fixed(r.p50Ms, 2),
      fixed(r.p99Ms, 2),
      fixed(r.proxyPeakRssMiB, 0),
      fixed(r.proxyCpuPercent, 0),
      fixed(r.proxyCpuMicrosPerRequest, 0),
      fixed(r.loadCpuMicrosPerRequest, 0),
      fixed(r.machineCpuPercent, 0),
      r.variant === "h1-32-h1up" ? "1.00×" : times(r.ratioToH1),
      r.variant === "h1-32-h1up" ? "1.00×" : times(r.cpuRatioToH1),
      times(r.ratioToMitmdump),
      String(r.errors),
      `${r.clientConnects} / ${r.upstreamConnects}`,
    ]),
  );
}

/**
 * egressgate's rows at a fixed, moderate offered load: proxy CPU per request at equal throughput,
 * with about one request in flight, so streams share no wake-ups, TLS records or frame batches:
 * what one HTTP/2 stream costs against one HTTP/1.1 request, without multiplexing's savings.
 */
export interface H2PacedRow {
  readonly variant: H2Variant;
  readonly label: string;
  readonly offeredPerSecond: number;
  readonly requestsPerSecond: number;
  readonly requestsPerSecondMin: number;
  readonly proxyCpuMicrosPerRequest: number | undefined;
  readonly cpuByRound: readonly (number | undefined)[];
  /** The HTTP/1.1 row's CPU per request ÷ this row's. */
  readonly cpuRatioToH1: number | undefined;
  readonly errors: number;
}

export function h2PacedRows(all: readonly H2Window[]): H2PacedRow[] {
  const paced = all.filter((w) => w.pacedRate !== undefined && w.target === "egressgate");
  const perRequest = (w: H2Window): number | undefined => microsPerRequest(w.proxyCpuPercent, w.requestsPerSecond);
  const rows = [...new Set(paced.map((w) => w.variant))].map((variant) => {
    const mine = paced.filter((w) => w.variant === variant).sort((a, b) => a.round - b.round);
    const rps = mine.map((w) => w.requestsPerSecond);
    return {
      variant,
      label: h2Variants[variant].label,
      offeredPerSecond: mine[0]?.pacedRate ?? 0,
      requestsPerSecond: median(rps),
      requestsPerSecondMin: Math.min(...rps),
      proxyCpuMicrosPerRequest: medianOf(defined(mine.map(perRequest))),
      cpuByRound: mine.map(perRequest),
      errors: mine.reduce((n, w) => n + w.errors, 0),
    };
  });
  const h1 = rows.find((r) => r.variant === "h1-32-h1up")?.proxyCpuMicrosPerRequest;
  return rows.map((r) => ({ ...r, cpuRatioToH1: h1 === undefined || r.proxyCpuMicrosPerRequest === undefined ? undefined : h1 / r.proxyCpuMicrosPerRequest }));
}

export function h2PacedTable(rows: readonly H2PacedRow[]): string {
  return table(
    ["egressgate, guest -> upstream", "offered req/s", "req/s (median, min)", "proxy CPU µs/req", "µs/req by round", "h1 CPU ÷ this", "errors"],
    ["l", "r", "r", "r", "l", "r", "r"],
    rows.map((r) => [
      r.label,
      String(r.offeredPerSecond),
      `${fixed(r.requestsPerSecond, 0)}, ${fixed(r.requestsPerSecondMin, 0)}`,
      fixed(r.proxyCpuMicrosPerRequest, 0),
      r.cpuByRound.map((v) => fixed(v, 0)).join(", "),
      r.variant === "h1-32-h1up" ? "1.00×" : times(r.cpuRatioToH1),
      String(r.errors),
    ]),
  );
}

export interface H2DownloadRow {
  readonly upstream: "h1" | "h2";
  readonly mib: number;
  readonly mbPerSecond: number | undefined;
  readonly rssBeforeMiB: number | undefined;
  readonly peakRssMiB: number | undefined;
  /** Peak RSS during the download minus RSS before it. */
  readonly growthMiB: number | undefined;
  readonly rssAfterMiB: number | undefined;
  readonly proxyCpuPercent: number | undefined;
  readonly errors: number;
  readonly failure: string | undefined;
}

export function h2DownloadRows(results: readonly H2DownloadResult[]): H2DownloadRow[] {
  const mib = (kb: number | undefined): number | undefined => (kb === undefined ? undefined : kb / 1024);
  return results.map((r) => {
    const before = mib(r.idleRssKb);
    const peak = mib(r.peakRssKb);
    return {
      upstream: r.upstream,
      mib: r.bytes / 2 ** 20,
      mbPerSecond: r.ms === undefined || r.errors > 0 ? undefined : r.bytes / 1e6 / (r.ms / 1000),
      rssBeforeMiB: before,
      peakRssMiB: peak,
      growthMiB: before === undefined || peak === undefined ? undefined : peak - before,
      rssAfterMiB: mib(r.endRssKb),
      proxyCpuPercent: r.proxyCpuPercent,
      errors: r.errors,
      failure: r.failure,
    };
  });
}

export function h2DownloadTable(rows: readonly H2DownloadRow[]): string {
  return table(
    ["download on one h2 stream", "size", "MB/s", "RSS before MiB", "peak RSS MiB", "RSS growth MiB (goal < 64)", "RSS after MiB", "proxy CPU %", "errors"],
    ["l", "r", "r", "r", "r", "r", "r", "r", "r"],
    rows.map((r) => [
      `egressgate (fresh process), ${r.upstream === "h1" ? "HTTP/1.1" : "h2-only"} upstream`,
      `${fixed(r.mib, 0)} MiB`,
      fixed(r.mbPerSecond, 0),
      fixed(r.rssBeforeMiB, 0),
      fixed(r.peakRssMiB, 0),
      fixed(r.growthMiB, 1),
      fixed(r.rssAfterMiB, 0),
      fixed(r.proxyCpuPercent, 0),
      r.failure === undefined ? String(r.errors) : `${r.errors} (${r.failure})`,
    ]),
  );
}

const clientNote = {
  library: "",
  raw: " from the minimal clients (against their HTTP/1.1 row)",
  h2load: " from h2load via socat (against its HTTP/1.1 row, through the same relay)",
} as const;

/** DESIGN.md §8: small GETs over h2 at least 1.2× the h1 figure in the same run; and flat memory on a 1 GiB h2 download. */
export function h2Goals(rows: readonly H2Row[], downloads: readonly H2DownloadRow[]): Goal[] {
  const goals: Goal[] = [];
  // The h2-only upstream rows too (HTTP/2 on both sides, what a guest gets from most public
  // upstreams), against the same HTTP/1.1 row as the others: HTTP/1.1 on both sides.
  for (const variant of ["h2-1-h1up", "h2-8-h1up", "raw-h2-1-h1up", "raw-h2-8-h1up", "raw-h2-1-h2up", "raw-h2-8-h2up", "h2load-1-h1up", "h2load-8-h1up"] as const) {
    const row = rows.find((r) => r.target === "egressgate" && r.variant === variant);
    if (row === undefined) continue;
    const cpu = row.cpuRatioToH1 === undefined ? "" : `; CPU per request ${times(row.cpuRatioToH1)} less`;
    const paired = row.pairedRatioToH1 === undefined ? "" : `; per round ${intervalText(row.pairedRatioToH1, 2)}`;
    const info = h2Variants[variant];
    // Where the row's baseline is not undici's HTTP/1.1 row, that reading too; and what the
    // machine and the load generator spent, which says whether the row measured the proxy.
    const undiciH1 = rows.find((r) => r.target === "egressgate" && r.variant === "h1-32-h1up");
    const againstUndici = info.client === "h2load" && undiciH1 !== undefined ? `; ${times(row.requestsPerSecond / undiciH1.requestsPerSecond)} undici's HTTP/1.1 row` : "";
    const machine = row.machineCpuPercent === undefined ? "" : `; machine ${fixed(row.machineCpuPercent, 0)}% busy, proxy ${fixed(row.proxyCpuPercent, 0)}%`;
    goals.push({
      goal: `HTTP/2 small GETs c=32 over ${info.connections === 1 ? "one connection" : "8 connections"}${info.upstream === "h2" ? " to the h2-only upstream" : ""}${clientNote[info.client ?? "library"]}: ≥ 1.2× the h1 figure (same run)`,
      measured: `${times(row.ratioToH1)} (${fixed(row.requestsPerSecond, 0)} against ${fixed(row.requestsPerSecond / (row.ratioToH1 ?? Number.NaN), 0)} req/s${cpu}${paired}${againstUndici}${machine})`,
      met: row.ratioToH1 === undefined ? undefined : row.ratioToH1 >= 1.2,
    });
  }
  for (const d of downloads) {
    goals.push({
      goal: `${d.mib >= 1024 ? `${fixed(d.mib / 1024, 0)} GiB` : `${fixed(d.mib, 0)} MiB`} download on one h2 stream (${d.upstream === "h1" ? "HTTP/1.1" : "h2-only"} upstream): RSS growth < 64 MiB`,
      measured: d.errors > 0 ? `failed: ${d.failure ?? "error"}` : `${fixed(d.growthMiB, 1)} MiB`,
      met: d.errors > 0 || d.growthMiB === undefined ? (d.errors > 0 ? false : undefined) : d.growthMiB < 64,
    });
  }
  return goals;
}
