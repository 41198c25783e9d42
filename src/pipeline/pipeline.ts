import { discardBody } from "../streams.js";
import { errors as undiciErrors, type Dispatcher } from "undici";
import type { Readable } from "node:stream";
import { EgressError, badRequest, denied } from "../errors.js";
import { BodyTap } from "../hooks/body-tap.js";
import { makeRequest } from "../hooks/fetch-objects.js";
import { runHook } from "../hooks/run-hook.js";
import type { HttpHooks } from "../hooks/http-hooks.js";
import { allow, deny, type Decision } from "../policy/decision.js";
import type { DeclarativePolicy } from "../policy/declarative-policy.js";
import type { RedirectHop, SecretTarget } from "../policy/secrets.js";
import type { PinnedPools } from "../upstream/pinned-pools.js";
import type { ResolvedAddress, Resolver } from "../upstream/resolve.js";
import { forbiddenMethods, type ExchangeContext, type GuestGone, type OutboundRequest, type PipelineResponse } from "./exchange.js";
import { endToEndHeaders, headerObjectToList } from "../headers.js";
import { runOnRequest, runOnResponse, type HookLimits } from "./hook-phases.js";
import { nextHop, redirectStatuses } from "./redirects.js";
import { bareHostname } from "../hostname.js";
import type { DjsEngine } from "../djs/engine.js";
import type { Logger } from "../log.js";
import { djsIsIpAllowed, djsIsRequestAllowed, djsOnRequest, djsOnResponse, type DjsRun } from "./djs-phases.js";

const answeredByHook = allow("tier3", "onRequest", "answered by the onRequest hook; no upstream was contacted");
const answeredByPolicy = allow("tier2", "onRequest", "answered by the onRequest policy; no upstream was contacted");

export interface PipelineOptions {
  readonly policy: DeclarativePolicy;
  /**
   * The hooks to run (tier 3). When the declarative tier is evaluated natively, the generated
   * check functions are left out of this.
   */
  readonly hooks: HttpHooks;
  /** The tier-2 policy: in every phase it runs before `hooks`. */
  readonly djs?: DjsEngine | undefined;
  /** Where a policy's console lines go. */
  readonly log?: Logger;
  readonly resolver: Resolver;
  readonly pools: PinnedPools;
  readonly maxRedirects: number;
  readonly limits: HookLimits;
  /**
   * With several guests: the name of another guest's secret whose placeholder the request
   * carries. Such a request is refused, naming the secret but never the guest that holds it.
   */
  readonly foreignSecret?: ((request: SecretTarget) => string | undefined) | undefined;
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

type BodyReadable = Dispatcher.ResponseData["body"];

/**
 * The order of evaluation of DESIGN §3 for one guest request: policy checks on the request as it
 * will leave, a connection to an approved address only, and redirects followed and checked again
 * at every hop. The onRequest/secrets/onResponse steps slot in around `authorize` and `send`.
 */
export class Pipeline {
  private readonly djsPhases: ReadonlySet<string>;

  constructor(private readonly options: PipelineOptions) {
    this.djsPhases = options.djs?.phases ?? new Set();
  }

  /** Whether any tier registers onRequest: then no early check can settle a request by its target alone. */
  get hasOnRequest(): boolean {
    return this.options.hooks.onRequest !== undefined || this.djsPhases.has("onRequest");
  }

  private run(context: { id: string } | undefined): DjsRun {
    return { engine: this.options.djs!, log: this.options.log, requestId: context?.id ?? "" };
  }

  async handle(initial: OutboundRequest, context: ExchangeContext): Promise<PipelineResponse> {
    const { hooks, limits } = this.options;
    const djsOnRequestRegistered = this.djsPhases.has("onRequest");
    const djsOnResponseRegistered = this.djsPhases.has("onResponse");
    let request = initial;
    // The secrets substituted into any hop so far: a later hop that leaves their hosts is checked for their values.
    const substituted = new Set<string>();
    let tap: BodyTap | undefined;
    if (this.hasOnRequest && initial.body !== null) {
      if (initial.method === "GET" || initial.method === "HEAD") {
        throw badRequest(`${initial.method} with a body is refused while an onRequest hook is registered`);
      }
      tap = new BodyTap(initial.body as Readable, {
        limit: limits.requestBodyBytes,
        record: false,
        ...(context.beforeBody !== undefined ? { onStart: context.beforeBody } : {}),
      });
    }
    for (let redirects = 0; ; redirects++) {
      // §3 step 2: onRequest may rewrite the request or answer it itself; tier 2 first, and
      // tier 3 sees the request as tier 2 left it.
      if (djsOnRequestRegistered) {
        const unread = redirects === 0 && tap !== undefined && request.body === initial.body;
        const outcome = await djsOnRequest(this.run(context), request, unread ? tap : undefined, limits);
        if ("response" in outcome) {
          return { ...outcome.response, decision: answeredByPolicy, url: request.url, redirects };
        }
        request = outcome.request;
      }
      if (hooks.onRequest !== undefined) {
        const unread = redirects === 0 && request.body === initial.body;
        const outcome = await runOnRequest(hooks.onRequest, request, unread ? tap : undefined, limits);
        if ("response" in outcome) {
          return { ...outcome.response, decision: answeredByHook, url: request.url, redirects };
        }
        request = outcome.request;
      }
      // §3 step 3, then step 4 on the request exactly as it will leave.
      request = this.substituteSecrets(request, substituted);
      const target = await this.authorize(request);
      if (request.body !== null) context.beforeBody?.();
      const upstream = await this.sendToFirstReachable(request, target.addresses, context.signal);
      const location = redirectStatuses.has(upstream.status) ? upstream.location : undefined;
      if (location === undefined) {
        if (hooks.onResponse === undefined && !djsOnResponseRegistered) {
          return { ...upstream, decision: target.decision, url: request.url, redirects };
        }
        // §3 step 7: tier 2, then tier 3 on what tier 2 returned.
        let response: { status: number; headers: string[]; body: Readable | null } = upstream;
        const cleanups: (() => void)[] = [];
        if (djsOnResponseRegistered) {
          const hooked = await djsOnResponse(this.run(context), response, request, limits);
          if (hooked.replaced) cleanups.push(hooked.discard);
          response = hooked;
        }
        if (hooks.onResponse !== undefined) {
          let hooked;
          try {
            hooked = await runOnResponse(hooks.onResponse, response, request, limits);
          } catch (error) {
            for (const cleanup of cleanups) cleanup();
            throw error;
          }
          if (hooked.replaced) cleanups.push(hooked.discard);
          response = hooked;
        }
        return {
          status: response.status,
          headers: response.headers,
          body: response.body,
          decision: target.decision,
          url: request.url,
          redirects,
          ...(cleanups.length > 0 ? { cleanup: () => cleanups.forEach((cleanup) => cleanup()) } : {}),
        };
      }
      // A redirect's own body is thrown away; dump() gives up (closing that connection) past the limit.
      // It gets a second, too: a body that trickles in would otherwise hold its connection for ever.
      void upstream.body?.dump({ limit: redirectBodyLimit, signal: AbortSignal.timeout(redirectDrainMs) }).catch(() => undefined);
      const secrets = this.options.policy.config.secrets;
      if (redirects >= this.options.maxRedirects) {
        // Redacted, then cut (a cut first could leave part of a value that redaction no longer
        // recognises): a crafted path must not make the body and the log line 60 KB. With secrets,
        // a host that an upstream named is not quoted: a wildcard-scoped secret's value may sit in
        // it, lowercased by the URL parser, where redaction cannot see it.
        const path = cut(secrets === undefined ? request.url.pathname : secrets.redact(request.url.pathname), maxQuotedPath);
        const from = secrets === undefined || request.url.host === initial.url.host ? request.url.origin : "a host it was redirected to";
        throw new EgressError("EG_REDIRECT_LOOP", 508, `more than ${this.options.maxRedirects} redirects, the last from ${from}${from.includes("/") ? "" : " at "}${path}`);
      }
      // A hop that leaves the hosts of a secret sent on an earlier hop is refused if it carries its value.
      const check = secrets === undefined || substituted.size === 0 ? undefined : (hop: RedirectHop) => secrets.checkRedirect(hop, substituted);
      request = nextHop(request, upstream.status, location, check);
    }
  }

  /**
   * For a protocol upgrade (WebSocket): onRequest (without a body), secrets and every check of
   * §3 step 4, like any request.
   * The caller connects to one of the returned addresses and tunnels the rest.
   */
  async authorizeUpgrade(initial: OutboundRequest): Promise<{ request: OutboundRequest; addresses: readonly ResolvedAddress[] }> {
    let rewritten = initial;
    const { onRequest } = this.options.hooks;
    if (this.djsPhases.has("onRequest")) {
      const outcome = await djsOnRequest(this.run(undefined), rewritten, undefined, this.options.limits);
      if ("response" in outcome) {
        discardBody(outcome.response.body);
        throw new EgressError("EG_HOOK_FAILED", 502, "the onRequest policy answered a protocol upgrade; upgrades can be continued, rewritten or blocked");
      }
      rewritten = outcome.request;
    }
    if (onRequest !== undefined) {
      const outcome = await runOnRequest(onRequest, rewritten, undefined, this.options.limits);
      if ("response" in outcome) {
        discardBody(outcome.response.body);
        throw new EgressError("EG_HOOK_FAILED", 502, "onRequest answered a protocol upgrade; upgrades can be continued, rewritten or blocked");
      }
      rewritten = outcome.request;
    }
    if (rewritten.body !== null) {
      // The upgrade's head is sent as it is, and the tunnel follows it: there is no place for a body.
      if (!(rewritten.body instanceof Uint8Array)) discardBody(rewritten.body);
      throw new EgressError("EG_HOOK_FAILED", 502, "onRequest gave a protocol upgrade a body; an upgrade request cannot carry one");
    }
    const request = this.substituteSecrets(rewritten);
    const target = await this.authorize(request);
    return { request, addresses: target.addresses };
  }

  /** §3 step 3: placeholders become values for the final destination; misplaced secrets refuse the request. */
  private substituteSecrets(request: OutboundRequest, substituted?: Set<string>): OutboundRequest {
    const secrets = this.options.policy.config.secrets;
    const changed = secrets?.apply(request, bareHostname(request.url.hostname), substituted);
    const result = changed === undefined ? request : { ...request, headers: changed.headers, url: changed.url };
    // What is left looking like a placeholder after this guest's own were replaced is either
    // nobody's or another guest's: the second is refused (a guest must not even learn that a
    // neighbour's placeholder works somewhere).
    const foreign = this.options.foreignSecret?.(result);
    if (foreign !== undefined) throw denied(`the request carries the placeholder of secret "${foreign}", which this guest does not hold`);
    return result;
  }

  /** §3 step 4: every check must allow, and the first denial wins. */
  private async authorize(request: OutboundRequest): Promise<ApprovedTarget> {
    const { policy, hooks, resolver } = this.options;
    const { url } = request;
    // The guest's own TRACE is refused before any hook; one here came from a rewrite.
    if (forbiddenMethods.has(request.method.toUpperCase())) {
      throw new EgressError("EG_HOOK_FAILED", 502, `onRequest rewrote the request to the forbidden method ${request.method}`);
    }
    if (this.djsPhases.has("isRequestAllowed") && !(await djsIsRequestAllowed(this.run(undefined), request))) {
      throw denied(`request to ${url.origin} refused by the isRequestAllowed policy`);
    }
    const isRequestAllowed = hooks.isRequestAllowed;
    if (isRequestAllowed !== undefined) {
      // The hook sees the request as it will leave (secrets substituted), without a body.
      const seen = makeRequest(url, request.method, request.headers, null);
      const allowed = await runHook("isRequestAllowed", this.options.limits.hookMs, () => isRequestAllowed(seen));
      if (allowed !== true) throw checkRefusal("isRequestAllowed", allowed, `request to ${url.origin} refused by isRequestAllowed`);
    }
    const hostDecision = policy.checkHost(url.hostname);
    if (!hostDecision.allowed) throw denied(hostDecision.reason);

    const port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
    const hostname = bareHostname(url.hostname);
    const protocol = url.protocol as "http:" | "https:";
    const addresses = await resolver.resolve(url.hostname);
    let firstRefusal: Decision | undefined;
    const approved: ResolvedAddress[] = [];
    for (const address of addresses) {
      const decision = policy.checkAddress(url.hostname, address, port);
      if (!decision.allowed) {
        firstRefusal ??= decision;
        continue;
      }
      // What both tiers' isIpAllowed are asked about.
      const info = { hostname, ip: address.ip, family: address.family, port, protocol };
      if (this.djsPhases.has("isIpAllowed")) {
        if (!(await djsIsIpAllowed(this.run(undefined), info))) {
          firstRefusal ??= deny("tier2", "isIpAllowed", `an address of "${hostname}" was refused by the isIpAllowed policy`, `${hostname} -> ${address.ip}`);
          continue;
        }
      }
      const isIpAllowed = hooks.isIpAllowed;
      if (isIpAllowed !== undefined) {
        const allowed = await runHook("isIpAllowed", this.options.limits.hookMs, () => isIpAllowed(info));
        if (allowed !== true) {
          if (allowed !== false) throw checkRefusal("isIpAllowed", allowed, "");
          firstRefusal ??= deny("hooks", "isIpAllowed", `an address of "${hostname}" was refused by isIpAllowed`, `${hostname} -> ${address.ip}`);
          continue;
        }
      }
      approved.push(address);
    }
    if (approved.length > 0) return { addresses: approved, decision: hostDecision };
    if (firstRefusal === undefined) throw denied(`host "${url.hostname}" has no usable address`);
    throw denied(firstRefusal.reason, firstRefusal.detail);
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
  ): ReturnType<Pipeline["send"]> {
    for (let i = 0; ; i++) {
      try {
        return await this.send(request, addresses[i]!, signal);
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
  ): Promise<{ status: number; headers: string[]; body: BodyReadable | null; location: string | undefined }> {
    const { url } = request;
    const pool = this.options.pools.get(url, address);
    let informational = 0;
    try {
      const response = await pool.request({
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
      });
      const location = response.headers["location"];
      const noBody =
        methodsWithoutResponseBody.has(request.method) || response.statusCode === 204 || response.statusCode === 304;
      if (noBody) void response.body.dump().catch(() => undefined);
      return {
        status: response.statusCode,
        headers: endToEndHeaders(headerObjectToList(response.headers)),
        body: noBody ? null : response.body,
        location: typeof location === "string" ? location : undefined,
      };
    } catch (error) {
      throw upstreamError(error, url);
    }
  }
}

const connectErrorCodes = new Set(["ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "EADDRNOTAVAIL", "UND_ERR_CONNECT_TIMEOUT"]);

function isConnectFailure(error: unknown): boolean {
  const cause = error instanceof EgressError ? error.cause : error;
  return cause instanceof undiciErrors.ConnectTimeoutError || connectErrorCodes.has((cause as NodeJS.ErrnoException)?.code ?? "");
}

/** Turns an undici or socket failure into the status the guest receives. */
export function upstreamError(error: unknown, url: URL): EgressError {
  if (error instanceof EgressError) return error;
  const target = `${url.hostname}:${url.port || (url.protocol === "https:" ? 443 : 80)}`;
  if (
    error instanceof undiciErrors.ConnectTimeoutError ||
    error instanceof undiciErrors.HeadersTimeoutError ||
    error instanceof undiciErrors.BodyTimeoutError
  ) {
    return new EgressError("EG_UPSTREAM_TIMEOUT", 504, `upstream ${target} timed out: ${(error as Error).message}`, {
      cause: error,
    });
  }
  const err = error as NodeJS.ErrnoException;
  const code = err.code ?? "";
  const tlsProblem = code.startsWith("ERR_TLS") || code.includes("CERT") || code.startsWith("ERR_SSL") || /certificate/i.test(err.message);
  const detail = `${code ? `${code}: ` : ""}${err.message}`;
  if (tlsProblem) return new EgressError("EG_UPSTREAM", 502, `upstream TLS failed for ${target}: ${detail}`, { cause: error, detail });
  // Socket errors (ECONNREFUSED 10.0.0.5:443) name the pinned address: the guest gets the code only.
  const shown = /^E[A-Z]+$/.test(code) ? code : detail;
  return new EgressError("EG_UPSTREAM", 502, `upstream request failed for ${target}: ${shown}`, { cause: error, detail });
}

/** `false` is a refusal (403); anything else but `true` is a broken hook (502, as DESIGN §2 says). */
function checkRefusal(hook: string, value: unknown, reason: string): EgressError {
  if (value === false) return denied(reason);
  return new EgressError("EG_HOOK_FAILED", 502, `${hook} returned ${typeof value}, not a boolean`);
}

/** How much of a path an error message quotes. */
const maxQuotedPath = 256;

function cut(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max)}…` : text;
}
