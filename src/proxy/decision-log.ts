import type { Logger } from "../log.js";

/** One decision, as its log line has it: what was asked, by which guest, and the answer. */
export interface DecisionFields {
  /** When the request arrived (performance.now()); the line gets the time it took. */
  readonly started: number;
  readonly guest: string | undefined;
  readonly [field: string]: unknown;
}

/**
 * The one writer of decision lines ("request"), for requests, CONNECTs and upgrades alike: every
 * line names the guest it decided for, so an operator can follow one sandbox's traffic.
 */
export type DecisionLog = (fields: DecisionFields) => void;

export function createDecisionLog(log: Logger): DecisionLog {
  return (fields) => {
    if (!log.enabled("info")) return;
    const { started, guest, ...rest } = fields;
    log.info("request", { ...(guest !== undefined ? { guest } : {}), ...rest, ms: Math.round((performance.now() - started) * 10) / 10 });
  };
}
