import { describe, expect, it } from "vitest";
import { buildAuditRecord, type AuditRecord } from "../../src/metrics/audit-record.js";
import { Counter, Histogram, Registry } from "prom-client";
import { createProxyMetrics, decisionOf, failureKind, ruleOf } from "../../src/metrics/metrics.js";
import { tallyCounter, tallyHistogram } from "../../src/metrics/tally.js";
import type { HookFailureKind } from "../../src/errors.js";

const base: AuditRecord = { time: "2026-01-01T00:00:00.000Z", guest: "g", method: "GET", url: "https://a.test/", status: 200, reason: "", sources: [], redirects: 0, bytesUp: 0, bytesDown: 0, ms: 1 };

describe("metric labels", () => {
  it("names an allowed request by its allowlist rule and a refusal by the phase and source that refused, never by host", () => {
    expect(ruleOf({ ...base, rule: { tier: "declarative", rule: "allowedHosts:*.a.test", reason: 'host "x.a.test" matches' } })).toBe("allowedHosts:*.a.test");
    expect(ruleOf({ ...base, rule: { tier: "tier2", rule: "onRequest", reason: "r", source: "policy.ts" } })).toBe("tier2:policy.ts");
    const refused = { ...base, status: 403, sources: [{ source: "declarative", tier: "declarative", phase: "allowlist", decision: "block" as const, reason: 'host "evil.test" is not in allowedHosts', ms: 0 }] };
    expect(ruleOf(refused)).toBe("declarative:allowlist");
    expect(ruleOf({ ...base, status: 400, code: "EG_BAD_REQUEST" })).toBe("EG_BAD_REQUEST");
  });

  it("tells allow, deny, error and a guest that left apart", () => {
    const rule = { tier: "declarative", rule: "allowedHosts:a.test", reason: "" };
    expect(decisionOf({ ...base, rule })).toBe("allow");
    expect(decisionOf({ ...base, rule, status: 404 })).toBe("allow");
    expect(decisionOf({ ...base, status: 403 })).toBe("deny");
    expect(decisionOf({ ...base, status: 502 })).toBe("error");
    expect(decisionOf({ ...base, rule, status: 504 })).toBe("error");
    expect(decisionOf({ ...base, status: 499 })).toBe("gone");
  });

  it("takes a hook failure's kind from the failure it carries, never from its message", () => {
    const entry = (reason: string, failure?: HookFailureKind) => ({ source: "p.ts", tier: "tier2", phase: "onRequest", decision: "error" as const, reason, ...(failure !== undefined ? { failure } : {}), ms: 0 });
    for (const kind of ["time", "memory", "stack", "invalid", "throw", "busy"] as const) expect(failureKind(entry("TypeError: x is undefined", kind))).toBe(kind);
    // A message that names a kind is no kind: one without a carried failure counts as a throw.
    expect(failureKind(entry("policy p.ts onRequest exceeded its time limit (50 ms)"))).toBe("throw");
    expect(failureKind(entry("onRequest returned an invalid header"))).toBe("throw");
    expect(failureKind(entry("command:x is busy: 2 processes are running", "busy"))).toBe("busy");
  });

  it("exposes the tallied series exactly as prom-client's own counter and histogram would", async () => {
    const registry = new Registry();
    const counter = tallyCounter({ name: "t_total", help: "h", labelNames: ["a", "b"], registry });
    const histogram = tallyHistogram({ name: "t_seconds", help: "h", labelNames: ["a"], buckets: [0.1, 1, 10], registry });
    const reference = new Registry();
    const promCounter = new Counter({ name: "t_total", help: "h", labelNames: ["a", "b"], registers: [reference] });
    const promHistogram = new Histogram({ name: "t_seconds", help: "h", labelNames: ["a"], buckets: [0.1, 1, 10], registers: [reference] });
    // Repeats, a change, and back: the series found last is remembered.
    for (const [a, b, by] of [["x", "y", 1], ["x", "y", 2], ["x", "z", 5], ["x", "y", 3], ["w", "y", 4], ["x", "z", 1]] as const) {
      counter.inc([a, b], by);
      promCounter.inc({ a, b }, by);
    }
    // On a bound, between bounds, past the last: the buckets are cumulative and +Inf counts all.
    for (const [a, value] of [["x", 0.1], ["x", 0.5], ["x", 20], ["y", 1], ["x", 2]] as const) {
      histogram.observe([a], value);
      promHistogram.observe({ a }, value);
    }
    expect(await registry.metrics()).toBe(await reference.metrics());
    // Read twice: the scrape does not count anything again.
    expect(await registry.metrics()).toBe(await reference.metrics());
  });

  it("counts the same from a decision's facts as from the record built of them", async () => {
    const input = { started: performance.now(), guest: "g", id: 3, method: "GET", target: "https://x.a.test/p", status: 502, reason: "failed", code: "EG_HOOK_FAILED", source: "p.ts" };
    const facts = {
      trace: [
        { source: "declarative", tier: "declarative", phase: "allowlist", decision: "allow" as const, reason: 'host "x.a.test" matches "*.a.test"', ms: 0.01 },
        { source: "p.ts", tier: "tier2", phase: "onResponse", decision: "error" as const, reason: "onResponse policy stopped: it hit its stack limit", failure: "stack" as const, ms: 2 },
      ],
      bytesUp: 7,
      bytesDown: 30,
      rule: { tier: "declarative", rule: "allowedHosts:*.a.test", reason: "r" },
    };
    const fromRecord = createProxyMetrics({}, { defaultMetrics: false });
    fromRecord.observe(buildAuditRecord(input, facts, (text) => text));
    const fromFacts = createProxyMetrics({}, { defaultMetrics: false });
    fromFacts.observeDecision(input, facts);
    // Durations differ by the microseconds between the two calls; every count agrees.
    const counts = (text: string): string[] => text.split("\n").filter((line) => /^egressgate_\w+(_total|_count)[{ ]/.test(line));
    const [a, b] = [counts(await fromRecord.text()), counts(await fromFacts.text())];
    expect(a.length).toBeGreaterThan(4);
    expect(b).toEqual(a);
  });

  it("takes a failure's kind from the record's failure field, never from its message", async () => {
    const metrics = createProxyMetrics({}, { defaultMetrics: false });
    const failed = { source: "p.ts", tier: "tier2", phase: "onRequest", decision: "error" as const, reason: "the call timed out", ms: 0 };
    metrics.observe({ ...base, status: 502, sources: [{ ...failed, failure: "memory" }] });
    metrics.observe({ ...base, status: 502, sources: [failed] });
    const text = await metrics.text();
    expect(text).toContain('egressgate_hook_failures_total{source="p.ts",kind="memory"} 1');
    // Without the field (a record made elsewhere), a throw: the message is never read.
    expect(text).toContain('egressgate_hook_failures_total{source="p.ts",kind="throw"} 1');
    expect(text).not.toContain('kind="time"');
  });

  it("counts a secret refusal by the secret's name", async () => {
    const metrics = createProxyMetrics({}, { defaultMetrics: false });
    metrics.observe({
      ...base,
      status: 403,
      sources: [
        { source: "declarative", tier: "declarative", phase: "secrets", decision: "block", reason: 'header authorization carries the placeholder of secret GH_TOKEN to host "x.test", which is not in its hosts', secret: "GH_TOKEN", ms: 0.1 },
      ],
    });
    // The name comes from the refusal's own field: a reason that reads like another name counts nothing.
    metrics.observe({
      ...base,
      status: 403,
      sources: [{ source: "declarative", tier: "declarative", phase: "secrets", decision: "block", reason: "header x-secret carries the value of secret GH_TOKEN", ms: 0.1 }],
    });
    const text = await metrics.text();
    expect(text).toContain('egressgate_secret_refusals_total{secret="GH_TOKEN"} 1');
    expect(text).not.toContain('secret="carries"');
    expect(text).toContain('egressgate_requests_total{guest="g",decision="deny",status_class="4xx",rule="declarative:secrets"} 2');
    expect(text).not.toContain("x.test");
  });
});
