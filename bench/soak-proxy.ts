/**
 * The soak's proxy: one egressgate process built with the embedding API, so it has both a
 * tier-2 policy (a module file, loaded as `--hooks-script` loads it) and tier-3 hooks:
 *
 * - tier 3 `onRequest` marks every request, blocks on `x-soak-t3: block` (429), and reads the
 *   upload through `request.clone()` on `read-request`;
 * - tier 3 `onResponse` replaces the response on `replace`, reads it on `read`, throws on `throw`.
 *
 * Forked by bench/soak.ts with an IPC channel and `--expose-gc`. It reads its settings from
 * SOAK_PROXY_SETTINGS (JSON) and imports egressgate from SOAK_EGRESSGATE (a file URL: dist/ for
 * `npm run soak`, src/ under tsx for the test), then reports `ready`. It answers `mark` (start
 * of the load: the event-loop delay histogram restarts), `stats` and `gc`. It exits when the
 * soak disconnects, so it cannot outlive it.
 *
 * bench/soak.ts transpiles this file for plain node, as the bench does with hooked-proxy.ts, so
 * it must import nothing but node builtins and the package.
 */
import { monitorEventLoopDelay } from "node:perf_hooks";
import { join } from "node:path";
import { writeHeapSnapshot } from "node:v8";
import type * as Egressgate from "../src/index.js";

export interface SoakProxySettings {
  readonly caDir: string;
  readonly upstreamCaPem: string;
  readonly policyFile: string;
  readonly resolve: Readonly<Record<string, readonly string[]>>;
  readonly allowedInternalHosts: readonly string[];
  readonly allowedHosts: readonly string[];
  readonly upstreamBodyMs: number;
  readonly dnsMs: number;
  readonly limits: { readonly timeoutMs: number; readonly memoryBytes: number; readonly stackBytes: number };
  readonly headers: { readonly tier3: string; readonly seen3: string };
  readonly replacedText: string;
}

export type SoakProxyMessage =
  | { readonly kind: "ready"; readonly url: string; readonly caCertPem: string }
  | { readonly kind: "marked" }
  | { readonly kind: "gc-done"; readonly heapUsedBytes: number; readonly heapTotalBytes: number }
  | { readonly kind: "snapshot-done"; readonly file: string }
  | {
      readonly kind: "stats";
      readonly eventLoopP99Ms: number;
      readonly eventLoopP50Ms: number;
      readonly eventLoopMaxMs: number;
      readonly heapUsedBytes: number;
      /** Log lines by level, and warn/error lines by message. */
      readonly logLevels: Readonly<Record<string, number>>;
      readonly logMessages: Readonly<Record<string, number>>;
    }
  | { readonly kind: "lines"; readonly lines: Readonly<Record<string, string>> };

const settings = JSON.parse(process.env["SOAK_PROXY_SETTINGS"] ?? "null") as SoakProxySettings | null;
const moduleUrl = process.env["SOAK_EGRESSGATE"];
if (settings === null || moduleUrl === undefined || process.send === undefined) {
  process.stderr.write("bench/soak-proxy.ts is started by bench/soak.ts (it needs SOAK_PROXY_SETTINGS, SOAK_EGRESSGATE and an IPC channel)\n");
  process.exit(2);
}
const { createDjsHooks, createHttpHooks, djsHooksOptionsFromFile, HttpRequestBlockedError, startProxy } = (await import(moduleUrl)) as typeof Egressgate;

const logLevels: Record<string, number> = {};
const logMessages: Record<string, number> = {};
/**
 * The last decision lines with a 5xx status, by target, so that the soak can print the proxy's
 * own account (code, detail, time taken) of a request that failed unexpectedly. Bounded: the
 * oldest go first.
 */
const serverErrors = new Map<string, string>();
const serverErrorsKept = 20_000;
// Every line is counted; only warn and error lines are parsed, for their message.
const logSink = (line: string): void => {
  const level = /"level":"(\w+)"/.exec(line)?.[1] ?? "?";
  logLevels[level] = (logLevels[level] ?? 0) + 1;
  const target = /"status":5\d\d\b.*?"target":"([^"]*)"|"target":"([^"]*)".*?"status":5\d\d\b/.exec(line);
  if (target !== null) {
    const key = target[1] ?? target[2] ?? "";
    serverErrors.delete(key);
    serverErrors.set(key, line);
    if (serverErrors.size > serverErrorsKept) serverErrors.delete(serverErrors.keys().next().value as string);
  }
  if (level !== "warn" && level !== "error") return;
  let msg = "?";
  try {
    msg = String((JSON.parse(line) as { msg?: unknown }).msg);
  } catch {
    // Not JSON: counted under "?".
  }
  const key = `${level}: ${msg}`;
  logMessages[key] = (logMessages[key] ?? 0) + 1;
};

const { tier3, seen3 } = settings.headers;
const djs = createDjsHooks({ ...djsHooksOptionsFromFile(settings.policyFile), limits: settings.limits });
const { httpHooks, env } = createHttpHooks({
  allowedHosts: [...settings.allowedHosts],
  allowedInternalHosts: [...settings.allowedInternalHosts],
  ...djs,
  onRequest: async (request: Request) => {
    const t3 = request.headers.get(tier3);
    if (t3 === "block") throw new HttpRequestBlockedError("soak: tier 3 blocks this request", 429, "Too Many Requests");
    if (t3 === "read-request") await request.clone().arrayBuffer();
    request.headers.set(seen3, "seen");
    return undefined;
  },
  onResponse: async (response: Response, request: Request) => {
    const t3 = request.headers.get(tier3);
    if (t3 === "replace") return new Response(settings.replacedText, { status: 200, headers: { "content-type": "text/plain" } });
    if (t3 === "read") await response.arrayBuffer();
    if (t3 === "throw") throw new Error("soak: tier 3 onResponse throws");
    return undefined;
  },
});

const proxy = await startProxy({
  httpHooks,
  env,
  listen: { host: "127.0.0.1", port: 0 },
  caDir: settings.caDir,
  resolve: settings.resolve,
  upstreamCa: [settings.upstreamCaPem],
  timeouts: { upstreamBodyMs: settings.upstreamBodyMs, dnsMs: settings.dnsMs },
  logLevel: "info",
  logSink,
});

const delay = monitorEventLoopDelay({ resolution: 10 });
delay.enable();
const send = (message: SoakProxyMessage): void => void process.send?.(message);
/**
 * A full, synchronous V8 collection of the main thread: plain `gc()`. On Node 20 (V8 11.3),
 * `gc({ type: "major", execution: "sync", flavor: "last-resort" })`, which these readings used
 * before, collects nothing in the old generation (it behaves like a scavenge): 180 MiB of dead
 * arrays stayed at 180 MiB in use after it, and went to 2.7 MiB after `gc()`. The readings then
 * measured how much garbage was waiting, 24 to 60 MiB of it (docs/reliability.md).
 */
const gc = (globalThis as { gc?: () => void }).gc;
const collect = (): void => gc?.();

process.on("disconnect", () => process.exit(0));
process.on("message", (message: { kind?: string }) => {
  if (message.kind === "mark") {
    delay.reset();
    send({ kind: "marked" });
  } else if (message.kind === "stats") {
    const ms = (ns: number): number => ns / 1e6;
    send({
      kind: "stats",
      eventLoopP99Ms: ms(delay.percentile(99)),
      eventLoopP50Ms: ms(delay.percentile(50)),
      eventLoopMaxMs: ms(delay.max),
      heapUsedBytes: process.memoryUsage().heapUsed,
      logLevels,
      logMessages,
    });
  } else if (message.kind === "lines") {
    const targets = (message as { targets?: readonly string[] }).targets ?? [];
    const lines: Record<string, string> = {};
    for (const target of targets) {
      // The log's target may be written differently (a default port, a redacted query): fall
      // back to the line whose target ends with the same path and query.
      let line = serverErrors.get(target);
      if (line === undefined) {
        const tail = /^[a-z]+:\/\/[^/]+(\/.*)$/.exec(target)?.[1];
        if (tail !== undefined) for (const [key, value] of serverErrors) if (key.endsWith(tail)) line = value;
      }
      if (line !== undefined) lines[target] = line;
    }
    send({ kind: "lines", lines });
  } else if (message.kind === "snapshot") {
    // The parent reads the file: parsing it here would grow the very process being measured.
    const file = writeHeapSnapshot(join(settings.caDir, "..", `live-${Date.now()}.heapsnapshot`));
    send({ kind: "snapshot-done", file });
  } else if (message.kind === "gc") {
    // Two full collections a turn apart: the first one's finalizers free more for the second.
    collect();
    setImmediate(() => {
      collect();
      const { heapUsed, heapTotal } = process.memoryUsage();
      send({ kind: "gc-done", heapUsedBytes: heapUsed, heapTotalBytes: heapTotal });
    });
  }
});
send({ kind: "ready", url: proxy.url, caCertPem: proxy.caCertPem });
