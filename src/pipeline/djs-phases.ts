import { discardBody } from "../streams.js";
import { Readable } from "node:stream";
import { validateHeaderName, validateHeaderValue } from "node:http";
import { EgressError, badRequest, type HookFailureKind } from "../errors.js";
import { endToEndHeaders, expectRefused, hasExpect, httpToken, withoutHeaders, type HeaderList } from "../headers.js";
import { BodyLimitError, BodyTap, contentCodings, readBounded } from "../hooks/body-tap.js";
import { hookFailure, requestEnded, type HookSignal } from "../hooks/run-hook.js";
import { busyLimit, type DjsEngine } from "../djs/engine.js";
import type { BodyRef, CallFields, CallReply, Outcome, PhaseName } from "../djs/protocol.js";
import type { Logger } from "../log.js";
import { maxExpansion, needle, NeedleSet, redactText, unscannedMarker } from "../policy/secret-scan.js";
import { hiddenCopies } from "../policy/hidden-url.js";
import type { SecretStore } from "../policy/secrets.js";
import { bodyDeadline, madeBodyFailure } from "./body-reads.js";
import type { OutboundRequest } from "./exchange.js";
import { contentLengthHeaders, encodedBodyHeaders, withExactLength, withFramingOf, type HookedResponse, type HookLimits, type OnRequestOutcome } from "./hook-phases.js";
import { withFields } from "../objects.js";

/**
 * §3 for tier 2: the same phases as tier 3, but the request never becomes a WHATWG object in
 * the proxy. Its head crosses to the policy's worker as flat fields, and its body only when the
 * policy reads it: then the call ends, the proxy loads the body (within the limits), and the
 * call runs again from the start with the bytes at hand. Fresh state and a fixed clock make that
 * second run see exactly what the first did.
 */
export interface DjsRun {
  readonly engine: DjsEngine;
  readonly log: Logger | undefined;
  readonly requestId: number | undefined;
  /** The guest's secrets, for the policy's console lines (logConsole). */
  readonly secrets?: ConsoleSecrets | undefined;
  /** The other guests' secrets, for a console line the log cuts (see {@link consoleText}). */
  readonly neighbours?: (() => Iterable<ConsoleSecrets | undefined>) | undefined;
  /** The request's end (its GuestGone): a call still waiting for a worker is dropped, one running let go. */
  readonly signal?: HookSignal | undefined;
  /** `timeouts.hookMs`: how long a call may wait for a worker before it gets 504. */
  readonly hookMs?: number | undefined;
}

/** What a console line is redacted with: one guest's secrets. */
export type ConsoleSecrets = Pick<SecretStore, "redact" | "reach" | "size" | "needles">;

/**
 * What a call's console lines and shown values are redacted with: the guest's secrets, and for a
 * hidden redirect hop (OutboundRequest.hiddenPath) its path and query too, which a policy that
 * logs `url.pathname` (policies/audit-log.mjs does) would write as the URL parser rewrote the
 * value there, past recognising.
 */
export function consoleSecretsFor(secrets: ConsoleSecrets | undefined, request: OutboundRequest): ConsoleSecrets | undefined {
  if (request.hiddenPath === undefined) return secrets;
  const copies = hiddenCopies(request.url, request.hiddenPath);
  if (copies.length === 0) return secrets;
  const needles = [...(secrets?.needles() ?? []), ...copies.map((copy) => needle(copy.name, copy.value))];
  const set = new NeedleSet(needles);
  const longest = Math.max(...copies.map((copy) => Buffer.byteLength(copy.value)));
  return {
    size: needles.length,
    needles: () => needles,
    reach: () => Math.max(secrets?.reach() ?? 0, maxExpansion * longest + 16),
    redact: (text, keep, tally) => redactText(text, set, undefined, keep, tally),
  };
}

/** The characters of a policy's console line the log keeps. */
export const consoleLineChars = 8192;

/**
 * Where the sandbox cuts a console line (`maxLineChars` in prelude/console.js): far enough past
 * {@link consoleLineChars} that a value the log's cut goes through is whole in what arrives,
 * for values whose longest encoding ({@link SecretStore.reach}) fits in the difference.
 */
export const consoleSandboxChars = 65_536;

const codeFalse = 0;
const codeTrue = 1;
const codeUnchanged = 2;

/** A header list for the policy: names lowercased, joined with LF, with `host` as it will be sent. */
export function joinHeaders(list: HeaderList, host?: string): string {
  let joined = "";
  for (let i = 0; i < list.length; i += 2) joined += `${i === 0 ? "" : "\n"}${list[i]!.toLowerCase()}\n${list[i + 1]!}`;
  if (host !== undefined) joined += `${joined === "" ? "" : "\n"}host\n${host}`;
  return joined;
}

function logConsole(run: DjsRun, reply: CallReply): void {
  const lines = reply.outcome.logs;
  if (lines === undefined || run.log === undefined) return;
  for (const [level, text] of lines) {
    const write = level === "debug" || level === "warn" || level === "error" ? run.log[level] : run.log.info;
    write("policy console", { id: run.requestId, policy: run.engine.filename, text: consoleText(text, run.secrets, run.neighbours?.()) });
  }
}

/**
 * A console line as the log keeps it: redacted, then cut to {@link consoleLineChars}. Cut
 * first, a value the cut went through lost its end, and redaction no longer knew its first part
 * (the log showed 40 of a token's 41 characters; black-box finding). A line the sandbox cut
 * where a value could still run past is not written: that value may be cut.
 *
 * A line the log cuts is redacted with every guest's values (`neighbours`), not only with the
 * calling guest's: the log's own pass over every guest comes after the cut, and would no longer
 * know another guest's value the cut went through (review finding). A line the log keeps whole
 * is left to that pass for the other guests.
 */
export function consoleText(text: string, secrets: ConsoleSecrets | undefined, neighbours?: Iterable<ConsoleSecrets | undefined>): string {
  const cut = text.length > consoleLineChars;
  return redactThenCut(text, cut ? [secrets, ...(neighbours ?? [])] : [secrets], consoleLineChars, "a console line");
}

/**
 * `text` redacted with `stores`, then cut to `keep` characters; a text the sandbox may have cut
 * through a value that reaches past `keep` once redacted is not shown at all.
 */
function redactThenCut(text: string, from: Iterable<ConsoleSecrets | undefined>, keep: number, what: string): string {
  const stores: ConsoleSecrets[] = [];
  for (const store of from) if (store !== undefined && store.size > 0) stores.push(store);
  if (stores.length === 0) return text.length > keep ? text.slice(0, keep) : text;
  if (text.length >= consoleSandboxChars && Math.max(...stores.map((s) => s.reach())) > consoleSandboxChars - keep) {
    return `${unscannedMarker} (${what} over ${consoleSandboxChars} characters, too long to redact)`;
  }
  if (stores.length === 1) return stores[0]!.redact(text, keep);
  return redactText(text, new NeedleSet(stores.flatMap((s) => s.needles())), undefined, keep);
}

/** The characters of a value a phase returned that the log's detail shows (see {@link shownValue}). */
export const shownValueChars = 100;

/**
 * What a phase returned that it cannot use, as the log's detail shows it after the policy's file:
 * its type and a short view of it (a string's first characters, quoted; a number; an object's
 * kind and first keys), with "…" when it is longer than {@link shownValueChars}. The sandbox
 * sends up to {@link consoleSandboxChars} of it, which is redacted before it is cut, as a console
 * line is ({@link consoleText}): the text is the policy's, and may hold a value (isRequestAllowed
 * sees the request with its secrets).
 */
function shownValue(type: string, shown: string | undefined, run: ShownRun): string {
  if (shown === undefined) return `returned ${type}`;
  // Every guest's values, whether cut or not: the log's own pass over them comes after the
  // quoting below, which escapes a value's `"` or `\` where that pass would not know it.
  const kept = redactThenCut(shown, [run.secrets, ...(run.neighbours?.() ?? [])], shownValueChars, "a returned value");
  const text = shown.length > shownValueChars && !kept.startsWith(unscannedMarker) ? `${kept}…` : kept;
  if (type === "string") return `returned string ${JSON.stringify(text)}`;
  if (type === "symbol") return `returned symbol Symbol(${JSON.stringify(text)})`;
  // The rest is the sandbox's description, with names the policy chose in it: no control characters.
  return `returned ${type} ${JSON.stringify(text).slice(1, -1)}`;
}

/** The detail of a failure for a value a phase returned: the policy's file, and the value when the sandbox showed it. */
export function returnedDetail(run: ShownRun, type: string, shown: string | undefined): string {
  return shown === undefined ? run.engine.filename : `${run.engine.filename}: ${shownValue(type, shown, run)}`;
}

/** What {@link failure} needs of a run to name and show what a policy returned. */
export type ShownRun = Pick<DjsRun, "secrets" | "neighbours"> & { readonly engine: Pick<DjsEngine, "filename"> };

/**
 * A seed for the policy's Math.random; each phase call gets its own, and keeps it when run again.
 * Not crypto.randomInt: policies get no crypto, and this runs on every call.
 */
export function newSeed(): number {
  return 1 + Math.floor(Math.random() * (2 ** 32 - 1));
}

/**
 * One call of the policy, for one request. A call that waits for a worker past `timeouts.hookMs`
 * gets 504, as a tier-3 hook that does not settle in time, and is never run. When the request
 * ends (its guest leaves, the drain cuts it), a call still waiting is dropped, and one running is
 * let go, as a tier-3 hook's is (runHook): the request ends at once, and the call runs on to its
 * own time limit, held by the request's signal; its console lines are logged when it ends.
 */
export async function call(run: DjsRun, message: CallFields): Promise<CallReply> {
  const { signal, hookMs } = run;
  if (signal?.aborted === true) throw requestEnded(message.phase, signal);
  const pending = run.engine.call(message, { signal, waitMs: hookMs });
  const reply = signal === undefined ? await pending : await unlessEnded(pending, signal, message.phase, run);
  const { outcome } = reply;
  if (outcome.t === "dropped" && outcome.why === "ended" && signal !== undefined) throw requestEnded(message.phase, signal);
  if (outcome.t === "dropped" && outcome.why === "waited") {
    throw new EgressError("EG_HOOK_TIMEOUT", 504, `the ${message.phase} policy did not settle within ${hookMs} ms: it waited that long for a worker, busy with the policy's other calls`, {
      detail: `${run.engine.filename}: ${message.phase} did not start within timeouts.hookMs`,
      failure: "time",
    });
  }
  logged(run, reply);
  return reply;
}

/** A call that stopped to have a body loaded, or for the proxy to perform a layer's next() or sleep(), runs again from the start: its lines come then. */
function logged(run: DjsRun, reply: CallReply): void {
  if (reply.outcome.t !== "need" && reply.outcome.t !== "effect") logConsole(run, reply);
}

/** The call's answer, or the request's end: a call still running then is let go, and held by the signal until it ends. */
function unlessEnded(pending: Promise<CallReply>, signal: HookSignal, phase: PhaseName, run: DjsRun): Promise<CallReply> {
  let ended!: () => void;
  const cut = new Promise<never>((_, reject) => {
    ended = () => {
      // Dropped as it waited, the call has its answer already; running, it goes on to its time limit.
      signal.hold?.(pending.then((late) => (late.outcome.t === "dropped" ? undefined : logged(run, late))));
      reject(requestEnded(phase, signal));
    };
  });
  signal.once("abort", ended);
  return Promise.race([pending, cut]).finally(() => signal.off("abort", ended));
}

/** Every outcome that is not an answer: the guest gets 502, or the policy's own block status. */
export function failure(phase: PhaseName, outcome: Outcome, run: ShownRun): EgressError {
  const filename = run.engine.filename;
  switch (outcome.t) {
    case "blocked":
      return hookFailure(phase, { name: "HttpRequestBlockedError", status: outcome.status, message: outcome.message, statusText: outcome.statusText });
    case "throw": {
      const error = new Error(outcome.message);
      error.name = `${outcome.name} (${filename})`;
      return hookFailure(phase, error);
    }
    case "limit":
      if (outcome.what === busyLimit) {
        // 502 like every exhausted limit (DESIGN §2): in onResponse the upstream has already acted,
        // and a 503 would invite the guest to send a POST again.
        return new EgressError("EG_HOOK_FAILED", 502, `${phase} policy is busy: limits.maxCalls calls are already waiting or running`, { detail: filename, failure: "busy" });
      }
      return new EgressError("EG_HOOK_FAILED", 502, `${phase} policy stopped: it hit its ${outcome.what} limit`, {
        detail: `${filename}: ${phase} exceeded the ${outcome.what} limit`,
        failure: limitKind(outcome.what),
      });
    case "pending":
      // No timers in the sandbox: a promise still pending when the call ends never settles, as a
      // tier-3 hook past its deadline; the same kind.
      return new EgressError("EG_HOOK_FAILED", 502, `${phase} policy returned a promise that never settles`, { detail: filename, failure: "time" });
    case "bad":
      return new EgressError("EG_HOOK_FAILED", 502, `${phase} policy returned ${outcome.what}`, {
        detail: returnedDetail(run, outcome.what, outcome.shown),
        failure: "invalid",
      });
    case "value":
      return new EgressError("EG_HOOK_FAILED", 502, `${phase} policy returned ${String(outcome.v)}, not a boolean`, {
        detail: returnedDetail(run, String(outcome.v), outcome.shown),
        failure: "invalid",
      });
    default:
      return new EgressError("EG_HOOK_FAILED", 502, `${phase} policy answered with something this phase cannot use (${outcome.t})`, { detail: filename, failure: "invalid" });
  }
}

/**
 * The sandbox's limit names as failure kinds: `time`, `memory` and `stack` as they are; a return
 * value past its size is memory the call tried to take out; a trap of the WASM itself, or a
 * policy closed under the call, is none of the three and counts as a throw.
 */
function limitKind(what: string): HookFailureKind {
  if (what === "time" || what === "memory" || what === "stack") return what;
  if (what === "return size") return "memory";
  return "throw";
}

/** A boolean check (`isRequestAllowed`, `isIpAllowed`): true or false, anything else throws. */
function checkResult(phase: PhaseName, outcome: Outcome, run: ShownRun): boolean {
  if (outcome.t === "code" && (outcome.v === codeTrue || outcome.v === codeFalse)) return outcome.v === codeTrue;
  throw failure(phase, outcome, run);
}

/** `isRequestAllowed` in the policy: the request as it will leave, without its body. */
export async function djsIsRequestAllowed(run: DjsRun, request: OutboundRequest): Promise<boolean> {
  const { outcome } = await call(run, {
    phase: "isRequestAllowed",
    now: Date.now(),
    seed: newSeed(),
    method: request.method,
    url: request.url.href,
    headers: joinHeaders(request.headers, request.url.host),
    hasBody: false,
  });
  return checkResult("isRequestAllowed", outcome, run);
}

export async function djsIsIpAllowed(
  run: DjsRun,
  info: { hostname: string; ip: string; family: number; port: number; protocol: string },
): Promise<boolean> {
  const { outcome } = await call(run, { phase: "isIpAllowed", now: Date.now(), seed: newSeed(), method: "", url: "", headers: "", hasBody: false, info });
  return checkResult("isIpAllowed", outcome, run);
}

/** A header list from the policy, checked as Node would check it before sending. */
export function policyHeaders(list: readonly string[], phase: PhaseName): HeaderList {
  if (list.length % 2 !== 0) throw new EgressError("EG_HOOK_FAILED", 502, `${phase} policy returned a malformed header list`);
  try {
    for (let i = 0; i < list.length; i += 2) {
      validateHeaderName(list[i]!);
      validateHeaderValue(list[i]!, list[i + 1]!);
    }
  } catch (error) {
    throw new EgressError("EG_HOOK_FAILED", 502, `${phase} policy returned an invalid header: ${(error as Error).message}`);
  }
  return endToEndHeaders([...list], new Set(["host"]));
}

/** The headers of a request the policy hands back to be sent, as {@link policyHeaders}; `Expect` is refused. */
export function policyRequestHeaders(list: readonly string[], phase: PhaseName, subject: string): HeaderList {
  const headers = policyHeaders(list, phase);
  if (hasExpect(headers)) throw new EgressError("EG_HOOK_FAILED", 502, `${subject} ${expectRefused}`);
  return headers;
}

/**
 * The most a policy may read of a body: the proxy's hook body limit, and no more than a quarter
 * of the policy's heap, which must also hold the text decoded from it and whatever the policy
 * makes of that. `reason` names whichever of the two is the smaller, for the guest's error.
 */
export function policyBodyCap(run: DjsRun, proxyLimit: number): { readonly cap: number; readonly reason: string } {
  const heapCap = Math.floor(run.engine.limits.memoryBytes / 4);
  return heapCap < proxyLimit
    ? { cap: heapCap, reason: `a quarter of the policy's limits.memoryBytes, ${run.engine.limits.memoryBytes}` }
    : { cap: proxyLimit, reason: "maxHttpBodyBytes or maxHttpResponseBodyBytes" };
}

export function bytesBody(bytes: Uint8Array): Readable {
  return Readable.from([Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)], { objectMode: false });
}

/** §3 step 2, tier 2. */
export async function djsOnRequest(
  run: DjsRun,
  request: OutboundRequest,
  tap: BodyTap | undefined,
  limits: HookLimits,
): Promise<OnRequestOutcome> {
  const now = Date.now();
  const seed = newSeed();
  // Bytes cross to the worker only once the policy asks for them, even when already in memory.
  let loaded: Uint8Array | undefined;
  const { cap, reason } = policyBodyCap(run, limits.requestBodyBytes);
  const tooLarge = (): EgressError =>
    new EgressError("EG_TOO_LARGE", 413, `the request body is larger than ${cap} bytes, the most this policy may read (${reason})`);
  for (let attempt = 0; ; attempt++) {
    const { outcome, bytes } = await call(run, {
      phase: "onRequest",
      now,
      seed,
      method: request.method,
      url: request.url.href,
      headers: joinHeaders(request.headers, request.url.host),
      hasBody: request.body !== null,
      ...(loaded !== undefined ? { requestBody: loaded } : {}),
    });
    if (outcome.t === "need") {
      if (attempt > 0 || loaded !== undefined || request.body === null || !outcome.which.every((w) => w === "request")) {
        throw failure("onRequest", outcome, run);
      }
      try {
        loaded =
          request.body instanceof Uint8Array
            ? request.body
            : await readBounded(tap !== undefined ? tap.web : request.body, cap, bodyDeadline("the onRequest policy", "request", limits.hookMs, null));
        if (loaded.byteLength > cap) throw new BodyLimitError(cap);
      } catch (error) {
        if (error instanceof BodyLimitError || tap?.limitHit === true) throw tooLarge();
        // The deadline's: the guest sent a byte now and then, never enough to end its body.
        if (error instanceof EgressError) throw error;
        throw new EgressError("EG_BAD_REQUEST", 400, `the request body could not be read for the policy: ${(error as Error).message}`);
      } finally {
        tap?.endHookPhase();
      }
      continue;
    }
    // The body, as the guest sent it, for whatever goes on: bytes once the policy has loaded them.
    const original = (): Readable | Uint8Array | null => loaded ?? request.body;
    // A guest stream the policy read goes on as bytes, framed by their exact length.
    // Otherwise the body goes with the framing it came with, whatever the policy set in place
    // (its content-length: 77 on an 18-byte upload made an HTTP/1.1 upstream wait, and an HTTP/2
    // upstream reset the stream).
    const originalHeaders = (headers: HeaderList): HeaderList =>
      loaded !== undefined && !(request.body instanceof Uint8Array) ? withExactLength(headers, loaded.byteLength) : withFramingOf(headers, request.headers);
    if (outcome.t === "code" && outcome.v === codeUnchanged) {
      return { request: withFields(request, { headers: originalHeaders(request.headers), body: original() }) };
    }
    if (outcome.t === "continue") {
      if (outcome.consumed === true) throw badRequest("onRequest read the request body and then forwarded it; read request.clone() instead");
      const headers =
        outcome.headers === null || outcome.headers === undefined
          ? request.headers
          : policyRequestHeaders(outcome.headers, "onRequest", "the request as the onRequest policy left it");
      return { request: withFields(request, { headers: originalHeaders(headers), body: original() }) };
    }
    if (outcome.t === "request") {
      let url: URL;
      try {
        url = new URL(outcome.url);
      } catch {
        throw new EgressError("EG_HOOK_FAILED", 502, "onRequest policy returned a Request with an invalid URL");
      }
      if (url.protocol !== "http:" && url.protocol !== "https:") {
        throw new EgressError("EG_HOOK_FAILED", 502, `onRequest policy returned a Request for a non-HTTP URL (${url.protocol})`);
      }
      url.hash = "";
      if (!httpToken.test(outcome.method)) throw new EgressError("EG_HOOK_FAILED", 502, "onRequest policy returned an invalid method");
      let headers = policyRequestHeaders(outcome.headers, "onRequest", "the Request the onRequest policy returned");
      const body = requestBodyOf(outcome.body, bytes, original, "onRequest");
      if (body instanceof Uint8Array) headers = withExactLength(headers, body.byteLength);
      else if (body === null) headers = withoutHeaders(headers, contentLengthHeaders);
      else headers = withFramingOf(headers, request.headers);
      return { request: { method: outcome.method, url, headers, body } };
    }
    if (outcome.t === "response") {
      const body = requestBodyOf(outcome.body, bytes, original, "onRequest");
      return { response: policyResponse(outcome, body instanceof Uint8Array ? bytesBody(body) : body, "onRequest") };
    }
    throw failure("onRequest", outcome, run);
  }
}

function requestBodyOf(
  ref: BodyRef,
  bytes: Uint8Array | undefined,
  original: () => Readable | Uint8Array | null,
  phase: PhaseName,
): Readable | Uint8Array | null {
  if (ref === null) return null;
  if ("b" in ref) return bytes ?? new Uint8Array(0);
  if ("h" in ref && ref.h === "request") return original();
  throw new EgressError("EG_HOOK_FAILED", 502, `${phase} policy used a response body where there is none`);
}

export function policyResponse(outcome: Extract<Outcome, { t: "response" }>, body: Readable | null, phase: PhaseName): HookedResponse {
  if (!Number.isInteger(outcome.status) || outcome.status < 200 || outcome.status > 599) {
    throw new EgressError("EG_HOOK_FAILED", 502, `${phase} policy returned a Response with status ${outcome.status}`);
  }
  return { status: outcome.status, headers: withoutHeaders(policyHeaders(outcome.headers, phase), contentLengthHeaders), body };
}

/**
 * §3 step 7, tier 2. The policy sees the response decoded (gzip, deflate, br); if it lets the
 * response through, the guest gets the original bytes, including what the policy read.
 */
export async function djsOnResponse(
  run: DjsRun,
  upstream: HookedResponse,
  request: OutboundRequest,
  limits: HookLimits,
): Promise<HookedResponse & { readonly replaced: boolean; readonly discard: () => void }> {
  if (upstream.status < 200 || upstream.status > 599) {
    throw new EgressError("EG_UPSTREAM", 502, `upstream answered status ${upstream.status}, which policies cannot represent`);
  }
  const codings = contentCodings(upstream.headers);
  const decode = codings !== undefined;
  const shownHeaders = decode ? withoutHeaders(upstream.headers, encodedBodyHeaders) : upstream.headers;
  const discard = (): void => {
    discardBody(upstream.body);
  };
  const { cap, reason } = policyBodyCap(run, limits.responseBodyBytes);
  const tooLarge = (): EgressError => {
    discard();
    return new EgressError("EG_UPSTREAM", 502, `the response body is larger than ${cap} bytes, the most this policy may read (${reason})`);
  };
  const now = Date.now();
  const seed = newSeed();
  let tap: BodyTap | undefined;
  let loaded: Uint8Array | undefined;
  for (let attempt = 0; ; attempt++) {
    let reply: CallReply;
    try {
      reply = await call(run, {
        phase: "onResponse",
        now,
        seed,
        method: request.method,
        url: request.url.href,
        headers: joinHeaders(request.headers, request.url.host),
        hasBody: false,
        response: { status: upstream.status, statusText: "", headers: joinHeaders(shownHeaders), url: request.url.href, hasBody: upstream.body !== null },
        ...(loaded !== undefined ? { responseBody: loaded } : {}),
      });
    } catch (error) {
      discard();
      throw error;
    }
    const { outcome } = reply;
    if (outcome.t === "need" && attempt === 0 && upstream.body !== null && outcome.which.every((w) => w === "response")) {
      tap = new BodyTap(upstream.body, { limit: limits.responseBodyBytes, record: true, ...(codings !== undefined ? { encodings: codings } : {}) });
      try {
        loaded = await readBounded(tap.web, cap, bodyDeadline("the onResponse policy", "response", limits.hookMs, upstream.body));
      } catch (error) {
        if (error instanceof BodyLimitError || tap.limitHit) throw tooLarge();
        discard();
        // The deadline's (a body trickling in, never silent for long): nothing failed under the read.
        if (tap.failure === undefined && error instanceof EgressError) throw error;
        const failure = tap.failure ?? error;
        throw (
          madeBodyFailure(upstream.body, failure, "the onResponse policy") ??
          new EgressError("EG_UPSTREAM", 502, `the upstream response body failed while the policy read it: ${(failure as Error).message}`)
        );
      }
      tap.endHookPhase();
      continue;
    }
    if ((outcome.t === "code" && outcome.v === codeUnchanged) || outcome.t === "continue") {
      return withFields(upstream, { body: tap === undefined ? upstream.body : tap.replay(), replaced: false, discard });
    }
    if (outcome.t === "response") {
      let body: Readable | null;
      const ref = outcome.body;
      try {
        if (ref === null) body = null;
        else if ("b" in ref) body = bytesBody(reply.bytes ?? new Uint8Array(0));
        else if ("h" in ref && ref.h === "response") {
          // The original body, passed on without entering the sandbox: decoded, as the policy saw it.
          if (loaded !== undefined) body = bytesBody(loaded);
          else if (upstream.body === null) body = null;
          else body = decode ? Readable.from(new BodyTap(upstream.body, { limit: Number.MAX_SAFE_INTEGER, record: false, encodings: codings! }).web) : upstream.body;
        } else {
          throw new EgressError("EG_HOOK_FAILED", 502, "onResponse policy used a body other than the response's: the request body has already been sent");
        }
        const passedOn = ref !== null && !("b" in ref) && loaded === undefined;
        return withFields(policyResponse(outcome, body, "onResponse"), { replaced: true, discard: passedOn ? () => undefined : discard });
      } catch (error) {
        discard();
        throw error;
      }
    }
    discard();
    throw failure("onResponse", outcome, run);
  }
}
