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
 */
export function runHook<T>(name: string, timeoutMs: number, call: () => T | PromiseLike<T>): T | Promise<T> {
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
  return settleWithin(name, timeoutMs, result as PromiseLike<T>);
}

function isThenable<T>(value: T | PromiseLike<T>): value is PromiseLike<T> {
  return typeof (value as { then?: unknown } | null)?.then === "function";
}

async function settleWithin<T>(name: string, timeoutMs: number, pending: PromiseLike<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new EgressError("EG_HOOK_TIMEOUT", 504, `${name} hook did not settle within ${timeoutMs} ms`, { failure: "time" })),
      timeoutMs,
    );
  });
  try {
    return await Promise.race([pending, deadline]);
  } catch (error) {
    throw hookFailure(name, error);
  } finally {
    clearTimeout(timer);
  }
}

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
