import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FuzzHarness, type FuzzTarget } from "../helpers/fuzz/harness.js";

/**
 * A short seeded run of the fuzzer (bench/fuzz.ts runs long ones): a proxy in a child process,
 * recording upstreams, and the cases of fixed seeds through real sockets, each judged by every
 * oracle (test/helpers/fuzz/harness.ts). A failure lists each finding with its seed, target and
 * index, which `node --import tsx bench/fuzz.ts --seed S --target T --first I --cases 1 --show`
 * (with `--policy` for the second block, `--auth` for the third, `--hooks --guests 3` for the
 * fourth, `--deciders` for the fifth) replays alone.
 */
interface Run {
  readonly target: FuzzTarget;
  readonly seed: string;
  readonly cases: number;
  readonly what: string;
}

const runs: readonly Run[] = [
  { target: "h1", seed: "suite-1", cases: 300, what: "HTTP/1.1 requests inside a TLS tunnel" },
  { target: "plain", seed: "suite-1", cases: 500, what: "absolute-form requests on the listener" },
  { target: "connect", seed: "suite-1", cases: 500, what: "CONNECT request lines and headers" },
  { target: "h2", seed: "suite-1", cases: 120, what: "HTTP/2 frames after ALPN h2" },
  { target: "tls", seed: "suite-1", cases: 400, what: "TLS ClientHellos after CONNECT" },
];

/** With a tier-2 policy that reads every upload: requests take the hooks' path (buffered bodies, checks after onRequest). */
const policyRuns: readonly Run[] = [
  { target: "h1", seed: "suite-2", cases: 120, what: "HTTP/1.1 requests inside a TLS tunnel" },
  { target: "plain", seed: "suite-2", cases: 200, what: "absolute-form requests on the listener" },
  { target: "h2", seed: "suite-2", cases: 50, what: "HTTP/2 frames after ALPN h2" },
];

/** With a guest that authenticates: credentials on every request on the listener, now and then wrong. */
const authRuns: readonly Run[] = [
  { target: "plain", seed: "suite-3", cases: 300, what: "absolute-form requests with credentials" },
  { target: "connect", seed: "suite-3", cases: 300, what: "CONNECT request lines with credentials" },
  { target: "h1", seed: "suite-3", cases: 100, what: "HTTP/1.1 requests inside an authenticated TLS tunnel" },
];

/**
 * Against upstreams that answer badly (test/helpers/fuzz/hostile-upstream.ts), with tier-3 hooks
 * that give every answer a hook may give, and three guests, each with its own secret's value.
 */
const hostileRuns: readonly Run[] = [
  { target: "upstream", seed: "suite-4", cases: 60, what: "answers from hostile HTTP/1.1 and HTTP/2 upstreams, through tier-3 hooks" },
  { target: "guests", seed: "suite-4", cases: 30, what: "cases of two or three guests at once" },
  { target: "h2guest", seed: "suite-4", cases: 40, what: "answers from hostile upstreams to an HTTP/2 guest, through tier-3 hooks" },
];

/**
 * With a webhook and an OPA decider that answer the `decider` cases badly
 * (test/helpers/fuzz/hostile-decider.ts), and WebSocket upgrades to upstreams that answer them
 * badly (hostile-websocket.ts).
 */
const deciderRuns: readonly Run[] = [
  { target: "decider", seed: "suite-5", cases: 120, what: "requests whose external decider answers badly" },
  { target: "websocket", seed: "suite-5", cases: 120, what: "WebSocket upgrades to hostile upstreams, with a hostile guest" },
];

function fuzzes(runsOf: readonly Run[], options: { readonly policy?: boolean; readonly auth?: boolean; readonly hooks?: boolean; readonly guests?: number; readonly deciders?: boolean }): void {
  let harness: FuzzHarness;
  beforeAll(async () => {
    harness = await FuzzHarness.start(options);
  });
  afterAll(async () => {
    await harness.close();
  });

  for (const { target, seed, cases, what } of runsOf) {
    it(`${cases} mutated ${what} (seed ${seed}) leave the proxy serving, answer well-formed or close, and leak nothing`, { timeout: 120_000 }, async () => {
      const result = await harness.run({ seed, cases, targets: [target] });
      expect(result.cases).toBe(cases);
      expect(harness.restarts, "the proxy process died").toBe(0);
      expect(result.findings.map((f) => `${f.oracle} (seed ${f.seed}, ${f.target} #${f.index}): ${f.detail.slice(0, 600)} [${f.steps.join("; ")}]`)).toEqual([]);
    });
  }
}

describe("the seeded fuzz run", () => {
  fuzzes(runs, {});
});

describe("the seeded fuzz run with a tier-2 policy", () => {
  fuzzes(policyRuns, { policy: true });
});

describe("the seeded fuzz run with a guest that authenticates", () => {
  fuzzes(authRuns, { auth: true });
});

describe("the seeded fuzz run against hostile upstreams, with tier-3 hooks and three guests", () => {
  fuzzes(hostileRuns, { hooks: true, guests: 3 });
});

describe("the seeded fuzz run against hostile deciders and WebSocket upstreams", () => {
  fuzzes(deciderRuns, { deciders: true });
});
