import type { DjsEngine } from "../djs/engine.js";
import type { PhaseName } from "../djs/protocol.js";
import { EgressError, denied } from "../errors.js";
import type { BodyTap } from "../hooks/body-tap.js";
import { makeRequest } from "../hooks/fetch-objects.js";
import type { ChainEntry } from "../hooks/declarative-binding.js";
import type { HttpHooks, IpInfo } from "../hooks/http-hooks.js";
import { runHook } from "../hooks/run-hook.js";
import type { Logger } from "../log.js";
import { allow, deny, type Decision } from "../policy/decision.js";
import { consoleSecretsFor, djsIsIpAllowed, djsIsRequestAllowed, djsOnRequest, djsOnResponse, type DjsRun } from "./djs-phases.js";
import { djsHandle } from "./djs-layer.js";
import { concealFor, revealNothing, type Conceal } from "../deciders/document.js";
import type { OpenFailure } from "../deciders/failure.js";
import type { SecretStore } from "../policy/secrets.js";
import { deciderSource } from "./decider-source.js";
import { runHandle } from "./layer-phases.js";
import type { GuestGone, OutboundRequest } from "./exchange.js";
import { runOnRequest, runOnResponse, type HookedResponse, type HookLimits, type OnRequestOutcome } from "./hook-phases.js";

/** What a call is for: the request id its console lines carry, and the guest it serves. */
export interface SourceCall {
  /** The decision line's id (ExchangeContext.id); undefined for a protocol upgrade's, whose line has none. */
  readonly requestId: number | undefined;
  /** The guest's name (`default` when there is one guest). */
  readonly guest: string;
  /** Aborts when the guest leaves: what an external decider has queued or running for it ends then. */
  readonly signal?: GuestGone | undefined;
}

/**
 * What a layer (`handle(request, next)`) is given to run the rest of the path. `next` runs the
 * inner layers, then DESIGN §3 steps 2–7 (onRequest, secrets, every check, the upstream with its
 * redirects, onResponse) on `request`, and resolves to the response; it rejects with the
 * EgressError that ended the descent (a 403 for a refusal). A response it resolved to that the
 * layer does not return as it is remains the source's to discard. `sleep` waits, within the
 * request's `timeouts.requestMs` (it rejects with 504 at once when the wait would not fit).
 */
export interface LayerNext {
  next(request: OutboundRequest): Promise<HookedResponse>;
  sleep(ms: number): Promise<void>;
}

/** What onResponse gives back: the response for the guest, and how to drop the one it replaced. */
export type HookedOnResponse = HookedResponse & {
  readonly replaced: boolean;
  readonly discard: () => void;
  /** A failOpen decider failed and let the response go on: the trace says so. */
  readonly failedOpen?: OpenFailure;
};

/**
 * One source of hooks, whatever runs it: a QuickJS policy (tier 2) or callbacks in this process
 * (tier 3). The pipeline walks an ordered list of them in every phase (DESIGN §3); a source says
 * which phases it registers, so a phase nobody registers costs nothing.
 */
export interface HookSource {
  readonly tier: "tier2" | "tier3" | "decider";
  /**
   * Who decided, for the decision log: a policy's file, `hooks[N]` / `hooks` for callbacks, or
   * an external decider's kind and target (`command:./check.sh`, `webhook:http://…`, `opa:http://…`).
   */
  readonly label: string;
  readonly phases: ReadonlySet<PhaseName>;
  /** How messages name this source's hook: "the onRequest policy" (tier 2) or "onRequest" (tier 3). */
  describe(phase: PhaseName): string;
  /** The decision when this source's onRequest answered the request itself. */
  readonly answered: Decision;
  onRequest(request: OutboundRequest, tap: BodyTap | undefined, limits: HookLimits, call: SourceCall): Promise<OnRequestOutcome>;
  /** Throws a 403 for `false`, and a 502 for anything but a boolean. */
  isRequestAllowed(request: OutboundRequest, limits: HookLimits, call: SourceCall): Promise<void>;
  /** The refusal for this address, or undefined when it may be used; throws when the hook is broken. */
  isIpAllowed(info: IpInfo, limits: HookLimits, call: SourceCall): Promise<Decision | undefined>;
  onResponse(response: HookedResponse, request: OutboundRequest, limits: HookLimits, call: SourceCall): Promise<HookedOnResponse>;
  /**
   * The source's layer, present when it registers `handle`. It answers with a response: one that
   * `layer.next` resolved to, returned as it is (the same object), or one of its own. `tap` is
   * the request's body as a lazy web stream, when the body is the guest's stream.
   */
  handle?(request: OutboundRequest, tap: BodyTap | undefined, layer: LayerNext, limits: HookLimits, call: SourceCall): Promise<HookedResponse>;
}

const tier2Answered = allow("tier2", "onRequest", "answered by the onRequest policy; no upstream was contacted");
const tier3Answered = allow("tier3", "onRequest", "answered by the onRequest hook; no upstream was contacted");

/** A tier-2 policy: its calls cross to the engine's worker threads. */
export function policySource(engine: DjsEngine, log: Logger | undefined, secrets?: SecretStore, neighbours?: DjsRun["neighbours"]): HookSource {
  const run = (call: SourceCall, limits: HookLimits, request?: OutboundRequest): DjsRun => ({
    engine,
    log,
    requestId: call.requestId,
    secrets: request === undefined ? secrets : consoleSecretsFor(secrets, request),
    neighbours,
    signal: call.signal,
    hookMs: limits.hookMs,
  });
  return {
    tier: "tier2",
    label: engine.filename,
    phases: engine.phases,
    describe: (phase) => `the ${phase} policy`,
    answered: tier2Answered,
    onRequest: (request, tap, limits, call) => djsOnRequest(run(call, limits, request), request, tap, limits),
    isRequestAllowed: async (request, limits, call) => {
      if (!(await djsIsRequestAllowed(run(call, limits, request), request))) throw denied(`request to ${request.url.origin} refused by the isRequestAllowed policy`);
    },
    isIpAllowed: async (info, limits, call) =>
      (await djsIsIpAllowed(run(call, limits), info))
        ? undefined
        : deny("tier2", "isIpAllowed", `an address of "${info.hostname}" was refused by the isIpAllowed policy`, `${info.hostname} -> ${info.ip}`),
    onResponse: (response, request, limits, call) => djsOnResponse(run(call, limits, request), response, request, limits),
    ...(engine.phases.has("handle") ? { handle: (request, tap, layer, limits, call) => djsHandle(run(call, limits, request), request, tap, layer, limits) } : {}),
  };
}

/** Tier-3 callbacks: ordinary (a)sync functions given WHATWG objects. */
export function callbackSource(hooks: HttpHooks, label = "hooks"): HookSource {
  const phases = new Set<PhaseName>();
  for (const phase of ["isRequestAllowed", "isIpAllowed", "onRequest", "onResponse", "handle"] as const) if (hooks[phase] !== undefined) phases.add(phase);
  return {
    tier: "tier3",
    label,
    phases,
    describe: (phase) => phase,
    answered: tier3Answered,
    onRequest: (request, tap, limits, call) => runOnRequest(hooks.onRequest!, request, tap, limits, call.signal),
    isRequestAllowed: async (request, limits, call) => {
      const isRequestAllowed = hooks.isRequestAllowed!;
      // The hook sees the request as it will leave (secrets substituted), without a body.
      const seen = makeRequest(request.url, request.method, request.headers, null);
      const allowed = await runHook("isRequestAllowed", limits.hookMs, () => isRequestAllowed(seen), call.signal);
      if (allowed !== true) throw checkRefusal("isRequestAllowed", allowed, `request to ${request.url.origin} refused by isRequestAllowed`);
    },
    isIpAllowed: async (info, limits, call) => {
      const isIpAllowed = hooks.isIpAllowed!;
      const allowed = await runHook("isIpAllowed", limits.hookMs, () => isIpAllowed(info), call.signal);
      if (allowed === true) return undefined;
      if (allowed !== false) throw checkRefusal("isIpAllowed", allowed, "");
      return deny("hooks", "isIpAllowed", `an address of "${info.hostname}" was refused by isIpAllowed`, `${info.hostname} -> ${info.ip}`);
    },
    onResponse: (response, request, limits, call) => runOnResponse(hooks.onResponse!, response, request, limits, call.signal),
    ...(hooks.handle !== undefined ? { handle: (request, tap, layer, limits) => runHandle(hooks.handle!, request, tap, layer, limits) } : {}),
  };
}

/**
 * The sources of one guest, in the order of DESIGN §3: the tier-2 policy, then the chain in its
 * own order (`createHttpHooks({ hooks })`, which excludes the other two), then the tier-3
 * callbacks (a spread copy's added hooks included). External deciders get documents with the
 * guest's secret values mapped back to placeholders by `secrets`.
 */
export function hookSources(
  djs: DjsEngine | undefined,
  chain: readonly ChainEntry[],
  hooks: HttpHooks,
  log: Logger | undefined,
  secrets?: SecretStore | undefined,
  neighbours?: DjsRun["neighbours"],
): HookSource[] {
  const sources: HookSource[] = [];
  if (djs !== undefined) sources.push(policySource(djs, log, secrets, neighbours));
  const conceal: Conceal = secrets === undefined ? revealNothing : concealFor(secrets);
  for (const entry of chain) {
    if (entry.kind === "policy") sources.push(policySource(entry.djs.engine, log, secrets, neighbours));
    else if (entry.kind === "decider") sources.push(deciderSource(entry.decider, conceal, log));
    else sources.push(callbackSource(entry.hooks, `hooks[${entry.index}]`));
  }
  const callbacks = callbackSource(hooks);
  if (callbacks.phases.size > 0) sources.push(callbacks);
  return sources;
}

/** `false` is a refusal (403); anything else but `true` is a broken hook (502, as DESIGN §2 says). */
function checkRefusal(hook: string, value: unknown, reason: string): EgressError {
  if (value === false) return denied(reason);
  return new EgressError("EG_HOOK_FAILED", 502, `${hook} returned ${typeof value}, not a boolean`);
}
