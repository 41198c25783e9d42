import { Readable } from "node:stream";
import { EgressError } from "../errors.js";
import { httpToken, withoutHeaders, type HeaderList } from "../headers.js";
import { BodyLimitError, readBounded, type BodyTap } from "../hooks/body-tap.js";
import type { CallFields, EffectRejection, JournalEntry, NeededBody, Outcome } from "../djs/protocol.js";
import { discardBody } from "../streams.js";
import { bytesBody, call, failure, returnedDetail, joinHeaders, newSeed, policyBodyCap, policyRequestHeaders, policyResponse, type DjsRun } from "./djs-phases.js";
import type { OutboundRequest } from "./exchange.js";
import { contentLengthHeaders, withExactLength, type HookedResponse, type HookLimits } from "./hook-phases.js";
import type { LayerNext } from "./hook-source.js";

/**
 * The most effects (`next()` and `sleep()` calls) one call of a policy's handle may make. Each
 * costs a run of the policy from the start, so the bound keeps a layer's work in the sandbox
 * finite; LayerRun's own bound on descents (10) comes first for next().
 */
export const maxLayerEffects = 32;

/** An effect the proxy performed for the call: what the policy is told, and what the proxy keeps. */
interface Performed {
  readonly entry: JournalEntry;
  /** What `layer.next` resolved to. */
  readonly response?: HookedResponse;
  /** Its body, once loaded for the policy (as it arrived, still encoded, as tier 3's layers see it). */
  loaded?: Uint8Array;
  /** How the effect failed, to answer with if the policy throws that failure on. */
  readonly error?: EgressError;
}

type NextEffect = Extract<Outcome, { t: "effect"; k: "next" }>;

/**
 * A tier-2 layer: the policy's `handle(request, next)`. The policy runs in its worker and cannot
 * wait there for the upstream, so `next()` and `sleep()` end the call: the proxy performs the
 * effect (a descent through `layer.next`, or `layer.sleep`), writes its result in the call's
 * journal and runs the call again from the start, with the same clock and seed, and the journal
 * answering the effects already made. Each run has the policy's time limit; time spent in the
 * upstream or asleep is not the policy's. A body the policy reads is loaded the same way as in
 * onRequest and onResponse.
 */
export async function djsHandle(run: DjsRun, request: OutboundRequest, tap: BodyTap | undefined, layer: LayerNext, limits: HookLimits): Promise<HookedResponse> {
  const filename = run.engine.filename;
  const now = Date.now();
  const seed = newSeed();
  const performed: Performed[] = [];
  /** The request's body, once loaded for the policy. */
  let loaded: Uint8Array | undefined;
  /** The request's body, read whole by the proxy: bytes it had already, or held for a clone. */
  let held: Uint8Array | undefined = request.body instanceof Uint8Array ? request.body : undefined;
  /** Whether a descent took the guest's stream. */
  let streamed = false;
  /** A descent's response whose body the answer uses, so it is not discarded. */
  let kept: HookedResponse | undefined;
  const head = { method: request.method, url: request.url.href, headers: joinHeaders(request.headers, request.url.host), hasBody: request.body !== null };
  // The guest's stream, as long as nothing has read or sent it.
  const guestStream = (): Readable | undefined =>
    request.body instanceof Readable && tap !== undefined && !tap.started && !streamed ? request.body : undefined;

  /** The guest's body read whole, within `cap`: for the policy to read, or for the proxy to hold. */
  const readGuestBody = async (cap: number, reason: string, what: string): Promise<Uint8Array> => {
    const stream = guestStream();
    if (stream === undefined) {
      throw new EgressError("EG_HOOK_FAILED", 502, "handle policy read or cloned the request body after next() had streamed it upstream; clone the request before its first next()", { detail: filename });
    }
    try {
      const bytes = await readBounded(tap!.web, cap);
      if (bytes.byteLength > cap) throw new BodyLimitError(cap);
      return bytes;
    } catch (error) {
      if (error instanceof BodyLimitError || tap?.limitHit === true) {
        throw new EgressError("EG_TOO_LARGE", 413, `the request body is larger than ${cap} bytes, the most ${what} (${reason})`);
      }
      throw new EgressError("EG_BAD_REQUEST", 400, `the request body could not be read for the policy: ${(error as Error).message}`);
    } finally {
      tap?.endHookPhase();
    }
  };

  const loadRequestBody = async (): Promise<void> => {
    if (loaded !== undefined || request.body === null) throw new EgressError("EG_HOOK_FAILED", 502, "handle policy asked again for a request body it has", { detail: filename });
    const { cap, reason } = policyBodyCap(run, limits.requestBodyBytes);
    if (held === undefined) {
      loaded = held = await readGuestBody(cap, reason, "this policy may read");
      return;
    }
    if (held.byteLength > cap) throw new EgressError("EG_TOO_LARGE", 413, `the request body is larger than ${cap} bytes, the most this policy may read (${reason})`);
    loaded = held;
  };

  /** For request.clone(): the proxy reads the body whole and keeps it, so each next() can send it. */
  const holdRequestBody = async (): Promise<void> => {
    if (request.body === null) throw new EgressError("EG_HOOK_FAILED", 502, "handle policy asked for a request body there is none of", { detail: filename });
    // Loaded for the policy in the same stop, the bytes are held already.
    if (held !== undefined) return;
    held = await readGuestBody(limits.requestBodyBytes, "maxHttpBodyBytes", "the proxy holds for a layer to send again");
  };

  const loadResponseBody = async (index: number): Promise<Uint8Array> => {
    const done = performed[index];
    const body = done?.response?.body;
    if (done === undefined || body === undefined) throw new EgressError("EG_HOOK_FAILED", 502, `handle policy asked for the body of a next() response it was not given`, { detail: filename });
    if (done.loaded !== undefined) return done.loaded;
    if (body === null) return (done.loaded = new Uint8Array(0));
    const { cap, reason } = policyBodyCap(run, limits.responseBodyBytes);
    try {
      done.loaded = await readBounded(body, cap);
      return done.loaded;
    } catch (error) {
      discardBody(body);
      if (error instanceof BodyLimitError) {
        throw new EgressError("EG_UPSTREAM", 502, `the response body is larger than ${cap} bytes, the most this policy may read (${reason})`);
      }
      throw new EgressError("EG_UPSTREAM", 502, `the upstream response body failed while the policy read it: ${(error as Error).message}`);
    }
  };

  const load = async (which: readonly NeededBody[]): Promise<void> => {
    if (which.length === 0) throw new EgressError("EG_HOOK_FAILED", 502, "handle policy stopped without saying why", { detail: filename });
    for (const body of which) {
      if (body === "request") await loadRequestBody();
      else if (body === "held") await holdRequestBody();
      else if (typeof body === "number") {
        if (performed[body]?.loaded !== undefined) throw new EgressError("EG_HOOK_FAILED", 502, "handle policy asked again for a body it has", { detail: filename });
        await loadResponseBody(body);
      } else throw new EgressError("EG_HOOK_FAILED", 502, "handle policy asked for a response body outside a next() response", { detail: filename });
    }
  };

  /** The request a next() effect describes, checked as onRequest's Request would be. */
  const outbound = async (effect: NextEffect, bytes: Uint8Array | undefined): Promise<OutboundRequest> => {
    let url: URL;
    try {
      url = new URL(effect.url);
    } catch {
      throw new EgressError("EG_HOOK_FAILED", 502, "handle policy passed next() a Request with an invalid URL");
    }
    if (url.protocol !== "http:" && url.protocol !== "https:") {
      throw new EgressError("EG_HOOK_FAILED", 502, `handle policy passed next() a Request for a non-HTTP URL (${url.protocol})`);
    }
    url.hash = "";
    if (!httpToken.test(effect.method)) throw new EgressError("EG_HOOK_FAILED", 502, "handle policy passed next() a Request with an invalid method");
    const headers = policyRequestHeaders(effect.headers, "handle", "the Request the handle policy passed to next()");
    const ref = effect.body;
    const sized = (body: Uint8Array): OutboundRequest => ({ method: effect.method, url, headers: withExactLength(headers, body.byteLength), body });
    if (ref === null) return { method: effect.method, url, headers: withoutHeaders(headers, contentLengthHeaders), body: null };
    if ("b" in ref) return sized(bytes ?? new Uint8Array(0));
    if ("n" in ref) return sized(await loadResponseBody(ref.n));
    if (ref.h !== "request" || request.body === null) throw new EgressError("EG_HOOK_FAILED", 502, "handle policy passed next() a body it does not have");
    if (held !== undefined) return sized(held);
    const stream = guestStream();
    if (stream === undefined) {
      // The sandbox refuses this itself; this is the proxy's own guard. No empty body goes out.
      throw new EgressError("EG_HOOK_FAILED", 502, "next() was given a request whose body an earlier next() already streamed; pass request.clone() to each next()");
    }
    streamed = true;
    // The guest's own framing goes on with its stream.
    return { method: effect.method, url, headers, body: stream };
  };

  const perform = async (effect: Extract<Outcome, { t: "effect" }>, bytes: Uint8Array | undefined): Promise<Performed> => {
    if (effect.i !== performed.length) throw new EgressError("EG_HOOK_FAILED", 502, "handle policy's effects are out of step with its journal", { detail: filename });
    if (performed.length >= maxLayerEffects) {
      throw new EgressError("EG_HOOK_FAILED", 502, `handle policy called next() and sleep() more than ${maxLayerEffects} times in one call`, { detail: filename });
    }
    const k = effect.k;
    try {
      if (effect.k === "sleep") {
        await layer.sleep(effect.ms);
        return { entry: { k, sig: effect.sig } };
      }
      const sent = await outbound(effect, bytes);
      const response = await layer.next(sent);
      return {
        entry: { k, sig: effect.sig, res: { status: response.status, statusText: "", headers: joinHeaders(response.headers), url: sent.url.href, hasBody: response.body !== null } },
        response,
      };
    } catch (caught) {
      const error = caught instanceof EgressError ? caught : new EgressError("EG_HOOK_FAILED", 502, `${k}() failed: ${(caught as Error).message}`, { cause: caught });
      return { entry: { k, sig: effect.sig, rej: rejectionOf(error) }, error };
    }
  };

  /** The answer from a Response the policy built or rebuilt. */
  const answer = (outcome: Extract<Outcome, { t: "response" }>, bytes: Uint8Array | undefined): HookedResponse => {
    const ref = outcome.body;
    let body: Readable | null;
    if (ref === null) body = null;
    else if ("b" in ref) body = bytesBody(bytes ?? new Uint8Array(0));
    else if ("n" in ref) {
      const done = performed[ref.n];
      if (done?.response === undefined) throw new EgressError("EG_HOOK_FAILED", 502, "handle policy answered with the body of a next() response it was not given");
      if (done.loaded !== undefined) body = bytesBody(done.loaded);
      else {
        body = done.response.body;
        kept = done.response;
      }
    } else if (ref.h === "request" && request.body !== null) {
      if (held !== undefined) body = bytesBody(held);
      else {
        const stream = guestStream();
        if (stream === undefined) throw new EgressError("EG_HOOK_FAILED", 502, "handle policy answered with the request body after next() had streamed it upstream");
        body = stream;
        streamed = true;
      }
    } else {
      throw new EgressError("EG_HOOK_FAILED", 502, "handle policy answered with a body it does not have");
    }
    return policyResponse(outcome, body, "handle");
  };

  try {
    for (;;) {
      const journal = performed.map((done) => done.entry);
      const message: CallFields = {
        phase: "handle",
        now,
        seed,
        ...head,
        ...(loaded !== undefined ? { requestBody: loaded } : {}),
        ...(journal.length > 0 ? { journal, nextBodies: performed.map((done) => done.loaded) } : {}),
        ...(held !== undefined ? { replayable: true } : {}),
      };
      const { outcome, bytes } = await call(run, message);
      switch (outcome.t) {
        case "need":
          await load(outcome.which);
          continue;
        case "effect":
          performed.push(await perform(outcome, bytes));
          continue;
        case "passed": {
          const done = performed[outcome.i];
          if (done?.response === undefined) throw new EgressError("EG_HOOK_FAILED", 502, "handle policy returned a response next() did not give it", { detail: filename });
          if (done.loaded === undefined) {
            // Passed through: the descent's own response, stream and all (LayerRun knows it by identity).
            kept = done.response;
            return done.response;
          }
          // The policy read it (through a clone): the bytes it was read into go on, framed by their length.
          const { status, headers } = done.response;
          return { status, headers: withExactLength(headers as HeaderList, done.loaded.byteLength), body: bytesBody(done.loaded) };
        }
        case "response":
          return answer(outcome, bytes);
        case "diverged":
          throw new EgressError("EG_HOOK_FAILED", 502, "the policy's rerun diverged from its first run", {
            detail: `${filename}: handle ran again from the start and ${outcome.what}; a layer must make the same next() and sleep() calls every time it runs`,
          });
        case "bad":
          throw new EgressError("EG_HOOK_FAILED", 502, `handle policy returned ${outcome.what}, not a Response; a layer must answer with next()'s Response or its own`, { detail: returnedDetail(run, outcome.what, outcome.shown) });
        case "throw":
        case "blocked": {
          // next()'s own failure, thrown on as it came: the guest gets what ended the descent.
          const original = outcome.from === undefined ? undefined : performed[outcome.from]?.error;
          if (original !== undefined) throw original;
          throw failure("handle", outcome, run);
        }
        default:
          throw failure("handle", outcome, run);
      }
    }
  } finally {
    // What the answer does not use goes back, so its connection returns to the pool.
    for (const done of performed) if (done.response !== undefined && done.response !== kept) discardBody(done.response.body);
  }
}

/** How an effect failed, as the sandbox rejects with it: refusals become HttpRequestBlockedError. */
function rejectionOf(error: EgressError): EffectRejection {
  const blocked = error.code === "EG_DENIED" || error.code === "EG_HOOK_BLOCKED";
  return { blocked, name: blocked ? "HttpRequestBlockedError" : "Error", message: error.message, status: error.status, statusText: error.statusText, code: error.code };
}
