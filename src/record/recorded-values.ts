import { findFirst, needle, NeedleSet, redactText, ScanBudget } from "../policy/secret-scan.js";
import type { SecretStore } from "../policy/secrets.js";

/**
 * The secret values an exchange's entry is redacted with and searched for before it is written:
 * every value, current and retired, of the guest that made it and of every other guest. One
 * recording holds every guest's entries, and an upstream they share (a cache, an activity feed,
 * a debug page) can echo one guest's value to another: guest a's entry held guest b's token in
 * clear, in a response header and its body (black-box finding). The guest's own store alone
 * turns placeholders and its own values into tokens; another guest's value is redacted in a
 * response, and anywhere else keeps the entry from being written, as the guest's own is.
 */
export class RecordedValues {
  private set: NeedleSet | undefined;

  private constructor(
    private readonly stores: readonly SecretStore[],
    private readonly extra: readonly Copy[],
  ) {}

  /**
   * Undefined when no store holds a value and there is no `extra` copy: there is nothing to look
   * for. `extra`: texts looked for as values are, under a secret's name (a hidden redirect hop's
   * path and query, src/policy/hidden-url.ts).
   */
  static of(own: SecretStore | undefined, others: Iterable<SecretStore | undefined> = [], extra: readonly Copy[] = []): RecordedValues | undefined {
    const stores: SecretStore[] = [];
    for (const store of [own, ...others]) if (store !== undefined && !stores.includes(store) && store.valuesToFind().length > 0) stores.push(store);
    return stores.length === 0 && extra.length === 0 ? undefined : new RecordedValues(stores, extra);
  }

  /** The text with every value replaced by `[REDACTED:NAME]` ({@link SecretStore.redact}). */
  redact(text: string): string {
    if (this.stores.length === 1 && this.extra.length === 0) return this.stores[0]!.redact(text);
    return redactText(text, this.needles());
  }

  /** The name of a secret whose value the text holds ({@link SecretStore.findValue}); throws UnscannableError as it does. */
  findValue(text: string): string | undefined {
    if (this.stores.length === 1 && this.extra.length === 0) return this.stores[0]!.findValue(text);
    return findFirst(text, this.needles(), ScanBudget.forLength(text.length))?.needle.name;
  }

  /** Every value with its secret's name, for the search of large and binary bodies. Never logged or written. */
  valuesToFind(): Copy[] {
    return [...this.stores.flatMap((store) => store.valuesToFind()), ...this.extra];
  }

  private needles(): NeedleSet {
    return (this.set ??= new NeedleSet([...this.stores.flatMap((store) => store.needles()), ...this.extra.map((copy) => needle(copy.name, copy.value))]));
  }
}

/** A text to look for, and the secret's name a match is reported under. */
interface Copy {
  readonly name: string;
  readonly value: string;
}
