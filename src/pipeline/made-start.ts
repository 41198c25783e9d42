import { isReplay } from "../hooks/body-tap.js";
import { madeBodyOf } from "../hooks/made-bodies.js";
import type { EgressError } from "../errors.js";
import { discardBody, firstChunk } from "../streams.js";
import { madeBodyFailedFirst } from "./body-reads.js";
import type { GuestGone, PipelineResponse, TraceEntry } from "./exchange.js";
import { bodyFailedUnsent } from "./upstream-errors.js";
import { blameMadeBody } from "./verdicts.js";

/**
 * The guest's head waits for the first chunk (or the end) of a body a tier-3 hook made: a
 * Response from onRequest, onResponse or a layer. The head goes out once the body has shown it
 * can produce, so a body that fails before its first byte (a stream that errors, a pull that
 * throws, one silent for `timeouts.upstreamBodyMs`) is answered 502 `EG_HOOK_FAILED` (504
 * `EG_HOOK_TIMEOUT`) with its reason, and its source's trace entry says it failed. Sent at
 * once, the head went out as a 200 and the connection was cut with no byte of body (on HTTP/2,
 * the stream reset), logged 200 with an `error`.
 *
 * Undefined when there is nothing to wait for: an upstream's body (the normal path costs one
 * WeakMap lookup; its failure after the head stays a cut), no body, or a HEAD's, which is never
 * read. The promise resolves with `response` also when `signal` aborts first (the guest left,
 * the drain ended): the sender then finds the guest gone.
 */
export function madeBodyStarted(response: PipelineResponse, method: string, signal: GuestGone, trace: TraceEntry[] | undefined): Promise<PipelineResponse> | undefined {
  const body = response.body;
  if (body === null || method === "HEAD") return undefined;
  const made = madeBodyOf(body);
  if (made === undefined) return undefined;
  return firstChunk(body, signal).then((failure) => {
    if (failure === undefined) return response;
    discardBody(body);
    response.cleanup?.();
    const error = madeBodyFailedFirst(made, failure);
    if (trace !== undefined) blameMadeBody(trace, made.source, made.phase, error);
    throw error;
  });
}

/**
 * For an HTTP/2 guest: the head of an upstream body that a hook (or a policy) started to read,
 * and passed on, waits for the body's first chunk or its end. Such a body is the read's replay,
 * and fails when the upstream's did: an upstream that reset while an onResponse hook read a
 * clone to the failure, the hook returning nothing, is the README's "upstream body that breaks
 * while a hook holds the response", owed a 502. An HTTP/1.1 guest got it (Node sends a head
 * with the first body bytes, and sendResponse answers in its place when none went); an HTTP/2
 * guest's HEADERS went at once, and it got a 200 and a reset stream, logged 200 (review
 * finding). A failure before the first chunk is now 502 `EG_UPSTREAM`, as on HTTP/1.1.
 *
 * Undefined for any other body (an upstream body no hook read goes at once, as before), a HEAD's,
 * and a hook's own (made bodies: {@link madeBodyStarted}). Resolves with `response` also when
 * `signal` aborts first.
 */
export function replayStarted(response: PipelineResponse, method: string, signal: GuestGone): Promise<PipelineResponse> | undefined {
  const body = response.body;
  if (body === null || method === "HEAD" || !isReplay(body) || madeBodyOf(body) !== undefined) return undefined;
  return firstChunk(body, signal).then((failure) => {
    if (failure === undefined) return response;
    discardBody(body);
    response.cleanup?.();
    throw bodyFailedUnsent(response.url.host, failure);
  });
}

/**
 * The answer for a body a tier-3 hook made that failed after its first chunk but before any byte
 * of the response reached the guest (a `pull` that errors, at once or a few microtasks later,
 * right after the chunk the head waited for: the stream is destroyed with that chunk still
 * buffered, or Node still holds the head): that hook's failure, as one before its first byte is,
 * and its source's trace entry says so. Undefined for any other body, whose failure is the
 * upstream's. It was answered 502 `EG_UPSTREAM` "the upstream response body from HOST failed
 * before it could be sent", though the hook had made the body (and for onRequest or a layer, no
 * upstream was contacted), and the record said the hook had answered without trouble.
 */
export function madeBodyFailedUnsent(response: PipelineResponse, cause: Error | null, trace: TraceEntry[] | undefined): EgressError | undefined {
  const made = madeBodyOf(response.body);
  if (made === undefined) return undefined;
  const error = madeBodyFailedFirst(made, cause ?? new Error("the body closed before its end"), "before any of it was sent");
  if (trace !== undefined) blameMadeBody(trace, made.source, made.phase, error);
  return error;
}
