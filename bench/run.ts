/**
 * Small HTTPS GETs with keep-alive, side by side in one run: `direct` (the client talks TLS to
 * the upstream), `tcp-relay` (a plain CONNECT relay, the cost of any hop), `egressgate` (the
 * built CLI), and two proxies started through the embedding API by bench/hooked-proxy.ts with the
 * CLI's settings: `egressgate-api` (no hooks) and `egressgate+hooks` (a no-op onRequest/onResponse
 * pair), whose difference is the cost of tier-3 hooks. Targets take turns in interleaved rounds,
 * so drift and the machine's other work hit them alike. Upstream, relay, each proxy and the load
 * generator run in their own processes.
 *
 *   npm run build && npm run bench               (about 4.5 minutes)
 *   npm run bench -- --quick                     (about a minute; no `direct`)
 *   npm run bench -- --quick --cpu-prof          (also profiles the egressgate child)
 *
 * Prints a markdown table and writes bench/results/<YYYY-MM-DD>.json. docs/performance.md
 * records a run and reads it against DESIGN.md §8.
 */
import { fork, spawn, type ChildProcess } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { cpus, loadavg, release, tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";
import { createCaCertificate, importKeyPair, LeafSigner, parseCertificate } from "../src/tls/x509.js";
import type { LoadReply, LoadResult, LoadSetup, LoadSummaryEntry, TargetName } from "./load.js";
import type { RelayMessage, RelaySetup } from "./tcp-relay.js";
import type { UpstreamMessage, UpstreamSetup, UpstreamStats } from "./upstream.js";

type ProxyTarget = "egressgate" | "egressgate-api" | "egressgate+hooks";

interface BenchSettings {
  readonly mode: "quick" | "full";
  readonly targets: readonly TargetName[];
  readonly rounds: number;
  readonly concurrencies: readonly number[];
  /** Once per target and concurrency before round 1: JIT, TLS sessions, leaf certificate. */
  readonly initialWarmupMs: number;
  /** Before every measured window, unrecorded: re-opens connections a target closed while idle. */
  readonly warmupMs: number;
  readonly measureMs: number;
  /** The egressgate child run under `node --cpu-prof`, if any. */
  readonly cpuProf: ProxyTarget | undefined;
}

const allTargets: readonly TargetName[] = ["direct", "tcp-relay", "egressgate", "egressgate-api", "egressgate+hooks"];
const proxyTargets: readonly ProxyTarget[] = ["egressgate", "egressgate-api", "egressgate+hooks"];
/** Quick mode leaves out `direct`, the load generator's own ceiling, to stay near a minute. */
const quickTargets: readonly TargetName[] = allTargets.filter((t) => t !== "direct");
const bodyBytes = 100;
const keepAliveMs = 120_000;
const root = fileURLToPath(new URL("..", import.meta.url));
const cliPath = join(root, "dist", "cli", "bin.js");
const hookedProxyPath = fileURLToPath(new URL("./hooked-proxy.ts", import.meta.url));
const usage = `usage: npm run bench -- [--quick] [--rounds N] [--seconds S] [--targets LIST] [--cpu-prof[=TARGET]]
  --quick          2 rounds of 2 s windows without direct (about a minute);
                   default is 5 rounds of 4 s over all targets (about 4.5 minutes)
  --rounds N       interleaved rounds, 1..20
  --seconds S      measured seconds per window, 0.5..30
  --targets LIST   comma-separated, from ${allTargets.join(", ")}
  --cpu-prof       run the egressgate child under node --cpu-prof and print its top self-time functions;
                   --cpu-prof=egressgate+hooks (or egressgate-api) profiles that child instead`;

function parseTargets(list: string | undefined): TargetName[] {
  const names = (list ?? "").split(",").filter((name) => name !== "");
  for (const name of names) {
    if (!(allTargets as readonly string[]).includes(name)) throw new RangeError(`--targets: unknown target ${JSON.stringify(name)}\n${usage}`);
  }
  // Kept in the canonical order, whatever order they were named in.
  const chosen = allTargets.filter((t) => names.includes(t));
  if (chosen.length === 0) throw new RangeError(`--targets: expected at least one of ${allTargets.join(", ")}`);
  return chosen;
}

function parseArgs(argv: readonly string[]): BenchSettings {
  const quick = argv.includes("--quick");
  let rounds = quick ? 2 : 5;
  let measureMs = quick ? 2_000 : 4_000;
  let cpuProf: ProxyTarget | undefined;
  let targets = quick ? quickTargets : allTargets;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = (): number => {
      const n = Number(argv[++i]);
      if (argv[i] === undefined || !Number.isFinite(n)) throw new RangeError(`${arg}: expected a number, got ${JSON.stringify(argv[i])}\n${usage}`);
      return n;
    };
    if (arg === "--quick") continue;
    else if (arg === "--cpu-prof") cpuProf = "egressgate";
    else if (arg?.startsWith("--cpu-prof=") === true) {
      const name = arg.slice("--cpu-prof=".length);
      if (!(proxyTargets as readonly string[]).includes(name)) throw new RangeError(`--cpu-prof: expected one of ${proxyTargets.join(", ")}, got ${JSON.stringify(name)}`);
      cpuProf = name as ProxyTarget;
    } else if (arg === "--targets") targets = parseTargets(argv[++i]);
    else if (arg?.startsWith("--targets=") === true) targets = parseTargets(arg.slice("--targets=".length));
    else if (arg === "--rounds") rounds = value();
    else if (arg === "--seconds") measureMs = value() * 1000;
    else if (arg === "--help" || arg === "-h") {
      process.stdout.write(`${usage}\n`);
      process.exit(0);
    } else throw new TypeError(`unknown argument ${JSON.stringify(arg)}\n${usage}`);
  }
  if (!Number.isInteger(rounds) || rounds < 1 || rounds > 20) throw new RangeError(`--rounds: expected 1..20, got ${rounds}`);
  if (measureMs < 500 || measureMs > 30_000) throw new RangeError(`--seconds: expected 0.5..30, got ${measureMs / 1000}`);
  if (cpuProf !== undefined && !targets.includes(cpuProf)) targets = allTargets.filter((t) => targets.includes(t) || t === cpuProf);
  return {
    mode: quick ? "quick" : "full",
    targets,
    rounds,
    concurrencies: [1, 32],
    initialWarmupMs: quick ? 1_000 : 2_000,
    warmupMs: quick ? 400 : 750,
    measureMs,
    cpuProf,
  };
}

// ---------------------------------------------------------------------------------------------
// Child processes: every one is tracked, and every way out of this process ends them.

const children = new Map<ChildProcess, string>();
let workDir: string | undefined;
let stopping = false;

function track(child: ChildProcess, name: string): ChildProcess {
  children.set(child, name);
  child.once("exit", () => children.delete(child));
  child.on("error", (error) => process.stderr.write(`bench: ${name}: ${error.message}\n`));
  return child;
}

function waitExit(child: ChildProcess, ms: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

/** SIGTERM everything still running, SIGKILL what has not gone after 5 s, then remove the temp dir. */
async function cleanup(): Promise<void> {
  stopping = true;
  await Promise.all(
    [...children.keys()].map(async (child) => {
      child.kill("SIGTERM");
      if (!(await waitExit(child, 5_000))) child.kill("SIGKILL");
    }),
  );
  if (workDir !== undefined) rmSync(workDir, { recursive: true, force: true });
  workDir = undefined;
}

process.on("exit", () => {
  for (const child of children.keys()) child.kill("SIGKILL");
  if (workDir !== undefined) rmSync(workDir, { recursive: true, force: true });
});
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    if (stopping) return;
    process.stderr.write(`\nbench: ${signal}, stopping children\n`);
    void cleanup().finally(() => process.exit(130));
  });
}

/** Sends `message` (if any) and waits for the child's next message of `kind`. */
function ask<T extends { kind: string }>(child: ChildProcess, kind: T["kind"], message: object | undefined, ms: number): Promise<T> {
  const name = children.get(child) ?? "child";
  return new Promise((resolve, reject) => {
    const done = (): void => {
      clearTimeout(timer);
      child.off("message", onMessage);
      child.off("exit", onExit);
    };
    const timer = setTimeout(() => {
      done();
      reject(new Error(`${name}: no "${kind}" reply within ${ms} ms`));
    }, ms);
    const onMessage = (reply: { kind?: string }): void => {
      if (reply.kind !== kind) return;
      done();
      resolve(reply as T);
    };
    const onExit = (code: number | null, signal: string | null): void => {
      done();
      reject(new Error(`${name} exited (${code ?? signal}) while the bench waited for "${kind}"`));
    };
    child.on("message", onMessage);
    child.on("exit", onExit);
    if (message !== undefined) child.send(message);
  });
}

function forkTs(file: string, name: string): ChildProcess {
  return track(
    fork(fileURLToPath(new URL(file, import.meta.url)), [], {
      execArgv: ["--import", "tsx"],
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    }),
    name,
  );
}

// A child without an IPC channel outlives a SIGKILLed parent. This preload turns the end of its
// stdin pipe (the parent's death) into SIGTERM. The unref must follow resume()'s own ref, hence
// setImmediate; and the code is URI-encoded because a bare `?` would start the URL's query.
const exitWithParent = `data:text/javascript,${encodeURIComponent(
  'process.stdin.on("end",()=>process.kill(process.pid,"SIGTERM"));process.stdin.on("error",()=>{});process.stdin.resume();setImmediate(()=>process.stdin.unref?.());',
)}`;

/**
 * Starts one egressgate child with plain node (no IPC channel, hence the preload) and waits for
 * its `egressgate listening on URL` line. `script` is the CLI or the transpiled hooked-proxy.
 */
async function startProxyChild(
  name: ProxyTarget,
  script: string,
  args: readonly string[],
  profileDir: string | undefined,
): Promise<{ child: ChildProcess; url: string }> {
  const nodeArgs = [...(profileDir !== undefined ? ["--cpu-prof", "--cpu-prof-dir", profileDir] : []), "--import", exitWithParent, script, ...args];
  const child = track(spawn(process.execPath, nodeArgs, { stdio: ["pipe", "pipe", "inherit"] }), name);
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`${name} did not report its address within 20 s; stdout: ${out}`)), 20_000);
    child.stdout?.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      const match = /egressgate listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(out);
      if (match?.[1] !== undefined) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code ?? signal}) before listening`));
    });
  });
  return { child, url };
}

/**
 * bench/hooked-proxy.ts as plain JavaScript in the temp dir, so it runs without tsx (whose loader
 * would add about 35 MiB of RSS and turn on source maps). A `node_modules/egressgate` symlink to
 * this package lets its `import ... from "egressgate"` resolve through package.json to dist/, as
 * it does in place. (rmSync removes the symlink, never what it points to.)
 */
async function transpileHookedProxy(dir: string): Promise<string> {
  const ts = (await import("typescript")).default;
  const output = ts.transpileModule(readFileSync(hookedProxyPath, "utf8"), {
    fileName: hookedProxyPath,
    reportDiagnostics: true,
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2023, sourceMap: false },
  });
  if ((output.diagnostics ?? []).length > 0) {
    throw new Error(`bench/hooked-proxy.ts: ${ts.flattenDiagnosticMessageText(output.diagnostics![0]!.messageText, "\n")}`);
  }
  mkdirSync(join(dir, "node_modules"), { recursive: true });
  symlinkSync(root, join(dir, "node_modules", "egressgate"), "dir");
  const file = join(dir, "hooked-proxy.mjs");
  writeFileSync(file, output.outputText);
  return file;
}

// ---------------------------------------------------------------------------------------------
// /proc readings for a child: CPU ticks and peak RSS (VmHWM, resettable through clear_refs).

let clockTicks = 100;
try {
  const { execFileSync } = await import("node:child_process");
  clockTicks = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
} catch {
  // getconf is missing on some minimal images; 100 is Linux's USER_HZ nearly everywhere.
}

function cpuSeconds(pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / clockTicks;
  } catch {
    return undefined;
  }
}

/** A `kB` line of /proc/PID/status: VmHWM is the peak RSS, VmRSS the current one. */
function statusKb(pid: number | undefined, field: "VmHWM" | "VmRSS"): number | undefined {
  if (pid === undefined) return undefined;
  try {
    const match = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return match?.[1] === undefined ? undefined : Number(match[1]);
  } catch {
    return undefined;
  }
}

/** Resets VmHWM to the current RSS (Linux ≥ 4.0), so each target's windows get their own peak. */
function resetPeak(pid: number): boolean {
  try {
    writeFileSync(`/proc/${pid}/clear_refs`, "5");
    return true;
  } catch {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// Results.

interface Window {
  readonly round: number;
  readonly target: TargetName;
  readonly concurrency: number;
  readonly requestsPerSecond: number;
  readonly ok: number;
  readonly errors: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly proxyPeakRssKb: number | undefined;
  readonly proxyCpuPercent: number | undefined;
  readonly upstreamCpuPercent: number | undefined;
  readonly loadCpuPercent: number | undefined;
  /** New client-side connections in the warm-up and measured windows (CONNECTs or TLS dials). */
  readonly clientConnects: number;
  readonly upstreamConnects: number;
}

interface Aggregate {
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
  readonly proxyPeakRssMiB: number | undefined;
  readonly proxyCpuPercent: number | undefined;
  readonly loadCpuPercent: number | undefined;
  readonly upstreamCpuPercent: number | undefined;
  /** Proxy CPU time per request: unlike req/s, it barely moves when other work takes the cores. */
  readonly proxyCpuMicrosPerRequest: number | undefined;
  /** New connections over the whole run, warm-ups included: CONNECTs (or TLS dials) and upstream TLS handshakes. */
  readonly clientConnects: number;
  readonly upstreamConnects: number;
  readonly ratioToDirect: number;
  readonly ratioToTcpRelay: number;
}

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

function definedOnly(values: readonly (number | undefined)[]): number[] {
  return values.filter((v): v is number => v !== undefined);
}

function aggregate(
  targets: readonly TargetName[],
  windows: readonly Window[],
  summary: readonly LoadSummaryEntry[],
  connects: ReadonlyMap<string, { client: number; upstream: number }>,
): Aggregate[] {
  const rows: Omit<Aggregate, "ratioToDirect" | "ratioToTcpRelay">[] = [];
  for (const concurrency of new Set(windows.map((w) => w.concurrency))) {
    for (const target of targets) {
      const mine = windows.filter((w) => w.target === target && w.concurrency === concurrency);
      const hist = summary.find((s) => s.target === target && s.concurrency === concurrency);
      if (mine.length === 0 || hist === undefined) continue;
      const rss = definedOnly(mine.map((w) => w.proxyPeakRssKb));
      const proxyCpu = definedOnly(mine.map((w) => w.proxyCpuPercent));
      const loadCpu = definedOnly(mine.map((w) => w.loadCpuPercent));
      const upstreamCpu = definedOnly(mine.map((w) => w.upstreamCpuPercent));
      rows.push({
        target,
        concurrency,
        requestsPerSecond: median(mine.map((w) => w.requestsPerSecond)),
        requestsPerSecondMin: Math.min(...mine.map((w) => w.requestsPerSecond)),
        requestsPerSecondMax: Math.max(...mine.map((w) => w.requestsPerSecond)),
        p50Ms: hist.p50Ms,
        p90Ms: hist.p90Ms,
        p99Ms: hist.p99Ms,
        maxMs: hist.maxMs,
        requests: hist.count,
        errors: mine.reduce((n, w) => n + w.errors, 0),
        proxyPeakRssMiB: rss.length > 0 ? Math.max(...rss) / 1024 : undefined,
        proxyCpuPercent: proxyCpu.length > 0 ? median(proxyCpu) : undefined,
        loadCpuPercent: loadCpu.length > 0 ? median(loadCpu) : undefined,
        upstreamCpuPercent: upstreamCpu.length > 0 ? median(upstreamCpu) : undefined,
        proxyCpuMicrosPerRequest: proxyCpu.length > 0 ? median(mine.map((w) => ((w.proxyCpuPercent ?? 0) / 100 / w.requestsPerSecond) * 1e6)) : undefined,
        clientConnects: connects.get(`${target}/${concurrency}`)?.client ?? 0,
        upstreamConnects: connects.get(`${target}/${concurrency}`)?.upstream ?? 0,
      });
    }
  }
  return rows.map((row) => {
    const rps = (target: TargetName): number =>
      rows.find((r) => r.target === target && r.concurrency === row.concurrency)?.requestsPerSecond ?? Number.NaN;
    return { ...row, ratioToDirect: row.requestsPerSecond / rps("direct"), ratioToTcpRelay: row.requestsPerSecond / rps("tcp-relay") };
  });
}

const fixed = (n: number | undefined, digits: number): string => (n === undefined || Number.isNaN(n) ? "–" : n.toFixed(digits));
/** A ratio such as `0.42×`, or `–` when its reference target was not run. */
const times = (n: number): string => (Number.isNaN(n) ? "–" : `${n.toFixed(2)}×`);

function markdownTable(rows: readonly Aggregate[]): string {
  const lines = [
    "| target | conc. | req/s | req/s range | p50 ms | p99 ms | proxy peak RSS MiB | proxy CPU % | proxy CPU µs/req | load-gen CPU % | × direct | × tcp-relay | new conns (client / upstream) |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
  ];
  for (const r of rows) {
    const proxied = r.target !== "direct";
    lines.push(
      `| ${r.target} | ${r.concurrency} | ${fixed(r.requestsPerSecond, 0)} | ${fixed(r.requestsPerSecondMin, 0)}–${fixed(r.requestsPerSecondMax, 0)} | ` +
        `${fixed(r.p50Ms, 2)} | ${fixed(r.p99Ms, 2)} | ${proxied ? fixed(r.proxyPeakRssMiB, 1) : "–"} | ${proxied ? fixed(r.proxyCpuPercent, 0) : "–"} | ` +
        `${proxied ? fixed(r.proxyCpuMicrosPerRequest, 0) : "–"} | ` +
        `${fixed(r.loadCpuPercent, 0)} | ${times(r.ratioToDirect)} | ${times(r.ratioToTcpRelay)} | ${r.clientConnects} / ${r.upstreamConnects} |`,
    );
  }
  return lines.join("\n");
}

/** egressgate+hooks against egressgate-api at one concurrency: the cost of the no-op hook pair. */
interface HooksComparison {
  readonly concurrency: number;
  /** hooks ÷ no hooks, req/s medians. */
  readonly requestsPerSecondRatio: number;
  readonly p50Ms: { readonly noHooks: number; readonly hooks: number; readonly ratio: number };
  readonly p99Ms: { readonly noHooks: number; readonly hooks: number; readonly ratio: number };
  readonly proxyCpuMicrosPerRequest: { readonly noHooks: number; readonly hooks: number; readonly ratio: number; readonly added: number } | undefined;
  readonly proxyPeakRssMiB: { readonly noHooks: number; readonly hooks: number } | undefined;
}

function compareHooks(rows: readonly Aggregate[]): HooksComparison[] {
  const out: HooksComparison[] = [];
  for (const concurrency of new Set(rows.map((r) => r.concurrency))) {
    const base = rows.find((r) => r.target === "egressgate-api" && r.concurrency === concurrency);
    const hooked = rows.find((r) => r.target === "egressgate+hooks" && r.concurrency === concurrency);
    if (base === undefined || hooked === undefined) continue;
    const pair = (a: number, b: number): { noHooks: number; hooks: number; ratio: number } => ({ noHooks: a, hooks: b, ratio: b / a });
    const [cpuA, cpuB] = [base.proxyCpuMicrosPerRequest, hooked.proxyCpuMicrosPerRequest];
    const [rssA, rssB] = [base.proxyPeakRssMiB, hooked.proxyPeakRssMiB];
    out.push({
      concurrency,
      requestsPerSecondRatio: hooked.requestsPerSecond / base.requestsPerSecond,
      p50Ms: pair(base.p50Ms, hooked.p50Ms),
      p99Ms: pair(base.p99Ms, hooked.p99Ms),
      proxyCpuMicrosPerRequest: cpuA === undefined || cpuB === undefined ? undefined : { ...pair(cpuA, cpuB), added: cpuB - cpuA },
      proxyPeakRssMiB: rssA === undefined || rssB === undefined ? undefined : { noHooks: rssA, hooks: rssB },
    });
  }
  return out;
}

function hooksLines(comparisons: readonly HooksComparison[]): string {
  const lines = ["hooks vs no hooks (egressgate+hooks ÷ egressgate-api, same script, a no-op onRequest/onResponse pair the only difference):"];
  for (const c of comparisons) {
    const cpu = c.proxyCpuMicrosPerRequest;
    lines.push(
      `- c=${c.concurrency}: req/s ${fixed(c.requestsPerSecondRatio, 2)}×; ` +
        `p50 ${fixed(c.p50Ms.noHooks, 2)} → ${fixed(c.p50Ms.hooks, 2)} ms (${fixed(c.p50Ms.ratio, 2)}×); ` +
        `p99 ${fixed(c.p99Ms.noHooks, 2)} → ${fixed(c.p99Ms.hooks, 2)} ms (${fixed(c.p99Ms.ratio, 2)}×); ` +
        `proxy CPU ${cpu === undefined ? "–" : `${fixed(cpu.noHooks, 0)} → ${fixed(cpu.hooks, 0)} µs/req (${cpu.added >= 0 ? "+" : ""}${fixed(cpu.added, 0)} µs, ${fixed(cpu.ratio, 2)}×)`}; ` +
        `peak RSS ${c.proxyPeakRssMiB === undefined ? "–" : `${fixed(c.proxyPeakRssMiB.noHooks, 0)} → ${fixed(c.proxyPeakRssMiB.hooks, 0)} MiB`}`,
    );
  }
  return lines.join("\n");
}

// ---------------------------------------------------------------------------------------------
// The CPU profile of the egressgate child: self time per function and per file.

interface ProfileNode {
  readonly id: number;
  readonly callFrame: { readonly functionName: string; readonly url: string; readonly lineNumber: number };
  readonly hitCount?: number;
  readonly children?: readonly number[];
}

interface HotSpot {
  readonly name: string;
  readonly ms: number;
  readonly percent: number;
}

interface ProfileSummary {
  readonly busyMs: number;
  /** Self time: where the CPU was when sampled. Native bindings (writev, …) include the syscall and the TLS record. */
  readonly functions: HotSpot[];
  readonly files: HotSpot[];
  /** Inclusive time of egressgate's own functions (dist/), to see what each stage costs with all it calls. */
  readonly ownInclusive: HotSpot[];
}

function summarizeProfile(path: string): ProfileSummary {
  const profile = JSON.parse(readFileSync(path, "utf8")) as { nodes: ProfileNode[]; samples: number[]; startTime: number; endTime: number };
  const msPerSample = (profile.endTime - profile.startTime) / 1000 / Math.max(1, profile.samples.length);
  const short = (url: string): string => url.replace(/^file:\/\/.*?\/node_modules\//, "").replace(/^file:\/\/.*?\/dist\//, "dist/");
  const keyOf = (node: ProfileNode): string => {
    const { functionName, url, lineNumber } = node.callFrame;
    return `${functionName === "" ? "(anonymous)" : functionName}${url === "" ? "" : ` ${short(url)}:${lineNumber + 1}`}`;
  };
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  const self = new Map<string, number>();
  const byFile = new Map<string, number>();
  const inclusive = new Map<string, number>();
  let busyMs = 0;
  // Depth-first from the root; a function already on the path is not counted twice (recursion).
  const walk = (node: ProfileNode, onPath: ReadonlySet<string>): number => {
    const key = keyOf(node);
    const idle = node.callFrame.functionName === "(idle)";
    let total = idle ? 0 : (node.hitCount ?? 0) * msPerSample;
    if (total > 0) {
      busyMs += total;
      self.set(key, (self.get(key) ?? 0) + total);
      const file = node.callFrame.url === "" ? node.callFrame.functionName : short(node.callFrame.url);
      byFile.set(file, (byFile.get(file) ?? 0) + total);
    }
    const path = new Set(onPath).add(key);
    for (const id of node.children ?? []) {
      const child = byId.get(id);
      if (child !== undefined) total += walk(child, path);
    }
    if (!onPath.has(key) && node.callFrame.url.includes("/dist/")) inclusive.set(key, (inclusive.get(key) ?? 0) + total);
    return total;
  };
  const rootNode = profile.nodes[0];
  if (rootNode !== undefined) walk(rootNode, new Set());
  const top = (map: Map<string, number>, n: number): HotSpot[] =>
    [...map.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(([name, ms]) => ({ name, ms: Math.round(ms), percent: Math.round((ms / busyMs) * 1000) / 10 }));
  return { busyMs: Math.round(busyMs), functions: top(self, 25), files: top(byFile, 15), ownInclusive: top(inclusive, 15) };
}

// ---------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const settings = parseArgs(process.argv.slice(2));
  if (!existsSync(cliPath)) throw new Error(`${cliPath} is missing: run "npm run build" first`);
  const started = performance.now();
  const loadBefore = loadavg();
  workDir = mkdtempSync(join(tmpdir(), "egressgate-bench-"));
  const dir = workDir;
  const { targets } = settings;
  const profileDir = settings.cpuProf !== undefined ? join(dir, "profile") : undefined;

  // The upstream's own CA and a bench.test leaf; egressgate trusts it through --upstream-ca.
  const created = await createCaCertificate("egressgate bench upstream CA");
  const signer = await LeafSigner.create({ cert: parseCertificate(created.certPem), key: await importKeyPair(created.keyPem) }, "ecdsa");
  const leaf = await signer.sign("bench.test", 30);
  const upstreamCaFile = join(dir, "upstream-ca.pem");
  writeFileSync(upstreamCaFile, created.certPem);

  const upstream = forkTs("./upstream.ts", "upstream");
  const upstreamSetup: UpstreamSetup = { kind: "setup", keyPem: signer.leafKey.privateKeyPem, certPem: leaf.certPem, bodyBytes };
  const upstreamPort = (await ask<Extract<UpstreamMessage, { kind: "ready" }>>(upstream, "ready", upstreamSetup, 20_000)).port;
  const authority = `bench.test:${upstreamPort}`;

  const relay = forkTs("./tcp-relay.ts", "tcp-relay");
  const relaySetup: RelaySetup = { kind: "setup", allowedAuthority: authority };
  const relayPort = (await ask<Extract<RelayMessage, { kind: "ready" }>>(relay, "ready", relaySetup, 20_000)).port;

  // The egressgate children share one CA dir. They start one after another: the first creates
  // the CA (the CLI, when it runs), the others load it, and none races another to create it.
  const caDir = join(dir, "proxy-ca");
  const profileFor = (target: ProxyTarget): string | undefined => (settings.cpuProf === target ? profileDir : undefined);
  const proxies = new Map<ProxyTarget, { child: ChildProcess; url: string }>();
  if (targets.includes("egressgate")) {
    const args = [
      ...["--listen", "127.0.0.1:0", "--ca-dir", caDir, "--allow-internal-host", "bench.test"],
      ...["--resolve", "bench.test=127.0.0.1", "--upstream-ca", upstreamCaFile, "--log-level", "warn"],
    ];
    proxies.set("egressgate", await startProxyChild("egressgate", cliPath, args, profileFor("egressgate")));
  }
  const apiTargets = proxyTargets.filter((t) => t !== "egressgate" && targets.includes(t));
  const hookedProxy = apiTargets.length > 0 ? await transpileHookedProxy(dir) : undefined;
  for (const target of apiTargets) {
    const args = ["--ca-dir", caDir, "--upstream-ca", upstreamCaFile, ...(target === "egressgate+hooks" ? ["--hooks"] : [])];
    proxies.set(target, await startProxyChild(target, hookedProxy!, args, profileFor(target)));
  }
  // Without any egressgate target there is no proxy CA; the upstream's stands in (trusted anyway).
  const proxyCaPem = proxies.size > 0 ? readFileSync(join(caDir, "ca.crt"), "utf8") : created.certPem;

  const load = forkTs("./load.ts", "load");
  const loadSetup: LoadSetup = {
    kind: "setup",
    url: `https://${authority}/small`,
    expectedBytes: bodyBytes,
    upstreamCaPem: created.certPem,
    proxyCaPem,
    proxies: { "tcp-relay": `http://127.0.0.1:${relayPort}`, ...Object.fromEntries([...proxies].map(([target, p]) => [target, p.url])) },
    keepAliveMs,
  };
  await ask(load, "ready", loadSetup, 20_000);

  const pids: Record<TargetName, number | undefined> = {
    direct: undefined,
    "tcp-relay": relay.pid,
    egressgate: proxies.get("egressgate")?.child.pid,
    "egressgate-api": proxies.get("egressgate-api")?.child.pid,
    "egressgate+hooks": proxies.get("egressgate+hooks")?.child.pid,
  };
  const proxiedTargets = targets.filter((t) => t !== "direct");
  const rssNow = (): Partial<Record<TargetName, number | undefined>> => Object.fromEntries(proxiedTargets.map((t) => [t, statusKb(pids[t], "VmRSS")]));
  // Idle RSS, before any load: the relay's is mostly node + the tsx loader, egressgate's node + the CLI.
  const rssAtStart = rssNow();
  let runId = 0;
  const runWindow = async (target: TargetName, concurrency: number, durationMs: number, record: boolean): Promise<LoadResult> => {
    const result = await ask<LoadResult>(load, "result", { kind: "run", id: ++runId, target, concurrency, durationMs, record }, durationMs + 30_000);
    if (result.ok === 0) throw new Error(`${target} at concurrency ${concurrency}: no request succeeded (${result.errors} errors; first: ${result.firstError})`);
    if (result.errors > 0) process.stderr.write(`bench: ${target} c=${concurrency}: ${result.errors} errors; first: ${result.firstError}\n`);
    return result;
  };
  const upstreamStats = (): Promise<UpstreamStats> => ask<UpstreamStats>(upstream, "stats", { kind: "stats" }, 10_000);

  process.stderr.write(
    `bench (${settings.mode}): ${settings.rounds} rounds × ${settings.concurrencies.length} concurrencies × ${targets.length} targets, ` +
      `${settings.measureMs / 1000} s windows; upstream ${authority}, tcp-relay :${relayPort}` +
      `${[...proxies].map(([target, p]) => `, ${target} ${p.url}`).join("")}\n`,
  );
  // New connections per target and concurrency over the whole run, warm-ups included.
  const connects = new Map<string, { client: number; upstream: number }>();
  const countConnects = (target: TargetName, concurrency: number, client: number, upstream: number): void => {
    const key = `${target}/${concurrency}`;
    const seen = connects.get(key) ?? { client: 0, upstream: 0 };
    connects.set(key, { client: seen.client + client, upstream: seen.upstream + upstream });
  };
  for (const concurrency of settings.concurrencies) {
    for (const target of targets) {
      const before = await upstreamStats();
      const warm = await runWindow(target, concurrency, settings.initialWarmupMs, false);
      countConnects(target, concurrency, warm.connects, (await upstreamStats()).tlsConnections - before.tlsConnections);
    }
  }

  const windows: Window[] = [];
  let peakResettable = true;
  for (let round = 0; round < settings.rounds; round++) {
    for (const concurrency of settings.concurrencies) {
      // Rotating the order each round keeps any one target from always following another.
      const order = targets.map((_, i) => targets[(i + round) % targets.length]!);
      for (const target of order) {
        const pid = pids[target];
        const upstreamBefore = await upstreamStats();
        if (pid !== undefined) peakResettable = resetPeak(pid) && peakResettable;
        const warm = await runWindow(target, concurrency, settings.warmupMs, false);
        const cpu0 = [cpuSeconds(pid), cpuSeconds(upstream.pid), cpuSeconds(load.pid)];
        const t0 = performance.now();
        const result = await runWindow(target, concurrency, settings.measureMs, true);
        const seconds = (performance.now() - t0) / 1000;
        const cpu1 = [cpuSeconds(pid), cpuSeconds(upstream.pid), cpuSeconds(load.pid)];
        const percent = (i: number): number | undefined => {
          const [a, b] = [cpu0[i], cpu1[i]];
          return a === undefined || b === undefined ? undefined : ((b - a) / seconds) * 100;
        };
        const upstreamAfter = await upstreamStats();
        for (const [name, p] of proxies) {
          if (p.child.exitCode !== null || p.child.signalCode !== null) throw new Error(`${name} exited (${p.child.exitCode ?? p.child.signalCode}) during the run`);
        }
        const window: Window = {
          round: round + 1,
          target,
          concurrency,
          requestsPerSecond: result.ok / (result.elapsedMs / 1000),
          ok: result.ok,
          errors: result.errors + warm.errors,
          p50Ms: result.p50Ms,
          p99Ms: result.p99Ms,
          proxyPeakRssKb: statusKb(pid, "VmHWM"),
          proxyCpuPercent: percent(0),
          upstreamCpuPercent: percent(1),
          loadCpuPercent: percent(2),
          clientConnects: warm.connects + result.connects,
          upstreamConnects: upstreamAfter.tlsConnections - upstreamBefore.tlsConnections,
        };
        windows.push(window);
        countConnects(target, concurrency, window.clientConnects, window.upstreamConnects);
        process.stderr.write(
          `  round ${round + 1}/${settings.rounds} c=${concurrency} ${target.padEnd(16)} ${window.requestsPerSecond.toFixed(0).padStart(6)} req/s  ` +
            `p50 ${result.p50Ms.toFixed(2)} ms  p99 ${result.p99Ms.toFixed(2)} ms  proxy CPU ${fixed(window.proxyCpuPercent, 0)}%  ` +
            `load CPU ${fixed(window.loadCpuPercent, 0)}%  upstream CPU ${fixed(window.upstreamCpuPercent, 0)}%  conns ${window.clientConnects}/${window.upstreamConnects}\n`,
        );
      }
    }
  }

  const summary = (await ask<Extract<LoadReply, { kind: "summary" }>>(load, "summary", { kind: "summary" }, 10_000)).entries;
  const rssAtEnd = rssNow();
  // The relay's own count of CONNECTs, to check the client-side count against.
  const relayConnects = (await ask<Extract<RelayMessage, { kind: "stats" }>>(relay, "stats", { kind: "stats" }, 10_000)).connects;
  const rows = aggregate(targets, windows, summary, connects);
  const hooks = compareHooks(rows);

  // Close the load generator first, so egressgate's drain finds nothing in flight.
  load.send({ kind: "close" });
  await waitExit(load, 5_000);
  const exited = await Promise.all(
    [...proxies].map(async ([name, p]) => {
      p.child.kill("SIGTERM");
      return [name, await waitExit(p.child, 10_000)] as const;
    }),
  );
  const profiledExited = exited.some(([name, ok]) => name === settings.cpuProf && ok);
  let profile: ProfileSummary | undefined;
  let profileFile: string | undefined;
  const written = profileDir !== undefined && profiledExited && existsSync(profileDir) ? readdirSync(profileDir).find((f) => f.endsWith(".cpuprofile")) : undefined;
  if (profileDir !== undefined && written !== undefined) {
    // Kept outside the temp dir (which cleanup removes) for Chrome DevTools or speedscope.
    profileFile = join(tmpdir(), `egressgate-bench-${new Date().toISOString().replace(/[:.]/g, "-")}.cpuprofile`);
    copyFileSync(join(profileDir, written), profileFile);
    profile = summarizeProfile(profileFile);
  }

  const table = markdownTable(rows);
  const at32 = rows.find((r) => r.target === "egressgate" && r.concurrency === 32);
  const cpu = cpus();
  const machine = {
    cpus: cpu.length,
    cpuModel: cpu[0]?.model.trim() ?? "unknown",
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    os: `${process.platform} ${release()}`,
    node: process.version,
    openssl: process.versions.openssl,
    loadAverageBefore: loadBefore.map((n) => Math.round(n * 100) / 100),
    loadAverageAfter: loadavg().map((n) => Math.round(n * 100) / 100),
  };
  const totalSeconds = (performance.now() - started) / 1000;
  console.log(`\n# egressgate bench: small HTTPS GETs (${bodyBytes}-byte body), keep-alive, ${settings.mode} mode\n`);
  console.log(
    `node ${machine.node}, ${machine.cpus}× ${machine.cpuModel}, load average ${machine.loadAverageBefore.join(" ")} before, ${machine.loadAverageAfter.join(" ")} after\n` +
      `${settings.rounds} interleaved rounds, ${settings.measureMs / 1000} s measured per window; req/s is the median window, latencies pool all windows\n`,
  );
  console.log(table);
  if (hooks.length > 0) console.log(`\n${hooksLines(hooks)}`);
  if (at32 !== undefined && !Number.isNaN(at32.ratioToTcpRelay)) {
    const met = at32.ratioToTcpRelay >= 0.5 ? "met" : "NOT met";
    console.log(`\nDESIGN §8 goal, egressgate ≥ 0.5× tcp-relay at concurrency 32: ${at32.ratioToTcpRelay.toFixed(2)}× (${met})`);
  }
  const mib = (kb: number | undefined): string => fixed(kb === undefined ? undefined : kb / 1024, 0);
  const idle = proxiedTargets.map((t) => `${t} ${mib(rssAtStart[t])} MiB${t === "tcp-relay" ? " (runs under tsx)" : ""}`);
  console.log(`\nidle RSS before load: ${idle.join(", ")}; new conns over the whole run, warm-ups included`);
  if (!peakResettable) console.log("(VmHWM could not be reset between targets: peak RSS is the process lifetime's)");
  if (settings.cpuProf !== undefined) console.log(`(${settings.cpuProf} ran under --cpu-prof: its figures include the profiler's overhead)`);
  if (profile !== undefined) {
    console.log(`\n## ${settings.cpuProf} CPU profile: ${(profile.busyMs / 1000).toFixed(1)} s busy (idle excluded)\n`);
    console.log("| self ms | % | function |\n|---:|---:|---|");
    for (const f of profile.functions) console.log(`| ${f.ms} | ${f.percent} | ${f.name} |`);
    console.log("\n| self ms | % | file |\n|---:|---:|---|");
    for (const f of profile.files) console.log(`| ${f.ms} | ${f.percent} | ${f.name} |`);
    console.log("\n| inclusive ms | % | egressgate function (dist/) |\n|---:|---:|---|");
    for (const f of profile.ownInclusive) console.log(`| ${f.ms} | ${f.percent} | ${f.name} |`);
    console.log(`\nprofile: ${profileFile}`);
  } else if (settings.cpuProf !== undefined) console.log(`\n(no CPU profile was written: ${settings.cpuProf} did not exit cleanly)`);

  const date = new Date().toISOString().slice(0, 10);
  const resultsDir = join(root, "bench", "results");
  mkdirSync(resultsDir, { recursive: true });
  const resultsFile = join(resultsDir, `${date}.json`);
  const json = {
    date,
    command: `npm run bench${process.argv.length > 2 ? ` -- ${process.argv.slice(2).join(" ")}` : ""}`,
    settings: { ...settings, bodyBytes },
    machine,
    durationSeconds: Math.round(totalSeconds),
    goal: at32 === undefined || Number.isNaN(at32.ratioToTcpRelay) ? undefined : { description: "egressgate ≥ 0.5× tcp-relay, small GETs, concurrency 32", ratio: at32.ratioToTcpRelay, met: at32.ratioToTcpRelay >= 0.5 },
    results: rows,
    ...(hooks.length > 0 ? { hooksVsNoHooks: hooks } : {}),
    rssAtStartKb: rssAtStart,
    rssAtEndKb: rssAtEnd,
    relayConnectsSeenByRelay: relayConnects,
    windows,
    ...(profile !== undefined ? { cpuProfile: profile } : {}),
  };
  writeFileSync(resultsFile, `${JSON.stringify(json, null, 2)}\n`);
  console.log(`\nresults: ${resultsFile.slice(root.length)} (${totalSeconds.toFixed(0)} s)`);
}

try {
  await main();
} catch (error) {
  if (!stopping) process.stderr.write(`bench: ${(error as Error).message}\n`);
  process.exitCode = 1;
} finally {
  await cleanup();
}
