/**
 * A small seeded generator (mulberry32), so a fuzz case is a pure function of its seed, its
 * target and its index: any case a run reports is replayed alone with the same three.
 */
export class Rng {
  private state: number;

  constructor(...parts: readonly (string | number)[]) {
    // FNV-1a over the parts' text: nearby seeds and indexes still start far apart.
    let hash = 0x811c9dc5;
    for (const char of parts.join("\u0000")) {
      hash ^= char.charCodeAt(0);
      hash = Math.imul(hash, 0x01000193) >>> 0;
    }
    this.state = hash;
  }

  /** A float in [0, 1). */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** An integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }

  /** An integer in [min, max]. */
  range(min: number, max: number): number {
    return min + this.int(max - min + 1);
  }

  chance(p: number): boolean {
    return this.next() < p;
  }

  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new Error("pick from an empty list");
    return items[this.int(items.length)]!;
  }

  bytes(n: number): Buffer {
    const out = Buffer.alloc(n);
    for (let i = 0; i < n; i++) out[i] = this.int(256);
    return out;
  }
}
