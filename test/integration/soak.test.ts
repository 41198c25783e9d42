import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { tempDir } from "../helpers/proxy.js";

const root = fileURLToPath(new URL("../../", import.meta.url));

interface Reading {
  readonly fds: number;
  readonly rssBytes: number;
  readonly heapUsedBytes: number;
  readonly liveBytes: number;
}

interface SoakSummary {
  readonly requests: number;
  readonly failed: number;
  readonly bodies: { readonly checked: number; readonly matched: number };
  readonly perKind: Record<string, { readonly sent: number; readonly failed: number; readonly examples: string[] }>;
  readonly proxy: {
    readonly pid: number;
    readonly stayedUp: boolean;
    readonly servesAfter: boolean;
    readonly baseline: Reading;
    readonly after: Reading | undefined;
    readonly rssLimitBytes: number;
    readonly heapLimitBytes: number;
    readonly eventLoop: { readonly p99Ms: number } | undefined;
  };
  readonly upstream: { readonly unhooked: number; readonly stalledOpen: number };
  readonly tolerance: { readonly fdsAbsolute: number };
  readonly failures: string[];
  readonly passed: boolean;
}

/** Runs the soak as `npm run soak` does (tsx), on src/, and resolves with its exit code and output. */
function runSoak(args: readonly string[]): Promise<{ code: number | null; output: string }> {
  const child = spawn(process.execPath, ["--import", "tsx", "bench/soak.ts", ...args], { cwd: root, stdio: ["ignore", "pipe", "pipe"] });
  let output = "";
  child.stdout.on("data", (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on("data", (chunk: Buffer) => (output += chunk.toString()));
  // The soak stops its own children on SIGTERM; whatever is left when the test ends goes too.
  onTestFinished(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
  });
  return new Promise((resolve) => child.once("exit", (code) => resolve({ code, output })));
}

function alive(pid: number): boolean {
  return existsSync(`/proc/${pid}`) && !readFileSync(`/proc/${pid}/stat`, "utf8").includes(") Z ");
}

describe("npm run soak", () => {
  it("a small soak loses nothing, matches every body, and leaves the proxy up with its fds, V8 heap and RSS back", async () => {
    const json = join(tempDir(), "soak.json");
    // 2,500 requests are too few for RSS to settle: identical runs ended from 24 MiB below to 25
    // MiB above their baseline of about 220 MiB (allocator and V8 page retention, the tier-2
    // heaps' high marks). So this run holds RSS to 25% for gross leaks, and the V8 heap in use,
    // which counts live objects exactly, to the soak's own line. The full soak holds RSS to 5%.
    // The settle outlasts the proxy's 4 s upstream keep-alive, so pooled sockets are gone.
    const { code, output } = await runSoak([
      // A warm-up of 500 pays the JIT's and the heap's one-time growth before the baseline.
      ...["--requests", "2500", "--warmup", "500", "--concurrency", "64", "--settle-ms", "5000", "--deadline-ms", "20000"],
      ...["--rss-tolerance", "0.25", "--from", "src", "--json", json],
    ]);
    expect(existsSync(json), output.slice(-3000)).toBe(true);
    const summary = JSON.parse(readFileSync(json, "utf8")) as SoakSummary;
    const failedKinds = Object.entries(summary.perKind)
      .filter(([, tally]) => tally.failed > 0)
      .map(([name, tally]) => `${name}: ${tally.failed} of ${tally.sent}, e.g. ${tally.examples[0]}`);

    expect(summary.requests).toBe(2500);
    expect(failedKinds).toEqual([]);
    expect(summary.failed).toBe(0);
    expect(summary.bodies.checked).toBeGreaterThan(2000);
    expect(summary.bodies.matched).toBe(summary.bodies.checked);
    expect(summary.proxy.stayedUp).toBe(true);
    expect(summary.proxy.servesAfter).toBe(true);
    expect(summary.upstream).toMatchObject({ unhooked: 0, stalledOpen: 0 });
    expect(summary.proxy.after!.fds).toBeLessThanOrEqual(summary.proxy.baseline.fds + summary.tolerance.fdsAbsolute);
    expect(summary.proxy.after!.rssBytes).toBeLessThanOrEqual(summary.proxy.rssLimitBytes);
    expect(summary.proxy.rssLimitBytes).toBeLessThanOrEqual(summary.proxy.baseline.rssBytes * 1.25 + 1);
    expect(summary.proxy.after!.liveBytes).toBeLessThanOrEqual(summary.proxy.heapLimitBytes);
    expect(summary.proxy.eventLoop?.p99Ms).toBeGreaterThan(0);
    expect(summary.failures).toEqual([]);
    expect(summary.passed).toBe(true);
    expect(code, output.slice(-3000)).toBe(0);
    // The soak stopped every process it started.
    expect(alive(summary.proxy.pid)).toBe(false);
  }, 150_000);
});
