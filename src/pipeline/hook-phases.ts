import { discardBody } from "../streams.js";
import type { Readable } from "node:stream";
import { EgressError, badRequest, describeThrown, quoteShort } from "../errors.js";
import { getHeader, hasNoContent, noContentFraming, withoutHeaders, type HeaderList } from "../headers.js";
import { BodyTap, contentCodings } from "../hooks/body-tap.js";
import {
  fromHeaders,
  fromRequestHeaders,
  isRequest,
  isResponse,
  makeRequest,
  makeResponse,
  hookResponseBody,
  nodeBody,
  readHookBody,
  requestUrl,
} from "../hooks/fetch-objects.js";
import type { HttpHooks } from "../hooks/http-hooks.js";
import { carryMadeBody } from "../hooks/made-bodies.js";
import { hookFailure, requestEnded, runHook, type HookSignal } from "../hooks/run-hook.js";
import { madeBodyFailure } from "./body-reads.js";
import type { OpenFailure } from "../deciders/failure.js";
import type { OutboundRequest } from "./exchange.js";
import { withFields } from "../objects.js";

export interface HookLimits {
  readonly requestBodyBytes: number;
  readonly responseBodyBytes: number;
  readonly hookMs: number;
  /**
   * `timeouts.upstreamBodyMs`: the longest silence inside the body of a Response a hook made,
   * as inside an upstream's. None when absent (a check that sends nothing).
   */
  readonly bodySilenceMs?: number;
}

/** A response made or passed on by hooks, ready for the guest. */
export interface HookedResponse {
  readonly status: number;
  readonly headers: HeaderList;
  readonly body: Readable | null;
}

export type OnRequestOutcome =
  | {
      readonly request: OutboundRequest;
      /** The request goes on as the guest sent it, only its body read whole (a decider's includeBody): the trace says allow, not rewrite. */
      readonly asSent?: true;
      /** A failOpen decider failed and let the request go on: the trace says so. */
      readonly failedOpen?: OpenFailure;
    }
  | { readonly response: HookedResponse };

/** The framing of a body the proxy re-frames itself. */
export const contentLengthHeaders = new Set(["content-length", "transfer-encoding"]);
/** What no longer holds once a body is decoded for hooks. */
export const encodedBodyHeaders = new Set(["content-encoding", "content-length"]);

/** Headers for a body sent whole: its exact length, and no other framing. */
export function withExactLength(headers: HeaderList, length: number): HeaderList {
  return [...withoutHeaders(headers, contentLengthHeaders), "content-length", String(length)];
}

/**
 * Headers for a body that goes on as it came (the guest's stream, or bytes a hook built on an
 * earlier hop): the Content-Length it came with, whatever a hook set in place. A hook's
 * `content-length: 77` on an 18-byte upload reached an HTTP/2 upstream, which reset the stream
 * (502 blaming the upstream); an HTTP/1.1 upstream would have waited for bytes that never came.
 */
export function withFramingOf(headers: HeaderList, original: readonly string[]): HeaderList {
  const length = getHeader(original, "content-length");
  // Unchanged, the list stays as it is, in its order: the audit trace compares it to tell a rewrite.
  let framing = 0;
  let same = true;
  for (let i = 0; i < headers.length; i += 2) {
    const name = headers[i]!.toLowerCase();
    if (!contentLengthHeaders.has(name)) continue;
    framing += 1;
    if (name !== "content-length" || headers[i + 1] !== length) same = false;
  }
  if (same && framing === (length === undefined ? 0 : 1)) return headers;
  const kept = withoutHeaders(headers, contentLengthHeaders);
  return length === undefined ? kept : [...kept, "content-length", length];
}

/**
 * A Response from a hook, as the guest will get it. Its body is the hook's own stream, framed by
 * Node: a Content-Length the hook copied from another response (`new Response(short, response)`)
 * would no longer match.
 */
export function fromHookResponse(response: Response, hook: string, silenceMs: number | undefined): HookedResponse {
  return readReturned(hook, "a Response", () => {
    if (response.bodyUsed) {
      throw new EgressError("EG_HOOK_FAILED", 502, `${hook} returned a Response whose body was already read`);
    }
    // Read once: a getter (a subclass's) could answer the check one thing and the send another.
    const status: unknown = response.status;
    if (typeof status !== "number" || !Number.isInteger(status) || status < 200 || status > 599) {
      // Response.error() has status 0: there is nothing to send.
      throw new EgressError("EG_HOOK_FAILED", 502, `${hook} returned a Response with status ${quoteShort(String(status))}`);
    }
    const body = response.body;
    if (body?.locked === true) throw new EgressError("EG_HOOK_FAILED", 502, `${hook} returned a Response whose body a reader holds`);
    const headers = noContentFraming(status, withoutHeaders(fromHeaders(response.headers, `the Response ${hook} returned`), contentLengthHeaders));
    if (body !== null && hasNoContent(status)) {
      // A subclass can give any status a body; Node sent a 205's to HTTP/1.1 guests only.
      void body.cancel().catch(() => undefined);
      return { status, headers, body: null };
    }
    return { status, headers, body: body === null ? null : hookResponseBody(body, silenceMs, `the body of the Response ${hook} returned`, hook) };
  });
}

/**
 * Reads what a hook returned. Its fields are the hook's code (a subclass's getters, a Proxy):
 * whatever they throw is the hook's failure, 502 `EG_HOOK_FAILED`, not the proxy's.
 */
export function readReturned<T>(hook: string, what: string, read: () => T): T {
  try {
    return read();
  } catch (error) {
    if (error instanceof EgressError) throw error;
    throw new EgressError("EG_HOOK_FAILED", 502, `${hook} returned ${what} that could not be read (see the proxy log)`, { cause: error, detail: describeThrown(error) });
  }
}

/**
 * §3 step 2 for tier 3: the hook sees a Request with a lazily read body. Continuing with the same
 * Request keeps the original stream (not copied at all when unread, or its tee branch after
 * `clone()`); a new Request's body is read so it can go out with an exact Content-Length.
 */
export async function runOnRequest(
  onRequest: NonNullable<HttpHooks["onRequest"]>,
  request: OutboundRequest,
  tap: BodyTap | undefined,
  limits: HookLimits,
  signal?: HookSignal,
): Promise<OnRequestOutcome> {
  // The guest's stream on the first hop; on a 307/308 hop, the bytes a hook built earlier.
  const body =
    request.body === null
      ? null
      : request.body instanceof Uint8Array
        ? new Blob([request.body]).stream()
        : ((tap?.web as ReadableStream<Uint8Array> | undefined) ?? null);
  const seen = makeRequest(request.url, request.method, request.headers, body);
  const clones = trackClones(seen);
  const tooLarge = (): EgressError => requestTooLarge(limits);
  // A hook that hit the limit usually fails with it: the limit, not the hook, is the answer.
  let out: Awaited<ReturnType<typeof onRequest>>;
  const called = performance.now();
  try {
    out = await runHook("onRequest", limits.hookMs, () => onRequest(seen), signal);
  } catch (error) {
    throw tap?.limitHit === true ? tooLarge() : hookFailure("onRequest", error);
  }
  // A clone the hook left unread would queue the whole upload in its tee branch: cancel it.
  // One still held by a reader cannot be cancelled, so the limit then stays on.
  if (!releaseClones(clones)) tap?.endHookPhase();
  if (tap?.limitHit === true) throw tooLarge();
  if (isResponse(out)) return { response: fromHookResponse(out, "onRequest", limits.bodySilenceMs) };
  if (out !== undefined && !isRequest(out)) {
    throw new EgressError("EG_HOOK_FAILED", 502, "onRequest returned something other than undefined, a Request or a Response");
  }
  const final = out ?? seen;
  const read = readReturned("onRequest", "a Request", () => {
    if (final.bodyUsed) {
      throw badRequest("onRequest read the request body and then forwarded it; read request.clone() instead");
    }
    const method: unknown = final.method;
    if (typeof method !== "string") throw new EgressError("EG_HOOK_FAILED", 502, "onRequest returned a Request whose method is not a string");
    const subject = final === seen ? "the request as onRequest left it" : "the Request onRequest returned";
    return { method, url: requestUrl(final, "onRequest"), headers: fromRequestHeaders(final.headers, subject), body: final.body };
  });
  // The framing is the proxy's, as on the response side: the body's own length, never one a hook set.
  let headers = final === seen ? withFramingOf(read.headers, request.headers) : withoutHeaders(read.headers, contentLengthHeaders);
  let forwarded: Readable | Uint8Array | null = null;
  if (read.body !== null) {
    if (final === seen && request.body instanceof Uint8Array) {
      // Bytes an earlier entry built go on as bytes, whatever the hook read of its clone: as a
      // stream, the next entry saw no body (the request went out empty), and a 307 or 308 could
      // no longer send them again (black-box finding).
      forwarded = request.body;
      if (!read.body.locked) void read.body.cancel().catch(() => undefined);
    } else if (final === seen) {
      // The guest's own bytes: untouched (fast path) or through the tee that clone() made.
      forwarded = tap !== undefined && !tap.started && read.body === tap.web ? tap.source : nodeBody(read.body);
    } else {
      let bytes: Buffer;
      try {
        // The body is part of the hook's answer: it ends within the call's timeouts.hookMs.
        bytes = await readHookBody(read.body, limits.requestBodyBytes, {
          ms: limits.hookMs - (performance.now() - called),
          error: () =>
            new EgressError("EG_HOOK_TIMEOUT", 504, `onRequest hook did not settle within ${limits.hookMs} ms: the body of the Request it returned had not ended`, { failure: "time" }),
          ...(signal !== undefined ? { ended: { signal, error: () => requestEnded("onRequest", signal) } } : {}),
        });
      } catch (error) {
        if (error instanceof EgressError) throw error;
        throw new EgressError("EG_HOOK_FAILED", 502, "the body of the Request onRequest returned failed (see the proxy log)", { cause: error, detail: describeThrown(error) });
      }
      headers = withExactLength(headers, bytes.length);
      forwarded = bytes;
    }
  }
  return { request: { method: read.method, url: read.url, headers, body: forwarded } };
}

/**
 * §3 step 7 for tier 3: the hook sees the response decoded (gzip, deflate, br) and without
 * Content-Encoding. If it returns undefined, the guest gets the original bytes, including any
 * part of the body the hook read.
 */
export async function runOnResponse(
  onResponse: NonNullable<HttpHooks["onResponse"]>,
  upstream: HookedResponse,
  request: OutboundRequest,
  limits: HookLimits,
  signal?: HookSignal,
): Promise<HookedResponse & { readonly replaced: boolean; readonly discard: () => void }> {
  if (upstream.status < 200 || upstream.status > 599) {
    throw new EgressError("EG_UPSTREAM", 502, `upstream answered status ${upstream.status}, which hooks cannot represent`);
  }
  const codings = contentCodings(upstream.headers);
  const decode = codings !== undefined;
  const tap =
    upstream.body === null
      ? undefined
      : new BodyTap(upstream.body, { limit: limits.responseBodyBytes, record: true, ...(codings !== undefined ? { encodings: codings } : {}) });
  const hookHeaders = decode ? withoutHeaders(upstream.headers, encodedBodyHeaders) : upstream.headers;
  const seen = makeResponse(upstream.status, hookHeaders, (tap?.web as ReadableStream<Uint8Array> | undefined) ?? null);
  const clones = trackResponseClones(seen);
  const seenRequest = makeRequest(request.url, request.method, request.headers, null);
  const discard = (): void => {
    discardBody(upstream.body);
  };
  const tooLarge = (): EgressError => {
    discard();
    return new EgressError("EG_UPSTREAM", 502, `the response body is larger than maxHttpResponseBodyBytes (${limits.responseBodyBytes}) for a hook to read`);
  };
  let out: Awaited<ReturnType<typeof onResponse>>;
  try {
    out = await runHook("onResponse", limits.hookMs, () => onResponse(seen, seenRequest), signal);
  } catch (error) {
    if (tap?.limitHit === true) throw tooLarge();
    discard();
    // The body failed under the hook's read (the upstream cut it, fell silent, or its coding was
    // corrupt): the upstream's failure, as tier 2 reports it, whatever the hook made of it; or,
    // when an earlier hook's Response made the body, that hook's. A refusal the hook made of it
    // stays the hook's answer.
    const failed = hookFailure("onResponse", error);
    const failure = tap?.failure;
    if (failure !== undefined && failed.code !== "EG_HOOK_BLOCKED") {
      throw (
        madeBodyFailure(upstream.body, failure, "the onResponse hook") ??
        new EgressError("EG_UPSTREAM", 502, `the upstream response body failed while the hook read it: ${failure.message}`, { cause: failure, detail: failure.message })
      );
    }
    throw failed;
  }
  tap?.endHookPhase();
  if (tap?.limitHit === true) throw tooLarge();
  if (out === undefined) {
    // A clone the hook still reads goes on with the guest's replay, as a request's clone goes on
    // with the upload; every other branch of the hook's tee is cancelled, or it would queue
    // what that clone reads.
    const reading = releaseClones(clones);
    if (reading && seen.body !== null && !seen.body.locked) void seen.body.cancel().catch(() => undefined);
    const body = tap === undefined ? null : tap.replay(reading);
    // What the hook left unread of an earlier hook's body is still that hook's.
    carryMadeBody(upstream.body, body);
    return withFields(upstream, { body, replaced: false, discard });
  }
  if (!isResponse(out)) {
    discard();
    throw new EgressError("EG_HOOK_FAILED", 502, "onResponse returned something other than undefined or a Response");
  }
  try {
    return withFields(fromHookResponse(out, "onResponse", limits.bodySilenceMs), { replaced: true, discard });
  } catch (error) {
    discard();
    throw error;
  }
}

/** Records the clones a hook makes of `request`, so unread ones can be released afterwards. */
function trackClones(request: Request): Request[] {
  const clones: Request[] = [];
  const clone = request.clone.bind(request);
  Object.defineProperty(request, "clone", {
    value: () => {
      const copy = clone();
      clones.push(copy);
      return copy;
    },
  });
  return clones;
}

/** Records the clones a hook makes of `response`, and of those clones. */
function trackResponseClones(response: Response, clones: Response[] = []): Response[] {
  const clone = response.clone.bind(response);
  Object.defineProperty(response, "clone", {
    value: () => {
      const copy = clone();
      clones.push(copy);
      trackResponseClones(copy, clones);
      return copy;
    },
  });
  return clones;
}

/** Cancels unread clones; returns true if one is still held by a reader. */
function releaseClones(clones: readonly (Request | Response)[]): boolean {
  let locked = false;
  for (const copy of clones) {
    if (copy.body === null) continue;
    if (copy.body.locked) locked = true;
    else void copy.body.cancel().catch(() => undefined);
  }
  return locked;
}

/** A hook (onRequest, or a tier-3 layer) read the guest's body past maxHttpBodyBytes: the limit is the answer. */
export function requestTooLarge(limits: HookLimits): EgressError {
  return new EgressError("EG_TOO_LARGE", 413, `the request body is larger than maxHttpBodyBytes (${limits.requestBodyBytes}) for a hook to read`);
}
