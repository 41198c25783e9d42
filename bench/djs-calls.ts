/**
 * Tier-2 call costs, side by side: the same functions run in a QuickJS sandbox (on this thread,
 * and through the worker threads the proxy uses, one call at a time and pipelined, in wall-clock
 * time and in the CPU of all the process's threads), and natively in V8 on a WHATWG Request (on
 * a prebuilt one, and with the Request built per call as tier 3 does). Every figure is the
 * median of several rounds, in microseconds per call.
 *
 *   npx tsx bench/djs-calls.ts [--quick] [--json]
 *
 * It prints what it measured and judges nothing.
 */
import { bundlePolicy } from "../src/djs/bundle.js";
import { createDjsHooks, defaultDjsLimits } from "../src/djs/create-djs-hooks.js";
import type { CallFields, PhaseName } from "../src/djs/protocol.js";
import { Sandbox } from "../src/djs/sandbox.js";
import { headerAllowlistSource } from "./policies.js";
import { table } from "./report.js";

const emptySource = `export function isIpAllowed() { return true; }\nexport function onRequest() {}\nexport function onResponse() {}`;

const url = "https://origin.bench.test/repos/egressgate/egressgate/contents/README.md?ref=main";
const headerList = ["accept", "application/json", "user-agent", "undici", "accept-encoding", "gzip", "host", "origin.bench.test"];

function message(phase: PhaseName): CallFields {
  const base = { phase, now: Date.now(), seed: 12345, method: "GET", url, headers: headerList.join("\n"), hasBody: false };
  if (phase === "isIpAllowed") return { ...base, info: { hostname: "origin.bench.test", ip: "127.0.0.1", family: 4, port: 443, protocol: "https:" } };
  if (phase === "onResponse") return { ...base, response: { status: 200, statusText: "", headers: "content-type\napplication/json", url, hasBody: true } };
  return base;
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
}

/** Microseconds per call: the median of `rounds` timed loops of `n` calls, after a warm-up loop. */
function timeSync(n: number, rounds: number, fn: () => unknown): number {
  for (let i = 0; i < n; i++) fn();
  const samples: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const t0 = performance.now();
    for (let i = 0; i < n; i++) fn();
    samples.push(((performance.now() - t0) * 1000) / n);
  }
  return median(samples);
}

/**
 * Wall-clock and CPU microseconds per call (medians of `rounds` loops of `n` calls): CPU is this
 * process's user + system time, so it counts every thread a call touches, the workers included.
 */
async function timeAsync(n: number, rounds: number, fn: () => Promise<unknown>, pipelined: boolean): Promise<{ wall: number; cpu: number }> {
  const loop = async (): Promise<void> => {
    if (pipelined) await Promise.all(Array.from({ length: n }, fn));
    else for (let i = 0; i < n; i++) await fn();
  };
  await loop();
  const walls: number[] = [];
  const cpus: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    await loop();
    walls.push(((performance.now() - t0) * 1000) / n);
    const c = process.cpuUsage(c0);
    cpus.push((c.user + c.system) / n);
  }
  return { wall: median(walls), cpu: median(cpus) };
}

export interface CallRow {
  readonly call: string;
  readonly sandboxMicros: number;
  readonly workerSequentialMicros: number;
  readonly workerPipelinedMicros: number;
  /** CPU of the whole process (proxy thread, workers, V8's helpers) per call, one at a time and pipelined. */
  readonly workerSequentialCpuMicros: number;
  readonly workerPipelinedCpuMicros: number;
  readonly nativeMicros: number;
  readonly nativeWithRequestMicros: number;
}

export async function measureCalls(quick: boolean): Promise<CallRow[]> {
  const n = quick ? 2_000 : 10_000;
  const rounds = quick ? 3 : 5;
  const filename = "/bench/policy.mjs";
  const sandboxOf = async (source: string): Promise<Sandbox> => {
    const { code, map } = await bundlePolicy({ kind: "module", filename, source, modules: {}, fromDisk: false });
    return Sandbox.create("module", filename, code, map, defaultDjsLimits);
  };
  const emptySandbox = await sandboxOf(emptySource);
  const allowSandbox = await sandboxOf(headerAllowlistSource);
  const { djsHooks: emptyHooks } = createDjsHooks({ source: emptySource, filename });
  const { djsHooks: allowHooks } = createDjsHooks({ source: headerAllowlistSource, filename });

  // The same functions in V8: evaluated from the same source text.
  const native = (await import(`data:text/javascript,${encodeURIComponent(headerAllowlistSource)}`)) as { isRequestAllowed: (r: Request) => boolean };
  const nativeEmpty = (await import(`data:text/javascript,${encodeURIComponent(emptySource)}`)) as { onRequest: (r: Request) => void; onResponse: (r: Response) => void; isIpAllowed: () => boolean };
  const makeRequest = (): Request => new Request(url, { headers: Object.fromEntries(headerPairs()) });
  const prebuilt = makeRequest();
  const prebuiltResponse = new Response("x", { headers: { "content-type": "application/json" } });
  if (native.isRequestAllowed(prebuilt) !== true) throw new Error("the native header allowlist refused the bench request");

  const rows: CallRow[] = [];
  const row = async (call: string, sandbox: Sandbox, engine: typeof emptyHooks.engine, phase: PhaseName, v8: () => unknown, v8Built: () => unknown): Promise<void> => {
    const msg = { ...message(phase), id: 0, cell: 0 };
    const check = sandbox.call(msg).reply.outcome;
    if (check.t !== "code") throw new Error(`${call}: the sandbox answered ${JSON.stringify(check)}`);
    const sandboxMicros = timeSync(n, rounds, () => sandbox.call(msg));
    const sequential = await timeAsync(Math.ceil(n / 4), rounds, () => engine.call(message(phase)), false);
    const pipelined = await timeAsync(n, rounds, () => engine.call(message(phase)), true);
    rows.push({
      call,
      sandboxMicros,
      workerSequentialMicros: sequential.wall,
      workerPipelinedMicros: pipelined.wall,
      workerSequentialCpuMicros: sequential.cpu,
      workerPipelinedCpuMicros: pipelined.cpu,
      nativeMicros: timeSync(n * 10, rounds, v8),
      nativeWithRequestMicros: timeSync(n, rounds, v8Built),
    });
  };
  await row("empty isIpAllowed", emptySandbox, emptyHooks.engine, "isIpAllowed", () => nativeEmpty.isIpAllowed(), () => nativeEmpty.isIpAllowed());
  await row("empty onRequest", emptySandbox, emptyHooks.engine, "onRequest", () => nativeEmpty.onRequest(prebuilt), () => nativeEmpty.onRequest(makeRequest()));
  await row("empty onResponse", emptySandbox, emptyHooks.engine, "onResponse", () => nativeEmpty.onResponse(prebuiltResponse), () => nativeEmpty.onResponse(new Response("x", { headers: { "content-type": "application/json" } })));
  await row("header-allowlist isRequestAllowed", allowSandbox, allowHooks.engine, "isRequestAllowed", () => native.isRequestAllowed(prebuilt), () => native.isRequestAllowed(makeRequest()));
  await Promise.all([emptyHooks.close(), allowHooks.close()]);
  return rows;
}

function headerPairs(): [string, string][] {
  const pairs: [string, string][] = [];
  for (let i = 0; i < headerList.length; i += 2) if (headerList[i] !== "host") pairs.push([headerList[i]!, headerList[i + 1]!]);
  return pairs;
}

/**
 * What a slow policy does to the proxy's own thread: 16 calls that each busy-loop for `burnMs`,
 * all in flight at once, while a timer on this thread measures how late it fires. Through the
 * workers the event loop should barely notice; in-thread, it is blocked for every call.
 */
export interface StallRow {
  readonly where: "workers" | "this thread";
  readonly calls: number;
  readonly burnMs: number;
  readonly elapsedMs: number;
  readonly maxLoopDelayMs: number;
}

export async function measureStall(): Promise<StallRow[]> {
  const burnMs = 40;
  const calls = 16;
  // A loop of about 40 ms on this machine's QuickJS; the table reports what one call really took.
  const source = `export function isRequestAllowed() { let x = 0; for (let i = 0; i < ${burnMs} * 12500; i++) x += i; return x > 0; }`;
  const filename = "/bench/slow.mjs";
  const { code, map } = await bundlePolicy({ kind: "module", filename, source, modules: {}, fromDisk: false });
  const rows: StallRow[] = [];
  const watch = async (run: () => Promise<unknown>): Promise<{ elapsedMs: number; maxLoopDelayMs: number }> => {
    let maxLate = 0;
    let last = performance.now();
    const timer = setInterval(() => {
      const now = performance.now();
      maxLate = Math.max(maxLate, now - last - 1);
      last = now;
    }, 1);
    const t0 = performance.now();
    await run();
    const elapsedMs = performance.now() - t0;
    await new Promise((resolve) => setTimeout(resolve, 5));
    clearInterval(timer);
    return { elapsedMs, maxLoopDelayMs: maxLate };
  };
  const { djsHooks } = createDjsHooks({ source, filename, limits: { timeoutMs: 10_000 } });
  const msg = message("isRequestAllowed");
  await djsHooks.engine.call(msg);
  rows.push({ where: "workers", calls, burnMs, ...(await watch(() => Promise.all(Array.from({ length: calls }, () => djsHooks.engine.call(msg))))) });
  await djsHooks.close();
  const sandbox = await Sandbox.create("module", filename, code, map, { ...defaultDjsLimits, timeoutMs: 10_000 });
  rows.push({
    where: "this thread",
    calls,
    burnMs,
    ...(await watch(async () => {
      for (let i = 0; i < calls; i++) {
        sandbox.call({ ...msg, id: i, cell: 0 });
        // Let the timer run between calls, as an event loop serving requests would.
        await new Promise((resolve) => setImmediate(resolve));
      }
    })),
  });
  return rows;
}

export function stallTable(rows: readonly StallRow[]): string {
  const inThread = rows.find((r) => r.where === "this thread");
  const perCall = inThread === undefined ? Number.NaN : inThread.elapsedMs / inThread.calls;
  return table(
    ["policy runs on", "calls in flight", "one call, alone (ms)", "all done in ms", "worst event-loop delay ms"],
    ["l", "r", "r", "r", "r"],
    rows.map((r) => [r.where, String(r.calls), perCall.toFixed(0), r.elapsedMs.toFixed(0), r.maxLoopDelayMs.toFixed(1)]),
  );
}

export function callsTable(rows: readonly CallRow[]): string {
  const f = (v: number): string => (v < 10 ? v.toFixed(2) : v.toFixed(1));
  return table(
    ["call", "QuickJS, this thread", "via workers, one at a time", "(its CPU)", "via workers, pipelined", "(its CPU)", "V8, same function", "V8 + new Request", "QuickJS ÷ V8 + Request"],
    ["l", "r", "r", "r", "r", "r", "r", "r", "r"],
    rows.map((r) => [
      r.call,
      f(r.sandboxMicros),
      f(r.workerSequentialMicros),
      f(r.workerSequentialCpuMicros),
      f(r.workerPipelinedMicros),
      f(r.workerPipelinedCpuMicros),
      f(r.nativeMicros),
      f(r.nativeWithRequestMicros),
      `${(r.sandboxMicros / r.nativeWithRequestMicros).toFixed(1)}×`,
    ]),
  );
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const quick = process.argv.includes("--quick");
  const rows = await measureCalls(quick);
  const stall = await measureStall();
  if (process.argv.includes("--json")) process.stdout.write(`${JSON.stringify({ calls: rows, stall })}\n`);
  else {
    process.stdout.write(`Tier-2 call cost, µs per call (median of rounds)\n\n${callsTable(rows)}\n`);
    process.stdout.write(`\nA slow policy and the proxy's event loop\n\n${stallTable(stall)}\n`);
  }
}
