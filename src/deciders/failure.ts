/**
 * How asking a decider can go wrong, apart from an answer (a block is an answer). A failure
 * means 502, or an allow with `failOpen`; a busy decider (its queue is full) means 503 whatever
 * `failOpen` says, so an overload never waves requests through.
 */
export class DeciderFailure extends Error {
  override readonly name = "DeciderFailure";

  constructor(
    message: string,
    /** How it failed, for the hook-failure metric: no answer in time, an answer that cannot be used, or anything else. */
    readonly kind: "time" | "invalid" | "throw" = "throw",
  ) {
    super(message);
  }
}

/**
 * The request a call is for has ended (its guest left): what a decider has queued or running for
 * it ends too, so that guests that leave do not hold its queue, processes or connections. A
 * GuestGone, seen through what a decider needs of it.
 */
export interface CallSignal {
  readonly aborted: boolean;
  once(event: "abort", listener: () => void): unknown;
  off(event: "abort", listener: () => void): unknown;
}

/** Why such a call ended. */
export const guestLeftReason = "the guest left before the decider answered";

/** A call ended because its guest left: not the decider's failure (no failOpen, no failure metric). */
export class DeciderCancelled extends Error {
  override readonly name = "DeciderCancelled";

  constructor() {
    super(guestLeftReason);
  }
}

/**
 * A failOpen decider's allow after it failed: how it failed and why, so that the request it let
 * through is audited (`failure`, `failOpen`) and counted in `egressgate_hook_failures_total`, not
 * only warned about in a log line a log level can hide.
 */
export interface FailedOpen {
  readonly decision: "allow";
  readonly failedOpen: OpenFailure;
}

/** How a failOpen decider failed: the failure's kind and its reason (for the operator, as the 502's log detail). */
export interface OpenFailure {
  readonly failure: DeciderFailure["kind"];
  readonly reason: string;
}

export class DeciderBusy extends Error {
  override readonly name = "DeciderBusy";
}
