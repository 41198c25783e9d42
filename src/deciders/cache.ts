import type { Verdict } from "./answer.js";

/**
 * A decider's answers kept for `cacheMs`, per (phase, guest, method, scheme, host, port, path):
 * allows and blocks only. A rewrite is not kept, because it usually depends on headers the key
 * leaves out; neither is a failure, which should be asked again. Bounded: past `maxEntries` the
 * oldest entry goes (a Map keeps insertion order, and a hit is not moved: expiry, not recency,
 * is what makes an entry stale).
 */
export class DecisionCache {
  private readonly entries = new Map<string, { readonly verdict: Verdict; readonly until: number }>();

  constructor(
    private readonly ttlMs: number,
    private readonly maxEntries: number,
    // Monotonic: on the wall clock, a step back (NTP, a VM restored from a snapshot) kept an
    // allow or a block for as long again as the step, past cacheMs.
    private readonly now: () => number = () => performance.now(),
  ) {}

  get size(): number {
    return this.entries.size;
  }

  get(key: string): Verdict | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    if (entry.until <= this.now()) {
      this.entries.delete(key);
      return undefined;
    }
    return entry.verdict;
  }

  set(key: string, verdict: Verdict): void {
    if (verdict.decision === "rewrite") return;
    this.entries.delete(key);
    while (this.entries.size >= this.maxEntries) {
      const oldest = this.entries.keys().next();
      if (oldest.done === true) break;
      this.entries.delete(oldest.value);
    }
    this.entries.set(key, { verdict, until: this.now() + this.ttlMs });
  }
}

/** The cache key: JSON of the tuple, so no part can run into the next. */
export function cacheKey(parts: { phase: string; guest: string | null; method: string; scheme: string; host: string; port: number; path: string }): string {
  return JSON.stringify([parts.phase, parts.guest, parts.method, parts.scheme, parts.host, parts.port, parts.path]);
}
