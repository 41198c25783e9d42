import { validateHostPattern } from "../policy/host-pattern.js";
import { DeclarativePolicy, type DeclarativeConfig } from "../policy/declarative-policy.js";
import { secretRedirectModes, SecretStore, secretValueProblem, type SecretInfo, type SecretOptions, type SecretRedirects, type SecretRedirectOptions } from "../policy/secrets.js";
import { makeIssue, OptionError, requiresReason, shownValue, unknownKeyReason, type OptionRequirement, type Segment } from "../option-error.js";
import { DjsHooks } from "../djs/create-djs-hooks.js";
import { bind, type ChainEntry } from "./declarative-binding.js";
import { HttpRequestBlockedError } from "./blocked-error.js";
import { isRequest, isResponse } from "./fetch-objects.js";
import { EgressError, statusText } from "../errors.js";
import { bareHostname } from "../hostname.js";
import { reservedVariableReason } from "../guest-variables.js";
import { homePath } from "../home-path.js";
import { programProblem } from "../deciders/find-program.js";
import { withFields } from "../objects.js";
import { Decider } from "../deciders/decider.js";
import { isDeciderEntry, resolveDecider, type DeciderOptions } from "../deciders/options.js";

export { chainOf, declarativeConfigOf, djsHooksOf, userPartOf, type ChainEntry } from "./declarative-binding.js";

/** What `isIpAllowed` is asked about: one resolved address of the destination. */
export interface IpInfo {
  readonly hostname: string;
  readonly ip: string;
  readonly family: 4 | 6;
  readonly port: number;
  /** `"http"` or `"https"` (no colon), as in Gondolin. */
  readonly protocol: "http" | "https";
}

type MaybePromise<T> = T | Promise<T>;

/**
 * The tier-3 hooks: ordinary (a)sync functions in the embedding process, given real WHATWG
 * `Request`/`Response` objects. The return-value contract is DESIGN.md §2:
 * - `isRequestAllowed(request)`: `false` means 403. The request has no body.
 * - `isIpAllowed(info)`: `false` skips that address; none left means 403.
 * - `onRequest(request)`: `undefined` continues (in-place header edits kept), a `Request`
 *   continues rewritten (and is checked again), a `Response` answers without any upstream.
 * - `onResponse(response, request)`: `undefined` forwards the response as received, a
 *   `Response` replaces it.
 * - `handle(request, next)`: a layer around all of that. `next(request)` runs the rest of the
 *   path (onRequest, secrets, every check, the upstream with its redirects, onResponse) and
 *   resolves to the upstream's Response; the layer answers with it, or with its own Response.
 *
 * Throw `HttpRequestBlockedError` to answer with its status; any other failure means 502.
 */
export interface HttpHooks {
  isRequestAllowed?: (request: Request) => MaybePromise<boolean>;
  isIpAllowed?: (info: IpInfo) => MaybePromise<boolean>;
  onRequest?: (request: Request) => MaybePromise<Request | Response | undefined | void>;
  onResponse?: (response: Response, request: Request) => MaybePromise<Response | undefined | void>;
  handle?: Layer;
}

/**
 * A layer: may call `next` zero times (a mock, a cache), once, or several times (a retry, a
 * fallback), at most 10 times per request over all layers. Each `next()` is checked again; one
 * the policy refuses rejects with HttpRequestBlockedError (status 403). A body goes once: pass
 * `request.clone()` to a `next()` that may be repeated.
 */
export type Layer = (request: Request, next: (request?: Request) => Promise<Response>) => MaybePromise<Response>;

export interface HttpHooksOptions extends HttpHooks {
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
  /**
   * A redirect hop that leaves the hosts of a secret the request carried, or goes to plain
   * http://: `"scan"` (default) follows it unless its URL or headers hold the value in any
   * common encoding; `"refuse"` refuses it unless it goes over https:// to a host in
   * `followRedirectsTo`. A secret may set its own.
   */
  readonly secretRedirects?: SecretRedirects;
  /** Host patterns that redirects may reach after all over https://, for secrets in `"refuse"` mode. A secret may set its own. */
  readonly followRedirectsTo?: readonly string[];
  /**
   * Derive secret placeholders from this key (at least 32 characters) instead of at random, so
   * that every process given the same key hands guests the same placeholders: several
   * instances or `--workers N` behind one guest, or a restart the guest does not see.
   */
  readonly secretPlaceholderKey?: string;
  /**
   * A tier-2 policy from `createDjsHooks()` (spread it in: `...createDjsHooks(source)`). In every
   * phase it runs before the tier-3 hooks given here, and sees nothing of them.
   */
  readonly djsHooks?: DjsHooks;
  /**
   * A chain of hook sources, run in this order in every phase: each entry is an object of
   * callbacks, what `createDjsHooks()` returns, or an external decider: `{ command: [...] }`,
   * `{ webhook: url }` or `{ opa: url }`, each with its options (README "External deciders"). Within a phase a rewrite is what the next
   * source sees, the first block, throw or Response ends the phase, and the checks are AND-ed.
   * Not together with `djsHooks` or the callbacks above: put those in the list.
   *
   * @example
   * ```ts
   * createHttpHooks({ allowedHosts: ["api.test"], hooks: [createDjsHooks(auditPolicy), { onRequest: tag }, createDjsHooks(strictPolicy)] });
   * createHttpHooks({ allowedHosts: ["api.test"], hooks: [{ command: ["./check.sh"], timeoutMs: 2000 }, { webhook: "http://127.0.0.1:9000/decide" }] });
   * ```
   */
  readonly hooks?: readonly HookChainEntry[];
  /**
   * Layers, outermost first: `layers: [a, b]` runs `a(request, next)`, whose `next` runs `b`,
   * whose `next` runs the rest of the path. They become the returned hooks' one `handle`. Not
   * together with `handle`.
   *
   * @example
   * ```ts
   * createHttpHooks({ allowedHosts: ["api.test"], layers: [async (request, next) => {
   *   const started = Date.now();
   *   const response = await next(request);
   *   console.log(request.url, response.status, Date.now() - started);
   *   return response;
   * }] });
   * ```
   */
  readonly layers?: readonly Layer[];
}

/**
 * One entry of `hooks`: tier-3 callbacks, a tier-2 policy (`createDjsHooks()`'s result, or its
 * `djsHooks`), or an external decider (`{ command }`, `{ webhook }` or `{ opa }`, with its options).
 */
export type HookChainEntry = HttpHooks | { readonly djsHooks: DjsHooks } | DjsHooks | DeciderOptions;

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

/** The hooks, the only keys an `httpHooks` object has. */
export const hookNames = ["isRequestAllowed", "isIpAllowed", "onRequest", "onResponse", "handle"] as const;
const knownOptions = new Set<string>([
  "allowedHosts",
  "allowedInternalHosts",
  "blockInternalRanges",
  "secrets",
  "replaceSecretsInQuery",
  "secretRedirects",
  "followRedirectsTo",
  "secretPlaceholderKey",
  "djsHooks",
  "hooks",
  "layers",
  ...hookNames,
]);


/** An option error of createHttpHooks: code EG_INVALID_OPTION and the option's path. */
function invalid(path: string | readonly Segment[], reason: string, kind: "invalid" | "unknown" | "clause" = "invalid", requires?: OptionRequirement): OptionError {
  const segments = typeof path === "string" ? (path === "" ? [] : path.split(".")) : path;
  return new OptionError(makeIssue(segments, reason, kind, requires), { prefix: "createHttpHooks: " });
}

const secretKeys = ["hosts", "value", "secretRedirects", "followRedirectsTo"];
const refuse: OptionRequirement = { path: "secretRedirects", value: "refuse" };

function checkMode(mode: unknown, path: string): void {
  if (mode !== undefined && !secretRedirectModes.includes(mode as SecretRedirects)) throw invalid(path, `must be "scan" or "refuse" (got ${shownValue(mode)})`);
}

/**
 * The secrets and their redirect options, checked here so each error names its option's path
 * (the secret store checks them again, for its other callers).
 */
function checkSecrets(options: HttpHooksOptions): void {
  checkMode(options.secretRedirects, "secretRedirects");
  patternList(options.followRedirectsTo, "followRedirectsTo");
  const mode = options.secretRedirects ?? "scan";
  let anyRefuses = mode === "refuse";
  for (const [name, secret] of Object.entries(options.secrets ?? {})) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw invalid(["secrets", name], "a secret name must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", "clause");
    const reserved = reservedVariableReason(name);
    if (reserved !== undefined) throw invalid(["secrets", name], reserved, "clause");
    const at = `secrets.${name}`;
    if (typeof secret !== "object" || secret === null || Array.isArray(secret)) throw invalid(at, "must be an object { hosts, value }");
    for (const key of Object.keys(secret)) {
      if (!secretKeys.includes(key)) throw invalid(`${at}.${key}`, unknownKeyReason(key, secretKeys), "unknown");
    }
    if (patternList(secret.hosts, `${at}.hosts`).length === 0) throw invalid(`${at}.hosts`, "a secret needs at least one host");
    // Never quoted: it is the secret.
    if (typeof secret.value !== "string" || secret.value === "") throw invalid(`${at}.value`, "must be a non-empty string");
    const problem = secretValueProblem(secret.value);
    if (problem !== undefined) throw invalid(`${at}.value`, problem);
    checkMode(secret.secretRedirects, `${at}.secretRedirects`);
    patternList(secret.followRedirectsTo, `${at}.followRedirectsTo`);
    const own = secret.secretRedirects ?? mode;
    if (secret.followRedirectsTo !== undefined && own !== "refuse") throw invalid(`${at}.followRedirectsTo`, requiresReason(refuse), "invalid", refuse);
    anyRefuses ||= own === "refuse";
  }
  // Hosts to let through where nothing is refused: a mistake in the configuration, not something to ignore.
  if (options.followRedirectsTo !== undefined && !anyRefuses) throw invalid("followRedirectsTo", requiresReason(refuse), "invalid", refuse);
}

function secretStore(options: HttpHooksOptions, key: string | undefined): SecretStore {
  checkSecrets(options);
  const redirects: { -readonly [K in keyof SecretRedirectOptions]: SecretRedirectOptions[K] } = {};
  if (options.secretRedirects !== undefined) redirects.secretRedirects = options.secretRedirects;
  if (options.followRedirectsTo !== undefined) redirects.followRedirectsTo = options.followRedirectsTo;
  return new SecretStore(options.secrets ?? {}, options.replaceSecretsInQuery ?? false, (hosts, path) => Object.freeze(patternList(hosts, path)), key, redirects);
}

function patternList(value: unknown, name: string): string[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw invalid(name, `must be an array of host patterns (got ${shownValue(value)})`);
  return value.map((pattern, i) => {
    try {
      return validateHostPattern(pattern, `${name}[${i}]`);
    } catch {
      throw new OptionError(makeIssue([...name.split("."), i], `is not a host pattern: letters, digits, ".", "-", "_" and "*" only, with no scheme, port or path (got ${shownValue(pattern)})`), {
        prefix: "createHttpHooks: ",
      });
    }
  });
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
  if (typeof options !== "object" || options === null) throw invalid("", `must be an object (got ${shownValue(options)})`);
  for (const key of Object.keys(options)) {
    if (!knownOptions.has(key)) throw invalid(key, unknownKeyReason(key, [...knownOptions]), "unknown");
  }
  if (options.blockInternalRanges !== undefined && typeof options.blockInternalRanges !== "boolean") {
    throw invalid("blockInternalRanges", `must be true or false (got ${shownValue(options.blockInternalRanges)})`);
  }
  for (const name of hookNames) {
    if (options[name] !== undefined && typeof options[name] !== "function") throw invalid(name, "must be a function");
  }
  if (options.djsHooks !== undefined && !(options.djsHooks instanceof DjsHooks)) throw invalid("djsHooks", "must come from createDjsHooks()");
  if (options.replaceSecretsInQuery !== undefined && typeof options.replaceSecretsInQuery !== "boolean") {
    throw invalid("replaceSecretsInQuery", `must be true or false (got ${shownValue(options.replaceSecretsInQuery)})`);
  }
  if (options.secrets !== undefined && (typeof options.secrets !== "object" || options.secrets === null || Array.isArray(options.secrets))) {
    throw invalid("secrets", "must be an object of { NAME: { hosts, value } }");
  }
  const key = options.secretPlaceholderKey;
  // Never quoted: it is a secret.
  if (key !== undefined && (typeof key !== "string" || key.length < 32)) throw invalid("secretPlaceholderKey", "must be a string of at least 32 characters");
  const secrets = secretStore(options, key);
  const config: DeclarativeConfig = Object.freeze({
    allowedHosts: Object.freeze(patternList(options.allowedHosts, "allowedHosts")),
    allowedInternalHosts: Object.freeze(patternList(options.allowedInternalHosts, "allowedInternalHosts")),
    blockInternalRanges: options.blockInternalRanges ?? true,
    ...(secrets.size > 0 ? { secrets } : {}),
  });
  const chain = chainEntries(options);
  const handle = layered(options);
  // The generated checks ask the same DeclarativePolicy the proxy evaluates natively (no
  // listening addresses here: only startProxy knows them, and checks them itself).
  const policy = new DeclarativePolicy(config, () => []);
  const hostAllowed = (request: Request): boolean => policy.checkHost(new URL(request.url).hostname).allowed;
  // The whole verdict on its own, as Gondolin's: the host must be allowed, and this address too.
  const ipAllowed = (info: IpInfo): boolean =>
    policy.checkHost(info.hostname).allowed && policy.checkAddress(info.hostname, { ip: info.ip, family: info.family }, info.port).allowed;
  const userAllow = options.isRequestAllowed;
  const userIp = options.isIpAllowed;
  // Called on their own (without startProxy), the generated functions give the whole verdict:
  // the declarative checks, then the user's hooks, or the chain's callbacks in order.
  const callbacks: readonly HttpHooks[] = chain === undefined ? [options] : chain.flatMap((entry) => (entry.kind === "callbacks" ? [entry.hooks] : []));
  const checks = <K extends "isRequestAllowed" | "isIpAllowed">(name: K): NonNullable<HttpHooks[K]>[] =>
    callbacks.flatMap((hooks) => (hooks[name] === undefined ? [] : [hooks[name]!]));
  const allowChecks = checks("isRequestAllowed");
  const ipChecks = checks("isIpAllowed");
  const standaloneOnRequest = standaloneRequestPhase(secrets, callbacks, chain);
  const httpHooks: HttpHooks = {
    isRequestAllowed: allowChecks.length === 0 ? hostAllowed : async (request) => hostAllowed(request) && (await every(allowChecks, request)),
    isIpAllowed: ipChecks.length === 0 ? ipAllowed : async (info) => ipAllowed(info) && (await every(ipChecks, info)),
    ...(standaloneOnRequest !== undefined ? { onRequest: standaloneOnRequest } : {}),
    ...(options.onResponse !== undefined ? { onResponse: options.onResponse } : {}),
    ...(handle !== undefined ? { handle } : {}),
  };
  // The generated functions carry the configuration, the policy and the chain too: a spread
  // copy keeps them (declarative-binding.ts). startProxy calls only the user's part of each:
  // it evaluates the rest natively, and runs the chain itself.
  bind(httpHooks, { config, djs: options.djsHooks, chain, userAllow, userIp, userOnRequest: options.onRequest });
  return {
    httpHooks,
    env: Object.freeze(secrets.env()),
    // What may be reached: the allowed hosts and the internal ones (which count as allowed), once each.
    allowedHosts: Object.freeze([...new Set([...config.allowedHosts, ...config.allowedInternalHosts])]),
    secretManager: {
      listSecrets: () => secrets.list(),
      updateSecret: (name, change) => secrets.update(name, change),
      deleteSecret: (name) => secrets.delete(name),
    },
  };
}

/** Whether every check allows, in order; the first refusal stops the rest. */
async function every<T>(checks: readonly ((value: T) => boolean | Promise<boolean>)[], value: T): Promise<boolean> {
  for (const check of checks) if ((await check(value)) !== true) return false;
  return true;
}

/**
 * `httpHooks.onRequest` on its own, as Gondolin's: the user's onRequest hooks in order (a
 * Response or a throw ends it), then the secrets for the final destination, and a Request
 * back. Present whenever there is something to do. A tier-2 policy's onRequest needs the proxy's
 * workers, so one in the chain makes the standalone function refuse (fail closed).
 */
function standaloneRequestPhase(secrets: SecretStore, callbacks: readonly HttpHooks[], chain: readonly ChainEntry[] | undefined): HttpHooks["onRequest"] {
  const hooks = callbacks.flatMap((entry) => (entry.onRequest === undefined ? [] : [entry.onRequest]));
  const policies = (chain ?? []).filter((entry) => entry.kind === "policy" && entry.djs.phases.includes("onRequest"));
  const deciders = (chain ?? []).filter((entry) => entry.kind === "decider" && entry.decider.phases.has("request"));
  if (hooks.length === 0 && secrets.size === 0 && policies.length === 0 && deciders.length === 0) return undefined;
  return async (input: Request) => {
    if (policies.length > 0) {
      throw new HttpRequestBlockedError("this chain holds a tier-2 onRequest policy, which runs only inside startProxy", 502, "Bad Gateway");
    }
    if (deciders.length > 0) {
      throw new HttpRequestBlockedError("this chain holds an external decider, which runs only inside startProxy", 502, "Bad Gateway");
    }
    let request = input;
    for (const hook of hooks) {
      const out = await hook(request);
      if (isResponse(out)) return out;
      if (isRequest(out)) request = out;
      else if (out !== undefined) throw new TypeError("onRequest returned something other than undefined, a Request or a Response");
    }
    return substitutedRequest(secrets, request);
  };
}

/** A Request with the placeholders replaced for its destination; a misplaced one is refused (HttpRequestBlockedError, 403). */
function substitutedRequest(secrets: SecretStore, request: Request): Request {
  if (secrets.size === 0) return request;
  const url = new URL(request.url);
  // Every header as the guest sent it, Proxy-Authorization included (its Basic form is substituted too).
  const headers: string[] = [];
  for (const [name, value] of request.headers) if (name !== "set-cookie") headers.push(name, value);
  let changed;
  try {
    changed = secrets.apply({ url, headers }, bareHostname(url.hostname));
  } catch (error) {
    if (error instanceof EgressError) throw new HttpRequestBlockedError(error.message, error.status, statusText(error.status));
    throw error;
  }
  if (changed === undefined) return request;
  const rebuilt = new Headers();
  for (let i = 0; i < changed.headers.length; i += 2) rebuilt.append(changed.headers[i]!, changed.headers[i + 1]!);
  return new Request(changed.url, { method: request.method, headers: rebuilt, body: request.body, redirect: request.redirect, signal: request.signal, ...(request.body !== null ? { duplex: "half" } : {}) } as RequestInit);
}

/** `layers: [a, b]` as one layer: `a`'s next runs `b`, and `b`'s the rest of the path. */
function layered(options: HttpHooksOptions): Layer | undefined {
  const list = options.layers as unknown;
  if (list === undefined) return options.handle;
  if (!Array.isArray(list)) throw invalid("layers", "must be an array of functions (request, next) => Response");
  if (options.handle !== undefined) throw invalid("handle", "cannot be combined with layers: put it in the layers list");
  if (options.hooks !== undefined) throw invalid("layers", "cannot be combined with hooks: give the layer as an entry's handle");
  list.forEach((layer, i) => {
    if (typeof layer !== "function") throw invalid(["layers", i], "must be a function (request, next) => Response");
  });
  const layers = [...(list as Layer[])];
  if (layers.length === 0) return undefined;
  const at = (index: number, request: Request, next: (request?: Request) => Promise<Response>): MaybePromise<Response> =>
    index === layers.length - 1 ? layers[index]!(request, next) : layers[index]!(request, async (inner) => at(index + 1, inner ?? request, next));
  return (request, next) => at(0, request, next);
}

/** A decider entry checked (its first problem thrown, with its path) and made ready; nothing is opened yet. */
function deciderOf(entry: DeciderOptions, index: number): Decider {
  const resolved = resolveDecider(entry, process.env, (reason, segments = [], kind = "invalid") => {
    throw invalid(["hooks", index, ...segments], reason, kind === "range" ? "invalid" : kind);
  });
  // resolveDecider reports every problem, and the first one has thrown above.
  const decider = resolved!;
  if (decider.kind !== "command" || decider.shell) return new Decider(decider);
  // A program's path as the config file has it (hook-chain.ts): no shell between a program and
  // createHttpHooks expands `~/check.sh`, and spawn took it as a folder named `~` (every call 502).
  const written = decider.argv[0]!;
  const program = !written.includes("/")
    ? written
    : homePath(written, process.env, (reason) => {
        throw invalid(["hooks", index, "command"], reason);
      });
  // And looked for as the config file's is, as spawn will (in the PATH the child gets, from the
  // proxy's working directory): a program that is not there was taken, and every request it was
  // asked about got 502 "could not start: ENOENT", where the CLI refuses it at start.
  const problem = programProblem(program, decider.env["PATH"], process.cwd());
  if (problem !== undefined) throw invalid(["hooks", index, "command"], problem);
  return new Decider(program === written ? decider : withFields(decider, { argv: [program, ...decider.argv.slice(1)] }));
}

/** `hooks: [...]` validated into the chain the proxy runs, each entry a policy or callbacks. */
function chainEntries(options: HttpHooksOptions): readonly ChainEntry[] | undefined {
  const list = options.hooks as unknown;
  if (list === undefined) return undefined;
  if (!Array.isArray(list)) throw invalid("hooks", "must be an array of hook objects, createDjsHooks() results or deciders");
  const mixed = ["djsHooks", ...hookNames].find((name) => options[name as keyof HttpHooksOptions] !== undefined);
  if (mixed !== undefined) throw invalid(mixed, "cannot be combined with hooks: put it in the hooks list, where its place in the order is explicit");
  return Object.freeze(
    list.map((entry: unknown, index): ChainEntry => {
      if (entry instanceof DjsHooks) return { kind: "policy", djs: entry };
      // Made by the config file's build, from options it has already checked.
      if (entry instanceof Decider) return { kind: "decider", decider: entry, index };
      if (typeof entry !== "object" || entry === null || Array.isArray(entry)) throw invalid(["hooks", index], "must be an object of hooks, a createDjsHooks() result or a decider");
      if (isDeciderEntry(entry)) return { kind: "decider", decider: deciderOf(entry, index), index };
      const record = entry as Record<string, unknown>;
      if (record["djsHooks"] !== undefined) {
        if (!(record["djsHooks"] instanceof DjsHooks) || Object.keys(record).length !== 1) throw invalid(["hooks", index], "must be createDjsHooks()'s result as it is");
        return { kind: "policy", djs: record["djsHooks"] };
      }
      const hooks: HttpHooks = {};
      for (const [key, fn] of Object.entries(record)) {
        if (!(hookNames as readonly string[]).includes(key)) throw invalid(["hooks", index, key], unknownKeyReason(key, [...hookNames]), "unknown");
        if (typeof fn !== "function") throw invalid(["hooks", index, key], "must be a function");
        (hooks as Record<string, unknown>)[key] = fn;
      }
      return { kind: "callbacks", hooks: Object.freeze(hooks), index };
    }),
  );
}
