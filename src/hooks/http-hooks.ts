import { compileHostPatterns, validateHostPattern } from "../policy/host-pattern.js";
import type { DeclarativeConfig } from "../policy/declarative-policy.js";
import { classifyIp } from "../policy/ip-classify.js";
import { SecretStore, type SecretInfo, type SecretOptions } from "../policy/secrets.js";

/** What `isIpAllowed` is asked about: one resolved address of the destination. */
export interface IpInfo {
  readonly hostname: string;
  readonly ip: string;
  readonly family: 4 | 6;
  readonly port: number;
  readonly protocol: "http:" | "https:";
}

/**
 * The hook functions a proxy runs. Tier-3 semantics (Request/Response objects, onRequest and
 * onResponse) arrive with the tier-3 work; the declarative tier is carried alongside, hidden
 * from spreading.
 */
export interface HttpHooks {
  isRequestAllowed?: (request: { readonly url: string; readonly method: string }) => boolean | Promise<boolean>;
  isIpAllowed?: (info: IpInfo) => boolean | Promise<boolean>;
}

export interface HttpHooksOptions {
  /** Host patterns that may be reached; `*` matches any run of characters. Default: none (deny-all). */
  readonly allowedHosts?: readonly string[];
  /** Host patterns that may resolve to internal addresses; they count as allowed hosts too. */
  readonly allowedInternalHosts?: readonly string[];
  /** Refuse loopback, private, link-local and other internal addresses. Default: true. */
  readonly blockInternalRanges?: boolean;
  /**
   * Secrets the guest holds only as placeholders: `{ GH_TOKEN: { hosts: ["api.github.com"], value } }`.
   * The placeholder is replaced by the value in requests to those hosts, and refused anywhere else.
   */
  readonly secrets?: Readonly<Record<string, SecretOptions>>;
  /** Also substitute placeholders in the query string (names and values). Default: false. */
  readonly replaceSecretsInQuery?: boolean;
}

/** Changes secrets at run time; every change applies to the next request. */
export interface SecretManager {
  /** Name, placeholder, hosts and whether deleted; never the value. */
  listSecrets(): SecretInfo[];
  /** Rotates the value or changes the hosts. The old value is refused everywhere from then on. Throws for an unknown or deleted name. */
  updateSecret(name: string, change: { value?: string; hosts?: readonly string[] }): void;
  /** Deletes a secret: its placeholder becomes "" and its value is refused everywhere. Safe to call twice. */
  deleteSecret(name: string): void;
}

export interface CreatedHttpHooks {
  readonly httpHooks: HttpHooks;
  /** Environment variables for the guest (secret placeholders). */
  readonly env: Readonly<Record<string, string>>;
  readonly allowedHosts: readonly string[];
  readonly secretManager: SecretManager;
}

/**
 * The declarative configuration rides on the hooks object under a non-enumerable symbol, so the
 * proxy can evaluate it natively. `{ ...httpHooks }` drops it by design; the proxy then calls the
 * generated functions instead, which give the same answers more slowly.
 */
const declarativeKey = Symbol.for("egressgate.declarative");

const knownOptions = new Set(["allowedHosts", "allowedInternalHosts", "blockInternalRanges", "secrets", "replaceSecretsInQuery"]);

function patternList(value: unknown, name: string): string[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw new TypeError(`${name}: expected an array of host patterns`);
  return value.map((p, i) => validateHostPattern(p, `${name}[${i}]`));
}

/**
 * Builds the hooks for the declarative tier.
 *
 * @example
 * ```ts
 * const { httpHooks } = createHttpHooks({ allowedHosts: ["api.github.com", "*.npmjs.org"] });
 * const proxy = await startProxy({ httpHooks });
 * ```
 */
export function createHttpHooks(options: HttpHooksOptions = {}): CreatedHttpHooks {
  if (typeof options !== "object" || options === null) throw new TypeError("createHttpHooks: options must be an object");
  for (const key of Object.keys(options)) {
    if (!knownOptions.has(key)) {
      throw new TypeError(`createHttpHooks: unknown option "${key}" (known: ${[...knownOptions].join(", ")})`);
    }
  }
  if (options.blockInternalRanges !== undefined && typeof options.blockInternalRanges !== "boolean") {
    throw new TypeError("createHttpHooks: blockInternalRanges must be a boolean");
  }
  if (options.replaceSecretsInQuery !== undefined && typeof options.replaceSecretsInQuery !== "boolean") {
    throw new TypeError("createHttpHooks: replaceSecretsInQuery must be a boolean");
  }
  if (options.secrets !== undefined && (typeof options.secrets !== "object" || options.secrets === null || Array.isArray(options.secrets))) {
    throw new TypeError("createHttpHooks: secrets must be an object of { NAME: { hosts, value } }");
  }
  const secrets = new SecretStore(options.secrets ?? {}, options.replaceSecretsInQuery ?? false, (hosts, path) => {
    const list = patternList(hosts, path);
    if (list.length === 0) throw new TypeError(`${path}: a secret needs at least one host`);
    return Object.freeze(list);
  });
  const config: DeclarativeConfig = Object.freeze({
    allowedHosts: Object.freeze(patternList(options.allowedHosts, "allowedHosts")),
    allowedInternalHosts: Object.freeze(patternList(options.allowedInternalHosts, "allowedInternalHosts")),
    blockInternalRanges: options.blockInternalRanges ?? true,
    ...(secrets.size > 0 ? { secrets } : {}),
  });
  const hosts = compileHostPatterns([...config.allowedHosts, ...config.allowedInternalHosts]);
  const internal = compileHostPatterns(config.allowedInternalHosts);
  const httpHooks: HttpHooks = {
    isRequestAllowed: (request) => hosts.match(new URL(request.url).hostname.replace(/^\[|\]$/g, "")) !== undefined,
    isIpAllowed: (info) => {
      const c = classifyIp(info.ip);
      if (c.metadata) return false;
      return !c.internal || !config.blockInternalRanges || internal.match(info.hostname) !== undefined;
    },
  };
  // The generated functions carry the configuration too: a spread copy keeps them, and the
  // proxy recognises them and knows the declarative tier is delegated to them.
  for (const target of [httpHooks, httpHooks.isRequestAllowed, httpHooks.isIpAllowed]) {
    Object.defineProperty(target, declarativeKey, { value: config, enumerable: false });
  }
  return {
    httpHooks,
    env: Object.freeze(secrets.env()),
    allowedHosts: config.allowedHosts,
    secretManager: {
      listSecrets: () => secrets.list(),
      updateSecret: (name, change) => secrets.update(name, change),
      deleteSecret: (name) => secrets.delete(name),
    },
  };
}

/** The declarative configuration attached by createHttpHooks, if the object still carries it. */
export function declarativeConfigOf(hooksOrGenerated: object | undefined): DeclarativeConfig | undefined {
  if (hooksOrGenerated === undefined) return undefined;
  return (hooksOrGenerated as Record<symbol, DeclarativeConfig | undefined>)[declarativeKey];
}
