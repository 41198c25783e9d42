import { describe, expect, it } from "vitest";
import { FormIndex, type IndexedForm } from "../../src/policy/needle-index.js";

/*
 * Forms crafted so that FormIndex's hashes collide (black-box finding: a configured value was
 * logged in clear). The index files a form under the low 30 bits of the hash of its first 16
 * characters, and each group's quick filter counted buckets per slot; the slot was taken from the
 * whole 32-bit hash and marked only when a form made a new bucket. A form that joined a bucket
 * with its hash's top 2 bits different kept its own slot unmarked and was never found, and its
 * removal took a count from a slot it had never added to. Found by a search over strings of these
 * shapes (a birthday search for a shared key, a count up for a shared slot) and written down here.
 */
/** hash -59742156, of which the low 30 bits are 1013999668. */
const A = "s3cr3t-jcujm2jb8";
/** hash 1013999668: A's bucket, A's hash with its top 2 bits different. */
const B = "s3cr3t-9atydanp1";
/** Its own bucket, in the slot B's whole hash fell in (the slot A's and B's removal emptied). */
const C = "other-value-9010";
/** Its own bucket, in the slot A's whole hash fell in. */
const D = "other-form-02644";
/** Its own bucket, in the slot the bucket of A and B falls in when slots are taken from bucket keys. */
const E = "other-value-0029";
/** A's first 16 characters: A's bucket with A's very hash. */
const A2 = `${A}-and-more`;
/** A second pair of one bucket and different top bits, from `pair-` and a count in base 36. */
const P = "pair-0000000aaaa";
const Q = "pair-0000008u7rt";

/**
 * More than FormIndex's eight, so that it searches through its buckets and not one form at a time
 * with indexOf. Sixteen characters, like the crafted forms: the same group of buckets.
 */
const fillers = Array.from({ length: 8 }, (_, i) => `filler-form-${String(i).padStart(4, "0")}`);

/** The index's hash (src/policy/needle-index.ts), to check that the forms above still collide. */
function hashOf(text: string): number {
  let h = 0;
  for (let i = 0; i < 16; i++) h = (Math.imul(h, 0x01000193) + text.charCodeAt(i)) | 0;
  return h;
}
const slotOf = (h: number): number => Math.imul(h, 0x9e3779b1) >>> 18;
const keyOf = (h: number): number => h & 0x3fffffff;

class Tracked {
  readonly index = new FormIndex<string>();
  readonly live: IndexedForm<string>[] = [];

  add(entry: IndexedForm<string>): void {
    this.index.add(entry);
    this.live.push(entry);
  }

  remove(entry: IndexedForm<string>): void {
    this.index.remove(entry);
    this.live.splice(this.live.indexOf(entry), 1);
  }

  /** Every occurrence in `text`, as `value@at`, sorted. */
  found(text: string): string[] {
    const out: string[] = [];
    this.index.find(text, (entry, at) => {
      out.push(`${entry.value}@${at}`);
      return false;
    });
    return out.sort();
  }

  /** What indexOf finds of every live form: what {@link found} must say. */
  expected(text: string): string[] {
    return this.live
      .flatMap((e) => {
        const out: string[] = [];
        for (let at = text.indexOf(e.form); at >= 0; at = text.indexOf(e.form, at + 1)) out.push(`${e.value}@${at}`);
        return out;
      })
      .sort();
  }
}

function permutations<T>(items: readonly T[]): T[][] {
  if (items.length <= 1) return [[...items]];
  return items.flatMap((item, i) => permutations([...items.slice(0, i), ...items.slice(i + 1)]).map((rest) => [item, ...rest]));
}

/**
 * Adds `forms` in `addOrder` and removes them in `removeOrder`, with the fillers in the index
 * throughout, and after every step looks for them all: every form in the index is found, and
 * none taken out.
 */
function run(forms: readonly string[], addOrder: readonly number[], removeOrder: readonly number[]): void {
  const t = new Tracked();
  for (const filler of fillers) t.add({ form: filler, value: filler });
  const entries = forms.map((form) => ({ form, value: form }));
  // Every form in one text: find() reports every occurrence of every form, so one hides none.
  const texts = [forms.join(" "), forms.join("")];
  const steps = [...addOrder.map((i) => ["add", i] as const), ...removeOrder.map((i) => ["remove", i] as const)];
  for (const [step, [op, i]] of steps.entries()) {
    t[op](entries[i]!);
    for (const text of texts) {
      const found = t.found(text);
      const expected = t.expected(text);
      // expect() only on a difference: thousands of sequences are checked.
      if (found.join() !== expected.join()) {
        const done = steps.slice(0, step + 1).map(([o, j]) => `${o} ${forms[j]}`);
        expect(found, `${done.join(", ")}: in "${text}"`).toEqual(expected);
      }
    }
  }
}

describe("FormIndex with forms whose hashes collide", () => {
  it("the crafted forms collide as described (if the hash changes, craft them again)", () => {
    const [a, b, c, d, e, a2, p, q] = [A, B, C, D, E, A2, P, Q].map(hashOf) as [number, number, number, number, number, number, number, number];
    expect(keyOf(a)).toBe(keyOf(b));
    expect(a).not.toBe(b);
    expect(slotOf(a)).not.toBe(slotOf(b));
    expect(keyOf(c)).not.toBe(keyOf(a));
    expect(slotOf(c)).toBe(slotOf(b));
    expect(keyOf(d)).not.toBe(keyOf(a));
    expect(slotOf(d)).toBe(slotOf(a));
    expect(keyOf(e)).not.toBe(keyOf(a));
    expect(slotOf(keyOf(e))).toBe(slotOf(keyOf(a)));
    expect(a2).toBe(a);
    expect(keyOf(p)).toBe(keyOf(q));
    expect(p).not.toBe(q);
    const crafted = new Set([A, B, C, D, E, P, Q].map((form) => keyOf(hashOf(form))));
    for (const filler of fillers) expect(crafted.has(keyOf(hashOf(filler))), filler).toBe(false);
  });

  // Every order of adding them, and every order of taking them out.
  it.each([
    ["one bucket, two slots of the whole hash", [A, B]],
    ["one bucket, two slots, the other way round", [B, A]],
    ["one bucket and another in the slot of its second form's hash", [A, B, C]],
    ["one bucket and another in the slot of its first form's hash", [A, B, D]],
    ["one bucket and another in the slot of its key", [A, B, E]],
    ["one bucket holding three forms, two with the same hash", [A, B, A2]],
    ["two buckets, each of two hashes that differ in their top bits", [A, B, P, Q]],
    ["two buckets in one slot, each alone", [B, C]],
  ] as const)("%s: every form in the index is found after every add and remove, in any order", (_what, forms) => {
    const orders = permutations(forms.map((_, i) => i));
    for (const addOrder of orders) for (const removeOrder of orders) run(forms, addOrder, removeOrder);
  });

  it("all of them at once: every order of adding them, then every order of taking them out", () => {
    const forms = [A, B, C, D, E, A2];
    const orders = permutations(forms.map((_, i) => i));
    const inOrder = forms.map((_, i) => i);
    for (const addOrder of orders) run(forms, addOrder, inOrder);
    for (const removeOrder of orders) run(forms, inOrder, removeOrder);
  });

  it("a form found before the others came and went is found after, however often they do", () => {
    const t = new Tracked();
    for (const filler of fillers) t.add({ form: filler, value: filler });
    const c = { form: C, value: C };
    t.add(c);
    for (let round = 0; round < 3; round++) {
      const a = { form: A, value: A };
      const b = { form: B, value: B };
      t.add(a);
      t.add(b);
      t.remove(a);
      t.remove(b);
      expect(t.found(`x ${C} x`), `round ${round}`).toEqual([`${C}@2`]);
    }
  });

  it("agrees with indexOf over random adds and removes of colliding, shared and random forms (fixed seed)", () => {
    let seed = 20261204;
    const random = (n: number): number => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) >>> 8) % n;
    const word = (length: number): string => Array.from({ length }, () => "ab-s3"[random(5)]).join("");
    // The crafted forms, one twice (two owners of one value), and short and long random words from
    // a small alphabet, so that many share their first characters and key lengths vary.
    const pool: IndexedForm<string>[] = [A, B, C, D, E, A2, P, Q, A, ...fillers, ...Array.from({ length: 24 }, () => word(1 + random(40)))].map((form, i) => ({
      form,
      value: `${i}`,
    }));
    const t = new Tracked();
    for (let step = 0; step < 3000; step++) {
      const entry = pool[random(pool.length)]!;
      if (t.live.includes(entry)) t.remove(entry);
      else t.add(entry);
      const pieces = Array.from({ length: 1 + random(6) }, () => (random(3) === 0 ? word(random(8)) : pool[random(pool.length)]!.form));
      const text = pieces.join(random(2) === 0 ? "" : " ");
      const found = t.found(text);
      const expected = t.expected(text);
      if (found.join() !== expected.join() || t.index.size !== t.live.length) {
        expect(found, `step ${step}: ${t.live.length} forms; "${text}"`).toEqual(expected);
        expect(t.index.size, `step ${step}`).toBe(t.live.length);
      }
    }
  });
});
