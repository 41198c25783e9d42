import { EgressError } from "../errors.js";
import { HttpRequestBlockedError } from "./blocked-error.js";

/** A hook refusal of any tier: ours, or an error shaped like it (tier 2 rebuilds its own). */
function asBlocked(error: unknown): { status: number; message: string; statusText: string } | undefined {
  const e = error as { name?: unknown; status?: unknown; message?: unknown; statusText?: unknown } | null;
  if (!(error instanceof HttpRequestBlockedError) && e?.name !== "HttpRequestBlockedError") return undefined;
  // Our own class too: its constructor checks the status, but a hook can set it afterwards
  // (`error.status = 200`). Each field is read once.
  const status = e?.status;
  if (typeof status !== "number" || !Number.isInteger(status) || status < 400 || status > 599) return undefined;
  const statusText = e?.statusText;
  return { status, message: String(e?.message), statusText: typeof statusText === "string" ? statusText : "" };
}

/**
 * A reason phrase goes on the status line: only visible ASCII and spaces may stay. It is cut to
 * length after redaction (`guestError`), not here.
 */
function safeStatusText(text: string): string | undefined {
  const clean = text.replace(/[^\x20-\x7e]/g, "").trim();
  return clean === "" ? undefined : clean;
}

/**
 * Calls one hook with a deadline and turns every way it can fail into an answer for the guest:
 * HttpRequestBlockedError becomes its own status, a hook that never settles 504, and any other
 * throw or rejection 502. The hook's own error goes to the log (`detail`), not to the guest.
 * A hook that returns synchronously costs no timer and no extra promise.
 *
 * With `signal` (the request's GuestGone), a call still pending when the request ends (its guest
 * left, the proxy's drain cut it, a layer's deadline passed) is let go at once: the request ends
 * then, not at `timeoutMs`, and the call's timer no longer holds the process. The timer alone
 * held a request whose guest had gone until hookMs, and kept the embedding process alive that
 * long after close(). The call itself still runs: it is handed to `signal.hold`.
 */
export function runHook<T>(name: string, timeoutMs: number, call: () => T | PromiseLike<T>, signal?: HookSignal): T | Promise<T> {
  if (signal?.aborted === true) return Promise.reject(requestEnded(name, signal));
  let result: T | PromiseLike<T>;
  try {
    result = call();
  } catch (error) {
    throw hookFailure(name, error);
  }
  let thenable: boolean;
  try {
    // Reading `then` runs the hook's code too (a getter, a Proxy's trap).
    thenable = isThenable(result);
  } catch (error) {
    throw hookFailure(name, error);
  }
  if (!thenable) return result as T;
  return settleWithin(name, timeoutMs, result as PromiseLike<T>, signal);
}

/**
 * What ends a request early, as the pipeline's GuestGone is seen here (hooks sit below the
 * pipeline): `reason` is why it ended.
 */
export interface HookSignal {
  readonly aborted: boolean;
  readonly reason: unknown;
  once(event: "abort", listener: () => void): unknown;
  off(event: "abort", listener: () => void): unknown;
  /** Counts a call let go that still runs (GuestGone.hold). */
  hold?(work: Promise<unknown>): void;
}

/**
 * A call let go because its request ended. The guest left, or the drain cut it: a 499, which the
 * decision line gives as the guest's leaving or the drain's cut, and a block, as an external
 * decider's call ended the same way is (no failure of the hook's, for the metrics or the audit
 * record). The request's deadline passed under a layer (its error is ours, and the guest's
 * answer): the call did not settle in time.
 */
export function requestEnded(name: string, signal: HookSignal): EgressError {
  const reason = signal.reason;
  if (reason instanceof EgressError) {
    return new EgressError("EG_HOOK_TIMEOUT", reason.status, `${name} hook had not settled when the request's deadline passed: ${reason.message}`, { failure: "time" });
  }
  const why = reason instanceof Error ? reason.message : "the request ended";
  return new EgressError("EG_HOOK_BLOCKED", 499, `the request ended before the ${name} hook settled: ${why}`, { detail: `${name} had not settled` });
}

function isThenable<T>(value: T | PromiseLike<T>): value is PromiseLike<T> {
  return typeof (value as { then?: unknown } | null)?.then === "function";
}

async function settleWithin<T>(name: string, timeoutMs: number, pending: PromiseLike<T>, signal: HookSignal | undefined): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new EgressError("EG_HOOK_TIMEOUT", 504, `${name} hook did not settle within ${timeoutMs} ms`, { failure: "time" })),
      timeoutMs,
    );
  });
  let ended: (() => void) | undefined;
  let letGo = false;
  const cut =
    signal === undefined
      ? undefined
      : new Promise<never>((_, reject) => {
          ended = () => {
            letGo = true;
            // The call goes on in the hook's code, still bounded by its deadline, whose timer no
            // longer holds the process (the request is over; close() may be under way).
            timer?.unref();
            signal.hold?.(Promise.race([pending, deadline]).then(noop, noop));
            // Once the call settles its deadline has nothing left to bound: left in the timer list,
            // it held the signal, and through its reason's stack the guest's connection, for hookMs.
            const settled = (): void => clearTimeout(timer);
            Promise.resolve(pending).then(settled, settled);
            reject(requestEnded(name, signal));
          };
          signal.once("abort", ended);
        });
  try {
    return await Promise.race(cut === undefined ? [pending, deadline] : [pending, deadline, cut]);
  } catch (error) {
    throw hookFailure(name, error);
  } finally {
    if (!letGo) clearTimeout(timer);
    if (ended !== undefined) signal!.off("abort", ended);
  }
}

function noop(): void {}

/**
 * Any way a hook of either tier failed, as the guest's answer: its own status when blocked, else
 * 502. Never throws: what a hook throws is its own (a Proxy, getters that throw), and reading it
 * must not turn the hook's failure into the proxy's "internal error".
 */
export function hookFailure(name: string, error: unknown): EgressError {
  try {
    return describeFailure(name, error);
  } catch {
    return new EgressError("EG_HOOK_FAILED", 502, `${name} hook failed (see the proxy log)`, { detail: `${name} threw a value that could not be read`, failure: "throw" });
  }
}

/**
 * The most of a hook's own words (a block's message, a throw's) that its answer, the log and the
 * audit record carry: a policy that quoted a 6 MB upload in its error wrote a 6 MB log line and
 * a 12 MB audit record for every such request. Console lines are cut at the same length.
 */
export const maxHookTextChars = 8192;

function capped(text: string): string {
  return text.length <= maxHookTextChars ? text : `${text.slice(0, maxHookTextChars)}… (${text.length} characters, cut)`;
}

function describeFailure(name: string, error: unknown): EgressError {
  if (error instanceof EgressError) return error;
  const blocked = asBlocked(error);
  if (blocked !== undefined) {
    const text = safeStatusText(blocked.statusText);
    return new EgressError("EG_HOOK_BLOCKED", blocked.status, capped(blocked.message), {
      detail: `${name} blocked the request`,
      ...(text !== undefined ? { statusText: text } : {}),
    });
  }
  // An Error, or an error's fields as tier 2 sends them back; a block whose status is not one.
  const shaped = error as { name?: unknown; message?: unknown; status?: unknown } | null;
  const detail =
    shaped?.name === "HttpRequestBlockedError"
      ? `HttpRequestBlockedError with status ${String(shaped.status)}, not an integer from 400 to 599`
      : typeof shaped?.message === "string"
        ? capped(`${String(shaped.name ?? "Error")}: ${shaped.message}`)
        : capped(String(error));
  // A block with a status that is none is a return the phase cannot use; V8's own stack overflow
  // (a RangeError it makes, not one a hook threw with its own words) is the stack; anything else a throw.
  const failure = shaped?.name === "HttpRequestBlockedError" ? "invalid" : isStackOverflow(error) ? "stack" : "throw";
  return new EgressError("EG_HOOK_FAILED", 502, `${name} hook failed (see the proxy log)`, { cause: error, detail, failure });
}

function isStackOverflow(error: unknown): boolean {
  return error instanceof RangeError && error.message === "Maximum call stack size exceeded";
}
