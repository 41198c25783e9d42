import { EgressError } from "../errors.js";
import { HttpRequestBlockedError } from "./blocked-error.js";

/** A hook refusal of any tier: ours, or an error shaped like it (tier 2 rebuilds its own). */
function asBlocked(error: unknown): { status: number; message: string; statusText: string } | undefined {
  if (error instanceof HttpRequestBlockedError) return error;
  const e = error as { name?: unknown; status?: unknown; message?: unknown; statusText?: unknown } | null;
  if (e?.name === "HttpRequestBlockedError" && typeof e.status === "number" && e.status >= 400 && e.status <= 599) {
    return { status: e.status, message: String(e.message), statusText: typeof e.statusText === "string" ? e.statusText : "" };
  }
  return undefined;
}

/** A reason phrase goes on the status line: only visible ASCII and spaces may stay. */
function safeStatusText(text: string): string | undefined {
  const clean = text.replace(/[^\x20-\x7e]/g, "").trim().slice(0, 100);
  return clean === "" ? undefined : clean;
}

/**
 * Calls one hook with a deadline and turns every way it can fail into an answer for the guest:
 * HttpRequestBlockedError becomes its own status, a hook that never settles 504, and any other
 * throw or rejection 502. The hook's own error goes to the log (`detail`), not to the guest.
 */
export async function runHook<T>(name: string, timeoutMs: number, call: () => T | Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new EgressError("EG_HOOK_TIMEOUT", 504, `${name} hook did not settle within ${timeoutMs} ms`)),
      timeoutMs,
    );
  });
  try {
    return await Promise.race([Promise.resolve().then(call), deadline]);
  } catch (error) {
    if (error instanceof EgressError) throw error;
    const blocked = asBlocked(error);
    if (blocked !== undefined) {
      const text = safeStatusText(blocked.statusText);
      throw new EgressError("EG_HOOK_BLOCKED", blocked.status, blocked.message, {
        detail: `${name} blocked the request`,
        ...(text !== undefined ? { statusText: text } : {}),
      });
    }
    const detail = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    throw new EgressError("EG_HOOK_FAILED", 502, `${name} hook failed (see the proxy log)`, { cause: error, detail });
  } finally {
    clearTimeout(timer);
  }
}
