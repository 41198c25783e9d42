import type { Logger } from "../log.js";
import { buildAuditRecord, type AuditFacts, type AuditRecord } from "../metrics/audit-record.js";

/** One decision, as its log line has it: what was asked, by which guest, and the answer. */
export interface DecisionFields {
  /** When the request arrived (performance.now()); the line gets the time it took. */
  readonly started: number;
  readonly guest: string | undefined;
  readonly [field: string]: unknown;
}

/**
 * The one writer of decision lines ("request"), for requests, CONNECTs and upgrades alike: every
 * line names the guest it decided for, so an operator can follow one sandbox's traffic. With an
 * audit log or onDecision, every decision also becomes an audit record, whatever the log level;
 * `facts` carries what only the record holds (the sources' trace, the bytes, the rule).
 */
export interface DecisionLog {
  (fields: DecisionFields, facts?: AuditFacts): void;
  /** Whether records are wanted: only then do callers trace the sources and count the bytes. */
  readonly auditing: boolean;
}

export function createDecisionLog(log: Logger, audit?: { readonly write: (record: AuditRecord) => void; readonly redact: (text: string) => string }): DecisionLog {
  const decide = (fields: DecisionFields, facts?: AuditFacts): void => {
    if (audit !== undefined) audit.write(buildAuditRecord(fields, facts, audit.redact));
    if (!log.enabled("info")) return;
    const { started, guest, ...rest } = fields;
    log.info("request", { ...(guest !== undefined ? { guest } : {}), ...rest, ms: Math.round((performance.now() - started) * 10) / 10 });
  };
  return Object.assign(decide, { auditing: audit !== undefined });
}
