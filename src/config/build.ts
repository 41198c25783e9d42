import { createHmac } from "node:crypto";
import { Decider } from "../deciders/decider.js";
import { createDjsHooks, djsHooksOptionsFromFile, DjsHooks } from "../djs/create-djs-hooks.js";
import { createHttpHooks, declarativeConfigOf, type HookChainEntry, type HttpHooks, type HttpHooksOptions } from "../hooks/http-hooks.js";
import { defaults } from "./defaults.js";
import { singleGuestName, type GuestConfig, type ProxyConfig, type ProxyWideConfig } from "./document.js";
import { makeIssue, OptionError, type Segment } from "./option-error.js";

/**
 * A resolved configuration into startProxy's options: each guest's createHttpHooks (with its
 * tier-2 policy, when it has one). This is the only step that starts anything (the policies'
 * worker threads), so it runs only on a configuration already checked whole.
 */

/** One guest as startProxy's `guests` option takes it. */
export interface BuiltGuest {
  readonly httpHooks: HttpHooks;
  readonly env: Readonly<Record<string, string>>;
  readonly resolve?: Readonly<Record<string, readonly string[]>>;
  readonly sources?: readonly string[];
}

/** startProxy's options, in the single-guest form (`httpHooks`, `env`) or with `guests`. */
export interface BuiltProxyOptions extends ProxyWideConfig {
  readonly httpHooks?: HttpHooks;
  readonly env?: Readonly<Record<string, string>>;
  readonly guests?: Readonly<Record<string, BuiltGuest>>;
  readonly deploymentKey?: string;
}

export interface BuiltConfig {
  readonly options: BuiltProxyOptions;
  /**
   * How the guests' placeholders derive from the deployment key: `single`, the one guest of the
   * top-level options, from the key itself; `guests`, each listed guest from a key of its own.
   * Undefined without a deployment key (placeholders are then random per build).
   */
  readonly placeholderDerivation: "single" | "guests" | undefined;
  /** The guests' names. */
  readonly guestNames: readonly string[];
  /** Every guest's tier-2 policy, to be closed with the proxy. */
  readonly policies: readonly DjsHooks[];
  /** Replaces every guest's secret values in `text` (for a last-resort error line). */
  redact(text: string): string;
  /** Stops every policy's worker threads. */
  close(): Promise<void>;
}

export interface BuildOptions {
  /**
   * The deployment key (EGRESSGATE_PLACEHOLDER_KEY): guest tokens and placeholders derive from
   * it, so workers and restarts agree. Without it both are random per start.
   */
  readonly deploymentKey?: string | undefined;
}

/**
 * Each listed guest's placeholders derive from a key of its own, so two guests' same-named
 * secrets get different placeholders (one guest's placeholder means nothing to another). The
 * single guest keeps the deployment key itself, so its placeholders are those of before guests.
 */
export function guestPlaceholderKey(deploymentKey: string, guest: string): string {
  return createHmac("sha256", deploymentKey).update(`egressgate guest placeholders\0${guest}`).digest("hex");
}

/** Builds the options; on a failure, the policies already loaded are closed before it throws. */
export function buildProxyOptions(config: ProxyConfig, options: BuildOptions = {}): BuiltConfig {
  const key = options.deploymentKey;
  // Checked before anything loads; never quoted, it is a secret.
  if (key !== undefined && key.length < 32) throw new OptionError(makeIssue(["deploymentKey"], "must be at least 32 characters long"));
  const policies: DjsHooks[] = [];
  /** Closed with the policies: a decider still deciding when the proxy closes would hold the process open for its timeoutMs. */
  const deciders: Decider[] = [];
  const redactors: Array<(text: string) => string> = [];
  const built: Record<string, BuiltGuest> = {};
  try {
    for (const [name, guest] of Object.entries(config.guests)) {
      const base: Segment[] = config.single ? [] : ["guests", name];
      const placeholderKey = key === undefined ? undefined : config.single ? key : guestPlaceholderKey(key, name);
      const loaded = loadPolicies(guest, base, policies);
      for (const entry of loaded) if (entry instanceof Decider) deciders.push(entry);
      const created = createGuestHooks(guest, loaded, placeholderKey, base);
      const secrets = declarativeConfigOf(created.httpHooks)?.secrets;
      if (secrets !== undefined) redactors.push((text) => secrets.redact(text));
      built[name] = {
        httpHooks: created.httpHooks,
        env: created.env,
        ...(guest.resolve !== undefined ? { resolve: guest.resolve } : {}),
        ...(guest.sources !== undefined ? { sources: guest.sources } : {}),
      };
    }
  } catch (error) {
    // A policy that fails to close must not become an unhandled rejection on top of the start's error.
    void Promise.all(policies.map((policy) => policy.close())).catch(() => undefined);
    throw error;
  }
  const keyOption = key === undefined ? {} : { deploymentKey: key };
  const single = built["default"];
  const proxyOptions: BuiltProxyOptions =
    config.single && single !== undefined
      ? { ...config.proxy, httpHooks: single.httpHooks, env: single.env, ...keyOption }
      : { ...config.proxy, guests: built, ...keyOption };
  return {
    options: proxyOptions,
    placeholderDerivation: key === undefined ? undefined : config.single ? "single" : "guests",
    guestNames: Object.keys(built),
    policies,
    redact: (text) => redactors.reduce((out, redact) => redact(out), text),
    close: async () => {
      await Promise.all([...policies, ...deciders].map((closing) => closing.close()));
    },
  };
}

/**
 * Why a reload from the configuration serving to `next` is refused, or undefined. The single
 * guest (top-level options) derives its placeholders from the deployment key itself, so that
 * they are those of before guests existed; a guest under `guests:` from a key of its own, so that
 * two guests' same-named secrets differ. Neither can change without changing placeholders that
 * deployments hold, so a file that switches between the two forms and keeps the guest `default`
 * would give it other placeholders: the one in its environment would no longer be known, and
 * would go upstream as it is (black-box finding). Refused for the whole life of the process, not
 * only where `default` has secrets now: a secret it gains by a later reload would otherwise take
 * the other form's placeholder while its environment file holds the first.
 */
export function reloadRefusal(serving: Pick<BuiltConfig, "placeholderDerivation" | "guestNames">, next: Pick<BuiltConfig, "placeholderDerivation" | "guestNames">): string | undefined {
  const before = serving.placeholderDerivation;
  const after = next.placeholderDerivation;
  if (before === undefined || after === undefined || before === after) return undefined;
  if (!serving.guestNames.includes(singleGuestName) || !next.guestNames.includes(singleGuestName)) return undefined;
  const [from, to] = before === "single" ? ["the top-level options of one guest", "guests:"] : ["guests:", "the top-level options of one guest"];
  return (
    `reload: the file switches from ${from} to ${to} and keeps the guest "${singleGuestName}", whose secret placeholders would then change ` +
    `(the one guest's derive from the deployment key itself, a guest under guests: from a key of its own), and a placeholder it still sends would go upstream as it is. ` +
    `Restart the proxy to switch, and give "${singleGuestName}" its new environment (--guest-env-file); or, under guests:, name that guest otherwise (a new guest, with new credentials)`
  );
}

/**
 * The guest's chain in order: its policies (from hooksScript, or the script entries of hooks)
 * and its external deciders. Each policy loaded is also pushed to `loaded`, to be closed.
 */
function loadPolicies(guest: GuestConfig, base: readonly Segment[], loaded: DjsHooks[]): (DjsHooks | Decider)[] {
  const timeoutMs = guest.hooksTimeoutMs ?? defaults.guest.hooksTimeoutMs;
  const load = (script: string, at: readonly Segment[]): DjsHooks => {
    try {
      const { djsHooks } = createDjsHooks({ ...djsHooksOptionsFromFile(script), limits: { timeoutMs } });
      loaded.push(djsHooks);
      return djsHooks;
    } catch (error) {
      // A syntax error, a refused import or a top-level throw: the PolicyLoadError stays the cause.
      throw new OptionError(makeIssue(at, (error as Error).message, "clause"), { cause: error });
    }
  };
  if (guest.hooks !== undefined) {
    return guest.hooks.map((entry, i) => (entry.kind === "script" ? load(entry.path, [...base, "hooks", i, "script"]) : new Decider(entry.decider)));
  }
  const scripts = guest.hooksScript ?? [];
  return scripts.map((script, i) => load(script, scripts.length === 1 ? [...base, "hooksScript"] : [...base, "hooksScript", i]));
}

function createGuestHooks(guest: GuestConfig, policies: readonly (DjsHooks | Decider)[], placeholderKey: string | undefined, base: readonly Segment[]): ReturnType<typeof createHttpHooks> {
  const secrets: Record<string, NonNullable<HttpHooksOptions["secrets"]>[string]> = {};
  for (const [name, secret] of Object.entries(guest.secrets ?? {})) {
    secrets[name] = {
      hosts: secret.hosts,
      value: secret.value,
      ...(secret.secretRedirects !== undefined ? { secretRedirects: secret.secretRedirects } : {}),
      ...(secret.followRedirectsTo !== undefined ? { followRedirectsTo: secret.followRedirectsTo } : {}),
    };
  }
  const hooksOptions: HttpHooksOptions = {
    allowedHosts: guest.allowHosts ?? [],
    allowedInternalHosts: guest.allowInternalHosts ?? [],
    blockInternalRanges: guest.blockInternalRanges ?? defaults.guest.blockInternalRanges,
    secrets,
    replaceSecretsInQuery: guest.replaceSecretsInQuery ?? defaults.guest.replaceSecretsInQuery,
    ...(guest.secretRedirects !== undefined ? { secretRedirects: guest.secretRedirects } : {}),
    ...(guest.followRedirectsTo !== undefined ? { followRedirectsTo: guest.followRedirectsTo } : {}),
    // One policy keeps the single form; several, or any decider, are a chain run in the order given.
    ...(policies.length === 1 && policies[0] instanceof DjsHooks
      ? { djsHooks: policies[0] }
      : policies.length > 0
        ? { hooks: policies as readonly unknown[] as readonly HookChainEntry[] }
        : {}),
    ...(placeholderKey !== undefined ? { secretPlaceholderKey: placeholderKey } : {}),
  };
  try {
    return createHttpHooks(hooksOptions);
  } catch (error) {
    // The schema has checked every value createHttpHooks checks; this is a last line, not a path.
    throw new OptionError(makeIssue(base, `is refused by ${(error as Error).message}`), { cause: error });
  }
}
