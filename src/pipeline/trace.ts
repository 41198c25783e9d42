import { EgressError } from "../errors.js";
import type { TraceEntry } from "./exchange.js";

/**
 * The pieces of a request's trace (ExchangeContext.trace) that the pipeline and the layers share:
 * how long a call took, and what a throw means.
 */

/** Milliseconds since `started` (performance.now()), to the microsecond. */
export function elapsed(started: number): number {
  return Math.round((performance.now() - started) * 1000) / 1000;
}

/** A call that threw: a refusal (403, or a hook's HttpRequestBlockedError) is a block, anything else an error. */
export function failedEntry(source: string, tier: string, phase: string, error: unknown, started: number): TraceEntry {
  const blocked = error instanceof EgressError && (error.code === "EG_DENIED" || error.code === "EG_HOOK_BLOCKED");
  return {
    source,
    tier,
    phase,
    decision: blocked ? "block" : "error",
    reason: error instanceof Error ? error.message : String(error),
    ...(error instanceof EgressError ? { status: error.status } : {}),
    ms: elapsed(started),
  };
}
