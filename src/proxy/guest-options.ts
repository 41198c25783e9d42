import { chainOf, declarativeMode, djsHooksOf, type ChainEntry } from "../hooks/declarative-binding.js";
import { hookNames, type HttpHooks } from "../hooks/http-hooks.js";
import type { DjsEngine } from "../djs/engine.js";
import type { DeclarativeConfig } from "../policy/declarative-policy.js";
import { parseCidr, type Cidr } from "../policy/cidr.js";
import { buildStaticHosts, type StaticHosts } from "../upstream/resolve.js";
import { guestNamePattern } from "./auth.js";
import { reservedVariableReason } from "../guest-variables.js";
import { formatPath, makeIssue, OptionError, shownValue, unknownKeyReason, type OptionIssueKind, type Segment } from "../option-error.js";

/** One guest of a proxy that serves several: its own allowlist, secrets, policy and names. */
export interface GuestOptions {
  /** From this guest's own `createHttpHooks()`: allowlist, secrets, tier-2 policy and tier-3 hooks. */
  readonly httpHooks?: HttpHooks;
  /** The `env` from that `createHttpHooks()` (its placeholders), merged into `guestEnv(name)`. */
  readonly env?: Readonly<Record<string, string>>;
  /** This guest's static names, over the proxy-wide `resolve` (a name here wins). */
  readonly resolve?: Readonly<Record<string, readonly string[]>>;
  /**
   * Source ranges (`"10.88.0.2/32"`) whose connections are this guest without credentials, for
   * VMs whose clients cannot carry them. Sound only where no other guest can send from these
   * addresses: one veth or one network per guest (see the README, "Many guests").
   */
  readonly sources?: readonly string[];
}

/** A guest's options, validated. */
export interface ResolvedGuest {
  readonly name: string;
  readonly hooks: HttpHooks;
  /** The declarative tier, evaluated natively. */
  readonly declarative: DeclarativeConfig;
  /**
   * The hooks the pipeline calls. The generated declarative checks are left out when the native
   * path covers them (only the user's own part stays).
   */
  readonly checkHooks: HttpHooks;
  /** The tier-2 policy, if createHttpHooks was given one; it runs before `checkHooks` in every phase. */
  readonly djs: DjsEngine | undefined;
  /** The hook chain (`createHttpHooks({ hooks: [...] })`), run in its order after `djs` and before `checkHooks`. */
  readonly chain: readonly ChainEntry[];
  readonly env: Readonly<Record<string, string>>;
  readonly staticHosts: StaticHosts;
  readonly sources: readonly Cidr[];
}

const guestKeys = ["httpHooks", "env", "resolve", "sources"];

/**
 * The function the options were given to (`startProxy`, `reload`, `addGuest`): it starts every
 * message, and the error is an OptionError (code EG_INVALID_OPTION, `path`) like the schema's.
 * These were plain TypeErrors, all "startProxy:", whichever call it was (black-box finding).
 */
export type OptionCaller = "startProxy" | "reload" | "addGuest";

function refuse(caller: OptionCaller, segments: readonly Segment[], reason: string, kind: OptionIssueKind = "invalid"): never {
  throw new OptionError(makeIssue(segments, reason, kind), { prefix: `${caller}: ` });
}

function fail(caller: OptionCaller, segments: readonly Segment[], message: string, value: unknown): never {
  refuse(caller, segments, `${message} (got ${shownValue(value)})`);
}

export function plainObject(value: unknown, segments: readonly Segment[], caller: OptionCaller = "startProxy"): Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) fail(caller, segments, "must be an object", value);
  return value as Record<string, unknown>;
}

function hooksOf(value: unknown, segments: readonly Segment[], caller: OptionCaller): HttpHooks {
  const hooks = (value === undefined ? {} : plainObject(value, segments, caller)) as HttpHooks;
  for (const [key, fn] of Object.entries(hooks)) {
    if ((hookNames as readonly string[]).includes(key)) {
      if (fn !== undefined && typeof fn !== "function") fail(caller, [...segments, key], "must be a function", fn);
      continue;
    }
    // Anything else would be ignored, and a policy spread in here (`...createDjsHooks(p)`)
    // would then never run: refused, with the way that works.
    const hint = key === "djsHooks" ? "pass a tier-2 policy through createHttpHooks({ ...createDjsHooks(policy) })" : undefined;
    refuse(caller, [...segments, key], unknownKeyReason(key, hookNames, hint), "unknown");
  }
  return hooks;
}

function envOf(value: unknown, segments: readonly Segment[], caller: OptionCaller): Record<string, string> {
  const env: Record<string, string> = {};
  if (value === undefined) return env;
  for (const [k, v] of Object.entries(plainObject(value, segments, caller))) {
    if (typeof v !== "string") fail(caller, [...segments, k], "must be a string", v);
    const reserved = reservedVariableReason(k);
    if (reserved !== undefined) refuse(caller, [...segments, k], reserved, "clause");
    env[k] = v;
  }
  return env;
}

/**
 * Validates one guest. `path` prefixes every error (`["guests", "ci"]`, or [] for the
 * single-guest form, whose options sit at the top level); `proxyResolve` is the proxy-wide map it
 * starts from; `caller` is the function the options were given to, which starts every message.
 */
export function resolveGuestOptions(
  name: string,
  options: GuestOptions,
  path: readonly Segment[],
  proxyResolve: Readonly<Record<string, readonly string[]>> = {},
  caller: OptionCaller = "startProxy",
): ResolvedGuest {
  if (!guestNamePattern.test(name)) fail(caller, path.length === 0 ? ["guest name"] : path, "must be 1 to 64 of a-z, 0-9, '.', '_' and '-'", name);
  // An absent options object (`addGuest("ci")`) is the error at the guest's own path.
  const o = plainObject(options, path, caller);
  const at = (key: string): Segment[] => [...path, key];
  if (path.length > 0) {
    for (const key of Object.keys(o)) {
      if (!guestKeys.includes(key)) refuse(caller, at(key), unknownKeyReason(key, guestKeys), "unknown");
    }
  }
  const hooks = hooksOf(o["httpHooks"], at("httpHooks"), caller);
  const resolveIn = o["resolve"] === undefined ? {} : plainObject(o["resolve"], at("resolve"), caller);
  // Entries, not Object.assign: a name "__proto__" stays a name (for the check to refuse), never a prototype.
  const staticHosts = buildStaticHosts(Object.fromEntries([...Object.entries(proxyResolve), ...Object.entries(resolveIn as Record<string, string[]>)]), `${caller}: ${formatPath(at("resolve"))}`);
  const sourcesIn = o["sources"] ?? [];
  if (!Array.isArray(sourcesIn)) fail(caller, at("sources"), "must be an array of address ranges", sourcesIn);
  const sources = sourcesIn.map((entry: unknown, i) => {
    if (typeof entry !== "string") fail(caller, [...at("sources"), i], "must be an address range such as 10.88.0.2/32", entry);
    return parseCidr(entry, `${caller}: ${formatPath([...at("sources"), i])}`);
  });
  return {
    name,
    hooks,
    ...declarativeMode(hooks),
    djs: djsHooksOf(hooks)?.engine,
    chain: chainOf(hooks) ?? [],
    env: envOf(o["env"], at("env"), caller),
    staticHosts,
    sources,
  };
}
