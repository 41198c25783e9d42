import type { GuestRegistry } from "./guests.js";

/**
 * The log's and error bodies' redaction across every guest: each guest's secret values (in every
 * encoding its SecretStore decodes), and every guest's token, bare or in its Basic form. Rebuilt
 * when guests come and go; a line with nothing to hide costs one pass per guest with secrets.
 */
export class GuestRedactor {
  private stores: { redact(text: string): string }[] = [];
  private tokens: RegExp | undefined;

  update(guests: GuestRegistry): void {
    this.stores = [...guests.all()].flatMap((guest) => (guest.policy.config.secrets === undefined ? [] : [guest.policy.config.secrets]));
    const needles = guests.open ? [] : guests.credentialNeedles();
    this.tokens = needles.length === 0 ? undefined : new RegExp(needles.map(escape).join("|"), "gi");
  }

  redact(text: string): string {
    let out = text;
    for (const store of this.stores) out = store.redact(out);
    return this.tokens === undefined ? out : out.replace(this.tokens, "[REDACTED:GUEST_TOKEN]");
  }
}

function escape(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
}
