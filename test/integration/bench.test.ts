import { execFile, execFileSync, spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { beforeAll, describe, expect, it } from "vitest";
import { tempDir } from "../helpers/proxy.js";

const root = fileURLToPath(new URL("../../", import.meta.url));

function hasCommand(name: string): boolean {
  return spawnSync("sh", ["-c", `command -v ${name}`], { stdio: "ignore" }).status === 0;
}

interface RateRow {
  readonly target: string;
  readonly concurrency: number;
  readonly requestsPerSecond: number;
  readonly requests: number;
  readonly errors: number;
  readonly firstError?: string;
}

beforeAll(() => {
  // The bench runs dist/ (the CLI and the package), as a user's `npm run bench` does.
  if (!existsSync(join(root, "dist", "cli", "bin.js"))) execFileSync("npm", ["run", "build"], { cwd: root, stdio: "inherit", timeout: 170_000 });
}, 180_000);

describe("npm run bench", () => {
  it("a tiny run gives figures for every target it started, and names any it skipped", async () => {
    const out = join(tempDir(), "bench.json");
    const targets = ["direct", "tcp-relay", "egressgate", "egressgate-api", "egressgate+hooks", "egressgate+djs", "egressgate+webhook", "mockttp", "http-mitm-proxy", "mitmdump"];
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile(
        process.execPath,
        ["--import", "tsx", "bench/run.ts", "--quick", "--scenarios", "small", "--rounds", "1", "--seconds", "0.2", "--targets", targets.join(","), "--out", out],
        { cwd: root, timeout: 120_000, maxBuffer: 16 * 1024 * 1024 },
        (error, text, stderr) => (error === null ? resolve(text) : reject(new Error(`${error.message}\n${stderr}`))),
      );
    });
    const json = JSON.parse(readFileSync(out, "utf8")) as { skipped: Record<string, string>; dropped: Record<string, string>; results: { small: RateRow[] } };
    expect(json.dropped).toEqual({});
    const ran = targets.filter((t) => json.skipped[t] === undefined);
    // mitmdump is the only target that may be absent (when mitmproxy is not installed), with a reason.
    for (const skipped of Object.keys(json.skipped)) expect(skipped).toBe("mitmdump");
    for (const target of ran) {
      for (const concurrency of [1, 32]) {
        const row = json.results.small.find((r) => r.target === target && r.concurrency === concurrency);
        expect(row?.requests, `${target} at ${concurrency}`).toBeGreaterThan(0);
        expect(row?.errors, `${target} at ${concurrency}: ${row?.firstError}`).toBe(0);
        expect(row?.requestsPerSecond, `${target} at ${concurrency}`).toBeGreaterThan(0);
      }
    }
    // The printed report has the table, the ratios and the hooks comparison.
    expect(stdout).toContain("## Small HTTPS GETs");
    expect(stdout).toContain("× best peer");
    expect(stdout).toContain("no-op tier-2 pair");
    expect(stdout).toContain("no-op tier-3 pair");
    // The external decider against no source, and its goal line.
    expect(stdout).toContain("local webhook (cacheMs off)");
    expect(stdout).toContain("External deciders: a local webhook adds under 0.3 ms p50");
  }, 150_000);

  it("the side scenario loads egressgate and egressgate+metrics in the same windows and prints the paired ratios and the metrics goal", async () => {
    const out = join(tempDir(), "bench-side.json");
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile(
        process.execPath,
        ["--import", "tsx", "bench/run.ts", "--quick", "--scenarios", "side", "--rounds", "2", "--seconds", "0.2", "--targets", "egressgate,egressgate+metrics", "--out", out],
        { cwd: root, timeout: 120_000, maxBuffer: 16 * 1024 * 1024 },
        (error, text, stderr) => (error === null ? resolve(text) : reject(new Error(`${error.message}\n${stderr}`))),
      );
    });
    const json = JSON.parse(readFileSync(out, "utf8")) as {
      dropped: Record<string, string>;
      windows: { side: { round: number; baseRequestsPerSecond: number; targetRequestsPerSecond: number; baseCpuMicrosPerRequest?: number; targetCpuMicrosPerRequest?: number; errors: number }[] };
      results: { side: { target: string; base: string; requestsPerSecondRatio: { n: number; median: number } }[] };
    };
    expect(json.dropped).toEqual({});
    expect(json.windows.side.map((w) => w.round)).toEqual([1, 2]);
    for (const w of json.windows.side) {
      expect(w.errors).toBe(0);
      // Both were loaded in the same window, each with its own CPU per request.
      expect(w.baseRequestsPerSecond).toBeGreaterThan(0);
      expect(w.targetRequestsPerSecond).toBeGreaterThan(0);
      expect(w.baseCpuMicrosPerRequest).toBeGreaterThan(0);
      expect(w.targetCpuMicrosPerRequest).toBeGreaterThan(0);
    }
    expect(json.results.side).toHaveLength(1);
    expect(json.results.side[0]).toMatchObject({ target: "egressgate+metrics", base: "egressgate", requestsPerSecondRatio: { n: 2 } });
    expect(stdout).toContain("## Side by side");
    expect(stdout).toMatch(/Metrics cost under 3% .*\| side by side: [0-9.]+× \(/);
  }, 150_000);

  it("the h2 scenario gives HTTP/2 and HTTP/1.1 figures side by side, the ratio to h1, and an h2 download's RSS", async () => {
    const out = join(tempDir(), "bench-h2.json");
    const targets = ["direct", "egressgate", "mitmdump"];
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile(
        process.execPath,
        ["--import", "tsx", "bench/run.ts", "--quick", "--scenarios", "h2", "--rounds", "1", "--seconds", "0.2", "--targets", targets.join(","), "--out", out],
        { cwd: root, timeout: 120_000, maxBuffer: 16 * 1024 * 1024 },
        (error, text, stderr) => (error === null ? resolve(text) : reject(new Error(`${error.message}\n${stderr}`))),
      );
    });
    const json = JSON.parse(readFileSync(out, "utf8")) as {
      skipped: Record<string, string>;
      dropped: Record<string, string>;
      results: {
        h2: (RateRow & { variant: string; ratioToH1?: number; machineCpuPercent?: number })[];
        h2Paced: { variant: string; requestsPerSecond: number; errors: number; proxyCpuMicrosPerRequest?: number }[];
        h2Downloads: { upstream: string; errors: number; peakRssMiB?: number; failure?: string }[];
      };
    };
    expect(json.dropped).toEqual({});
    for (const skipped of Object.keys(json.skipped)) expect(skipped).toBe("mitmdump");
    const expected: [string, string][] = [
      ["direct", "h2-1-h2up"],
      ...["h1-32-h1up", "h2-1-h1up", "h2-8-h1up", "h2-1-h2up", "h2-8-h2up", "h1-32-h2up", "raw-h1-32-h1up", "raw-h2-1-h1up", "raw-h2-8-h1up", "raw-h2-1-h2up", "raw-h2-8-h2up"].map((v): [string, string] => ["egressgate", v]),
      ...(json.skipped["mitmdump"] === undefined ? ["h1-32-h1up", "h2-1-h2up", "h2-8-h2up"].map((v): [string, string] => ["mitmdump", v]) : []),
      // h2load through socat, when Debian's nghttp2-client and socat are installed.
      ...(hasCommand("h2load") && hasCommand("socat") ? ["h2load-h1-32-h1up", "h2load-1-h1up", "h2load-8-h1up"].map((v): [string, string] => ["egressgate", v]) : []),
    ];
    for (const [target, variant] of expected) {
      const row = json.results.h2.find((r) => r.target === target && r.variant === variant);
      expect(row?.requests, `${target} ${variant}`).toBeGreaterThan(0);
      expect(row?.errors, `${target} ${variant}: ${row?.firstError}`).toBe(0);
    }
    // The ratio to the HTTP/1.1 row of the same run is computed for every egressgate h2 row.
    // The minimal clients' h2 rows are compared with their own HTTP/1.1 row, not undici's.
    const ratioRows = json.results.h2.filter((r) => r.target === "egressgate" && /^(h2|raw-h2)/.test(r.variant));
    expect(ratioRows.length).toBeGreaterThanOrEqual(6);
    for (const row of ratioRows) expect(row.ratioToH1, row.variant).toBeGreaterThan(0);
    const rps = (variant: string): number => json.results.h2.find((r) => r.target === "egressgate" && r.variant === variant)!.requestsPerSecond;
    expect(json.results.h2.find((r) => r.variant === "raw-h2-1-h1up")!.ratioToH1).toBeCloseTo(rps("raw-h2-1-h1up") / rps("raw-h1-32-h1up"), 6);
    // h2load's h2 rows against h2load's own HTTP/1.1 row, through the same relay.
    if (hasCommand("h2load") && hasCommand("socat")) {
      expect(json.results.h2.find((r) => r.variant === "h2load-8-h1up")!.ratioToH1).toBeCloseTo(rps("h2load-8-h1up") / rps("h2load-h1-32-h1up"), 6);
    }
    // Each window records the machine's busy CPU, and each row its median.
    for (const row of json.results.h2.filter((r) => r.target === "egressgate")) expect(row.machineCpuPercent, row.variant).toBeGreaterThan(0);
    // egressgate's rows again at a fixed offered load, each with its CPU per request.
    expect(json.results.h2Paced.map((r) => r.variant)).toEqual(["h1-32-h1up", "h2-1-h1up", "h2-8-h1up"]);
    for (const row of json.results.h2Paced) {
      expect(row.errors, row.variant).toBe(0);
      expect(row.requestsPerSecond, row.variant).toBeGreaterThan(0);
      expect(row.proxyCpuMicrosPerRequest, row.variant).toBeGreaterThan(0);
    }
        // Both downloads on one h2 stream completed, each with the proxy's peak RSS read.
    expect(json.results.h2Downloads.map((d) => [d.upstream, d.errors, d.failure])).toEqual([
      ["h1", 0, undefined],
      ["h2", 0, undefined],
    ]);
    for (const d of json.results.h2Downloads) expect(d.peakRssMiB).toBeGreaterThan(0);
    expect(stdout).toContain("## HTTP/2: small GETs at concurrency 32, against HTTP/1.1");
    expect(stdout).toMatch(/HTTP\/2 small GETs c=32 over one connection: ≥ 1\.2× the h1 figure \(same run\) \| [\d.]+×/);
    expect(stdout).toMatch(/HTTP\/2 small GETs c=32 over 8 connections from the minimal clients \(against their HTTP\/1\.1 row\): ≥ 1\.2× the h1 figure \(same run\) \| [\d.]+×/);
  }, 150_000);

  // Node's own servers, no proxy: the floor that bounds the proxy's HTTP/2 ratio (docs/performance.md).
  it.skipIf(!hasCommand("h2load"))("bench/h2-floor.ts measures Node's HTTP/1.1 and HTTP/2 servers with one client and prints the ratio per lane", async () => {
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile(
        process.execPath,
        ["--import", "tsx", "bench/h2-floor.ts", "--rounds", "2", "--requests", "3000"],
        { cwd: root, timeout: 120_000, maxBuffer: 16 * 1024 * 1024 },
        (error, text, stderr) => (error === null ? resolve(text) : reject(new Error(`${error.message}\n${stderr}`))),
      );
    });
    expect(stdout.match(/^round \d\/2: /gm)).toHaveLength(2);
    const rows = [...stdout.matchAll(/^\| (HTTP\/[^|]+) \| ([\d.]+) \| ([\d.]+)× \(([\d.]+)–([\d.]+)×\) \|$/gm)];
    expect(rows.map((row) => row[1]!.trim())).toEqual(["HTTP/1.1, 32 connections", "HTTP/2, 8 connections x 4 streams", "HTTP/2, 1 connection x 32 streams"]);
    // Every lane measured: CPU per request, and the per-round ratios to the HTTP/1.1 lane.
    for (const row of rows) {
      for (const figure of [row[2], row[3], row[4], row[5]]) {
        expect(Number.isFinite(Number(figure)), `${row[1]}: ${figure}`).toBe(true);
        expect(Number(figure), `${row[1]}: ${figure}`).toBeGreaterThan(0);
      }
    }
  }, 150_000);
});
