import type { GuestRegistry } from "./guests.js";

/**
 * The log's and error bodies' redaction across every guest: each guest's secret values (in every
 * encoding its SecretStore decodes), and every guest's token, bare or in its Basic form. Rebuilt
 * when guests come and go; a line with nothing to hide costs one pass per guest with secrets.
 */
export class GuestRedactor {
  private stores: Redacting[] = [];
  /**
   * The stores of guests removed or replaced since: a request of theirs still under way holds its
   * guest, and with it its store, and what it logs or answers is redacted with it until it ends.
   * Dropped once nothing holds them. (Dropped at once, a block message that quoted a removed
   * guest's value went out in the clear, to the log, the audit record and the guest.)
   */
  private departed: WeakRef<Redacting>[] = [];
  private tokens: RegExp | undefined;

  update(guests: GuestRegistry): void {
    const next = [...guests.all()].flatMap((guest) => (guest.policy.config.secrets === undefined ? [] : [guest.policy.config.secrets]));
    const kept = new Set<Redacting>(next);
    const departed = [...this.departed.map((ref) => ref.deref()), ...this.stores].filter((store): store is Redacting => store !== undefined && !kept.has(store));
    this.departed = [...new Set(departed)].map((store) => new WeakRef(store));
    this.stores = next;
    const needles = guests.open ? [] : guests.credentialNeedles();
    this.tokens = needles.length === 0 ? undefined : new RegExp(needles.map(escape).join("|"), "gi");
  }

  redact(text: string): string {
    let out = text;
    for (const store of this.stores) out = store.redact(out);
    for (const ref of this.departed) out = ref.deref()?.redact(out) ?? out;
    return this.tokens === undefined ? out : out.replace(this.tokens, "[REDACTED:GUEST_TOKEN]");
  }
}

interface Redacting {
  redact(text: string): string;
}

function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
}
