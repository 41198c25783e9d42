import type { EgressError } from "../errors.js";
import type { Logger } from "../log.js";
import { buildAuditRecord, type AuditFacts, type AuditRecord } from "../metrics/audit-record.js";
import { requestEnd } from "../metrics/channels.js";
import type { ProxyMetrics } from "../metrics/metrics.js";

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
  /**
   * Whether records are wanted (an audit log, onDecision, metrics, or a subscriber to
   * `egressgate:request:end`): only then do callers trace the sources and count the bytes.
   */
  readonly auditing: boolean;
}

/** Where a decision goes besides the audit log: the metrics, and the diagnostics channel. */
export interface DecisionObserver {
  /** The metrics: they count from the record when one is built anyway, else from its facts (building one costs a share of a small request). */
  readonly metrics?: Pick<ProxyMetrics, "observe" | "observeDecision"> | undefined;
  readonly redact: (text: string) => string;
}

/** What a decision line says of an error answer: the status, the reason and the code; the hook source and the operator's detail when known. */
export interface ErrorFields {
  readonly status: number;
  readonly reason: string;
  readonly code: string;
  readonly source?: string;
  readonly detail?: string;
}

/** The error answer's fields of a decision line, the same for requests, streams, CONNECTs and upgrades. */
export function errorFields(err: EgressError): ErrorFields {
  if (err.source === undefined && err.detail === undefined) return { status: err.status, reason: err.message, code: err.code };
  return {
    status: err.status,
    reason: err.message,
    code: err.code,
    ...(err.source !== undefined ? { source: err.source } : {}),
    ...(err.detail !== undefined ? { detail: err.detail } : {}),
  };
}

/**
 * The field on every line of a request one of whose exchanges went upstream twice: its pooled
 * connection turned out closed before any answer, and it was sent once more on a fresh one
 * (ExchangeContext.onResend). Spread into the line: one frozen object for every such request.
 */
export const resentField: { readonly resent: true } = Object.freeze({ resent: true });

export function createDecisionLog(
  log: Logger,
  audit?: { readonly write: (record: AuditRecord) => void; readonly redact: (text: string) => string },
  observer?: DecisionObserver,
): DecisionLog {
  const redact = audit?.redact ?? observer?.redact;
  const decide = (fields: DecisionFields, facts?: AuditFacts): void => {
    // One record, built once, feeds the audit log, the metrics and the channel alike; with only
    // the metrics listening, they count from the same facts without it.
    if (redact !== undefined && (audit !== undefined || requestEnd.hasSubscribers)) {
      const record = buildAuditRecord(fields, facts, redact);
      // The embedder's onDecision (in audit.write, after the file's line) comes last: what it
      // does to the record (a status set to 999, a getter that throws) reaches nothing of ours.
      observer?.metrics?.observe(record);
      if (requestEnd.hasSubscribers) requestEnd.publish(record);
      audit?.write(record);
    } else observer?.metrics?.observeDecision(fields, facts);
    if (!log.enabled("info")) return;
    // Copied key by key: a leading spread would give every line's object a hidden class of its
    // own on Node 20 (src/objects.ts).
    const line: Record<string, unknown> = fields.guest !== undefined ? { guest: fields.guest } : {};
    for (const key of Object.keys(fields)) if (key !== "started" && key !== "guest") line[key] = fields[key];
    line["ms"] = Math.round((performance.now() - fields.started) * 10) / 10;
    log.info("request", line);
  };
  const always = audit !== undefined || observer?.metrics !== undefined;
  return Object.defineProperty(decide, "auditing", {
    // A getter: a diagnostics_channel subscriber can arrive after the start.
    get: () => always || (redact !== undefined && requestEnd.hasSubscribers),
  }) as DecisionLog;
}
