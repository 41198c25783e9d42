import { FormIndex, NeedleIndex, type IndexedForm } from "../policy/needle-index.js";
import { fold, redactText, type Needle } from "../policy/secret-scan.js";
import { secretValueChanges } from "../policy/secrets.js";

/** What the redactor reads of the guest registry (./guests.ts). */
export interface RedactedGuests {
  /** One guest without credentials: there is no token to hide. */
  readonly open: boolean;
  all(): Iterable<RedactedGuest>;
}

export interface RedactedGuest {
  readonly name: string;
  readonly token: string;
  readonly policy: { readonly config: { readonly secrets?: Redacting | undefined } };
}

/** A guest's SecretStore, as the redactor uses it. */
export interface Redacting {
  /** Every value, current and retired, as the scan looks for it; a new array once they change. */
  needles(): readonly Needle[];
}

/** A store whose values are indexed; held weakly once its guest has gone. */
interface Source {
  readonly store: WeakRef<Redacting>;
}

const tokenMarker = "[REDACTED:GUEST_TOKEN]";

/** How many removed guests' tokens stay redacted: two forms of under 100 characters each. */
export const defaultMaxRetiredTokens = 10_000;

/**
 * The log's and error bodies' redaction across every guest: each guest's secret values (in every
 * encoding the scan decodes), and every guest's token, bare or in its Basic form.
 *
 * Both are indexed (../policy/needle-index.ts), so a line costs the same however many guests
 * there are: one scan decodes its views once and finds every guest's values in each, and the
 * tokens are found in one more pass. Redacted store by store, behind a regex that alternated
 * every token, 1000 guests cost each request 11 ms of CPU and each addGuest 127 ms (black-box
 * finding). A guest that comes or goes changes the index by its own values and token only.
 * One scan also merges overlapping matches: store by store, a value that began with another
 * guest's value lost only that part, and the rest of it was logged in clear.
 */
export class GuestRedactor {
  private readonly values = new NeedleIndex<Source>();
  /** Each store met, and its place in the index. */
  private readonly sources = new WeakMap<Redacting, Source>();
  /** The stores of the guests served now, each with the {@link update} that last saw it. */
  private readonly current = new Map<Redacting, { readonly source: Source; seen: number }>();
  /**
   * The stores of guests removed or replaced since: a request of theirs still under way holds its
   * guest, and with it its store, and what it logs or answers is redacted with it until it ends.
   * Dropped once nothing holds them. (Dropped at once, a block message that quoted a removed
   * guest's value went out in the clear, to the log, the audit record and the guest.)
   */
  private readonly departed = new Set<Source>();
  private readonly collected = new FinalizationRegistry<Source>((source) => this.forget(source));
  /** {@link secretValueChanges} when the index last read its stores' values. */
  private valuesSeen = secretValueChanges();
  private readonly tokens = new FormIndex<undefined>();
  /** Each guest's token, the two forms of it that are indexed, and the update that last saw it. */
  private readonly tokenForms = new Map<string, { readonly forms: readonly IndexedForm<undefined>[]; seen: number }>();
  /**
   * The tokens of guests removed since, oldest first, still indexed: a line written later can
   * quote one (a removed guest's request still under way, a hook's console line, a client or
   * another guest that still sends it). A token is a lasting credential (README, "A guest's name
   * is a lasting credential"), so it is not dropped with its guest. (Dropped at once, another
   * guest's request that carried it logged it in clear.) Bounded: a pool that names each job's
   * guest anew would otherwise grow the index without end; past the bound the oldest go.
   */
  private readonly retiredTokens = new Map<string, readonly IndexedForm<undefined>[]>();
  private readonly maxRetiredTokens: number;
  private updates = 0;

  constructor(options: { readonly maxRetiredTokens?: number } = {}) {
    this.maxRetiredTokens = options.maxRetiredTokens ?? defaultMaxRetiredTokens;
  }

  /**
   * The guests served from now on. One pass over them, which adds to the index what is new and
   * takes out what has gone; what is unchanged is not built again, so an addGuest costs the
   * index its own values and token only.
   */
  update(guests: RedactedGuests): void {
    const stamp = ++this.updates;
    for (const guest of guests.all()) {
      if (!guests.open) {
        const held = this.tokenForms.get(guest.token);
        if (held !== undefined) held.seen = stamp;
        else {
          // A guest given a removed guest's name again has its token (the key and the name make it).
          let forms = this.retiredTokens.get(guest.token);
          if (forms !== undefined) this.retiredTokens.delete(guest.token);
          else {
            forms = tokenFormsOf(guest);
            for (const form of forms) this.tokens.add(form);
          }
          this.tokenForms.set(guest.token, { forms, seen: stamp });
        }
      }
      const store = guest.policy.config.secrets;
      if (store === undefined) continue;
      const held = this.current.get(store);
      if (held !== undefined) {
        held.seen = stamp;
        continue;
      }
      let source = this.sources.get(store);
      if (source === undefined) {
        source = { store: new WeakRef(store) };
        this.sources.set(store, source);
        this.values.set(source, store.needles());
      } else if (this.departed.delete(source)) this.collected.unregister(source);
      this.current.set(store, { source, seen: stamp });
    }
    for (const [store, held] of this.current) {
      if (held.seen === stamp) continue;
      this.current.delete(store);
      this.departed.add(held.source);
      this.collected.register(store, held.source, held.source);
    }
    for (const source of this.departed) if (source.store.deref() === undefined) this.forget(source);
    for (const [token, held] of this.tokenForms) {
      if (held.seen === stamp) continue;
      this.tokenForms.delete(token);
      this.retiredTokens.set(token, held.forms);
    }
    for (const [token, forms] of this.retiredTokens) {
      if (this.retiredTokens.size <= this.maxRetiredTokens) break;
      this.retiredTokens.delete(token);
      for (const form of forms) this.tokens.remove(form);
    }
  }

  redact(text: string): string {
    if (secretValueChanges() !== this.valuesSeen) this.reread();
    const out = this.values.size === 0 ? text : redactText(text, this.values);
    return this.tokens.size === 0 ? out : this.redactTokens(out);
  }

  /** A store's values changed (a rotation, a delete): the index takes every store's values as they are now. */
  private reread(): void {
    this.valuesSeen = secretValueChanges();
    for (const source of [...[...this.current.values()].map((held) => held.source), ...this.departed]) {
      const needles = source.store.deref()?.needles();
      if (needles === undefined) this.forget(source);
      else if (needles !== this.values.needlesOf(source)) this.values.set(source, needles);
    }
  }

  private forget(source: Source): void {
    this.departed.delete(source);
    this.values.delete(source);
  }

  /** Every token, and its Basic form, in any letter case, as one marker. */
  private redactTokens(text: string): string {
    const spans: [number, number][] = [];
    this.tokens.find(fold(text), (entry, at) => {
      spans.push([at, at + entry.form.length]);
      return false;
    });
    if (spans.length === 0) return text;
    spans.sort((a, b) => a[0] - b[0]);
    let out = "";
    let at = 0;
    for (const [start, end] of spans) {
      if (end <= at) continue;
      out += `${text.slice(at, Math.max(at, start))}${start >= at ? tokenMarker : ""}`;
      at = end;
    }
    return out + text.slice(at);
  }
}

function tokenFormsOf(guest: RedactedGuest): IndexedForm<undefined>[] {
  return [guest.token, Buffer.from(`${guest.name}:${guest.token}`).toString("base64")].map((form) => ({ form: fold(form), value: undefined }));
}
