import { EgressError, type HookFailureKind } from "../errors.js";
import type { Readable } from "node:stream";
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
    ...(error instanceof EgressError && error.secret !== undefined ? { secret: error.secret } : {}),
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
/** When the pending exchange went upstream, and its body: set while its end is the guest side's to report. */
const pendingSentAt = Symbol("egressgate.upstreamSentAt");
const pendingBody = Symbol("egressgate.upstreamBody");
/** Set by a guest side that watches the body it sends and reports its end ({@link claimUpstreamBody}). */
const deferred = Symbol("egressgate.upstreamDeferred");
type TimedTrace = readonly TraceEntry[] & {
  [upstreamTime]?: number;
  [deferred]?: boolean;
  [pendingSentAt]?: number;
  [pendingBody]?: NodeJS.EventEmitter | null;
};

/**
 * Adds one exchange's upstream time: from handing the request to the executor until the
 * response body's last byte arrived (or it failed, or there was none). A body the guest reads
 * slowly holds its last byte back, so this includes backpressure, as Envoy's upstream_rq_time does.
 *
 * On a trace marked by {@link deferUpstreamEnd}, a body's end is not listened for here: the
 * exchange is left pending, for the guest side to report from the close listener it puts on the
 * body it sends anyway ({@link claimUpstreamBody}). Two listeners and a closure per request
 * profiled at several percent of a small GET's CPU.
 */
export function timeUpstream(trace: readonly TraceEntry[], started: number, body: NodeJS.EventEmitter | null): void {
  const timed = trace as TimedTrace;
  if (body === null) return addUpstream(timed, started);
  if (timed[deferred] === true) {
    // A layer's second descent: the earlier exchange's body is not the one the guest side will see.
    if (timed[pendingBody] != null) listenUpstream(timed, timed[pendingSentAt] ?? started, timed[pendingBody]);
    timed[pendingSentAt] = started;
    timed[pendingBody] = body;
    return;
  }
  listenUpstream(timed, started, body);
}

function addUpstream(timed: TimedTrace, started: number): void {
  timed[upstreamTime] = (timed[upstreamTime] ?? 0) + (performance.now() - started);
}

function listenUpstream(timed: TimedTrace, started: number, body: NodeJS.EventEmitter): void {
  const stream = body as Partial<Pick<Readable, "readableEnded" | "destroyed">>;
  // It ended (or failed) while nobody listened: it ended no later than now.
  if (stream.readableEnded === true || stream.destroyed === true) return addUpstream(timed, started);
  let counted = false;
  const add = (): void => {
    if (counted) return;
    counted = true;
    addUpstream(timed, started);
  };
  // Plain listeners, not once(): once() wraps each. A body that fails is destroyed, which emits close.
  body.on("end", add);
  body.on("close", add);
}

/** Marks a trace whose guest side reports the end of the body it sends (see {@link timeUpstream}). */
export function deferUpstreamEnd(trace: readonly TraceEntry[]): void {
  (trace as TimedTrace)[deferred] = true;
}

/**
 * The guest side is about to send `body` and will call {@link upstreamBodyEnded} when it closes:
 * true when that body is the pending exchange's own. Otherwise (a hook replaced it, nothing is
 * sent, or nothing is pending) the pending exchange, if any, goes back to listening for its own
 * body's end, and the answer is false. Call with null on a path that sends no upstream body.
 */
export function claimUpstreamBody(trace: readonly TraceEntry[], body: NodeJS.EventEmitter | null): boolean {
  const timed = trace as TimedTrace;
  const pending = timed[pendingBody];
  if (pending == null) return false;
  if (pending === body) return true;
  timed[pendingBody] = null;
  listenUpstream(timed, timed[pendingSentAt] ?? 0, pending);
  return false;
}

/** The claimed body closed (after its end, or failing): the pending exchange's time is added. */
export function upstreamBodyEnded(trace: readonly TraceEntry[]): void {
  const timed = trace as TimedTrace;
  if (timed[pendingBody] == null) return;
  timed[pendingBody] = null;
  addUpstream(timed, timed[pendingSentAt] ?? 0);
}

/** The upstream time (ms) added for this trace, summed over redirect hops and layer descents; undefined when nothing went upstream. */
export function upstreamTimeOf(trace: readonly TraceEntry[]): number | undefined {
  const total = (trace as TimedTrace)[upstreamTime];
  return total === undefined ? undefined : Math.round(total * 10) / 10;
}
