import { describe, expect, it } from "vitest";
import { medianInterval, metricsGoal, sideRows } from "../../bench/report.js";
import type { SideWindow } from "../../bench/scenarios.js";

describe("bench: paired ratios and their interval", () => {
  it("medianInterval gives the median and the order statistics of a 95% interval, by sample size", () => {
    const values = Array.from({ length: 40 }, (_, i) => i + 1);
    // n = 40: P(B(40, ½) ≤ 13) = 1.9% and ≤ 14 = 4.0%, so the 14th and 27th values.
    expect(medianInterval(values)).toEqual({ n: 40, median: 20.5, low: 14, high: 27 });
    // n = 10: P(B ≤ 1) = 1.1%, ≤ 2 = 5.5%, so the 2nd and 9th.
    expect(medianInterval([10, 9, 8, 7, 6, 5, 4, 3, 2, 1])).toEqual({ n: 10, median: 5.5, low: 2, high: 9 });
    // Too few for any 95% interval: the whole range.
    expect(medianInterval([3, 1, 2])).toEqual({ n: 3, median: 2, low: 1, high: 3 });
    expect(medianInterval([]).n).toBe(0);
    // Windows where a target served nothing are left out, not ranked.
    expect(medianInterval([1, 2, Number.NaN, 4, 0.5, 3, Number.POSITIVE_INFINITY])).toMatchObject({ n: 5, median: 2 });
    // A sample past where 0.5^n underflows still ends, inside the range and around the median.
    const many = medianInterval(Array.from({ length: 1200 }, (_, i) => i));
    expect(many.median).toBe(599.5);
    expect(many.low).toBeLessThan(many.median);
    expect(many.high).toBeGreaterThan(many.median);
  });

  it("side-by-side windows become one row of per-window ratios, and the metrics goal reads it", () => {
    const window = (round: number, base: number, target: number, baseCpu: number, targetCpu: number): SideWindow => ({
      round,
      base: "egressgate",
      target: "egressgate+metrics",
      concurrency: 32,
      seconds: 1,
      baseRequestsPerSecond: base,
      targetRequestsPerSecond: target,
      baseCpuMicrosPerRequest: baseCpu,
      targetCpuMicrosPerRequest: targetCpu,
      errors: 0,
      firstError: undefined,
    });
    // The machine's speed drifts 2× between windows; the ratio within each window stays 0.96.
    const drifting = [1000, 2000, 1500, 3000, 2500, 1200, 1800].map((rps, i) => window(i + 1, rps, rps * 0.96, 200, 208));
    const [row] = sideRows(drifting);
    expect(row!.requestsPerSecondRatio.median).toBeCloseTo(0.96, 10);
    expect(row!.cpuPerRequestRatio!.median).toBeCloseTo(1.04, 10);
    const goal = metricsGoal([], [row!]);
    expect(goal?.met).toBe(false);
    expect(goal?.measured).toContain("side by side: 0.960×");
    const fine = sideRows(drifting.map((w) => ({ ...w, targetRequestsPerSecond: w.baseRequestsPerSecond * 0.99 })));
    expect(metricsGoal([], fine)?.met).toBe(true);
  });
});
