import { Readable } from "node:stream";
import { EgressError } from "../errors.js";
import { BodyTap, declaredLength } from "../hooks/body-tap.js";
import { claimMadeBody } from "../hooks/made-bodies.js";
import { allow } from "../policy/decision.js";
import { discardBody } from "../streams.js";
import { GuestGone, type ExchangeContext, type OutboundRequest, type PipelineResponse, type TraceEntry } from "./exchange.js";
import type { HookedResponse, HookLimits } from "./hook-phases.js";
import type { HookSource, LayerNext, SourceCall } from "./hook-source.js";
import { checkHandedRequest, checkMadeResponse } from "./head-bounds.js";
import { teedUpstreamBody } from "./layer-phases.js";
import { elapsed, failedEntry } from "./trace.js";
import { requestEnded } from "../hooks/run-hook.js";
import { withFields } from "../objects.js";

/** The most `next()` calls one guest request may make, over all layers (DESIGN §2). */
export const maxDescents = 10;

/** Steps 2–7 of DESIGN §3 for one descent. */
export type Descend = (request: OutboundRequest, context: ExchangeContext) => Promise<PipelineResponse>;

/**
 * One guest request through the layers (`handle(request, next)`), outermost first. It counts the
 * descents, holds the request's deadline (`timeouts.requestMs`) and cancels the upstream work
 * in flight when the deadline passes, and refuses a second descent with a guest stream already
 * sent. Its failures are sticky: once the descents or the time are used up, the request ends
 * with that error even if a layer catches it and answers something else.
 */
export class LayerRun {
  private descents = 0;
  private failure: EgressError | undefined;
  /** Guest streams already sent upstream: a stream goes once. */
  private readonly streamed = new WeakSet<Readable>();
  private readonly responses: PipelineResponse[] = [];
  /** Who made a response a layer answered with itself. */
  private readonly madeBy = new WeakMap<HookedResponse, HookSource>();
  private readonly gone = new GuestGone();
  private readonly deadline: number;
  private timer: NodeJS.Timeout | undefined;
  private ended = false;
  /** Descents waiting on steps 2–7 (the upstream among them). */
  private descending = 0;
  /** Calls (by layer index) whose handle has yet to settle: concurrent next() calls run a layer more than once. */
  private readonly unsettled = new Map<number, number>();
  /** The trace entries of calls yet to settle, with when each began. */
  private readonly pendingEntries = new Map<TraceEntry, number>();

  constructor(
    private readonly layers: readonly HookSource[],
    private readonly descend: Descend,
    private readonly context: ExchangeContext,
    private readonly limits: HookLimits,
    private readonly requestMs: number,
    private readonly guest: string,
  ) {
    this.deadline = performance.now() + requestMs;
  }

  async run(request: OutboundRequest): Promise<PipelineResponse> {
    let expire!: (error: unknown) => void;
    const expired = new Promise<never>((_, reject) => (expire = reject));
    // A guest that leaves ends the request at once, even while a layer has yet to settle.
    const guestGone = (): void => {
      // A layer still running when its request ended did not fail: the record says the request
      // ended (a block with nginx's 499, as for any hook's call), not "did not settle" of kind time.
      for (const [entry, started] of this.pendingEntries) {
        delete entry.failure;
        Object.assign(entry, failedEntry(entry.source, entry.tier, "handle", requestEnded("handle", this.context.signal), started));
      }
      this.pendingEntries.clear();
      this.gone.abort(this.context.signal.reason);
      expire(this.context.signal.reason);
    };
    if (this.context.signal.aborted) guestGone();
    else this.context.signal.once("abort", guestGone);
    this.timer = setTimeout(() => {
      const error = this.stick(this.timeout());
      this.gone.abort(error);
      expire(error);
    }, this.requestMs);
    const work = this.layer(0, request);
    try {
      const final = await Promise.race([work, expired]);
      if (this.failure !== undefined) throw this.failure;
      return this.answer(final, request);
    } catch (error) {
      // Nothing will be sent: every body a descent brought back goes, read or not.
      for (const response of this.responses) discardBody(response.body);
      // A layer still running when its guest left goes on in its own code: the request's signal
      // holds it (an HTTP/2 connection counts it as running work) until it settles or the
      // deadline it had passes.
      if (this.context.signal.aborted && this.unsettled.size > 0) this.context.signal.hold(settledWithin(work, this.deadline - performance.now()));
      // A layer still running past the deadline settles later: whatever it got goes back then.
      void work.then(
        (late) => {
          if (this.responses.includes(late as PipelineResponse)) return;
          discardBody(late.body);
        },
        () => undefined,
      );
      throw this.failure ?? error;
    } finally {
      this.ended = true;
      clearTimeout(this.timer);
      this.context.signal.removeListener("abort", guestGone);
      this.release();
    }
  }

  /** The final response for the guest, attributed to the descent it came from or the layer that made it. */
  private answer(final: HookedResponse, initial: OutboundRequest): PipelineResponse {
    const at = this.descentIndex(final);
    if (at >= 0) {
      const descent = this.responses.splice(at, 1)[0]!;
      // Or that descent with a layer's tee branch of its body (see descentIndex).
      return descent === final ? descent : (final as PipelineResponse);
    }
    const source = this.madeBy.get(final);
    const by = source?.tier === "tier2" ? "the handle policy" : "a handle layer";
    const answered = allow(source?.tier ?? "tier3", "handle", `answered by ${by}`);
    const decision = source !== undefined ? withFields(answered, { source: source.label }) : answered;
    // Its body may be a descent's own stream: that descent's hook cleanup waits until the guest has it.
    const reused = this.responses.findIndex((response) => response.body !== null && (response.body === final.body || response.body === teedUpstreamBody(final.body)));
    const cleanup = reused < 0 ? undefined : this.responses.splice(reused, 1)[0]!.cleanup;
    return { status: final.status, headers: final.headers, body: final.body, decision, url: initial.url, redirects: 0, ...(cleanup !== undefined ? { cleanup } : {}) };
  }

  /**
   * Where `response` is among the descents: one of them, or one with its head as it came and its
   * body a layer's tee branch of the descent's (the layer cloned it, and answered with it or
   * with the clone), which is still that descent's answer. -1 when it is neither.
   */
  private descentIndex(response: HookedResponse): number {
    const at = this.responses.indexOf(response as PipelineResponse);
    if (at >= 0) return at;
    const upstream = teedUpstreamBody(response.body);
    if (upstream === undefined) return -1;
    return this.responses.findIndex((r) => r.body === upstream && r.status === response.status && r.headers === response.headers);
  }

  /** Hook cleanups of descents that did not become the answer: their replaced upstream bodies. */
  private release(): void {
    for (const response of this.responses) response.cleanup?.();
    this.responses.length = 0;
  }

  private layer(index: number, request: OutboundRequest): Promise<HookedResponse> {
    if (index === this.layers.length) return this.down(request);
    const source = this.layers[index]!;
    const tap =
      request.body instanceof Readable && !this.streamed.has(request.body)
        ? new BodyTap(request.body, { limit: this.limits.requestBodyBytes, record: false, ...(this.context.beforeBody !== undefined ? { onStart: this.context.beforeBody } : {}), ...declaredLength(request.headers) })
        : undefined;
    const inner: LayerNext = {
      next: (next) => {
        try {
          checkHandedRequest(request, next, `${source.describe("handle")} passed next()`);
        } catch (error) {
          (error as EgressError).source = source.label;
          return Promise.reject(error);
        }
        return this.layer(index + 1, next);
      },
      sleep: (ms) => this.sleep(ms),
    };
    const call: SourceCall = { requestId: this.context.id, guest: this.guest, signal: this.context.signal };
    // With a trace, the layer's entry goes in before the entries of its descents, and its time includes theirs.
    const trace = this.context.trace;
    let entry: TraceEntry | undefined;
    const started = trace === undefined ? 0 : performance.now();
    if (trace !== undefined) {
      entry = { source: source.label, tier: source.tier, phase: "handle", decision: "error", reason: "did not settle", failure: "time", ms: 0 };
      trace.push(entry);
      this.pendingEntries.set(entry, started);
    }
    this.unsettled.set(index, (this.unsettled.get(index) ?? 0) + 1);
    const settled = (): void => {
      if (entry !== undefined) this.pendingEntries.delete(entry);
      const left = this.unsettled.get(index)! - 1;
      if (left === 0) this.unsettled.delete(index);
      else this.unsettled.set(index, left);
    };
    return source.handle!(request, tap, inner, this.limits, call).finally(settled).then(
      (response) => {
        const descended = this.descentIndex(response) >= 0;
        // What a descent or an inner layer gave back, passed on as it is, is no answer of this layer's.
        const passedOn = descended || this.madeBy.has(response);
        if (!passedOn) {
          try {
            // A descent's body it answered with is released with the descents'.
            checkMadeResponse(response, `${source.describe("handle")} answered with`, this.responses.some((r) => r.body !== null && r.body === response.body));
          } catch (error) {
            (error as EgressError).source = source.label;
            if (entry !== undefined) {
              delete entry.failure;
              Object.assign(entry, failedEntry(source.label, source.tier, "handle", error, started));
            }
            throw error;
          }
        }
        if (!descended) this.madeBy.set(response, source);
        // A body this layer made is its own when it fails (before its first byte, or under an outer layer's read).
        if (!passedOn) claimMadeBody(response.body, source.label);
        if (entry !== undefined) {
          entry.ms = elapsed(started);
          entry.decision = passedOn ? "allow" : "answer";
          delete entry.reason;
          delete entry.failure;
        }
        return response;
      },
      (error: unknown) => {
        if (error instanceof EgressError && error.source === undefined) error.source = source.label;
        if (entry !== undefined) {
          delete entry.failure;
          Object.assign(entry, failedEntry(source.label, source.tier, "handle", error, started));
        }
        throw error;
      },
    );
  }

  /** One `next()` past the innermost layer: steps 2–7, checked again. */
  private async down(request: OutboundRequest): Promise<PipelineResponse> {
    if (this.failure !== undefined) throw this.failure;
    if (this.ended) throw new EgressError("EG_HOOK_FAILED", 502, "next() was called after the layer had answered");
    if (++this.descents > maxDescents) {
      throw this.stick(new EgressError("EG_HOOK_FAILED", 502, `layers called next() more than ${maxDescents} times for one request`));
    }
    if (request.body instanceof Readable) {
      if (this.streamed.has(request.body) || request.body.destroyed || request.body.readableEnded) {
        throw new EgressError("EG_HOOK_FAILED", 502, "next() was given a request whose body an earlier next() already streamed; pass request.clone() to the first next()");
      }
      this.streamed.add(request.body);
    }
    this.descending++;
    let response: PipelineResponse;
    try {
      response = await this.descend(request, withFields(this.context, { signal: this.gone }));
    } finally {
      this.descending--;
    }
    if (this.ended || this.failure !== undefined) {
      // Too late: the request already ended (its deadline passed).
      discardBody(response.body);
      response.cleanup?.();
      throw this.failure ?? new EgressError("EG_HOOK_FAILED", 502, "next() settled after the layer had answered");
    }
    this.responses.push(response);
    return response;
  }

  private sleep(ms: number): Promise<void> {
    if (this.failure !== undefined) return Promise.reject(this.failure);
    if (!Number.isFinite(ms) || ms < 0) return Promise.reject(new EgressError("EG_HOOK_FAILED", 502, `sleep() takes a number of milliseconds, not ${String(ms)}`));
    if (performance.now() + ms > this.deadline) {
      return Promise.reject(this.stick(new EgressError("EG_HOOK_TIMEOUT", 504, `a handle layer asked to sleep ${ms} ms, past timeouts.requestMs (${this.requestMs} ms)`, { failure: "time" })));
    }
    if (this.gone.aborted) return Promise.reject(this.gone.reason);
    // Ends early, rejected, when the request does (the guest left, or the deadline passed).
    return new Promise((resolve, reject) => {
      const stop = (): void => {
        clearTimeout(timer);
        reject(this.gone.reason);
      };
      const timer = setTimeout(() => {
        this.gone.removeListener("abort", stop);
        resolve();
      }, ms);
      this.gone.once("abort", stop);
    });
  }

  /**
   * The deadline's error: the upstream's when a descent was under way, else the layer's that had
   * yet to settle, the innermost (it waited on nothing of the proxy's: its own timer, a sleep()
   * past the deadline, a promise that never settles). Named as the upstream's, a hanging layer
   * sent operators to the network (black-box finding).
   */
  private timeout(): EgressError {
    // A descent is under way until its response body is in: a layer reading a body the upstream
    // trickles waits on the upstream, not on itself (review finding). Bytes waiting unread are
    // the layer's to take.
    const upstreamBusy = this.descending > 0 || this.responses.some((r) => r.body !== null && !r.body.readableEnded && !r.body.destroyed && r.body.readableLength === 0);
    if (!upstreamBusy && this.unsettled.size > 0) {
      const source = this.layers[Math.max(...this.unsettled.keys())]!;
      const who = `${source.describe("handle")}${source.tier === "tier3" ? " hook" : ""} (${source.label})`;
      return new EgressError("EG_HOOK_TIMEOUT", 504, `${who} did not settle within timeouts.requestMs (${this.requestMs} ms) while no descent was under way`, {
        failure: "time",
      });
    }
    return new EgressError("EG_UPSTREAM_TIMEOUT", 504, `the request did not complete within timeouts.requestMs (${this.requestMs} ms) over all its layers' descents`);
  }

  private stick(error: EgressError): EgressError {
    this.failure ??= error;
    return this.failure;
  }
}

/** Settles when `work` does, or after `ms` at the latest, on a timer that does not hold the process. */
function settledWithin(work: Promise<unknown>, ms: number): Promise<void> {
  return new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, Math.max(0, ms));
    timer.unref();
    const done = (): void => {
      clearTimeout(timer);
      resolve();
    };
    work.then(done, done);
  });
}
