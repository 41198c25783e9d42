import { Readable } from "node:stream";
import { EgressError } from "../errors.js";
import { fromHeaders, fromRequestHeaders, isRequest, isResponse, makeRequest, makeResponse, readHookBody, requestUrl, webBody } from "../hooks/fetch-objects.js";
import { HttpRequestBlockedError } from "../hooks/blocked-error.js";
import type { BodyTap } from "../hooks/body-tap.js";
import type { HttpHooks } from "../hooks/http-hooks.js";
import { hookFailure } from "../hooks/run-hook.js";
import { discardBody } from "../streams.js";
import { withoutHeaders } from "../headers.js";
import type { OutboundRequest } from "./exchange.js";
import { contentLengthHeaders, fromHookResponse, readReturned, withExactLength, withFramingOf, type HookedResponse, type HookLimits } from "./hook-phases.js";
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
    return web;
  };

  let out: unknown;
  let kept: HookedResponse | undefined;
  try {
    try {
      out = await handle(seen, next);
    } catch (error) {
      const original = typeof error === "object" && error !== null ? refusals.get(error) : undefined;
      throw original ?? hookFailure("handle", error);
    }
    if (!isResponse(out)) {
      throw new EgressError("EG_HOOK_FAILED", 502, `handle returned ${out === null ? "null" : typeof out}, not a Response; a layer must answer with next()'s Response or its own`);
    }
    const answer = out;
    const passed = given.get(answer);
    const through = readReturned("handle", "a Response", () => {
      if (passed === undefined || answer.bodyUsed || answer.body?.locked === true) return undefined;
      // Passed through: the upstream's own stream and framing; headers the layer set in place count.
      return { status: answer.status, headers: fromHeaders(answer.headers, "the Response handle returned") };
    });
    if (passed !== undefined && through !== undefined) {
      kept = passed;
      return sameHeaders(through.headers, passed.headers) && through.status === passed.status ? passed : { status: through.status, headers: through.headers, body: passed.body };
    }
    return fromHookResponse(answer, "handle", limits.bodySilenceMs);
  } finally {
    // What the layer did not answer with and holds no reader on goes back: its connection is
    // freed. A body with a reader is the layer's: it may feed the answer (`pipeThrough`, a
    // stream of its own), so only the layer knows when it is done; `reader.cancel()` frees it.
    for (const [web, response] of given) {
      if (response !== kept && (web.body === null || !web.body.locked)) discardBody(response.body);
    }
  }
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

