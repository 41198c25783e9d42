import { Readable } from "node:stream";
import { EgressError } from "../errors.js";
import { fromHeaders, fromRequestHeaders, isRequest, isResponse, makeRequest, makeResponse, nodeBody, readHookBody, requestUrl, webBody } from "../hooks/fetch-objects.js";
import { HttpRequestBlockedError } from "../hooks/blocked-error.js";
import type { BodyTap } from "../hooks/body-tap.js";
import type { HttpHooks } from "../hooks/http-hooks.js";
import { hookFailure } from "../hooks/run-hook.js";
import { discardBody } from "../streams.js";
import { withoutHeaders } from "../headers.js";
import { withFields } from "../objects.js";
import type { OutboundRequest } from "./exchange.js";
import { contentLengthHeaders, fromHookResponse, readReturned, requestTooLarge, withExactLength, withFramingOf, type HookedResponse, type HookLimits } from "./hook-phases.js";
import type { LayerNext } from "./hook-source.js";

/** A tier-3 layer: `(request, next) => Response`. */
export type Layer = NonNullable<HttpHooks["handle"]>;

/**
 * A layer for tier 3: the layer sees a Request with a lazily read body and a `next` that takes
 * a Request and resolves to a Response whose body is the upstream's, as it arrived (still
 * encoded: a layer is a cache or a retry, not a reader of pages). The Request itself goes on
 * with the guest's own stream, once; `request.clone()` (or a new Request) is read whole and can
 * go any number of times.
 */
export async function runHandle(handle: Layer, request: OutboundRequest, tap: BodyTap | undefined, layer: LayerNext, limits: HookLimits): Promise<HookedResponse> {
  const body =
    request.body === null
      ? null
      : request.body instanceof Uint8Array
        ? new Blob([request.body]).stream()
        : ((tap?.web as ReadableStream<Uint8Array> | undefined) ?? webBody(request.body));
  const seen = makeRequest(request.url, request.method, request.headers, body);
  // Every response next() gave the layer, with what it came from.
  const given = new Map<Response, HookedResponse>();
  // The clones the layer made of them (of their clones too), each with the response next() gave.
  const clones = new Map<Response, Response>();
  // A refusal that reached the layer as HttpRequestBlockedError: rethrown as it is, it is the original.
  const refusals = new WeakMap<object, EgressError>();
  let guestStreamSent = false;

  const outbound = async (input: Request): Promise<OutboundRequest> => {
    if (input.bodyUsed) {
      throw new EgressError("EG_HOOK_FAILED", 502, "handle passed next() a Request whose body was already read or sent; pass request.clone() to next() to send a body again");
    }
    const url = requestUrl(input, "handle");
    let headers = fromRequestHeaders(input.headers, "the Request handle passed to next()");
    // The framing is the proxy's: the body's own length, never one the layer set in place.
    if (input === seen) headers = withFramingOf(headers, request.headers);
    if (input.body === null) return { method: input.method, url, headers: input === seen ? headers : withoutHeaders(headers, contentLengthHeaders), body: null };
    if (input === seen) {
      // The guest's own bytes, untouched, go as the guest's stream (once: see LayerRun).
      if (tap !== undefined && !tap.started && input.body === tap.web && request.body instanceof Readable) {
        if (guestStreamSent) {
          throw new EgressError("EG_HOOK_FAILED", 502, "handle called next() again with a request whose body was already streamed; pass request.clone() to the first next()");
        }
        guestStreamSent = true;
        return { method: input.method, url, headers, body: request.body };
      }
      if (request.body instanceof Uint8Array && input.body === body) return { method: input.method, url, headers, body: request.body };
    }
    // A clone or a new Request: read whole, so it can be sent with an exact length (and again).
    const bytes = await readHookBody(input.body, limits.requestBodyBytes);
    headers = withExactLength(headers, bytes.length);
    return { method: input.method, url, headers, body: bytes };
  };

  const next = async (input?: unknown): Promise<Response> => {
    const chosen = input ?? seen;
    if (!isRequest(chosen)) throw new TypeError("next() takes a Request (or nothing, for the layer's own request)");
    let response: HookedResponse;
    try {
      response = await layer.next(await outbound(chosen));
    } catch (error) {
      if (error instanceof EgressError && error.status === 403) {
        const blocked = new HttpRequestBlockedError(error.message, 403);
        refusals.set(blocked, error);
        throw blocked;
      }
      throw error;
    }
    const web = makeResponse(response.status, response.headers, response.body === null ? null : webBody(response.body));
    given.set(web, response);
    trackClones(web, web, clones);
    return web;
  };

  let out: unknown;
  let kept: HookedResponse | undefined;
  try {
    try {
      out = await handle(seen, next);
    } catch (error) {
      const original = typeof error === "object" && error !== null ? refusals.get(error) : undefined;
      // A layer whose read of the guest's body (itself or a clone) passed maxHttpBodyBytes fails
      // with the limit's error, as an onRequest hook does: the limit is the answer (413, and
      // RESOURCE_EXHAUSTED to gRPC), not a broken hook (502, UNAVAILABLE, which gRPC clients retry).
      throw original ?? (tap?.limitHit === true ? requestTooLarge(limits) : hookFailure("handle", error));
    }
    // Also when the layer caught that failure and answered with something else.
    if (tap?.limitHit === true) throw requestTooLarge(limits);
    if (!isResponse(out)) {
      throw new EgressError("EG_HOOK_FAILED", 502, `handle returned ${out === null ? "null" : typeof out}, not a Response; a layer must answer with next()'s Response or its own`);
    }
    const answer = out;
    // next()'s Response itself, or a clone of one (the Cache API's idiom returns either).
    const root = given.has(answer) ? answer : clones.get(answer);
    const passed = root === undefined ? undefined : given.get(root);
    const through = readReturned("handle", "a Response", () => {
      if (passed === undefined || answer.bodyUsed || answer.body?.locked === true) return undefined;
      // Passed through: the upstream's own stream and framing; headers the layer set in place count.
      return { status: answer.status, headers: fromHeaders(answer.headers, "the Response handle returned") };
    });
    if (passed !== undefined && through !== undefined) {
      kept = passed;
      const same = sameHeaders(through.headers, passed.headers) && through.status === passed.status;
      // Once cloned, the upstream's stream feeds the clone's tee: the guest gets the answer's own
      // branch of it. Piping the stream itself as well (as for a body nobody cloned) gave the
      // guest what the tee had not taken, a 200 missing 64 KiB here and there, or cut.
      if (answerBranch(answer, root!, clones)) {
        const body = answer.body === null ? null : teeBranchBody(answer.body, passed.body);
        return same ? withFields(passed, { body }) : { status: through.status, headers: through.headers, body };
      }
      return same ? passed : { status: through.status, headers: through.headers, body: passed.body };
    }
    return fromHookResponse(answer, "handle", limits.bodySilenceMs);
  } finally {
    // What the layer did not answer with and holds no reader on goes back: its connection is
    // freed. A body with a reader is the layer's: it may feed the answer (`pipeThrough`, a
    // stream of its own), so only the layer knows when it is done; `reader.cancel()` frees it.
    // A clone nobody reads is cancelled, so its tee branch does not queue the whole body while
    // the guest reads its own; a later read of it fails ("Body is unusable"). One being read
    // keeps the upstream's stream, which ends with it or with the guest's branch.
    for (const [web, response] of given) {
      const family = [web, ...[...clones].filter(([, of]) => of === web).map(([copy]) => copy)];
      let held = false;
      for (const member of family) {
        if (member === out || member.body === null) continue;
        if (member.body.locked) held = true;
        else if (family.length > 1) void member.body.cancel().catch(() => undefined);
      }
      if (response !== kept && !held) discardBody(response.body);
    }
  }
}

/**
 * Whether the answer is one branch of a body the layer cloned: `root`, next()'s Response, was
 * cloned (its body is then a tee branch too), or the answer is a clone.
 */
function answerBranch(answer: Response, root: Response, clones: ReadonlyMap<Response, Response>): boolean {
  if (answer !== root) return true;
  for (const of of clones.values()) if (of === root) return true;
  return false;
}

/** The bodies handed to the guest as branches of an upstream body a layer cloned, with that body. */
const teedFrom = new WeakMap<Readable, Readable>();

/**
 * A tee branch of an upstream body, as a Node stream for the guest. It is still the upstream's
 * body (a failure in it is the upstream's), so it is not marked as one a hook made.
 */
function teeBranchBody(branch: ReadableStream<Uint8Array>, upstream: Readable | null): Readable {
  const body = nodeBody(branch);
  // A branch of a branch (an outer layer cloned what an inner one answered with) is still the descent's.
  if (upstream !== null) teedFrom.set(body, teedFrom.get(upstream) ?? upstream);
  return body;
}

/** The upstream body `body` is a layer's tee branch of, when it is one. */
export function teedUpstreamBody(body: Readable | null): Readable | undefined {
  return body === null ? undefined : teedFrom.get(body);
}

/**
 * Records the clones a layer makes of `response` (and of those clones), each with `root`, the
 * Response next() gave: cloning tees the upstream's stream, which then goes to the guest only
 * through a branch.
 */
function trackClones(response: Response, root: Response, clones: Map<Response, Response>): void {
  const clone = response.clone.bind(response);
  Object.defineProperty(response, "clone", {
    value: () => {
      const copy = clone();
      clones.set(copy, root);
      trackClones(copy, root, clones);
      return copy;
    },
  });
}

function sameHeaders(a: readonly string[], b: readonly string[]): boolean {
  if (a.length !== b.length) return false;
  const key = (list: readonly string[]): string => {
    const pairs: string[] = [];
    for (let i = 0; i < list.length; i += 2) pairs.push(`${list[i]!.toLowerCase()}:${list[i + 1]}`);
    return pairs.sort().join("\n");
  };
  return key(a) === key(b);
}

