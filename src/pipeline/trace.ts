import { EgressError, type HookFailureKind } from "../errors.js";
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
  const failure = blocked ? undefined : failureOf(error);
  return {
    source,
    tier,
    phase,
    decision: blocked ? "block" : "error",
    reason: error instanceof Error ? error.message : String(error),
    ...(error instanceof EgressError ? { status: error.status } : {}),
    ...(failure !== undefined ? { failure } : {}),
    ms: elapsed(started),
  };
}

/**
 * How a hook's call failed, as the runner or the sandbox said when it made the error. A hook
 * error made without one is the proxy refusing what the hook gave back (a bad header, a
 * Response whose body was read, next() called too often): invalid. A failure past the hook (the
 * upstream under a layer's next()) is none of these: undefined.
 */
function failureOf(error: unknown): HookFailureKind | undefined {
  if (!(error instanceof EgressError)) return "throw";
  if (error.failure !== undefined) return error.failure;
  if (error.code === "EG_HOOK_TIMEOUT") return "time";
  if (error.code === "EG_HOOK_FAILED") return "invalid";
  return undefined;
}
