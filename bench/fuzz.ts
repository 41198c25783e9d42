/**
 * The seeded mutation fuzzer of the proxy's guest-facing parsers, and of what it makes of
 * upstreams that answer badly (test/helpers/fuzz/): a proxy in a child process, recording and
 * hostile upstreams, and cases of each target one by one through real sockets, every one judged
 * by every oracle (harness.ts). A case is a pure function of its seed,
 * target and index, so a finding is replayed with `--seed S --target T --first I --cases 1`.
 *
 *   node --import tsx bench/fuzz.ts --seed 1 --cases 2000 --target h1,plain,connect,h2
 *   node --import tsx bench/fuzz.ts --seed 1 --cases 2000 --target upstream,guests --hooks --guests 3
 *   node --import tsx bench/fuzz.ts --seed 1 --cases 2000 --target h2guest --hooks
 *   node --import tsx bench/fuzz.ts --seed 1 --cases 2000 --target decider,websocket --deciders
 *
 * `--policy` runs the proxy with a tier-2 policy that reads every upload (harness.ts, fuzzPolicy);
 * `--auth` makes its guest authenticate, and every request on the listener carry credentials;
 * `--hooks` adds tier-3 hooks whose every answer each request chooses (fuzz-proxy-child.ts);
 * `--guests N` serves N guests, each with its own secret's value (target `guests` runs several
 * at once; the other targets run as the first).
 * `h2guest` sends `upstream` cases from a `node:http2` guest in a TLS tunnel (h2-guest-run.ts);
 * `--deciders` puts a webhook (both phases, with bodies) and an OPA decider in every guest's
 * chain, which target `decider` makes answer badly (hostile-decider.ts, decider-inputs.ts);
 * `websocket` upgrades to upstreams that answer badly, with a guest that misbehaves too
 * (hostile-websocket.ts, websocket-inputs.ts).
 *
 * Prints one JSON line per finding, progress on stderr, and a summary line at the end; exits 1
 * if anything was found.
 */
import { parseArgs } from "node:util";
import { FuzzHarness, fuzzTargets, type FuzzTarget } from "../test/helpers/fuzz/harness.js";

const { values } = parseArgs({
  options: {
    seed: { type: "string", default: "1" },
    cases: { type: "string", default: "500" },
    first: { type: "string", default: "0" },
    target: { type: "string", default: fuzzTargets.join(",") },
    "timeout-ms": { type: "string", default: "1500" },
    verbose: { type: "boolean", default: false },
    show: { type: "boolean", default: false },
    policy: { type: "boolean", default: false },
    auth: { type: "boolean", default: false },
    hooks: { type: "boolean", default: false },
    guests: { type: "string", default: "1" },
    deciders: { type: "boolean", default: false },
  },
});
// `guests` needs several guests, `decider` the deciders; the default list leaves them out without.
const targets = (
  values.target === fuzzTargets.join(",") ? fuzzTargets.filter((t) => (t !== "guests" || Number(values.guests) >= 2) && (t !== "decider" || values.deciders)) : values.target.split(",")
) as FuzzTarget[];
for (const target of targets) if (!fuzzTargets.includes(target)) throw new Error(`--target: ${target} is not one of ${fuzzTargets.join(", ")}`);
const harness = await FuzzHarness.start({ timeoutMs: Number(values["timeout-ms"]), policy: values.policy, auth: values.auth, hooks: values.hooks, guests: Number(values.guests), deciders: values.deciders });
// Stopped early (Ctrl-C, timeout): the proxy's child, the upstreams and the CA folder go too.
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => void harness.close().finally(() => process.exit(130)));
}
const cases = Number(values.cases);
if (values.show) {
  for (let index = Number(values.first); index < Number(values.first) + cases; index++) {
    for (const target of targets) {
      const input = harness.caseOf(target, values.seed, index);
      if ("guests" in input) {
        process.stderr.write(`${JSON.stringify({ target, index, steps: input.steps })}\n`);
        continue;
      }
      if ("decider" in input) {
        process.stderr.write(`${JSON.stringify({ target, index, steps: input.steps, request: `${input.method} ${input.via} ${input.target}`, verdicts: input.verdicts, script: input.script.map((s) => (typeof s === "string" ? s : "write" in s ? s.write.toString("latin1").slice(0, 400) : "pause" in s ? `pause ${s.pause}` : "?")) })}\n`);
        continue;
      }
      if ("early" in input) {
        process.stderr.write(`${JSON.stringify({ target, index, steps: input.steps, via: input.via, fields: input.fields, early: input.early.length, late: input.late.length, cut: input.cut, expect: { ...input.expect, after: input.expect.after?.bytes.length } })}\n`);
        continue;
      }
      if ("outcome" in input) {
        // An upstream case's bytes are the upstream's: its steps say what they were.
        process.stderr.write(`${JSON.stringify({ target, index, steps: input.steps, request: `${input.method} ${input.target}`, fields: input.fields, outcome: input.outcome, script: input.script.map((s) => (typeof s === "string" ? s : "write" in s ? s.write.toString("latin1") : "pause" in s ? `pause ${s.pause}` : "smuggle" in s ? `smuggle ${s.smuggle}` : s.frame(1).toString("hex"))) })}\n`);
        continue;
      }
      const inside = "inside" in input && input.inside !== undefined ? { inside: input.inside.bytes.toString("latin1") } : {};
      process.stderr.write(`${JSON.stringify({ target, index, steps: input.steps, writes: input.writes.map((w) => w.toString("latin1")), ...inside })}\n`);
    }
  }
}
let last = Date.now();
const result = await harness.run({
  seed: values.seed,
  cases,
  first: Number(values.first),
  targets,
  onFinding: (finding) => console.log(JSON.stringify(values.verbose ? { ...finding, log: harness.lastLog().slice(-20) } : finding)),
  onProgress: (done) => {
    if (Date.now() - last > 10_000) {
      last = Date.now();
      process.stderr.write(`${done}/${cases * targets.length} cases\n`);
    }
  },
});
await harness.close();
const byOracle: Record<string, number> = {};
for (const f of result.findings) byOracle[f.oracle] = (byOracle[f.oracle] ?? 0) + 1;
console.log(JSON.stringify({ seed: values.seed, targets, cases: result.cases, seconds: result.ms / 1000, casesPerSecond: Math.round((result.cases / result.ms) * 1000), findings: result.findings.length, byOracle, restarts: harness.restarts, settled: harness.settled, statuses: Object.fromEntries([...harness.stats].sort()) }));
process.exitCode = result.findings.length > 0 ? 1 : 0;
