import type { Readable } from "node:stream";
import { discardBody } from "../streams.js";
import type { PhaseName } from "../djs/protocol.js";
import { EgressError } from "../errors.js";
import { contentCodingList, withoutHeaders, type HeaderList } from "../headers.js";
import { BodyLimitError, BodyTap, contentCodings, readBounded, type ReadDeadline } from "../hooks/body-tap.js";
import type { Logger } from "../log.js";
import { allow } from "../policy/decision.js";
import { blockError, type DecideContext, type Decider } from "../deciders/decider.js";
import { concealHidden, documentBody, headerObject, requestPart, type Conceal, type DecisionDocument } from "../deciders/document.js";
import { bodyDeadline, madeBodyFailure } from "./body-reads.js";
import type { OutboundRequest } from "./exchange.js";
import { encodedBodyHeaders, withExactLength, type HookedResponse, type HookLimits, type OnRequestOutcome } from "./hook-phases.js";
import type { HookedOnResponse, HookSource, SourceCall } from "./hook-source.js";
import { withFields } from "../objects.js";

/**
 * An external decider (a command, a webhook, OPA) as a hook source. Its request phase is an
 * onRequest: allow goes on unchanged, a rewrite sets and removes headers (and is then checked
 * again like any rewrite: secrets, allowlist, addresses), a block ends the phase with the
 * decider's status and reason. Its response phase is an onResponse: allow passes the response
 * through untouched, a block answers the guest instead and discards the upstream's body.
 *
 * The document never holds a real secret value: `conceal` maps every current value back to its
 * placeholder and redacts retired ones, since on a redirect hop and in the response phase the
 * request already carries the values substituted for the hop before.
 */
export function deciderSource(decider: Decider, conceal: Conceal, log: Logger | undefined): HookSource {
  const phases = new Set<PhaseName>();
  if (decider.phases.has("request")) phases.add("onRequest");
  if (decider.phases.has("response")) phases.add("onResponse");
  const { label } = decider;
  const unregistered = (phase: string) => (): never => {
    throw new EgressError("EG_HOOK_FAILED", 502, `${label} has no ${phase} phase`);
  };
  return {
    tier: "decider",
    label,
    phases,
    describe: (phase) => `${label} (${phase})`,
    answered: allow("decider", "onRequest", `answered by ${label}`),
    onRequest: (request, tap, limits, call) => decideRequest(decider, conceal, request, tap, limits, { log, requestId: call.requestId, signal: call.signal }, call),
    isRequestAllowed: unregistered("isRequestAllowed"),
    isIpAllowed: unregistered("isIpAllowed"),
    onResponse: (response, request, limits, call) => decideResponse(decider, conceal, response, request, limits, { log, requestId: call.requestId, signal: call.signal }, call),
  };
}

async function decideRequest(
  decider: Decider,
  conceal: Conceal,
  request: OutboundRequest,
  tap: BodyTap | undefined,
  limits: HookLimits,
  context: DecideContext,
  call: SourceCall,
): Promise<OnRequestOutcome> {
  const { includeBody, maxBodyBytes } = decider.options;
  let outgoing = request;
  const shown = concealHidden(conceal, request.url, request.hiddenPath);
  const part = requestPart(request.method, request.url, request.headers, shown, request.hiddenPath);
  if (includeBody && request.body !== null) {
    const bytes =
      request.body instanceof Uint8Array ? request.body : await loadRequestBody(request.body, tap, limits.requestBodyBytes, bodyDeadline(decider.label, "request", limits.hookMs, null));
    // Read whole, the body goes on as bytes with its exact length (as when a policy reads it).
    if (!(request.body instanceof Uint8Array)) outgoing = withFields(request, { headers: withExactLength(request.headers, bytes.byteLength), body: bytes });
    part.body = documentBody(bytes, maxBodyBytes, shown);
  }
  const document: DecisionDocument = { phase: "request", guest: call.guest, request: part };
  const verdict = await decider.decide(document, context);
  // A failOpen decider that failed: on as an allow goes, and marked for the trace.
  if ("failedOpen" in verdict) return outgoing === request ? { request, failedOpen: verdict.failedOpen } : { request: outgoing, asSent: true, failedOpen: verdict.failedOpen };
  // Read whole for the document, the body is still the guest's: an allow changed nothing.
  if (verdict.decision === "allow") return outgoing === request ? { request } : { request: outgoing, asSent: true };
  if (verdict.decision === "block") throw blockError(verdict, decider.label, "request");
  const drop = new Set([...verdict.removeHeaders, ...verdict.setHeaders.map(([name]) => name)]);
  const headers: HeaderList = withoutHeaders(outgoing.headers, drop);
  for (const [name, value] of verdict.setHeaders) headers.push(name, value);
  return { request: withFields(outgoing, { headers }) };
}

async function loadRequestBody(body: Readable, tap: BodyTap | undefined, limit: number, deadline: ReadDeadline): Promise<Uint8Array> {
  try {
    return await readBounded(tap !== undefined ? tap.web : body, limit, deadline);
  } catch (error) {
    if (error instanceof BodyLimitError || tap?.limitHit === true) {
      throw new EgressError("EG_TOO_LARGE", 413, `the request body is larger than maxHttpBodyBytes (${limit}) for a decider to read`);
    }
    // The deadline's: the guest sent a byte now and then, never enough to end its body.
    if (error instanceof EgressError) throw error;
    throw new EgressError("EG_BAD_REQUEST", 400, `the request body could not be read for a decider: ${(error as Error).message}`);
  } finally {
    tap?.endHookPhase();
  }
}

async function decideResponse(
  decider: Decider,
  concealValues: Conceal,
  upstream: HookedResponse,
  request: OutboundRequest,
  limits: HookLimits,
  context: DecideContext,
  call: SourceCall,
): Promise<HookedOnResponse> {
  const discard = (): void => discardBody(upstream.body);
  const { includeBody, maxBodyBytes } = decider.options;
  // A hidden hop's response can quote its request whole: its path and query are redacted too.
  const conceal = concealHidden(concealValues, request.url, request.hiddenPath);
  const codings = contentCodings(upstream.headers);
  const decode = codings !== undefined;
  // Like the hooks, a decider sees a compressed body decoded, and so without Content-Encoding.
  const shownHeaders = includeBody && decode ? withoutHeaders(upstream.headers, encodedBodyHeaders) : upstream.headers;
  let passOn: Readable | null = upstream.body;
  const response: NonNullable<DecisionDocument["response"]> = { status: upstream.status, headers: headerObject(shownHeaders, conceal) };
  try {
    if (includeBody && upstream.body !== null) {
      if (!decode && conceal.active?.() === true) {
        const named = contentCodingList(upstream.headers);
        if (named.length > 0) {
          // Compressed or otherwise encoded, a copy of a value cannot be found to conceal (as the
          // recorder refuses to write such a body): the decider is not shown it.
          throw new EgressError(
            "EG_UPSTREAM",
            502,
            `the response body is in a content coding the proxy cannot undo (${named.join(", ")}), so it cannot be searched for secret values and is not sent to ${decider.label}`,
          );
        }
      }
      const tap = new BodyTap(upstream.body, { limit: limits.responseBodyBytes, record: true, ...(codings !== undefined ? { encodings: codings } : {}) });
      let bytes: Uint8Array;
      try {
        bytes = await readBounded(tap.web, limits.responseBodyBytes, bodyDeadline(decider.label, "response", limits.hookMs, upstream.body));
      } catch (error) {
        if (error instanceof BodyLimitError || tap.limitHit) {
          throw new EgressError("EG_UPSTREAM", 502, `the response body is larger than maxHttpResponseBodyBytes (${limits.responseBodyBytes}) for a decider to read`);
        }
        // The deadline's (a body trickling in, never silent for long): nothing failed under the read.
        if (tap.failure === undefined && error instanceof EgressError) throw error;
        const failure = tap.failure ?? error;
        throw (
          madeBodyFailure(upstream.body, failure, decider.label) ??
          new EgressError("EG_UPSTREAM", 502, `the upstream response body failed while a decider read it: ${(failure as Error).message}`)
        );
      }
      tap.endHookPhase();
      // The guest gets the original bytes, still compressed.
      passOn = tap.replay();
      response.body = documentBody(bytes, maxBodyBytes, conceal);
    }
    const document: DecisionDocument = { phase: "response", guest: call.guest, request: requestPart(request.method, request.url, request.headers, conceal, request.hiddenPath), response };
    const verdict = await decider.decide(document, context);
    if (verdict.decision === "block") throw blockError(verdict, decider.label, "response");
    // Passed on as an allow is, and marked for the trace.
    if ("failedOpen" in verdict) return withFields(upstream, { body: passOn, replaced: false, discard, failedOpen: verdict.failedOpen });
    // A rewrite cannot come back for a response: the answer's parser refuses one there.
    return withFields(upstream, { body: passOn, replaced: false, discard });
  } catch (error) {
    discard();
    if (passOn !== upstream.body) discardBody(passOn);
    throw error;
  }
}
