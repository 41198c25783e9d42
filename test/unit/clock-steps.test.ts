import { afterEach, describe, expect, it, vi } from "vitest";
import { DecisionCache, cacheKey } from "../../src/deciders/cache.js";
import { buildAuditRecord } from "../../src/metrics/audit-record.js";

// The wall clock cannot be set here, so Date alone is faked (vi.setSystemTime): a step of the
// clock as NTP or a VM restored from a snapshot makes one. Timers and performance.now() run on.

const hour = 3_600_000;

afterEach(() => {
  vi.useRealTimers();
});

describe("a step of the wall clock", () => {
  it("back by an hour keeps no decider answer past cacheMs", async () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    const cache = new DecisionCache(20, 10);
    const key = cacheKey({ phase: "request", guest: "g", method: "GET", scheme: "https", host: "a", port: 443, path: "/" });
    const set = performance.now();
    cache.set(key, { decision: "allow" });
    expect(cache.get(key)).toEqual({ decision: "allow" });
    vi.setSystemTime(Date.now() - hour);
    while (performance.now() - set <= 20) await new Promise((resolve) => setTimeout(resolve, 5));
    expect(cache.get(key)).toBeUndefined();
  });

  it("forward by an hour stamps an audit record with the clock of its log lines", () => {
    const started = performance.now();
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(Date.now() + hour);
    const record = buildAuditRecord({ started, guest: "g", method: "GET", target: "https://a.test/", status: 200, reason: "" }, undefined, (text) => text);
    // A log line written now says new Date(): the record's start is at most the moments since.
    const off = Date.now() - Date.parse(record.time);
    expect(off).toBeGreaterThanOrEqual(0);
    expect(off).toBeLessThan(60_000);
  });
});
