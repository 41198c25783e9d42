/**
 * `npm run bench`: egressgate against direct, a plain CONNECT relay and peer MITM proxies, side by
 * side in one run, over five scenarios (bench/scenarios.ts):
 *
 *   small    small HTTPS GETs, keep-alive, concurrency 1 and 32 (also egressgate-api and, on the
 *            same script, egressgate+hooks, egressgate+djs and egressgate+djs-allowlist: the cost
 *            of a no-op tier-3 pair, a no-op tier-2 pair and a tier-2 header allowlist; and
 *            egressgate+webhook and egressgate+command: an external decider, a local webhook or a
 *            command, each against no source, as added p50 latency and req/s)
 *   newconn  the same GETs with a new connection per request, concurrency 8
 *   hosts    the first request to each of 1,000 new hostnames (100 in quick mode)
 *   bulk     a 32 MiB upload to the Node upstream and a 32 MiB download from openssl s_server
 *            (or from the Node upstream, with --bulk-upstream node)
 *   big      a 1 GiB download through a fresh egressgate process: its RSS growth; and again
 *            through one with an onResponse-only tier-2 policy
 *   h2       small GETs over HTTP/2 (one and 8 guest connections, an h2-only upstream) against the
 *            HTTP/1.1 figure of the same run, egressgate and mitmdump; 1 GiB on one h2 stream
 *            through a fresh egressgate process (bench/h2-scenario.ts)
 *
 *   calls    tier-2 call costs: QuickJS in-thread and through the workers, next to V8 (bench/djs-calls.ts)
 *
 * Targets: direct, tcp-relay, egressgate (CLI), egressgate-w2 (CLI, --workers 2), egressgate-api, the hooked ones above, mockttp,
 * http-mitm-proxy, and mitmdump when it is installed (bench/targets.ts). Upstreams, each proxy
 * and the load generator (bench/load.ts) run in their own processes, all on 127.0.0.1.
 *
 *   npm run build && npm run bench               (about 14 minutes on 2 cores)
 *   npm run bench -- --quick                     (about 2½ minutes)
 *   npm run bench -- --quick --cpu-prof          (also profiles the egressgate child)
 *
 * Prints one markdown table per scenario and the goals of issue 6, and writes everything to
 * bench/results/<YYYY-MM-DD>.json. docs/performance.md records a run and reads it.
 */
import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, writeFileSync } from "node:fs";
import { cpus, loadavg, release, tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { ask, cleanup, forkTs, installCleanup, isStopping, root, setWorkDir, statusKb, stopChild, waitExit } from "./children.js";
import type { LoadReply, LoadSetup, TargetName } from "./load.js";
import { callsTable, stallTable, type CallRow, type StallRow } from "./djs-calls.js";
import {
  bigRow,
  bigTable,
  bulkRows,
  bulkTable,
  compareDeciders,
  compareHooks,
  deciderGoal,
  decidersTable,
  goals,
  goalsTable,
  hooksTable,
  hostsRows,
  hostsTable,
  metricsGoal,
  sideRows,
  sideTable,
  rateRows,
  rateTable,
  type BigRow,
} from "./report.js";
import { profileTables, summarizeProfile, type ProfileSummary } from "./profile.js";
import { Harness, hostsFor, runBig, runBulk, runHosts, runRate, runSideBySide, scenarioNames, type BulkWindow, type HostsWindow, type RateWindow, type ScenarioName, type SideWindow } from "./scenarios.js";
import { pinPlan, pinTree, pinUnavailable, type PinPlan } from "./pin.js";
import { h1Baseline, h2Targets, h2Variants, runH2, runH2Downloads, type H2DownloadResult, type H2Variant, type H2Window } from "./h2-scenario.js";
import { h2DownloadRows, h2DownloadTable, h2Goals, h2PacedRows, h2PacedTable, h2Rows, h2Table } from "./h2-report.js";
import { allTargets, egressgateTargets, hookedTargets, smallOnlyTargets, startTargets, type EgressgateTarget } from "./targets.js";

/**
 * The h2 scenario's fixed offered load for its CPU-per-request comparison at equal throughput:
 * well under what egressgate sustains on 2 busy cores over either protocol.
 */
const h2PacedRate = 1000;

interface BenchSettings {
  readonly mode: "quick" | "full";
  /** Where the JSON goes instead of bench/results/<date>.json (the harness test uses a temp file). */
  readonly out: string | undefined;
  readonly targets: readonly TargetName[];
  readonly scenarios: readonly ScenarioName[];
  /** small and newconn: interleaved rounds, and each window's timing. */
  readonly rounds: number;
  /** The small scenario's concurrencies (1 and 32 unless --concurrency names others). */
  readonly smallConcurrencies: readonly number[];
  readonly initialWarmupMs: number;
  readonly warmupMs: number;
  readonly measureMs: number;
  readonly newconnConcurrency: number;
  readonly hosts: { readonly rounds: number; readonly perRound: number; readonly warmup: number; readonly windowMaxMs: number; readonly controlEvery: number };
  readonly bulk: { readonly rounds: number; readonly count: number; readonly bytes: number };
  readonly bigBytes: number;
  /** The h2 scenario's downloads on one stream: 1 GiB, 64 MiB in quick mode. */
  readonly h2DownloadBytes: number;
  /** Where bulk downloads come from: openssl s_server (the default) or the Node upstream. */
  readonly bulkUpstream: "openssl" | "node";
  /** The egressgate child run under `node --cpu-prof`, if any. */
  readonly cpuProf: EgressgateTarget | undefined;
  /** The h2 scenario's rows, when only some are wanted (`--h2-variants`); all by default. */
  readonly h2Variants: readonly H2Variant[] | undefined;
  /** `--pin`: the proxies on the last core, everything else on the others (bench/pin.ts). */
  readonly pin: PinPlan | undefined;
}

const usage = `usage: npm run bench -- [--quick] [--targets LIST] [--scenarios LIST] [--rounds N] [--seconds S] [--hosts N] [--cpu-prof[=TARGET]]
  --quick            shorter windows, 100 new hostnames, 2 rounds, no egressgate-w2 (about 2½ minutes on 2 cores);
                     the default (full) takes about 14 minutes
  --targets LIST     comma-separated, from ${allTargets.join(", ")}
  --scenarios LIST   comma-separated, from ${scenarioNames.join(", ")}
  --rounds N         interleaved rounds of small and newconn, 1..100
  --concurrency LIST the small scenario's concurrencies, comma-separated (default 1,32)
  --seconds S        measured seconds per small/newconn window, 0.2..30
  --hosts N          new hostnames per target in the hosts scenario, 1..5000
  --bulk-upstream U  where bulk and 1 GiB downloads come from: openssl (s_server -HTTP, the default) or node
  --h2-variants LIST the h2 scenario's rows, comma-separated (default all): fewer rows put each
                     HTTP/2 window closer in time to its HTTP/1.1 window, so that the machine's drift
                     between them is smaller; a row's HTTP/1.1 baseline is added when not named
  --out FILE         write the JSON there instead of bench/results/<date>.json
  --cpu-prof         run the egressgate child under node --cpu-prof and print its top self-time functions;
                     --cpu-prof=egressgate+hooks (or egressgate-api) profiles that child instead
  --pin              the proxies under test on the last CPU, this process, the load generator and the
                     upstreams on the others (taskset; Linux, 2 CPUs or more): req/s is then what one
                     core of proxy serves, not what the scheduler left it. Every proxy shares that one
                     CPU, so egressgate-w2 and the side scenario then measure one core`;

function parseList<T extends string>(flag: string, list: string | undefined, allowed: readonly T[]): T[] {
  const names = (list ?? "").split(",").filter((name) => name !== "");
  for (const name of names) {
    if (!(allowed as readonly string[]).includes(name)) throw new RangeError(`${flag}: unknown name ${JSON.stringify(name)}\n${usage}`);
  }
  // Kept in the canonical order, whatever order they were named in.
  const chosen = allowed.filter((t) => names.includes(t));
  if (chosen.length === 0) throw new RangeError(`${flag}: expected at least one of ${allowed.join(", ")}`);
  return chosen;
}

function parseArgs(argv: readonly string[]): BenchSettings {
  const quick = argv.includes("--quick");
  // Quick mode leaves out egressgate-w2 unless asked for (`--targets`): comparing process counts
  // wants the full run's longer windows, and quick mode must stay short.
  let targets: readonly TargetName[] = quick ? allTargets.filter((t) => t !== "egressgate-w2") : allTargets;
  let scenarios: readonly ScenarioName[] = scenarioNames;
  let rounds = quick ? 2 : 5;
  let smallConcurrencies: readonly number[] = [1, 32];
  let measureMs = quick ? 600 : 2_000;
  let hostCount = quick ? 100 : 1_000;
  let cpuProf: EgressgateTarget | undefined;
  let bulkUpstream: "openssl" | "node" = "openssl";
  let out: string | undefined;
  let h2VariantList: readonly H2Variant[] | undefined;
  let pin: PinPlan | undefined;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const [flag, inline] = arg.startsWith("--") && arg.includes("=") ? [arg.slice(0, arg.indexOf("=")), arg.slice(arg.indexOf("=") + 1)] : [arg, undefined];
    const text = (): string | undefined => inline ?? argv[++i];
    const number = (): number => {
      const raw = text();
      const n = Number(raw);
      if (raw === undefined || raw === "" || !Number.isFinite(n)) throw new RangeError(`${flag}: expected a number, got ${JSON.stringify(raw)}\n${usage}`);
      return n;
    };
    if (flag === "--quick") continue;
    else if (flag === "--pin") {
      const why = pinUnavailable();
      if (why !== undefined) throw new RangeError(why);
      pin = pinPlan();
    }
    else if (flag === "--cpu-prof") {
      const name = inline ?? "egressgate";
      if (!(egressgateTargets as readonly string[]).includes(name)) throw new RangeError(`--cpu-prof: expected one of ${egressgateTargets.join(", ")}, got ${JSON.stringify(name)}`);
      cpuProf = name as EgressgateTarget;
    } else if (flag === "--targets") targets = parseList("--targets", text(), allTargets);
    else if (flag === "--scenarios") scenarios = parseList("--scenarios", text(), scenarioNames);
    else if (flag === "--rounds") rounds = number();
    else if (flag === "--concurrency") {
      smallConcurrencies = (text() ?? "").split(",").filter((c) => c !== "").map(Number);
      if (smallConcurrencies.length === 0 || smallConcurrencies.some((c) => !Number.isInteger(c) || c < 1 || c > 256)) throw new RangeError(`--concurrency: expected a comma-separated list of 1..256`);
    }
    else if (flag === "--seconds") measureMs = number() * 1000;
    else if (flag === "--hosts") hostCount = number();
    else if (flag === "--out") out = text();
    else if (flag === "--h2-variants") {
      const named = parseList("--h2-variants", text(), Object.keys(h2Variants) as H2Variant[]);
      h2VariantList = (Object.keys(h2Variants) as H2Variant[]).filter((v) => named.includes(v) || named.some((n) => h1Baseline(n) === v));
    }
    else if (flag === "--bulk-upstream") {
      const value = text();
      if (value !== "openssl" && value !== "node") throw new RangeError(`--bulk-upstream: expected openssl or node, got ${JSON.stringify(value)}`);
      bulkUpstream = value;
    }
    else if (flag === "--help" || flag === "-h") {
      process.stdout.write(`${usage}\n`);
      process.exit(0);
    } else throw new TypeError(`unknown argument ${JSON.stringify(arg)}\n${usage}`);
  }
  if (!Number.isInteger(rounds) || rounds < 1 || rounds > 100) throw new RangeError(`--rounds: expected 1..100, got ${rounds}`);
  if (measureMs < 200 || measureMs > 30_000) throw new RangeError(`--seconds: expected 0.2..30, got ${measureMs / 1000}`);
  if (!Number.isInteger(hostCount) || hostCount < 1 || hostCount > 5_000) throw new RangeError(`--hosts: expected 1..5000, got ${hostCount}`);
  if (cpuProf !== undefined && !targets.includes(cpuProf)) targets = allTargets.filter((t) => targets.includes(t) || t === cpuProf);
  const hostRounds = Math.min(hostCount, quick ? 2 : 4);
  return {
    mode: quick ? "quick" : "full",
    out,
    targets,
    scenarios,
    rounds,
    smallConcurrencies,
    initialWarmupMs: quick ? 300 : 1_500,
    warmupMs: quick ? 150 : 500,
    measureMs,
    newconnConcurrency: 8,
    hosts: { rounds: hostRounds, perRound: Math.ceil(hostCount / hostRounds), warmup: quick ? 3 : 5, windowMaxMs: quick ? 3_000 : 12_000, controlEvery: 10 },
    bulk: { rounds: quick ? 2 : 3, count: quick ? 2 : 3, bytes: 32 * 2 ** 20 },
    bigBytes: 2 ** 30,
    h2DownloadBytes: quick ? 64 * 2 ** 20 : 2 ** 30,
    bulkUpstream,
    cpuProf,
    h2Variants: h2VariantList,
    pin,
  };
}

/**
 * The targets of a scenario: egressgate-api and the hooked targets only take part in small GETs;
 * egressgate-w2 (two cluster workers) in everything but the new-hostname scenario, whose names
 * only the single-process egressgate is set up to resolve.
 */
function targetsOf(settings: BenchSettings, scenario: ScenarioName): TargetName[] {
  if (scenario === "small") return [...settings.targets];
  // The CLI and the CLI with metrics, loaded at once (the only pair it measures).
  if (scenario === "side") return settings.targets.includes("egressgate") && settings.targets.includes("egressgate+metrics") ? ["egressgate", "egressgate+metrics"] : [];
  if (scenario === "h2") return settings.targets.filter((t) => h2Targets.includes(t));
  return settings.targets.filter((t) => t !== "egressgate-api" && !hookedTargets.includes(t) && !smallOnlyTargets.includes(t) && (scenario !== "hosts" || t !== "egressgate-w2"));
}

function machineInfo(loadBefore: readonly number[]): Record<string, unknown> {
  const cpu = cpus();
  return {
    cpus: cpu.length,
    cpuModel: cpu[0]?.model.trim() ?? "unknown",
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    os: `${process.platform} ${release()}`,
    loadAverageBefore: loadBefore.map((n) => Math.round(n * 100) / 100),
    loadAverageAfter: loadavg().map((n) => Math.round(n * 100) / 100),
  };
}

async function main(): Promise<void> {
  const settings = parseArgs(process.argv.slice(2));
  const started = performance.now();
  const loadBefore = loadavg();
  installCleanup();
  // Before any child starts, so that every one of them inherits the load cores.
  if (settings.pin !== undefined) pinTree(process.pid, settings.pin.loadCpus);
  const dir = mkdtempSync(join(tmpdir(), "egressgate-bench-"));
  setWorkDir(dir);
  const profileDir = settings.cpuProf !== undefined ? join(dir, "profile") : undefined;
  const has = (s: ScenarioName): boolean => settings.scenarios.includes(s);
  const log = (line: string): void => void process.stderr.write(`${line}\n`);

  const runBigScenario = has("big") && settings.targets.includes("egressgate");
  const withH2Downloads = has("h2") && settings.targets.includes("egressgate");
  const downloadSizes = [
    ...(has("bulk") ? [settings.bulk.bytes] : []),
    ...(runBigScenario ? [settings.bigBytes] : []),
    ...(withH2Downloads && !(runBigScenario && settings.h2DownloadBytes === settings.bigBytes) ? [settings.h2DownloadBytes] : []),
  ];
  // Only what the chosen scenarios use: egressgate-api and the hooked targets take part in small GETs only.
  const needed = settings.targets.filter((target) => settings.scenarios.some((s) => s !== "big" && s !== "calls" && targetsOf(settings, s).includes(target)));
  const t = await startTargets({
    dir,
    targets: needed,
    egressgateHostnames: has("hosts") && settings.targets.includes("egressgate") ? hostsFor(settings.hosts, "egressgate") : [],
    downloadSizes,
    bulkUpstream: settings.bulkUpstream,
    cpuProf: settings.cpuProf,
    profileDir,
    freshEgressgate: runBigScenario,
    freshEgressgateH2: withH2Downloads,
  });
  const targets = needed.filter((target) => !t.skipped.has(target));
  if (settings.pin !== undefined) {
    const proxyPids = [...t.proxies.values(), t.freshEgressgate, t.freshEgressgateDjs, t.freshEgressgateH2].map((p) => p?.child.pid);
    for (const pid of [...proxyPids, t.relay?.pid]) if (pid !== undefined) pinTree(pid, settings.pin.proxyCpus);
  }
  for (const [target, why] of t.skipped) log(`bench: skipping ${target}: ${why}`);

  const load = forkTs("./load.ts", "load");
  const proxies: Record<string, { url: string; caPem: string }> = Object.fromEntries([...t.proxies].map(([name, p]) => [name, { url: p.url, caPem: p.caPem }]));
  if (t.relayPort !== undefined) proxies["tcp-relay"] = { url: `http://127.0.0.1:${t.relayPort}`, caPem: t.upstreamCaPem };
  if (t.freshEgressgate !== undefined) proxies["egressgate-fresh"] = { url: t.freshEgressgate.url, caPem: t.freshEgressgate.caPem };
  if (t.freshEgressgateDjs !== undefined) proxies["egressgate-fresh-djs"] = { url: t.freshEgressgateDjs.url, caPem: t.freshEgressgateDjs.caPem };
  if (t.freshEgressgateH2 !== undefined) proxies["egressgate-fresh-h2"] = { url: t.freshEgressgateH2.url, caPem: t.freshEgressgateH2.caPem };
  // 4 s, undici's own default, is shorter than any target's idle close (egressgate 5 s, mockttp
  // 6 s), so an idle connection is always closed by the client. A request sent on a connection in
  // the moment its target closes it fails with ECONNRESET; mockttp invites that race by passing on
  // the upstream's `Keep-Alive: timeout=120` while it closes after 6 s. The warm-up before every
  // window reopens what the turn-taking closed.
  const loadSetup: LoadSetup = { kind: "setup", upstreamCaPem: t.upstreamCaPem, proxies, keepAliveMs: 4_000 };
  await ask(load, "ready", loadSetup, 30_000);

  const pidOf = (target: TargetName): number | undefined => (target === "tcp-relay" ? t.relay?.pid : t.proxies.get(target)?.child.pid);
  const proxied = targets.filter((x) => x !== "direct");
  const idleRss = Object.fromEntries(proxied.map((x) => [x, statusKb(pidOf(x), "VmRSS")]));
  log(
    `bench (${settings.mode}): scenarios ${settings.scenarios.join(", ")}; targets ${targets.join(", ")}; ` +
      `upstream :${t.upstreamPort}${t.bulk !== undefined ? `, s_server :${t.bulk.port}` : ""}; started in ${((performance.now() - started) / 1000).toFixed(1)} s`,
  );

  const h = new Harness(load, t, log);
  const only = (scenario: ScenarioName): TargetName[] => targetsOf(settings, scenario).filter((x) => targets.includes(x));
  const rate = { rounds: settings.rounds, initialWarmupMs: settings.initialWarmupMs, measureMs: settings.measureMs };
  let smallWindows: RateWindow[] = [];
  let sideWindows: SideWindow[] = [];
  let newconnWindows: RateWindow[] = [];
  let hostsWindows: HostsWindow[] = [];
  let bulkWindows: BulkWindow[] = [];
  let big: BigRow | undefined;
  let h2Windows: H2Window[] = [];
  let h2Downloads: H2DownloadResult[] = [];
  const timings: Record<string, number> = {};
  const timed = async <T>(name: string, fn: () => Promise<T>): Promise<T> => {
    const t0 = performance.now();
    try {
      return await fn();
    } finally {
      timings[name] = Math.round((performance.now() - t0) / 100) / 10;
    }
  };
  if (has("small")) {
    smallWindows = await timed("small", () => runRate(h, { ...rate, scenario: "small", targets: only("small"), concurrencies: settings.smallConcurrencies, newConnections: false, warmupMs: settings.warmupMs }));
  }
  if (has("newconn")) {
    newconnWindows = await timed("newconn", () =>
      runRate(h, { ...rate, scenario: "newconn", targets: only("newconn"), concurrencies: [settings.newconnConcurrency], newConnections: true, warmupMs: 0 }),
    );
  }
  if (has("hosts")) hostsWindows = await timed("hosts", () => runHosts(h, { ...settings.hosts, targets: only("hosts") }));
  if (has("bulk")) {
    bulkWindows = await timed("bulk", () => runBulk(h, { ...settings.bulk, targets: only("bulk"), windowMaxMs: 60_000 }));
  }
  if (has("side") && only("side").length === 2) {
    sideWindows = await timed("side", () =>
      runSideBySide(h, { base: "egressgate", targets: ["egressgate+metrics"], concurrency: 32, rounds: settings.rounds, initialWarmupMs: settings.initialWarmupMs, warmupMs: settings.warmupMs, measureMs: settings.measureMs }),
    );
  }
  if (has("h2")) {
    h2Windows = await timed("h2", () => runH2(h, { ...rate, targets: only("h2"), concurrency: 32, warmupMs: settings.warmupMs, pacedRate: h2PacedRate, variants: settings.h2Variants }));
    if (t.freshEgressgateH2 !== undefined) {
      const fresh = t.freshEgressgateH2;
      h2Downloads = await timed("h2 downloads", () => runH2Downloads(h, settings.h2DownloadBytes));
      await stopChild(fresh.child);
    }
  }
  let calls: CallRow[] = [];
  let stall: StallRow[] = [];
  if (has("calls")) {
    // In its own process, while the proxies idle: the table compares QuickJS with V8, not with load.
    ({ calls, stall } = await timed("calls", async () => {
      const out = execFileSync(process.execPath, ["--import", "tsx", join(root, "bench", "djs-calls.ts"), "--json", ...(settings.mode === "quick" ? ["--quick"] : [])], {
        cwd: root,
        encoding: "utf8",
        timeout: 300_000,
      });
      return JSON.parse(out.trim().split("\n").pop() ?? "{}") as { calls: CallRow[]; stall: StallRow[] };
    }));
  }
  let bigWithPolicy: BigRow | undefined;
  if (t.freshEgressgate !== undefined) {
    const result = await timed("big", () => runBig(h, settings.bigBytes));
    big = bigRow(result);
    await stopChild(t.freshEgressgate.child);
  }
  if (t.freshEgressgateDjs !== undefined) {
    const result = await timed("big+policy", () => runBig(h, settings.bigBytes, true));
    bigWithPolicy = bigRow(result);
    await stopChild(t.freshEgressgateDjs.child);
  }

  const summary = (await ask<Extract<LoadReply, { kind: "summary" }>>(load, "summary", { kind: "summary" }, 10_000)).entries;
  const rssAtEnd = Object.fromEntries(proxied.map((x) => [x, statusKb(pidOf(x), "VmRSS")]));
  const relayConnects = t.relay !== undefined ? (await ask<{ kind: "stats"; connects: number }>(t.relay, "stats", { kind: "stats" }, 10_000)).connects : undefined;

  // Close the load generator first, so the proxies' drains find nothing in flight.
  load.send({ kind: "close" });
  await waitExit(load, 5_000);
  let profile: ProfileSummary | undefined;
  let profileFile: string | undefined;
  if (settings.cpuProf !== undefined && profileDir !== undefined) {
    const child = t.proxies.get(settings.cpuProf)?.child;
    const exited = child !== undefined && (await stopChild(child, 10_000)) && child.signalCode === null;
    const written = exited && existsSync(profileDir) ? readdirSync(profileDir).find((f) => f.endsWith(".cpuprofile")) : undefined;
    if (written !== undefined) {
      // Kept outside the temp dir (which cleanup removes) for Chrome DevTools or speedscope.
      profileFile = join(tmpdir(), `egressgate-bench-${new Date().toISOString().replace(/[:.]/g, "-")}.cpuprofile`);
      copyFileSync(join(profileDir, written), profileFile);
      profile = summarizeProfile(profileFile);
    }
  }

  const smallRows = rateRows("small", only("small"), smallWindows, summary);
  const newconnRows = rateRows("newconn", only("newconn"), newconnWindows, summary);
  const hosts = hostsRows(only("hosts"), hostsWindows);
  const bulk = bulkRows(only("bulk"), bulkWindows);
  const hooks = compareHooks(smallRows);
  const deciders = compareDeciders(smallRows);
  const deciderGoalRow = deciderGoal(deciders);
  const metricsCost = compareHooks(smallRows, ["egressgate+metrics"], "egressgate");
  const side = sideRows(sideWindows);
  const metricsGoalRow = metricsGoal(metricsCost, side);
  const h2 = h2Rows(h2Windows, summary);
  const h2Paced = h2PacedRows(h2Windows);
  const h2DownloadList = h2DownloadRows(h2Downloads);
  const goalList = [
    ...goals({ small: smallRows, newconn: newconnRows, hosts, bulk, big, egressgateFailure: h.dropped.get("egressgate") }),
    ...(deciderGoalRow !== undefined ? [deciderGoalRow] : []),
    ...(metricsGoalRow !== undefined ? [metricsGoalRow] : []),
    ...h2Goals(h2, h2DownloadList),
  ];
  const machine = machineInfo(loadBefore);
  const totalSeconds = (performance.now() - started) / 1000;
  const out: string[] = [];
  const print = (text: string): void => void out.push(text);

  print(`# egressgate bench, ${settings.mode} mode\n`);
  print(
    `${String(machine["cpus"])}× ${String(machine["cpuModel"])}, node ${process.version}, ${t.versions["openssl"]}; ` +
      `load average ${(machine["loadAverageBefore"] as number[]).join(" ")} before, ${(machine["loadAverageAfter"] as number[]).join(" ")} after; ` +
      `peers: ${["mockttp", "http-mitm-proxy", "mitmdump"].map((p) => `${p} ${t.versions[p] ?? "(not run)"}`).join(", ")}`,
  );
  if (settings.pin !== undefined) print(`\nPinned (--pin): the proxies on CPU ${settings.pin.proxyCpus}, the load generator, the upstreams and this process on CPU ${settings.pin.loadCpus}.`);
  for (const [target, why] of t.skipped) print(`\n**${target} not run**: ${why}`);
  for (const [target, why] of h.dropped) print(`\n**${target} dropped out**: ${why}`);
  if (smallRows.length > 0) {
    print(`\n## Small HTTPS GETs (${100}-byte body), keep-alive\n`);
    print(`${settings.rounds} interleaved rounds of ${settings.measureMs / 1000} s windows; req/s is the median window, latencies pool all windows.\n`);
    print(rateTable(smallRows));
    if (hooks.length > 0) {
      print("\nHooks (each hooked target ÷ `egressgate-api`, the same script but for the hooks; proxy CPU includes the tier-2 worker threads, the event-loop thread column leaves them out):\n");
      print(hooksTable(hooks));
    }
    if (metricsCost.length > 0) {
      print("\nMetrics (`egressgate+metrics` ÷ `egressgate`: the same CLI with `--metrics-listen`, scraped every second during the run):\n");
      print(hooksTable(metricsCost));
    }
    if (deciders.length > 0) {
      print("\nExternal deciders (each against `egressgate-api`, the same script with no source; the webhook is a process of its own on 127.0.0.1, and the command a new process per request):\n");
      print(decidersTable(deciders));
    }
  }
  if (side.length > 0) {
    print("\n## Side by side: egressgate and egressgate+metrics loaded in the same seconds\n");
    print(
      `${settings.rounds} windows of ${settings.measureMs / 1000} s; concurrency 32 to each from one load generator. Each window's ratios are paired; ` +
        "the median of those ratios is the figure, with its distribution-free 95% interval.\n",
    );
    print(sideTable(side));
  }
  if (newconnRows.length > 0) {
    print(`\n## New connection per request, concurrency ${settings.newconnConcurrency}\n`);
    print("Each GET is sent with `reset: true`: a new CONNECT, a new TLS session to the proxy and whatever the proxy does upstream.\n");
    print(rateTable(newconnRows));
  }
  if (hosts.length > 0) {
    print(`\n## First request to each of ${settings.hosts.rounds * settings.hosts.perRound} new hostnames, one at a time\n`);
    print(
      `Each over a new connection; every ${settings.hosts.controlEvery}th is followed by a new connection to an already-seen hostname. ` +
        `Windows stop after ${settings.hosts.windowMaxMs / 1000} s, so a slow target does fewer hostnames.\n`,
    );
    print(hostsTable(hosts));
  }
  if (bulk.length > 0) {
    const source = settings.bulkUpstream === "openssl" ? "openssl s_server" : "the Node upstream";
    print(`\n## 32 MiB upload (Node upstream) and 32 MiB download (${source}), one at a time\n`);
    print(`MB/s is 10^6 bytes per second, the median transfer of ${settings.bulk.rounds} rounds × ${settings.bulk.count}; p50/p99 are transfer times.\n`);
    print(bulkTable(bulk));
  }
  if (calls.length > 0) {
    print("\n## Tier-2 calls, µs per call (bench/djs-calls.ts)\n");
    print("The same functions in a QuickJS sandbox (this thread; through the proxy's worker threads, one call at a time and pipelined, wall clock and the CPU of all the process's threads) and natively in V8 (on a prebuilt Request, and with the Request built per call as tier 3 does).\n");
    print(callsTable(calls));
    print("\nA slow policy and the proxy's event loop: 16 calls of a busy loop, all in flight, while a 1 ms timer on the proxy's thread measures how late it fires.\n");
    print(stallTable(stall));
  }
  if (big !== undefined) {
    print(`\n## 1 GiB download (${settings.bulkUpstream === "openssl" ? "openssl s_server" : "the Node upstream"}) through egressgate\n`);
    print(bigTable(bigWithPolicy === undefined ? [big] : [big, bigWithPolicy]));
  }
  if (h2.length > 0 || h2DownloadList.length > 0) {
    print(`\n## HTTP/2: small GETs at concurrency 32, against HTTP/1.1 (issue 20)\n`);
    print(
      `${settings.rounds} interleaved rounds of ${settings.measureMs / 1000} s windows, 32 requests (streams) in flight. ` +
        "`× h1` is req/s ÷ the same target's HTTP/1.1 row (32 connections, h1 upstream, the `small` path); `h1 CPU ÷ this` is that row's proxy CPU per request ÷ this row's.\n",
    );
    if (h2.length > 0) print(h2Table(h2));
    if (h2Paced.length > 0) {
      print(`\negressgate again, each row offered ${h2PacedRate} req/s (32 in flight at most, about one in practice): proxy CPU per request at equal throughput, where streams share no wake-ups or TLS records, so multiplexing saves nothing:\n`);
      print(h2PacedTable(h2Paced));
    }
    if (h2DownloadList.length > 0) {
      print(`\nOne ${settings.h2DownloadBytes / 2 ** 20} MiB download on one HTTP/2 stream each, through a fresh egressgate process (peak RSS reset before each):\n`);
      print(h2DownloadTable(h2DownloadList));
    }
  }
  print(`\n## Goals (issue 6, DESIGN.md §8)\n`);
  print(goalsTable(goalList));
  const idleText = proxied.map((x) => `${x} ${((idleRss[x] ?? Number.NaN) / 1024).toFixed(0)}`).join(", ");
  print(`\nIdle RSS before any load, MiB: ${idleText}.${proxied.includes("tcp-relay") ? " tcp-relay runs under tsx, which adds about 35 MiB." : ""}`);
  if (!h.peakResettable) print("(VmHWM could not be reset between windows: a peak RSS is the process lifetime's)");
  if (settings.cpuProf !== undefined) print(`(${settings.cpuProf} ran under --cpu-prof: its figures include the profiler's overhead)`);
  if (profile !== undefined) {
    print(`\n## ${settings.cpuProf} CPU profile: ${(profile.busyMs / 1000).toFixed(1)} s busy (idle excluded)\n`);
    print(profileTables(profile));
    print(`\nprofile: ${profileFile}`);
  } else if (settings.cpuProf !== undefined) print(`\n(no CPU profile was written: ${settings.cpuProf} did not exit cleanly)`);

  const date = new Date().toISOString().slice(0, 10);
  const resultsDir = join(root, "bench", "results");
  mkdirSync(resultsDir, { recursive: true });
  const resultsFile = settings.out ?? join(resultsDir, `${date}.json`);
  const json = {
    date,
    command: `npm run bench${process.argv.length > 2 ? ` -- ${process.argv.slice(2).join(" ")}` : ""}`,
    settings,
    machine,
    versions: t.versions,
    skipped: Object.fromEntries(t.skipped),
    dropped: Object.fromEntries(h.dropped),
    durationSeconds: Math.round(totalSeconds),
    scenarioSeconds: timings,
    goals: goalList,
    results: { small: smallRows, side, newconn: newconnRows, hosts, bulk, big, bigWithPolicy, h2, h2Paced, h2Downloads: h2DownloadList },
    hooksVsNoHooks: hooks,
    decidersVsNoSource: deciders,
    tier2Calls: calls,
    tier2Stall: stall,
    rssAtStartKb: idleRss,
    rssAtEndKb: rssAtEnd,
    relayConnectsSeenByRelay: relayConnects,
    windows: { small: smallWindows, side: sideWindows, newconn: newconnWindows, hosts: hostsWindows, bulk: bulkWindows, h2: h2Windows },
    ...(profile !== undefined ? { cpuProfile: profile } : {}),
  };
  writeFileSync(resultsFile, `${JSON.stringify(json, null, 2)}\n`);
  print(`\nresults: ${resultsFile.startsWith(root) ? resultsFile.slice(root.length) : resultsFile} (${totalSeconds.toFixed(0)} s; ${Object.entries(timings).map(([k, v]) => `${k} ${v} s`).join(", ")})`);
  console.log(out.join("\n"));
}

try {
  await main();
} catch (error) {
  if (!isStopping()) process.stderr.write(`bench: ${(error as Error).stack ?? String(error)}\n`);
  process.exitCode = 1;
} finally {
  await cleanup();
}
