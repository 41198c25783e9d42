/**
 * Why a request was allowed or refused. The same text goes to the log line and to the body of
 * the guest's error response, so an operator can see which tier and rule decided.
 */
export interface Decision {
  readonly allowed: boolean;
  /** "declarative", later "tier2"/"tier3". */
  readonly tier: string;
  /** The rule that decided: a pattern, a range category, "default-deny"… */
  readonly rule: string;
  readonly reason: string;
  /** For the log only (resolved addresses): never sent to the guest. */
  readonly detail?: string;
  /** The hook source that decided (a policy's file, `hooks[N]`), when one did. */
  readonly source?: string;
}

export function allow(tier: string, rule: string, reason: string): Decision {
  return { allowed: true, tier, rule, reason };
}

export function deny(tier: string, rule: string, reason: string, detail?: string): Decision {
  return detail === undefined ? { allowed: false, tier, rule, reason } : { allowed: false, tier, rule, reason, detail };
}
