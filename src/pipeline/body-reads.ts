import type { Readable } from "node:stream";
import { EgressError, describeThrown } from "../errors.js";
import type { ReadDeadline } from "../hooks/body-tap.js";
import { madeBodyOf, type MadeBody } from "../hooks/made-bodies.js";

/**
 * Reading a whole body for a source that cannot read it itself (a tier-2 policy, whose body the
 * proxy loads between its runs, or an external decider with `includeBody`): how long it may
 * take, and whose failure it is when it breaks.
 */

/** An error that names the hook that made the body as its source, for the log and the trace. */
function blamed(error: EgressError, made: MadeBody): EgressError {
  error.source = made.source;
  return error;
}

/**
 * The read ends within `timeouts.hookMs`, as a tier-3 hook reading the same body must settle
 * within it: 504 `EG_HOOK_TIMEOUT`, the reader's (`who`) failure of kind time, or the failure of
 * the hook that made the body when one did.
 */
export function bodyDeadline(who: string, what: "request" | "response", hookMs: number, body: Readable | null): ReadDeadline {
  return {
    ms: hookMs,
    error: () => {
      const made = madeBodyOf(body);
      if (made !== undefined) {
        return blamed(new EgressError("EG_HOOK_TIMEOUT", 504, `${made.subject} had not ended within ${hookMs} ms (timeouts.hookMs) while ${who} read it`, { failure: "time" }), made);
      }
      return new EgressError("EG_HOOK_TIMEOUT", 504, `${who} did not settle within ${hookMs} ms: the ${what} body it reads had not ended`, { failure: "time" });
    },
  };
}

/**
 * The failure of a response body under `reader`'s read when a hook's Response made it: that
 * hook's (502 `EG_HOOK_FAILED`, or 504 `EG_HOOK_TIMEOUT` when it fell silent for
 * `timeouts.upstreamBodyMs`), not the upstream's. Undefined for any other body.
 */
export function madeBodyFailure(body: Readable | null, failure: unknown, reader: string): EgressError | undefined {
  const made = madeBodyOf(body);
  if (made === undefined) return undefined;
  if (failure instanceof EgressError && failure.code === "EG_HOOK_TIMEOUT") {
    // Its own words say the guest's response was cut: here nothing was sent yet.
    const silent = `${made.subject} produced nothing for ${made.silenceMs} ms (timeouts.upstreamBodyMs) while ${reader} read it`;
    return blamed(new EgressError("EG_HOOK_TIMEOUT", 504, silent, { failure: "time" }), made);
  }
  return blamed(
    new EgressError("EG_HOOK_FAILED", 502, `${made.subject} failed while ${reader} read it (see the proxy log)`, { cause: failure, detail: describeThrown(failure), failure: "throw" }),
    made,
  );
}

/**
 * The failure of a body a hook made before its first byte, while the guest's head waited for it
 * (`when`: "before its first byte"), or after it but before any of it reached the guest ("before
 * any of it was sent"): that hook's (502 `EG_HOOK_FAILED`, or 504 `EG_HOOK_TIMEOUT` when it fell
 * silent for `timeouts.upstreamBodyMs`). Nothing was sent yet, so the guest gets this answer with
 * its reason.
 */
export function madeBodyFailedFirst(made: MadeBody, failure: Error, when = "before its first byte"): EgressError {
  if (failure instanceof EgressError && failure.code === "EG_HOOK_TIMEOUT") {
    // Its own words say the guest's response was cut: here nothing was sent yet.
    return blamed(new EgressError("EG_HOOK_TIMEOUT", 504, `${made.subject} produced nothing for ${made.silenceMs} ms (timeouts.upstreamBodyMs) ${when}`, { failure: "time" }), made);
  }
  return blamed(
    new EgressError("EG_HOOK_FAILED", 502, `${made.subject} failed ${when} (see the proxy log)`, { cause: failure, detail: describeThrown(failure), failure: "throw" }),
    made,
  );
}
