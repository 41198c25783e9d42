import type { Decider } from "../deciders/decider.js";
import type { DjsHooks } from "../djs/create-djs-hooks.js";
import type { DeclarativeConfig } from "../policy/declarative-policy.js";
import type { HttpHooks } from "./http-hooks.js";

/**
 * How what createHttpHooks builds travels to startProxy: the declarative configuration, the
 * tier-2 policy and the hook chain ride on the returned `httpHooks` object under symbols, and
 * on its generated check functions too. `{ ...httpHooks }` drops the object's symbols by design
 * but keeps the functions, so the proxy still finds everything: on the native path it evaluates
 * the configuration itself and calls only the user's part of each generated function.
 */
const declarativeKey = Symbol.for("egressgate.declarative");
const djsKey = Symbol.for("egressgate.djs");
const chainKey = Symbol.for("egressgate.chain");
/** The user's own function inside a generated one, for the native path to call alone. */
const userHookKey = Symbol.for("egressgate.userHook");

/** One entry of a hook chain (`createHttpHooks({ hooks: [...] })`), in the order it runs. */
export type ChainEntry =
  | { readonly kind: "policy"; readonly djs: DjsHooks }
  | { readonly kind: "callbacks"; readonly hooks: HttpHooks; readonly index: number }
  | { readonly kind: "decider"; readonly decider: Decider; readonly index: number };

export interface Binding {
  readonly config: DeclarativeConfig;
  readonly djs: DjsHooks | undefined;
  readonly chain: readonly ChainEntry[] | undefined;
  readonly userAllow: HttpHooks["isRequestAllowed"];
  readonly userIp: HttpHooks["isIpAllowed"];
  readonly userOnRequest: HttpHooks["onRequest"];
}

/**
 * Attaches the binding to `httpHooks` and its generated check functions (which must exist), and
 * marks a generated onRequest (the chain, then secrets) with the user's own.
 */
export function bind(httpHooks: HttpHooks, binding: Binding): void {
  const holders = [httpHooks, httpHooks.isRequestAllowed!, httpHooks.isIpAllowed!];
  for (const target of holders) {
    Object.defineProperty(target, declarativeKey, { value: binding.config, enumerable: false });
    if (binding.djs !== undefined) Object.defineProperty(target, djsKey, { value: binding.djs, enumerable: false });
    if (binding.chain !== undefined) Object.defineProperty(target, chainKey, { value: binding.chain, enumerable: false });
  }
  Object.defineProperty(httpHooks.isRequestAllowed, userHookKey, { value: binding.userAllow, enumerable: false });
  Object.defineProperty(httpHooks.isIpAllowed, userHookKey, { value: binding.userIp, enumerable: false });
  if (httpHooks.onRequest !== undefined) {
    Object.defineProperty(httpHooks.onRequest, declarativeKey, { value: binding.config, enumerable: false });
    Object.defineProperty(httpHooks.onRequest, userHookKey, { value: binding.userOnRequest, enumerable: false });
  }
}

/** For a generated check function: the user's own hook inside it, if any. */
export function userPartOf<F extends object>(generated: F): F | undefined {
  return (generated as Record<symbol, F | undefined>)[userHookKey];
}

/** The declarative configuration attached by createHttpHooks, if the object still carries it. */
export function declarativeConfigOf(hooksOrGenerated: object | undefined): DeclarativeConfig | undefined {
  if (hooksOrGenerated === undefined) return undefined;
  return (hooksOrGenerated as Record<symbol, DeclarativeConfig | undefined>)[declarativeKey];
}

function found<T>(hooks: HttpHooks, key: symbol): T | undefined {
  for (const holder of [hooks, hooks.isRequestAllowed, hooks.isIpAllowed]) {
    const value = holder === undefined ? undefined : (holder as Record<symbol, T | undefined>)[key];
    if (value !== undefined) return value;
  }
  return undefined;
}

/** The tier-2 policy attached by createHttpHooks, from the hooks object or a generated function. */
export function djsHooksOf(hooks: HttpHooks): DjsHooks | undefined {
  return found<DjsHooks>(hooks, djsKey);
}

/** The hook chain attached by createHttpHooks (`hooks: [...]`), from the object or a generated function. */
export function chainOf(hooks: HttpHooks): readonly ChainEntry[] | undefined {
  return found<readonly ChainEntry[]>(hooks, chainKey);
}

const denyAll: DeclarativeConfig = Object.freeze({ allowedHosts: [], allowedInternalHosts: [], blockInternalRanges: true });

/** The allowlist and the IP block are left to the generated functions; secrets stay native. */
function delegatedConfig(recovered: DeclarativeConfig): DeclarativeConfig {
  return Object.freeze({
    allowedHosts: ["*"],
    allowedInternalHosts: ["*"],
    blockInternalRanges: false,
    ...(recovered.secrets !== undefined ? { secrets: recovered.secrets } : {}),
  });
}

/**
 * Picks how the declarative tier is enforced. Hooks straight from createHttpHooks carry their
 * configuration and run natively. A spread copy (`{ ...httpHooks, onResponse }`) has lost it but
 * still holds both generated functions: then the proxy calls those instead (slower, same
 * answers). If a spread copy replaced one of them, the configuration recovered from the other is
 * enforced natively, so replacing a hook can never switch the allowlist or the internal-range
 * block off. Hooks with no configuration at all are deny-all.
 *
 * `checkHooks` are the tier-3 callbacks the pipeline calls: the generated check functions are
 * left out when the native path covers them (only the user's own part stays).
 */
export function declarativeMode(hooks: HttpHooks): { declarative: DeclarativeConfig; checkHooks: HttpHooks } {
  const generatedAllow = declarativeConfigOf(hooks.isRequestAllowed);
  const generatedIp = declarativeConfigOf(hooks.isIpAllowed);
  const native = declarativeConfigOf(hooks);
  const delegated = native === undefined && generatedAllow !== undefined && generatedIp !== undefined;
  const checkHooks: HttpHooks = {};
  const allow = hooks.isRequestAllowed === undefined || delegated || generatedAllow === undefined ? hooks.isRequestAllowed : userPartOf(hooks.isRequestAllowed);
  const ip = hooks.isIpAllowed === undefined || delegated || generatedIp === undefined ? hooks.isIpAllowed : userPartOf(hooks.isIpAllowed);
  if (allow !== undefined) checkHooks.isRequestAllowed = allow;
  if (ip !== undefined) checkHooks.isIpAllowed = ip;
  // A generated onRequest substitutes secrets and runs the chain, which the proxy does itself.
  const onRequest = hooks.onRequest !== undefined && declarativeConfigOf(hooks.onRequest) !== undefined ? userPartOf(hooks.onRequest) : hooks.onRequest;
  if (onRequest !== undefined) checkHooks.onRequest = onRequest;
  if (hooks.onResponse !== undefined) checkHooks.onResponse = hooks.onResponse;
  if (hooks.handle !== undefined) checkHooks.handle = hooks.handle;
  if (delegated) return { declarative: delegatedConfig(generatedAllow), checkHooks };
  return { declarative: native ?? generatedAllow ?? generatedIp ?? denyAll, checkHooks };
}
