import { describeThrown } from "../errors.js";
import type { AuditLogFile, AuditWarn } from "./audit-log.js";
import type { AuditRecord } from "./audit-record.js";

/** `startProxy({ onDecision })`: called with every audit record; what it returns or throws never reaches a guest. */
export type DecisionCallback = (record: AuditRecord) => unknown;

/**
 * Where each audit record goes: a line in the file, then the embedder's callback. The line is
 * made first, so a callback that changes the record cannot change what was written. A callback
 * that throws or rejects is warned about (rate-limited by the caller) and otherwise ignored:
 * the guest's answer is already decided, and the proxy keeps serving.
 */
export function createAuditSink(file: AuditLogFile | undefined, onDecision: DecisionCallback | undefined, warn: AuditWarn): (record: AuditRecord) => void {
  // What it throws is the embedder's: a value with no toString, or a message that throws when
  // read, must not throw here (in a rejection's handler, that ended the process).
  const failed = (error: unknown): void =>
    warn("audit:onDecision", "onDecision threw; the record is written and the proxy carries on", { error: describeThrown(error) });
  return (record) => {
    if (file !== undefined) {
      try {
        file.append(`${JSON.stringify(record)}\n`);
      } catch (error) {
        // append never throws by design; a bug there must still not take a guest's request down.
        warn("audit:append", "audit log: a record could not be written", { error: error instanceof Error ? error.message : String(error) });
      }
    }
    if (onDecision === undefined) return;
    try {
      const result = onDecision(record) as { then?: unknown } | undefined;
      // A rejected promise would otherwise be an unhandled rejection, which ends the CLI's process.
      if (result !== null && (typeof result === "object" || typeof result === "function") && typeof result.then === "function") {
        (result as PromiseLike<unknown>).then(undefined, failed);
      }
    } catch (error) {
      failed(error);
    }
  };
}
