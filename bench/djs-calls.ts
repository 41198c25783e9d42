/**
 * Tier-2 call costs, side by side: the same functions run in a QuickJS sandbox (on this thread,
 * and through the worker threads the proxy uses, one call at a time and pipelined), and natively
 * in V8 on a WHATWG Request (on a prebuilt one, and with the Request built per call as tier 3
 * does). Every figure is the median of several rounds, in microseconds per call.
 *
 *   npx tsx bench/djs-calls.ts [--quick] [--json]
 *
 * It prints what it measured and judges nothing.
 */
import { bundlePolicy } from "../src/djs/bundle.js";
import { createDjsHooks, defaultDjsLimits } from "../src/djs/create-djs-hooks.js";
import type { CallMessage, PhaseName } from "../src/djs/protocol.js";
import { Sandbox } from "../src/djs/sandbox.js";
import { headerAllowlistSource } from "./policies.js";
import { table } from "./report.js";

const emptySource = `export function isIpAllowed() { return true; }\nexport function onRequest() {}\nexport function onResponse() {}`;

const url = "https://origin.bench.test/repos/egressgate/egressgate/contents/README.md?ref=main";
const headerList = ["accept", "application/json", "user-agent", "undici", "accept-encoding", "gzip", "host", "origin.bench.test"];

function message(phase: PhaseName): Omit<CallMessage, "id"> {
  const base = { phase, now: Date.now(), method: "GET", url, headers: headerList.join("\n"), hasBody: false };
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

async function timeAsync(n: number, rounds: number, fn: () => Promise<unknown>, pipelined: boolean): Promise<number> {
  const loop = async (): Promise<void> => {
    if (pipelined) await Promise.all(Array.from({ length: n }, fn));
    else for (let i = 0; i < n; i++) await fn();
  };
  await loop();
  const samples: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const t0 = performance.now();
    await loop();
    samples.push(((performance.now() - t0) * 1000) / n);
  }
  return median(samples);
}

export interface CallRow {
  readonly call: string;
  readonly sandboxMicros: number;
  readonly workerSequentialMicros: number;
  readonly workerPipelinedMicros: number;
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
    const msg = { ...message(phase), id: 0 };
    const check = sandbox.call(msg).reply.outcome;
    if (check.t !== "code") throw new Error(`${call}: the sandbox answered ${JSON.stringify(check)}`);
    rows.push({
      call,
      sandboxMicros: timeSync(n, rounds, () => sandbox.call(msg)),
      workerSequentialMicros: await timeAsync(Math.ceil(n / 4), rounds, () => engine.call(message(phase)), false),
      workerPipelinedMicros: await timeAsync(n, rounds, () => engine.call(message(phase)), true),
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

export function callsTable(rows: readonly CallRow[]): string {
  const f = (v: number): string => (v < 10 ? v.toFixed(2) : v.toFixed(1));
  return table(
    ["call", "QuickJS, this thread", "via workers, one at a time", "via workers, pipelined", "V8, same function", "V8 + new Request", "QuickJS ÷ V8 + Request"],
    ["l", "r", "r", "r", "r", "r", "r"],
    rows.map((r) => [
      r.call,
      f(r.sandboxMicros),
      f(r.workerSequentialMicros),
      f(r.workerPipelinedMicros),
      f(r.nativeMicros),
      f(r.nativeWithRequestMicros),
      `${(r.sandboxMicros / r.nativeWithRequestMicros).toFixed(1)}×`,
    ]),
  );
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const quick = process.argv.includes("--quick");
  const rows = await measureCalls(quick);
  if (process.argv.includes("--json")) process.stdout.write(`${JSON.stringify(rows)}\n`);
  else process.stdout.write(`Tier-2 call cost, µs per call (median of rounds)\n\n${callsTable(rows)}\n`);
}
