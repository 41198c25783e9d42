import { discardBody, joinBuffered, joinSmallPushes } from "../streams.js";
import type { Readable } from "node:stream";
import { EgressError, badRequest, denied, quoteShort, secretDenied } from "../errors.js";
import { BodyTap, declaredLength } from "../hooks/body-tap.js";
import { claimMadeBody } from "../hooks/made-bodies.js";
import type { Decision } from "../policy/decision.js";
import type { DeclarativePolicy } from "../policy/declarative-policy.js";
import type { RedirectHop, SecretStore, SecretTarget } from "../policy/secrets.js";
import type { PinnedPools } from "../upstream/pinned-pools.js";
import { refusedAlpn } from "../upstream/h2-connect.js";
import type { ResolvedAddress, Resolver } from "../upstream/resolve.js";
import {
  forbiddenMethods,
  forwardedMethods,
  spellingHint,
  type ExchangeContext,
  type Executor,
  type ExecutorResponse,
  type GuestGone,
  type OutboundRequest,
  type PipelineResponse,
  type TraceEntry,
  type SendInfo,
} from "./exchange.js";
import { getHeader, hasNoContent, headerObjectToList, noContentFraming, upstreamResponseFields, type HeaderList } from "../headers.js";
import type { HookLimits, OnRequestOutcome } from "./hook-phases.js";
import { checkHandedRequest, checkMadeResponse } from "./head-bounds.js";
import { nextHop, redirectStatuses } from "./redirects.js";
import { hiddenPath, secretInLocation } from "../policy/hidden-url.js";
import { bareHostname } from "../hostname.js";
import type { PhaseName } from "../djs/protocol.js";
import type { HookedOnResponse, HookSource, SourceCall } from "./hook-source.js";
import { LayerRun, type Descend } from "./layers.js";
import { endsEmpty } from "./empty-body.js";
import { failedEntry, timeUpstream } from "./trace.js";
import { withFields } from "../objects.js";
import { isConnectFailure, resendOnceIfStale, upstreamError } from "./upstream-errors.js";
import { attributed, blameMaker, declarativeEntry, declarativeSource, ipVerdict, onRequestVerdict, onResponseVerdict } from "./verdicts.js";

export interface PipelineOptions {
  /** The guest this pipeline serves, as hook sources are told. */
  readonly guest: string;
  readonly policy: DeclarativePolicy;
  /**
   * The hook sources, in the order every phase runs them (a tier-2 policy before tier-3
   * callbacks; see hookSources). When the declarative tier is evaluated natively, the generated
   * check functions are left out of the callbacks.
   */
  readonly sources: readonly HookSource[];
  readonly resolver: Resolver;
  readonly pools: PinnedPools;
  readonly maxRedirects: number;
  readonly limits: HookLimits;
  /** `timeouts.requestMs`: the whole of a request that passes through layers, over all its descents. */
  readonly requestMs: number;
  /**
   * With several guests: the name of another guest's secret whose placeholder the request
   * carries. Such a request is refused, naming the secret but never the guest that holds it.
   */
  readonly foreignSecret?: ((request: SecretTarget) => string | undefined) | undefined;
  /**
   * The innermost executor, given the upstream: a recorder wraps it, a replay answers in its
   * place (DESIGN §2). Every check runs before it either way. Default: the upstream itself.
   */
  readonly executor?: ((upstream: Executor) => Executor) | undefined;
}

interface ApprovedTarget {
  /** Every approved address, in resolver order: the first that accepts a connection is used. */
  readonly addresses: readonly ResolvedAddress[];
  readonly decision: Decision;
}

const methodsWithoutResponseBody = new Set(["HEAD"]);
const redirectBodyLimit = 64 * 1024;
const redirectDrainMs = 1_000;
/** 1xx responses (103 Early Hints, say) accepted before the final one. */
const maxInformational = 16;

/**
 * The order of evaluation of DESIGN §3 for one guest request: policy checks on the request as it
 * will leave, a connection to an approved address only, and redirects followed and checked again
 * at every hop. The onRequest/secrets/onResponse steps slot in around `authorize` and `send`.
 */
export class Pipeline {
  /** The sources that register each phase, in order: a phase nobody registers is skipped whole. */
  private readonly phase: Readonly<Record<PhaseName, readonly HookSource[]>>;

  constructor(private readonly options: PipelineOptions) {
    const of = (name: PhaseName): HookSource[] => options.sources.filter((source) => source.phases.has(name));
    this.phase = {
      onRequest: of("onRequest"),
      isRequestAllowed: of("isRequestAllowed"),
      isIpAllowed: of("isIpAllowed"),
      onResponse: of("onResponse"),
      handle: options.sources.filter((source) => source.handle !== undefined),
    };
    this.descend = (request, context) => this.steps(request, context);
    const upstream: Executor = { send: (request, address, signal, info) => this.send(request, address, signal, info.onResend) };
    this.executor = options.executor?.(upstream) ?? upstream;
  }

  private readonly executor: Executor;

  private readonly descend: Descend;

  /**
   * Whether any source registers onRequest or a layer: then the request that leaves may not be
   * the guest's, and no early check can settle a request by its target alone.
   */
  get mayRewrite(): boolean {
    return this.phase.onRequest.length > 0 || this.phase.handle.length > 0;
  }

  /** Requests and upgrades under way here, counted only when a source could still be called. */
  private active = 0;
  private idleWaiters: Array<() => void> = [];
  private readonly settle = (): void => {
    this.active -= 1;
    if (this.active === 0) for (const wake of this.idleWaiters.splice(0)) wake();
  };

  /** `work`, counted until it settles (with no source to call, nothing is counted). */
  private tracked<T>(work: Promise<T>): Promise<T> {
    if (this.options.sources.length === 0) return work;
    this.active += 1;
    void work.then(this.settle, this.settle);
    return work;
  }

  /**
   * Resolves once no request or upgrade that began here is still in its pipeline, where its
   * hooks, policies and deciders may be called: after a reload, the replaced configuration's
   * policies can close then.
   */
  idle(): Promise<void> {
    return this.active === 0 ? Promise.resolve() : new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** One guest request: through the layers when there are any (each `next()` is steps 2–7), else steps 2–7 once. */
  handle(initial: OutboundRequest, context: ExchangeContext): Promise<PipelineResponse> {
    if (initial.body !== null && !(initial.body instanceof Uint8Array) && (initial.method === "GET" || initial.method === "HEAD") && this.mayRewrite && !declaresBytes(initial.headers)) {
      return this.tracked(this.bodilessFirst(initial, initial.body, context));
    }
    return this.tracked(this.layersOrSteps(initial, context));
  }

  /**
   * A GET or HEAD framed with a body of unknown length (chunked, or an HTTP/2 stream its HEADERS did not end) while
   * a hook is shown the request: one whose body ends without a byte has none, and is served as a
   * GET without a body is (it got 400); one with bytes, or one whose guest asked for
   * `100 Continue`, is refused by the checks below.
   */
  private async bodilessFirst(initial: OutboundRequest, body: Readable, context: ExchangeContext): Promise<PipelineResponse> {
    // A guest that asked for `100 Continue` sends nothing of its body, not even its end, until
    // then; and it says it has content (RFC 9110 §10.1.1: a client MUST NOT ask without). Such a
    // GET is refused as one with a declared length is, at once and without the 100, which told
    // it to send a body only to refuse it (helper finding).
    if (context.beforeBody !== undefined) return this.layersOrSteps(initial, context);
    const empty = await endsEmpty(body, context.signal);
    return this.layersOrSteps(empty ? withFields(initial, { body: null }) : initial, context);
  }

  private layersOrSteps(initial: OutboundRequest, context: ExchangeContext): Promise<PipelineResponse> {
    if (this.phase.handle.length === 0) return this.steps(initial, context);
    // A layer is shown the request as a WHATWG Request, which cannot hold a GET's or HEAD's body:
    // refused as onRequest refuses it, rather than a 502 "internal error" logged at level error.
    if (initial.body !== null && (initial.method === "GET" || initial.method === "HEAD")) {
      return Promise.reject(badRequest(`${initial.method} with a body is refused while a layer is registered`));
    }
    return new LayerRun(this.phase.handle, this.descend, context, this.options.limits, this.options.requestMs, this.options.guest).run(initial);
  }

  /** DESIGN §3 steps 2–7 for one request: onRequest, secrets, the checks, the upstream and its redirects, onResponse. */
  private async steps(initial: OutboundRequest, context: ExchangeContext): Promise<PipelineResponse> {
    const { limits } = this.options;
    const call: SourceCall = { requestId: context.id, guest: this.options.guest, signal: context.signal };
    const trace = context.trace;
    let request = initial;
    // The secrets substituted into any hop so far: a later hop that leaves their hosts is checked for their values.
    const substituted = new Set<string>();
    let tap: BodyTap | undefined;
    if (this.phase.onRequest.length > 0 && initial.body !== null) {
      if (initial.method === "GET" || initial.method === "HEAD") {
        throw badRequest(`${initial.method} with a body is refused while an onRequest hook is registered`);
      }
      tap = new BodyTap(initial.body as Readable, {
        limit: limits.requestBodyBytes,
        record: false,
        ...(context.beforeBody !== undefined ? { onStart: context.beforeBody } : {}),
        ...declaredLength(initial.headers),
      });
    }
    // Once a Location held a secret's value, the name of that secret: every hop from there on is
    // named by its origin only (src/policy/hidden-url.ts).
    let hidden: string | undefined;
    for (let redirects = 0; ; redirects++) {
      // §3 step 2: onRequest may rewrite the request or answer it itself, source by source: each
      // sees the request as the one before left it, and the first answer ends the phase.
      for (const source of this.phase.onRequest) {
        const unread = redirects === 0 && request.body === initial.body;
        const before = request;
        const outcome = await attributed(source, () => source.onRequest(before, unread ? tap : undefined, limits, call).then((o) => handedOn(source, before, o)), trace, "onRequest", (o) => onRequestVerdict(before, o));
        if ("response" in outcome) {
          // A body its hook made is that hook's when it fails (before its first byte, or under a layer's read).
          claimMadeBody(outcome.response.body, source.label);
          return withFields(outcome.response, { decision: withFields(source.answered, { source: source.label }), url: request.url, redirects });
        }
        request = outcome.request;
        // A source's rewrite is a new request: the next source's document, and the recording, still hide the hop.
        if (hidden !== undefined && request.hiddenPath === undefined) request = withFields(request, { hiddenPath: hidden });
      }
      // §3 step 3, then step 4 on the request exactly as it will leave.
      request = this.substituteSecrets(request, substituted, trace);
      const target = await this.authorize(request, call, trace);
      if (request.body !== null) context.beforeBody?.();
      const sentAt = trace === undefined ? 0 : performance.now();
      let upstream: ExecutorResponse;
      try {
        upstream = await this.sendToFirstReachable(request, target.addresses, context.signal, { id: context.id, hop: redirects, onResend: context.onResend });
      } catch (error) {
        if (trace !== undefined) timeUpstream(trace, sentAt, null);
        throw error;
      }
      const location = redirectStatuses.has(upstream.status) ? upstream.location : undefined;
      // A redirect's body is discarded while the next hop goes out: its time ends at its head,
      // so hops never overlap in the sum.
      if (trace !== undefined) timeUpstream(trace, sentAt, location === undefined ? upstream.body : null);
      if (location === undefined) {
        if (this.phase.onResponse.length === 0) {
          // Named field by field: `{ ...upstream, decision, … }` gave every response a hidden class
          // of its own on Node 20 (src/objects.ts); a small GET now costs 0.76× the proxy CPU.
          const { status, headers, body, trailers } = upstream;
          return trailers === undefined
            ? { status, headers, body, decision: target.decision, url: request.url, redirects }
            : { status, headers, body, decision: target.decision, url: request.url, redirects, trailers };
        }
        // §3 step 7: source by source, each on what the one before returned.
        let response: { status: number; headers: string[]; body: Readable | null } = upstream;
        const cleanups: (() => void)[] = [];
        let replaced = false;
        for (const source of this.phase.onResponse) {
          let hooked;
          try {
            const seen = response;
            hooked = await attributed(source, () => source.onResponse(seen, request, limits, call).then((made) => madeResponse(source, made)), trace, "onResponse", onResponseVerdict);
          } catch (error) {
            for (const cleanup of cleanups) cleanup();
            if (trace !== undefined) blameMaker(trace, error, source.label, "onResponse");
            throw error;
          }
          // A body its hook made is that hook's when it fails under a later source's read.
          claimMadeBody(hooked.body, source.label);
          if (hooked.replaced) {
            replaced = true;
            cleanups.push(hooked.discard);
          }
          response = hooked;
        }
        return {
          status: response.status,
          headers: response.headers,
          body: response.body,
          decision: target.decision,
          url: request.url,
          redirects,
          // A replaced response has no trailers: a WHATWG Response cannot carry them.
          ...(!replaced && upstream.trailers !== undefined ? { trailers: upstream.trailers } : {}),
          ...(cleanups.length > 0 ? { cleanup: () => cleanups.forEach((cleanup) => cleanup()) } : {}),
        };
      }
      // A redirect's own body is thrown away; dump() gives up (closing that connection) past the limit.
      // It gets a second, too: a body that trickles in would otherwise hold its connection for ever.
      if (upstream.body?.dump !== undefined) void upstream.body.dump({ limit: redirectBodyLimit, signal: AbortSignal.timeout(redirectDrainMs) }).catch(() => undefined);
      else discardBody(upstream.body);
      const secrets = this.options.policy.config.secrets;
      if (redirects >= this.options.maxRedirects) {
        // Redacted, then cut (a cut first could leave part of a value that redaction no longer
        // recognises): a crafted path must not make the body and the log line 60 KB. With secrets,
        // a host that an upstream named is not quoted: a wildcard-scoped secret's value may sit in
        // it, lowercased by the URL parser, where redaction cannot see it.
        const path = hidden !== undefined ? hiddenPath(hidden) : cut(secrets === undefined ? request.url.pathname : redactedPath(secrets, request.url), maxQuotedPath);
        const from = secrets === undefined || request.url.host === initial.url.host ? request.url.origin : "a host it was redirected to";
        throw new EgressError("EG_REDIRECT_LOOP", 508, `more than ${this.options.maxRedirects} redirects, the last from ${from}${from.includes("/") ? "" : " at "}${path}`);
      }
      // Read as the upstream wrote it: the URL parser can rewrite a copy past recognising.
      hidden ??= secretInLocation(secrets, location);
      // A hop that leaves the hosts of a secret sent on an earlier hop is refused if it carries its
      // value; any hop whose host name holds a value is refused, wherever it goes.
      const check = secrets === undefined || secrets.size === 0 ? undefined : (hop: RedirectHop) => this.checkRedirect(secrets, hop, substituted, trace);
      request = nextHop(request, upstream.status, location, check, hidden === undefined);
      if (hidden !== undefined) request = withFields(request, { hiddenPath: hidden });
    }
  }

  /**
   * For a protocol upgrade (WebSocket): onRequest (without a body), secrets and every check of
   * §3 step 4, like any request.
   * The caller connects to one of the returned addresses and tunnels the rest. `signal` aborts
   * when the guest leaves before the 101: a hook's call still pending is let go then, as a
   * request's is (its hookMs timer no longer holds the process, and is cleared once it settles).
   */
  authorizeUpgrade(initial: OutboundRequest, trace?: TraceEntry[], signal?: GuestGone): Promise<{ request: OutboundRequest; addresses: readonly ResolvedAddress[]; decision: Decision }> {
    return this.tracked(this.upgradeSteps(initial, trace, signal));
  }

  private async upgradeSteps(initial: OutboundRequest, trace?: TraceEntry[], signal?: GuestGone): Promise<{ request: OutboundRequest; addresses: readonly ResolvedAddress[]; decision: Decision }> {
    let rewritten = initial;
    const call: SourceCall = { requestId: undefined, guest: this.options.guest, signal };
    for (const source of this.phase.onRequest) {
      const before = rewritten;
      const outcome = await attributed(source, () => source.onRequest(before, undefined, this.options.limits, call).then((o) => handedOn(source, before, o)), trace, "onRequest", (o) => onRequestVerdict(before, o));
      if ("response" in outcome) {
        discardBody(outcome.response.body);
        throw new EgressError("EG_HOOK_FAILED", 502, `${source.describe("onRequest")} answered a protocol upgrade; upgrades can be continued, rewritten or blocked`);
      }
      rewritten = outcome.request;
    }
    if (rewritten.body !== null) {
      // The upgrade's head is sent as it is, and the tunnel follows it: there is no place for a body.
      if (!(rewritten.body instanceof Uint8Array)) discardBody(rewritten.body);
      throw new EgressError("EG_HOOK_FAILED", 502, "onRequest gave a protocol upgrade a body; an upgrade request cannot carry one");
    }
    const request = this.substituteSecrets(rewritten, undefined, trace);
    const target = await this.authorize(request, call, trace);
    return { request, addresses: target.addresses, decision: target.decision };
  }

  /**
   * A redirect hop, before it is followed: the secrets judge it (one that leaves the hosts of a
   * secret sent before, and any whose host name holds a value), and a refusal is theirs in the
   * trace, as at the first hop.
   */
  private checkRedirect(secrets: SecretStore, hop: RedirectHop, substituted: ReadonlySet<string>, trace: TraceEntry[] | undefined): void {
    const started = trace === undefined ? 0 : performance.now();
    try {
      if (substituted.size > 0) secrets.checkRedirect(hop, substituted);
      secrets.checkRedirectHost(hop);
    } catch (error) {
      trace?.push(failedEntry(declarativeSource, "declarative", "secrets", error, started));
      throw error;
    }
  }

  /** §3 step 3: placeholders become values for the final destination; misplaced secrets refuse the request. */
  private substituteSecrets(request: OutboundRequest, substituted?: Set<string>, trace?: TraceEntry[]): OutboundRequest {
    if (trace === undefined) return this.substituteSecretsNow(request, substituted);
    // Only a refusal is worth an entry: substitution itself decides nothing.
    const started = performance.now();
    try {
      return this.substituteSecretsNow(request, substituted);
    } catch (error) {
      trace.push(failedEntry(declarativeSource, "declarative", "secrets", error, started));
      throw error;
    }
  }

  private substituteSecretsNow(request: OutboundRequest, substituted?: Set<string>): OutboundRequest {
    const secrets = this.options.policy.config.secrets;
    const changed = secrets?.apply(request, bareHostname(request.url.hostname), substituted);
    const result = changed === undefined ? request : withFields(request, { headers: changed.headers, url: changed.url });
    // What is left looking like a placeholder after this guest's own were replaced is either
    // nobody's or another guest's: the second is refused (a guest must not even learn that a
    // neighbour's placeholder works somewhere).
    const foreign = this.options.foreignSecret?.(result);
    if (foreign !== undefined) throw secretDenied(foreign, `the request carries the placeholder of secret "${foreign}", which this guest does not hold`);
    return result;
  }

  /** §3 step 4: every check must allow, and the first denial wins. */
  private async authorize(request: OutboundRequest, call: SourceCall, trace: TraceEntry[] | undefined): Promise<ApprovedTarget> {
    const { policy, resolver, limits } = this.options;
    const { url } = request;
    // The guest's own method was checked before any hook; another one here came from a rewrite,
    // held to the same rule (a `patch` passed a check refusing PATCH, and went out as it was).
    if (!forwardedMethods.has(request.method)) {
      const method = quoteShort(request.method);
      const upper = request.method.toUpperCase();
      if (forbiddenMethods.has(upper)) throw new EgressError("EG_HOOK_FAILED", 502, `onRequest rewrote the request to the forbidden method ${method}`);
      throw new EgressError("EG_HOOK_FAILED", 502, `onRequest rewrote the request to the method ${method}, which the proxy does not forward${spellingHint(request.method)}`);
    }
    // The checks are AND-ed in source order: the first refusal wins.
    for (const source of this.phase.isRequestAllowed) await attributed(source, () => source.isRequestAllowed(request, limits, call), trace, "isRequestAllowed");
    const hostStarted = trace === undefined ? 0 : performance.now();
    // One string for every look-up below (a getter's new string is hashed again by each map).
    const urlHostname = url.hostname;
    const hostDecision = policy.checkHost(urlHostname);
    if (trace !== undefined) trace.push(declarativeEntry("allowlist", hostDecision, hostStarted));
    if (!hostDecision.allowed) throw denied(hostDecision.reason);

    // Each of a URL's getters makes a new string: read once.
    const secure = url.protocol === "https:";
    const port = Number(url.port || (secure ? 443 : 80));
    const hostname = bareHostname(urlHostname);
    // "http" or "https", as Gondolin's hooks get it (not the URL's "https:").
    const protocol: "http" | "https" = secure ? "https" : "http";
    const addresses = await resolver.resolve(urlHostname);
    let firstRefusal: Decision | undefined;
    const approved: ResolvedAddress[] = [];
    for (const address of addresses) {
      const addressStarted = trace === undefined ? 0 : performance.now();
      const decision = policy.checkAddress(urlHostname, address, port);
      if (!decision.allowed) {
        // An allowed address is the rule, not news: only refusals get an entry.
        if (trace !== undefined) trace.push(declarativeEntry("address", decision, addressStarted));
        firstRefusal ??= decision;
        continue;
      }
      // What every source's isIpAllowed is asked about; the first refusal skips the address.
      const info = { hostname, ip: address.ip, family: address.family, port, protocol };
      let refusal: Decision | undefined;
      for (const source of this.phase.isIpAllowed) {
        refusal = await attributed(source, () => source.isIpAllowed(info, limits, call), trace, "isIpAllowed", ipVerdict);
        if (refusal !== undefined) {
          refusal = withFields(refusal, { source: source.label });
          break;
        }
      }
      if (refusal !== undefined) {
        firstRefusal ??= refusal;
        continue;
      }
      approved.push(address);
    }
    if (approved.length > 0) return { addresses: approved, decision: hostDecision };
    if (firstRefusal === undefined) throw denied(`host "${urlHostname}" has no usable address`);
    const refused = denied(firstRefusal.reason, firstRefusal.detail);
    refused.source = firstRefusal.source;
    throw refused;
  }

  /**
   * Like a browser's fallback over A/AAAA records: when an approved address refuses or times out
   * the connection, the next approved one is tried. Only bodiless requests move on, because a
   * streamed body cannot be replayed.
   */
  private async sendToFirstReachable(
    request: OutboundRequest,
    addresses: readonly ResolvedAddress[],
    signal: GuestGone,
    info: SendInfo,
  ): Promise<ExecutorResponse> {
    for (let i = 0; ; i++) {
      try {
        return await this.executor.send(request, addresses[i]!, signal, info);
      } catch (error) {
        const last = i === addresses.length - 1;
        if (last || request.body !== null || !isConnectFailure(error)) throw error;
      }
    }
  }

  /** §3 step 5: one request on a pool pinned to the approved address. */
  private async send(
    request: OutboundRequest,
    address: ResolvedAddress,
    signal: GuestGone,
    onResend: (() => void) | undefined,
    askedAgain = false,
  ): Promise<ExecutorResponse> {
    const { url } = request;
    const noBody = methodsWithoutResponseBody.has(request.method);
    // An https origin that speaks h2, or has not been asked yet: the ALPN answer decides, once per origin and IP.
    if (url.protocol === "https:" && this.options.pools.protocolOf(url, address) !== "h1") {
      let h2;
      try {
        h2 = await resendOnceIfStale(request, signal, () => this.options.pools.sendH2(request, address, signal, noBody, maxInformational), onResend);
      } catch (error) {
        throw upstreamError(error, url);
      }
      if (h2 !== undefined) {
        // Statuses run from 100 to 599 (RFC 9110 §15): below, Node's writers refuse them (an
        // HTTP/2 guest's stream was reset, an HTTP/1.1 guest got "internal error").
        if (h2.status < 100 || h2.status > 599) {
          discardBody(h2.body);
          throw new EgressError("EG_UPSTREAM", 502, `upstream ${url.host} answered status ${h2.status}, which is not an HTTP status`);
        }
        const headers = upstreamHeaders(h2.status, h2.headers, url, h2.body);
        const locations = headers.filter((_, i) => i % 2 === 0 && headers[i]!.toLowerCase() === "location");
        return { status: h2.status, headers, body: h2.body, location: locations.length === 1 ? getHeader(headers, "location") : undefined, trailers: h2.trailers, httpVersion: "HTTP/2" };
      }
    }
    const pool = this.options.pools.get(url, address);
    let informational = 0;
    try {
      const response = await resendOnceIfStale(request, signal, () => pool.request({
        method: request.method,
        path: `${url.pathname}${url.search}`,
        headers: [...request.headers, "host", url.host],
        body: request.body,
        signal,
        // Each 1xx restarts undici's headers timer and nobody reads them: an upstream sending them
        // for ever would hold the request and burn CPU. A throw here ends the connection.
        onInfo: () => {
          if (++informational > maxInformational) {
            throw new EgressError("EG_UPSTREAM", 502, `upstream ${url.host} sent more than ${maxInformational} informational (1xx) responses`);
          }
        },
      }), onResend);
      // Statuses stop at 599 (RFC 9110 §15): a 600 went on to HTTP/1.1 guests as it came and reset
      // HTTP/2 guests' streams. undici takes off only the chunked coding: `gzip, chunked` reached
      // the guest (and hooks) still compressed, with nothing left to say so. And only where llhttp
      // reads it as chunked: spaces after `chunked`, not a tab (OWS too, RFC 9110 §5.6.3), with
      // which llhttp reads the body up to the close, chunk-size lines and all, and the guest got
      // the upstream's chunked encoding as the body (fuzzer finding). undici trims what is before.
      const framing = response.headers["transfer-encoding"];
      const refusal =
        response.statusCode > 599
          ? `answered status ${response.statusCode}, which is not an HTTP status`
          : framing !== undefined && !/^[ \t]*chunked *$/i.test(String(framing))
            ? `framed its response with Transfer-Encoding ${quoteShort(String(framing))}; only chunked can be passed on`
            : undefined;
      if (refusal !== undefined) {
        discardBody(response.body);
        throw new EgressError("EG_UPSTREAM", 502, `upstream ${url.host} ${refusal}`);
      }
      const location = response.headers["location"];
      const empty = noBody || hasNoContent(response.statusCode);
      if (empty) void response.body.dump().catch(() => undefined);
      // Only a chunked body can end in a trailer section; undici fills `trailers` before the body's end.
      const chunked = framing !== undefined && /chunked/i.test(String(framing));
      // Tiny chunks are joined per turn, as a guest's are. Each push of one that found the guest's
      // side full paused undici's parser, which on resuming copied the rest of the socket's read
      // again: a plain-HTTP body of a million 1-byte chunks took 50-60 s of the proxy's CPU
      // (black-box finding). A join that finds the guest's side full has nothing to pause: the
      // turn's next push, which goes straight through, tells undici.
      if (chunked && !empty) {
        joinSmallPushes(response.body, () => undefined);
        joinBuffered(response.body);
      }
      return {
        status: response.statusCode,
        headers: upstreamHeaders(response.statusCode, headerObjectToList(response.headers), url, empty ? null : response.body),
        body: empty ? null : response.body,
        location: typeof location === "string" ? location : undefined,
        ...(chunked && !empty ? { trailers: () => headerObjectToList(response.trailers) } : {}),
      };
    } catch (error) {
      // An origin remembered as HTTP/1.1 refused it in the TLS handshake (an h2-only server now
      // on its port): the pool's connector forgot that answer, and a handshake sends nothing, so
      // a request whose body can go again asks ALPN once. A streamed body undici has destroyed
      // by then: that request fails, and the next one asks.
      const replayable = request.body === null || request.body instanceof Uint8Array;
      if (!askedAgain && replayable && !signal.aborted && refusedAlpn(error) && this.options.pools.protocolOf(url, address) !== "h1") {
        return await this.send(request, address, signal, onResend, true);
      }
      throw upstreamError(error, url);
    }
  }
}

/** A Content-Length other than 0: the body has bytes, and a GET or HEAD with it is refused without waiting for them. */
function declaresBytes(headers: HeaderList): boolean {
  const length = getHeader(headers, "content-length");
  return length !== undefined && length !== "0";
}

/** What a source's onRequest gave back, held to the bounds on a head it built (src/pipeline/head-bounds.ts). */
function handedOn(source: HookSource, before: OutboundRequest, outcome: OnRequestOutcome): OnRequestOutcome {
  if ("response" in outcome) checkMadeResponse(outcome.response, `${source.describe("onRequest")} answered with`);
  else checkHandedRequest(before, outcome.request, `${source.describe("onRequest")} handed on`);
  return outcome;
}

/** A Response a source's onResponse replaced the response with, held to the same bounds; the one it replaced is released with it. */
function madeResponse(source: HookSource, hooked: HookedOnResponse): HookedOnResponse {
  if (!hooked.replaced) return hooked;
  try {
    checkMadeResponse(hooked, `${source.describe("onResponse")} replaced the response with`);
  } catch (error) {
    hooked.discard();
    throw error;
  }
  return hooked;
}

/**
 * An upstream's response header fields as the guest may get them: end to end only, the
 * Content-Length spelled as a number is ({@link upstreamResponseFields}: `002` is `2`), and the
 * length fields of a response without content as {@link noContentFraming} says. A Content-Length
 * that is not one number is a 502, its body released, and nothing of it is forwarded.
 */
function upstreamHeaders(status: number, list: HeaderList, url: URL, body: Readable | null): HeaderList {
  const fields = upstreamResponseFields(list);
  if (fields === undefined) {
    discardBody(body);
    throw new EgressError("EG_UPSTREAM", 502, `upstream ${url.host} sent a Content-Length that is not one number`);
  }
  return noContentFraming(status, fields);
}

/** How much of a path an error message quotes. */
const maxQuotedPath = 256;

/**
 * A URL's path redacted, without its query (which can carry credentials). The query is searched
 * with it and dropped after: a value that holds `?` lies across the two, and the path alone
 * held its first part, which redaction did not recognise (black-box finding).
 */
function redactedPath(secrets: SecretStore, url: URL): string {
  const redacted = secrets.redact(`${url.pathname}${url.search}`);
  const query = redacted.indexOf("?");
  return query < 0 ? redacted : redacted.slice(0, query);
}

function cut(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}
