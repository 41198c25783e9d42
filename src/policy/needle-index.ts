/**
 * Finding many literal strings in a text at once, in time that does not grow with how many
 * there are: the redaction of every guest's values and tokens (src/proxy/redactor.ts). Searched
 * one by one, or as one regex that alternates all of them, 1000 guests made every log line and
 * every request's target cost 1000 passes over it, and each addGuest rebuilt (and the next line
 * recompiled) a regex of 2000 tokens (black-box finding: 11 ms of CPU per request, 127 ms per
 * addGuest).
 *
 * Each string is filed under a hash of its first characters, in one group per key length (the
 * largest power of two up to {@link maxKey} not past the string's length: a handful of groups,
 * however the lengths vary). A search rolls each group's hash over the text once, and checks
 * only the strings filed under the hash found at each position. Strings are added and removed
 * one by one, so a guest that comes or goes costs its own strings only.
 */

import type { DecodeContext } from "./scan-decoders.js";
import type { Needle, NeedleSearch } from "./secret-scan.js";

/** The longest key: strings that share their first 64 characters share a bucket. */
const maxKey = 64;

/** The hash's base: odd, so no character's weight is lost mod 2³². */
const base = 0x01000193;

/** Slots of each group's filter: most positions of a text are passed over on one array read. */
const filterBits = 14;

/** One string in the index, with what it stands for. */
export interface IndexedForm<T> {
  /** What is looked for, exactly (a caller folds letter case on both sides). */
  readonly form: string;
  readonly value: T;
}

class Group<T> {
  /** base^(length-1) mod 2³², which rolls the first character out. */
  readonly outgoing: number;
  readonly buckets = new Map<number, IndexedForm<T>[]>();
  /** How many buckets each filter slot holds: a bucket counts once, in the slot of its key. */
  readonly filter = new Uint32Array(1 << filterBits);

  constructor(readonly length: number) {
    let pow = 1;
    for (let i = 1; i < length; i++) pow = Math.imul(pow, base);
    this.outgoing = pow;
  }
}

function hashOf(text: string, from: number, length: number): number {
  let h = 0;
  for (let i = from; i < from + length; i++) h = (Math.imul(h, base) + text.charCodeAt(i)) | 0;
  return h;
}

/** The Map's key: a small integer, which V8 keeps unboxed. */
function keyOf(hash: number): number {
  return hash & 0x3fffffff;
}

/**
 * A bucket's filter slot, taken from its key and not from the whole hash: hashes that differ only
 * in the bits the key drops share a bucket, so they must share its slot. Taken from the whole
 * hash, a form that joined a bucket marked under another slot was never looked for (its value was
 * logged in clear), and its removal unmarked a slot that another bucket counted on (black-box
 * finding).
 */
function slotOf(key: number): number {
  return Math.imul(key, 0x9e3779b1) >>> (32 - filterBits);
}

function keyLength(length: number): number {
  let k = 1;
  while (k * 2 <= Math.min(length, maxKey)) k *= 2;
  return k;
}

/**
 * Up to this many strings are searched for one by one with indexOf, as before there was an
 * index: a proxy with a guest or two pays nothing for it.
 */
const fewForms = 8;

/** Literal strings to find in a text, added and removed one at a time. */
export class FormIndex<T> {
  private readonly groups: Group<T>[] = [];
  private readonly all: IndexedForm<T>[] = [];

  get size(): number {
    return this.all.length;
  }

  add(entry: IndexedForm<T>): void {
    if (entry.form === "") return;
    const length = keyLength(entry.form.length);
    let group = this.groups.find((g) => g.length === length);
    if (group === undefined) {
      group = new Group<T>(length);
      this.groups.push(group);
      // Longest keys first: their buckets are the smallest, and nothing depends on the order.
      this.groups.sort((a, b) => b.length - a.length);
    }
    const key = keyOf(hashOf(entry.form, 0, length));
    const bucket = group.buckets.get(key);
    if (bucket === undefined) {
      group.buckets.set(key, [entry]);
      group.filter[slotOf(key)]! += 1;
    } else bucket.push(entry);
    this.all.push(entry);
  }

  /** Takes out `entry`, the object that was added (not an equal one). */
  remove(entry: IndexedForm<T>): void {
    if (entry.form === "") return;
    const length = keyLength(entry.form.length);
    const group = this.groups.find((g) => g.length === length);
    const key = keyOf(hashOf(entry.form, 0, length));
    const bucket = group?.buckets.get(key);
    const at = bucket?.indexOf(entry) ?? -1;
    if (group === undefined || bucket === undefined || at < 0) return;
    bucket.splice(at, 1);
    this.all.splice(this.all.indexOf(entry), 1);
    if (bucket.length > 0) return;
    group.buckets.delete(key);
    group.filter[slotOf(key)]! -= 1;
    if (group.buckets.size === 0) this.groups.splice(this.groups.indexOf(group), 1);
  }

  /**
   * Calls `found` for every place in `text` where an indexed string occurs, until it returns
   * true (then returns true). Overlapping occurrences are all reported, in no set order.
   */
  find(text: string, found: (entry: IndexedForm<T>, at: number) => boolean): boolean {
    if (this.all.length <= fewForms) {
      for (const entry of this.all) {
        for (let at = text.indexOf(entry.form); at >= 0; at = text.indexOf(entry.form, at + 1)) if (found(entry, at)) return true;
      }
      return false;
    }
    for (const group of this.groups) {
      const { length, outgoing, buckets, filter } = group;
      if (text.length < length) continue;
      let h = hashOf(text, 0, length);
      for (let at = 0; ; at++) {
        const key = keyOf(h);
        if (filter[slotOf(key)] !== 0) {
          const bucket = buckets.get(key);
          if (bucket !== undefined) {
            for (const entry of bucket) if (text.startsWith(entry.form, at) && found(entry, at)) return true;
          }
        }
        if (at + length >= text.length) break;
        h = (Math.imul((h - Math.imul(text.charCodeAt(at), outgoing)) | 0, base) + text.charCodeAt(at + length)) | 0;
      }
    }
    return false;
  }
}

/**
 * Secret values from many owners (a guest's SecretStore each), for the scan (./secret-scan.ts):
 * one scan decodes a text's views once and finds every owner's values in each, where a scan per
 * owner decoded them once per owner. An owner's needles are added and taken out together.
 */
export class NeedleIndex<K> implements NeedleSearch {
  private readonly forms = new FormIndex<Needle>();
  private readonly owners = new Map<K, { readonly needles: readonly Needle[]; readonly entries: readonly IndexedForm<Needle>[] }>();
  /** Every character of every form, both cases, counted, for DecodeContext.chars. */
  private readonly charCounts = new Map<string, number>();
  private readonly chars = new Set<string>();
  /** Needle.bytes of every needle, counted, for DecodeContext.minBytes. */
  private readonly byteCounts = new Map<number, number>();
  private minBytes = 0;
  private needleCount = 0;

  get size(): number {
    return this.needleCount;
  }

  get context(): DecodeContext {
    return { minBytes: this.minBytes, chars: this.chars };
  }

  /** What `owner` was last given ({@link set}), or undefined if it holds nothing here. */
  needlesOf(owner: K): readonly Needle[] | undefined {
    return this.owners.get(owner)?.needles;
  }

  owned(): IterableIterator<K> {
    return this.owners.keys();
  }

  /** `owner`'s needles from now on, in place of any it had. */
  set(owner: K, needles: readonly Needle[]): void {
    this.delete(owner);
    if (needles.length === 0) return;
    const entries = needles.flatMap((n) => n.forms.map((form) => ({ form, value: n })));
    for (const entry of entries) this.forms.add(entry);
    for (const n of needles) this.count(n, 1);
    this.owners.set(owner, { needles, entries });
  }

  delete(owner: K): void {
    const held = this.owners.get(owner);
    if (held === undefined) return;
    this.owners.delete(owner);
    for (const entry of held.entries) this.forms.remove(entry);
    for (const n of held.needles) this.count(n, -1);
  }

  find(lower: string, found: (needle: Needle, at: number, length: number) => boolean): boolean {
    return this.forms.find(lower, (entry, at) => found(entry.value, at, entry.form.length));
  }

  private count(n: Needle, by: 1 | -1): void {
    this.needleCount += by;
    for (const form of n.forms) {
      for (const c of `${form}${form.toUpperCase()}`) {
        const left = (this.charCounts.get(c) ?? 0) + by;
        if (left > 0) {
          this.charCounts.set(c, left);
          this.chars.add(c);
        } else {
          this.charCounts.delete(c);
          this.chars.delete(c);
        }
      }
    }
    const left = (this.byteCounts.get(n.bytes) ?? 0) + by;
    if (left > 0) this.byteCounts.set(n.bytes, left);
    else this.byteCounts.delete(n.bytes);
    this.minBytes = this.byteCounts.size === 0 ? 0 : by > 0 && this.minBytes > 0 ? Math.min(this.minBytes, n.bytes) : Math.min(...this.byteCounts.keys());
  }
}
