// What each source's call decided, for the audit trace, and whose a refusal or failure was.
import { EgressError, type HookFailureKind } from "../errors.js";
import type { OpenFailure } from "../deciders/failure.js";
import type { Decision } from "../policy/decision.js";
import type { OutboundRequest, SourceVerdict, TraceEntry } from "./exchange.js";
import type { OnRequestOutcome } from "./hook-phases.js";
import type { HookSource } from "./hook-source.js";
import { withFields } from "../objects.js";
import { elapsed, failedEntry } from "./trace.js";

/** What a call's result says, for the trace: allow unless the phase's verdict function says more. */
export type Verdict<T> = (value: T) => { decision: SourceVerdict; reason?: string; detail?: string; status?: number } | FailedOpenEntry;

/** The trace's part of a failOpen decider's allow after a failure: an allow, with the failure's kind and reason. */
export interface FailedOpenEntry {
  decision: "allow";
  reason: string;
  failure: HookFailureKind;
  failOpen: true;
}

function failedOpenEntry(failed: OpenFailure): FailedOpenEntry {
  return { decision: "allow", reason: `failed open: ${failed.reason}`, failure: failed.failure, failOpen: true };
}

/**
 * A source's phase, with any refusal or failure it throws marked as that source's, for the log.
 * With a trace (an audit log is configured), the call is also timed and its verdict pushed.
 */
export async function attributed<T>(source: HookSource, work: () => Promise<T>, trace?: TraceEntry[], phase?: string, verdict?: Verdict<T>): Promise<T> {
  if (trace === undefined) {
    try {
      return await work();
    } catch (error) {
      if (error instanceof EgressError && error.source === undefined) error.source = source.label;
      throw error;
    }
  }
  // Pushed when the call starts, so entries keep call order; a call that never settles stays an
  // error, of kind time (the kind is carried, never read from the reason).
  const entry: TraceEntry = { source: source.label, tier: source.tier, phase: phase ?? "", decision: "error", reason: "did not settle", failure: "time", ms: 0 };
  trace.push(entry);
  const started = performance.now();
  try {
    const value = await work();
    entry.ms = elapsed(started);
    delete entry.reason;
    delete entry.failure;
    Object.assign(entry, verdict === undefined ? { decision: "allow" } : verdict(value));
    return value;
  } catch (error) {
    if (error instanceof EgressError && error.source === undefined) error.source = source.label;
    delete entry.failure;
    Object.assign(entry, failedEntry(source.label, source.tier, entry.phase, error, started));
    throw error;
  }
}

/**
 * A call that failed with another source's failure (the body of a Response an earlier hook made
 * broke while this source read it): the error goes on the entry of the source it names, and the
 * reader's entry, which decided nothing, leaves the trace. The record said the maker had
 * rewritten the response and the reader had failed, and the metrics counted the reader's failure.
 */
export function blameMaker(trace: TraceEntry[], error: unknown, reader: string, phase: string): void {
  if (!(error instanceof EgressError) || error.source === undefined || error.source === reader) return;
  const readerAt = lastEntry(trace, reader, phase, trace.length - 1);
  const makerAt = readerAt < 0 ? -1 : lastEntry(trace, error.source, phase, readerAt - 1);
  if (makerAt < 0) return;
  const maker = trace[makerAt]!;
  trace[makerAt] = withFields(failedEntry(maker.source, maker.tier, phase, error, 0), { ms: maker.ms });
  trace.splice(readerAt, 1);
}

/**
 * A Response a source made (onRequest's or a layer's answer, onResponse's replacement) whose body
 * failed before its first byte: the entry of the call that returned it becomes that failure. The
 * record said the source had answered (or rewritten) without trouble, and no hook failure was counted.
 */
export function blameMadeBody(trace: TraceEntry[], source: string | undefined, phase: string, error: EgressError): void {
  if (source === undefined) return;
  const at = lastEntry(trace, source, phase, trace.length - 1);
  if (at < 0) return;
  const entry = trace[at]!;
  trace[at] = withFields(failedEntry(entry.source, entry.tier, phase, error, 0), { ms: entry.ms });
}

function lastEntry(trace: readonly TraceEntry[], source: string, phase: string, from: number): number {
  for (let i = from; i >= 0; i--) if (trace[i]!.source === source && trace[i]!.phase === phase) return i;
  return -1;
}

export const declarativeSource = "declarative";

export function declarativeEntry(phase: string, decision: Decision, started: number): TraceEntry {
  // The allowlist's allow, on every traced request: one literal, without the spreads' temporaries.
  if (decision.allowed && decision.detail === undefined) {
    return { source: declarativeSource, tier: decision.tier, phase, decision: "allow", reason: decision.reason, ms: elapsed(started) };
  }
  return {
    source: declarativeSource,
    tier: decision.tier,
    phase,
    decision: decision.allowed ? "allow" : "block",
    reason: decision.reason,
    ...(decision.detail !== undefined ? { detail: decision.detail } : {}),
    ...(decision.allowed ? {} : { status: 403 }),
    ms: elapsed(started),
  };
}

/** An onRequest that answered, changed the request, or let it go on as it was (a failOpen decider's failure included). */
export function onRequestVerdict(before: OutboundRequest, outcome: OnRequestOutcome): { decision: SourceVerdict } | FailedOpenEntry {
  if ("response" in outcome) return { decision: "answer" };
  if (outcome.failedOpen !== undefined) return failedOpenEntry(outcome.failedOpen);
  if (outcome.asSent === true) return { decision: "allow" };
  return { decision: rewrote(before, outcome.request) ? "rewrite" : "allow" };
}

export function onResponseVerdict(hooked: { replaced: boolean; failedOpen?: OpenFailure }): { decision: SourceVerdict } | FailedOpenEntry {
  if (hooked.failedOpen !== undefined) return failedOpenEntry(hooked.failedOpen);
  return { decision: hooked.replaced ? "rewrite" : "allow" };
}

export function ipVerdict(refusal: Decision | undefined): ReturnType<Verdict<Decision | undefined>> {
  if (refusal === undefined) return { decision: "allow" };
  return { decision: "block", reason: refusal.reason, status: 403, ...(refusal.detail !== undefined ? { detail: refusal.detail } : {}) };
}

/**
 * Whether onRequest changed what leaves. A source hands back a new object even when it changed
 * nothing (tier 3 builds one from the Request it showed), so the parts are compared; a body is
 * changed only when a hook built new bytes (a clone's tee of the guest's stream is the same body).
 */
function rewrote(before: OutboundRequest, after: OutboundRequest): boolean {
  if (before === after) return false;
  if (before.method !== after.method || before.url.href !== after.url.href) return true;
  if ((before.body === null) !== (after.body === null)) return true;
  if (after.body instanceof Uint8Array && after.body !== before.body) return true;
  if (before.headers.length !== after.headers.length) return true;
  for (let i = 0; i < before.headers.length; i++) if (before.headers[i] !== after.headers[i]) return true;
  return false;
}
