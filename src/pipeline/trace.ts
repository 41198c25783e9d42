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

/**
 * Upstream time of a request, carried on its trace array under a symbol: beside the entries
 * rather than among them (the trace lists sources that decided, and the upstream decides
 * nothing), and on the trace so that both guest sides (HTTP/1.1 and HTTP/2), which already hand
 * the pipeline one, bring it to the decision without a field of their own. A symbol key rather
 * than a WeakMap: this runs on every request while metrics are on, and a WeakMap's lookups cost
 * more than the property.
 */
const upstreamTime = Symbol("egressgate.upstreamMs");
type TimedTrace = readonly TraceEntry[] & { [upstreamTime]?: number };

/**
 * Adds one exchange's upstream time: from handing the request to the executor until the
 * response body's last byte arrived (or it failed, or there was none). A body the guest reads
 * slowly holds its last byte back, so this includes backpressure, as Envoy's upstream_rq_time does.
 */
export function timeUpstream(trace: readonly TraceEntry[], started: number, body: NodeJS.EventEmitter | null): void {
  const timed = trace as TimedTrace & { [upstreamTime]?: number };
  let counted = false;
  const add = (): void => {
    if (counted) return;
    counted = true;
    timed[upstreamTime] = (timed[upstreamTime] ?? 0) + (performance.now() - started);
  };
  if (body === null) return add();
  // Plain listeners, not once(): once() wraps each, and this runs per request. A body that
  // fails is destroyed, which emits close.
  body.on("end", add);
  body.on("close", add);
}

/** The upstream time (ms) added for this trace, summed over redirect hops and layer descents; undefined when nothing went upstream. */
export function upstreamTimeOf(trace: readonly TraceEntry[]): number | undefined {
  const total = (trace as TimedTrace)[upstreamTime];
  return total === undefined ? undefined : Math.round(total * 10) / 10;
}
