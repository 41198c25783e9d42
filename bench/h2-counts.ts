/**
 * `node --import tsx bench/h2-counts.ts [--dist DIR[,DIR…]] [--rows h1,h2-8,h2-1] [--mode io|strace|heap|cpu]
 *   [--rounds N] [--seconds S]`: what one small GET costs egressgate, in counts that a busy machine
 * moves far less than req/s (issue 20; docs/performance.md, "The reading of 2026-12-04 (eleventh
 * session)"). The bench's upstream (100-byte bodies) and the CLI proxy (one child per `--dist`, a
 * built `dist/` tree, so two builds run side by side in alternating order) are children; the
 * bench's minimal clients (bench/raw-load.ts) run here at concurrency 32: `h1` on 32 connections,
 * `h2-8` on 8 HTTP/2 connections, `h2-1` on one.
 *
 * Per request, for each window (a short warm-up before each, which reopens idle connections):
 * - `io` (the default): the proxy's CPU (all threads, /proc; its main thread's, and of that the
 *   part in the kernel), its read and write system calls (/proc/PID/io syscr, syscw) and its main
 *   thread's context switches; nothing attached.
 * - `strace`: every system call, by name (`strace -c -f` attached for the window; it slows the
 *   proxy, so more requests share a read than unattached).
 * - `heap`: V8 bytes allocated (its sampling heap profiler, collected objects included), and the
 *   sites that allocate most.
 * - `cpu`: V8's CPU profile of the window, self time per request by part of the path.
 * - `callgrind`: each proxy runs under `valgrind --tool=callgrind`, and a window is a fixed number
 *   of requests (`--requests`, after `--warmup` more in the first round): the instructions every
 *   thread of the proxy ran (Ir, read with `callgrind_control -e` around the window), which the
 *   machine's other work does not move. Slow (valgrind runs the proxy 30–50× slower), and h2's
 *   batching of frames per read moves with speed: compare rows at the same request count, with
 *   their reads and writes beside them.
 *
 * `--node-args "…"` passes V8/Node flags to the proxies; with `--trace-gc-nvp` among them, each
 * window also counts the proxy's collections and what survived them (bytes, and the global
 * handles V8 copied or promoted out of the young generation), per request.
 */
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { appendFileSync, copyFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { cleanup, cpuSeconds, installCleanup, mainThreadCpuSeconds, root, spawnListening, transpile } from "./children.js";
import type { H2Setup } from "./h2-load.js";
import { closeRaw, runRawRate, type RawRateRun } from "./raw-load.js";
import { createUpstreamCa, startBenchUpstream } from "./upstream-ca.js";

const args = process.argv.slice(2);
const option = (name: string, fallback: string): string => {
  const at = args.indexOf(name);
  return at < 0 ? fallback : args[at + 1]!;
};
const dists = option("--dist", join(root, "dist")).split(",").map((d) => resolve(d));
const rows = option("--rows", "h1,h2-8").split(",") as Row[];
const mode = option("--mode", "io") as "io" | "strace" | "heap" | "cpu" | "callgrind";
const fixedRequests = mode === "callgrind" ? Number(option("--requests", "4000")) : undefined;
const warmupRequests = Number(option("--warmup", "6000"));
const nodeArgs = option("--node-args", "").split(" ").filter((a) => a !== "");
const rounds = Number(option("--rounds", "4"));
const seconds = Number(option("--seconds", "3"));
const concurrency = 32;
const originHost = "origin.bench.test";
const bodyBytes = 100;

type Row = "h1" | "h2-8" | "h2-1";
const rowShape: Record<Row, { protocol: "h1" | "h2"; connections: number }> = {
  h1: { protocol: "h1", connections: 32 },
  "h2-8": { protocol: "h2", connections: 8 },
  "h2-1": { protocol: "h2", connections: 1 },
};

installCleanup();
const dir = mkdtempSync(join(tmpdir(), "eg-h2counts-"));
const upstreamCa = await createUpstreamCa(dir, "egressgate h2-counts upstream CA");
const upstreamCaFile = upstreamCa.caFile;
const { child: upstream, ready: { port: upstreamPort } } = await startBenchUpstream(upstreamCa, bodyBytes);
const url = `https://${originHost}:${upstreamPort}/small`;

const probe = await transpile(dir, fileURLToPath(new URL("./h2-counts-probe.ts", import.meta.url)));

interface Proxy {
  readonly name: string;
  readonly child: ChildProcess;
  readonly pid: number;
  readonly ctl: string;
  /** Summed from its `--trace-gc-nvp` lines, when asked for. */
  readonly gc: Record<string, number>;
}

const proxies: Proxy[] = [];
const setup: { upstreamCaPem: string; proxies: Record<string, { url: string; caPem: string }> } = { upstreamCaPem: upstreamCa.caPem, proxies: {} };
for (const [i, dist] of dists.entries()) {
  const cli = join(dist, "cli", "bin.js");
  if (!existsSync(cli)) throw new Error(`${cli} is missing: build that tree first`);
  const name = `${String.fromCharCode(65 + i)} ${dist}`;
  const caDir = join(dir, `ca-${i}`);
  const ctl = join(dir, `ctl-${i}.json`);
  const cliArgs = ["--listen", "127.0.0.1:0", "--ca-dir", caDir, "--allow-internal-host", "*.bench.test", "--resolve", `${originHost}=127.0.0.1`, "--upstream-ca", upstreamCaFile, "--log-level", "warn"];
  process.env["H2COUNTS_CTL"] = ctl;
  const node = [process.execPath, ...nodeArgs, "--import", pathHref(probe), cli, ...cliArgs];
  const command = mode === "callgrind" ? ["valgrind", "--tool=callgrind", "--smc-check=all-non-file", `--callgrind-out-file=${join(dir, "callgrind.%p")}`, ...node] : node;
  const { child, match } = await spawnListening(name, command[0]!, command.slice(1), /listening on (http:\/\/127\.0\.0\.1:\d+)/, { timeoutMs: mode === "callgrind" ? 600_000 : 30_000 });
  delete process.env["H2COUNTS_CTL"];
  setup.proxies[name] = { url: match, caPem: readFileSync(join(caDir, "ca.crt"), "utf8") };
  const gc: Record<string, number> = {};
  let partial = "";
  // H2COUNTS_PROXY_STDOUT=FILE: the proxies' stdout (V8's --trace-opt/--trace-deopt, say) kept in FILE.
  const keepStdout = process.env["H2COUNTS_PROXY_STDOUT"];
  child.stdout?.on("data", (chunk: Buffer) => {
    if (keepStdout !== undefined) appendFileSync(keepStdout, chunk);
    const lines = (partial + chunk.toString()).split("\n");
    partial = lines.pop() ?? "";
    for (const line of lines) {
      const kind = / gc=(\w+) /.exec(line)?.[1];
      if (kind === undefined) continue;
      gc[`gc ${kind} count`] = (gc[`gc ${kind} count`] ?? 0) + 1;
      for (const field of ["pause", "new_space_survived", "promoted", "nodes_copied_in_new", "nodes_promoted", "nodes_died_in_new"]) {
        const value = new RegExp(` ${field}=([\\d.]+)`).exec(line)?.[1];
        if (value !== undefined) gc[`gc ${kind} ${field}`] = (gc[`gc ${kind} ${field}`] ?? 0) + Number(value);
      }
    }
  });
  proxies.push({ name, child, pid: child.pid!, ctl, gc });
}

function pathHref(path: string): string {
  return new URL(`file://${path}`).href;
}

let nextId = 1;
function window(proxy: Proxy, row: Row, ms: number, requests?: number): Promise<{ ok: number; errors: number; firstError: string | undefined }> {
  const shape = rowShape[row];
  const run: RawRateRun = { kind: "rawrate", id: nextId++, lane: `${proxy.name}/${row}`, target: proxy.name, protocol: shape.protocol, url, expectedBytes: bodyBytes, concurrency, connections: shape.connections, durationMs: ms, record: false, ...(requests !== undefined ? { requests } : {}) };
  return runRawRate(setup as H2Setup, run);
}

async function command(proxy: Proxy, body: Record<string, unknown>): Promise<Record<string, unknown>> {
  const out = join(dir, `answer-${nextId++}.json`);
  writeFileSync(proxy.ctl, JSON.stringify({ ...body, out }));
  process.kill(proxy.pid, "SIGUSR2");
  for (let i = 0; i < 600; i++) {
    if (existsSync(out)) {
      try {
        return JSON.parse(readFileSync(out, "utf8")) as Record<string, unknown>;
      } catch {
        // Still being written.
      }
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${proxy.name} did not answer ${JSON.stringify(body)}`);
}

function ioCounts(pid: number): { syscr: number; syscw: number } {
  const io = readFileSync(`/proc/${pid}/io`, "utf8");
  return { syscr: Number(/syscr: (\d+)/.exec(io)![1]), syscw: Number(/syscw: (\d+)/.exec(io)![1]) };
}

/** Instructions run so far by every thread of a process under callgrind. */
function instructions(pid: number): number {
  const out = execFileSync("callgrind_control", ["-e", String(pid)], { encoding: "utf8" });
  let total = 0;
  for (const m of out.matchAll(/^\s*Th \d+\s+([\d,]+)\s*$/gm)) total += Number(m[1]!.replace(/,/g, ""));
  return total;
}

const clockTicks = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;

/** The main thread's CPU in the kernel (stime), seconds: system calls, and the loopback TCP work they do. */
function mainThreadSysSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/task/${pid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[12]) / clockTicks;
}

function switches(pid: number): number {
  const status = readFileSync(`/proc/${pid}/task/${pid}/status`, "utf8");
  return Number(/^voluntary_ctxt_switches:\s+(\d+)/m.exec(status)![1]) + Number(/^nonvoluntary_ctxt_switches:\s+(\d+)/m.exec(status)![1]);
}

/** strace -c's table: calls by syscall name. */
function parseStrace(text: string): Map<string, number> {
  const calls = new Map<string, number>();
  for (const line of text.split("\n")) {
    const m = /^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?([a-z_0-9]+)\s*$/.exec(line);
    if (m !== null && m[2] !== "total") calls.set(m[2]!, Number(m[1]));
  }
  return calls;
}

interface ProfileNode {
  readonly id: number;
  readonly callFrame: { readonly functionName: string; readonly url: string };
  readonly hitCount?: number;
}

/** Where a sampled frame's self time goes: the parts of the path this reading compares. */
function partOf(node: ProfileNode): string {
  const { url, functionName } = node.callFrame;
  if (url.includes("/dist/proxy/h2-")) return "egressgate h2 guest (proxy/h2-*)";
  if (url.includes("/dist/proxy/")) return "egressgate proxy/ other";
  if (url.includes("/dist/pipeline/")) return "egressgate pipeline/";
  if (url.includes("/dist/upstream/pinned-pools")) return "egressgate upstream/pinned-pools";
  if (url.includes("/dist/")) return "egressgate other";
  if (url.includes("node_modules/undici")) return "undici";
  if (url.startsWith("node:internal/http2")) return "node http2 (JS)";
  if (url.startsWith("node:_http") || url.startsWith("node:internal/http")) return "node http (JS)";
  if (url.startsWith("node:internal/streams")) return "node streams (JS)";
  if (url.startsWith("node:_tls") || url.startsWith("node:internal/tls")) return "node tls (JS)";
  if (url.startsWith("node:internal/timers") || url.startsWith("node:timers")) return "node timers (JS)";
  if (url.startsWith("node:internal/process") || url.startsWith("node:internal/async_hooks") || url.startsWith("node:events")) return "node events/ticks (JS)";
  if (url.startsWith("node:")) return "node other (JS)";
  if (url === "") return functionName.startsWith("(") ? functionName : `native ${functionName}`;
  return "other";
}

interface Reading {
  readonly proxy: string;
  readonly row: Row;
  readonly round: number;
  readonly requests: number;
  readonly errors: number;
  readonly values: Record<string, number>;
}

const readings: Reading[] = [];
const ms = seconds * 1000;
for (let round = 0; round < rounds; round++) {
  const order = round % 2 === 0 ? proxies : [...proxies].reverse();
  for (const row of rows) {
    for (const proxy of order) {
      if (fixedRequests !== undefined) await window(proxy, row, 600_000, round === 0 ? warmupRequests : Math.ceil(fixedRequests / 10));
      else await window(proxy, row, round === 0 ? 3000 : 700);
      const values: Record<string, number> = {};
      if (process.env["H2COUNTS_PROXY_STDOUT"] !== undefined) appendFileSync(process.env["H2COUNTS_PROXY_STDOUT"], `=== window ${row} ${proxy.name} round ${round + 1}\n`);
      const gc0 = { ...proxy.gc };
      const keepDumps = option("--keep-profiles", "");
      // Zeroed here and dumped after the window, a profile holds the window alone (callgrind_annotate reads it).
      if (mode === "callgrind" && keepDumps !== "") execFileSync("callgrind_control", ["-z", String(proxy.pid)], { stdio: "ignore" });
      const ir0 = mode === "callgrind" ? instructions(proxy.pid) : 0;
      const cpu0 = cpuSeconds(proxy.pid)!;
      const main0 = mainThreadCpuSeconds(proxy.pid)!;
      const sys0 = mainThreadSysSeconds(proxy.pid);
      const io0 = ioCounts(proxy.pid);
      const sw0 = switches(proxy.pid);
      let strace: ChildProcess | undefined;
      let straceOut = "";
      if (mode === "strace") {
        straceOut = join(dir, `strace-${nextId++}.txt`);
        strace = spawn("strace", ["-c", "-f", "-o", straceOut, "-p", String(proxy.pid)], { stdio: "ignore" });
        await new Promise((r) => setTimeout(r, 500));
      }
      if (mode === "heap") await command(proxy, { heap: "start" });
      const cpuOut = join(dir, `cpu-${nextId++}.cpuprofile`);
      if (mode === "cpu") await command(proxy, { cpu: "start" });
      const result = fixedRequests !== undefined ? await window(proxy, row, 600_000, fixedRequests) : await window(proxy, row, ms);
      const ir1 = mode === "callgrind" ? instructions(proxy.pid) : 0;
      if (mode === "callgrind" && keepDumps !== "") {
        const before = new Set(readdirSync(dir));
        execFileSync("callgrind_control", [`--dump=${row} ${proxy.name} round ${round + 1}`, String(proxy.pid)], { stdio: "ignore" });
        const dumped = readdirSync(dir).filter((f) => f.startsWith(`callgrind.${proxy.pid}`) && !before.has(f));
        for (const f of dumped) copyFileSync(join(dir, f), join(keepDumps, `${proxy.name.split(" ")[0]}-${row}-${round + 1}.callgrind`));
      }
      const io1 = ioCounts(proxy.pid);
      const sw1 = switches(proxy.pid);
      const cpu1 = cpuSeconds(proxy.pid)!;
      const main1 = mainThreadCpuSeconds(proxy.pid)!;
      const sys1 = mainThreadSysSeconds(proxy.pid);
      const n = result.ok;
      if (strace !== undefined) {
        strace.kill("SIGINT");
        await new Promise((r) => strace!.once("exit", r));
        const calls = parseStrace(readFileSync(straceOut, "utf8"));
        let total = 0;
        for (const [name, count] of calls) {
          values[`sys ${name}`] = count / n;
          total += count;
        }
        values["sys total"] = total / n;
      }
      if (mode === "heap") {
        const answer = await command(proxy, { heap: "stop" });
        values["heap bytes"] = (answer["heapBytes"] as number) / n;
        for (const [site, bytes] of answer["heapSites"] as [string, number][]) values[`heap ${site}`] = bytes / n;
      }
      if (mode === "cpu") {
        await command(proxy, { cpu: "stop", cpuOut });
        const profile = JSON.parse(readFileSync(cpuOut, "utf8")) as { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[] };
        const byId = new Map(profile.nodes.map((node) => [node.id, node]));
        const us = new Map<string, number>();
        const fn = new Map<string, number>();
        for (let i = 0; i < profile.samples.length; i++) {
          const node = byId.get(profile.samples[i]!)!;
          const delta = profile.timeDeltas[i + 1] ?? 0;
          const part = partOf(node);
          us.set(part, (us.get(part) ?? 0) + delta);
          const key = `${node.callFrame.functionName || "(anonymous)"} ${node.callFrame.url.replace(/^.*\/(dist|node_modules)\//, "$1/")}`;
          fn.set(key, (fn.get(key) ?? 0) + delta);
        }
        for (const [part, total] of us) values[`cpu ${part}`] = total / n;
        for (const [key, total] of [...fn].sort((a, b) => b[1] - a[1]).slice(0, 40)) values[`fn ${key}`] = total / n;
        const keep = option("--keep-profiles", "");
        if (keep !== "") writeFileSync(join(keep, `${proxy.name.split(" ")[0]}-${row}-${round + 1}.cpuprofile`), readFileSync(cpuOut));
        rmSync(cpuOut, { force: true });
      }
      if (mode === "callgrind") values["instructions (k)"] = (ir1 - ir0) / n / 1000;
      for (const [key, total] of Object.entries(proxy.gc)) values[key] = (total - (gc0[key] ?? 0)) / n;
      values["cpu µs"] = ((cpu1 - cpu0) * 1e6) / n;
      values["main thread cpu µs"] = ((main1 - main0) * 1e6) / n;
      values["main thread sys µs"] = ((sys1 - sys0) * 1e6) / n;
      values["reads"] = (io1.syscr - io0.syscr) / n;
      values["writes"] = (io1.syscw - io0.syscw) / n;
      values["main thread switches"] = (sw1 - sw0) / n;
      values["req/s"] = n / seconds;
      readings.push({ proxy: proxy.name, row, round, requests: n, errors: result.errors, values });
      process.stderr.write(`round ${round + 1} ${row} ${proxy.name}: ${n} requests, ${result.errors} errors${result.firstError !== undefined ? ` (${result.firstError})` : ""}\n`);
    }
  }
}

const median = (values: number[]): number => {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
};
const fmt = (v: number): string => (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(3));
console.log(`mode ${mode}, ${rounds} rounds of ${seconds} s, concurrency ${concurrency}, ${bodyBytes}-byte bodies; medians over rounds, per request`);
for (const row of rows) {
  const keys = new Set<string>();
  for (const r of readings) if (r.row === row) for (const k of Object.keys(r.values)) keys.add(k);
  const header = proxies.map((p) => p.name.split(" ")[0]!);
  console.log(`\n${row}: ${proxies.map((p) => p.name).join(" | ")}`);
  const lines: [string, number[]][] = [];
  for (const key of keys) {
    const meds = proxies.map((p) => median(readings.filter((r) => r.row === row && r.proxy === p.name).map((r) => r.values[key] ?? 0)));
    lines.push([key, meds]);
  }
  lines.sort((a, b) => (a[0].split(" ")[0]! < b[0].split(" ")[0]! ? -1 : a[0].split(" ")[0]! > b[0].split(" ")[0]! ? 1 : b[1][0]! - a[1][0]!));
  console.log(`| per request | ${header.join(" | ")} |${proxies.length > 1 ? " B/A paired median |" : ""}`);
  for (const [key, meds] of lines) {
    if (meds.every((m) => Math.abs(m) < 0.005)) continue;
    let paired = "";
    if (proxies.length > 1) {
      const ratios: number[] = [];
      for (let round = 0; round < rounds; round++) {
        const a = readings.find((r) => r.row === row && r.round === round && r.proxy === proxies[0]!.name)?.values[key];
        const b = readings.find((r) => r.row === row && r.round === round && r.proxy === proxies[1]!.name)?.values[key];
        if (a !== undefined && b !== undefined && a !== 0) ratios.push(b / a);
      }
      paired = ` ${ratios.length > 0 ? median(ratios).toFixed(3) : "–"} |`;
    }
    console.log(`| ${key} | ${meds.map(fmt).join(" | ")} |${paired}`);
  }
}
const outFile = option("--out", "");
if (outFile !== "") writeFileSync(outFile, JSON.stringify({ mode, rounds, seconds, proxies: proxies.map((p) => p.name), readings }, null, 1));
closeRaw();
upstream.disconnect();
await cleanup();
rmSync(dir, { recursive: true, force: true });
process.exit(0);
