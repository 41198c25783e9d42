import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import { declarativeConfigOf, djsHooksOf, hookNames, userPartOf, type HttpHooks } from "../hooks/http-hooks.js";
import type { DjsEngine } from "../djs/engine.js";
import { logLevels, type LogLevel, type LogSink } from "../log.js";
import type { DeclarativeConfig } from "../policy/declarative-policy.js";
import { defaultCaDir } from "../tls/ca-store.js";
import type { LeafKeyType } from "../tls/x509.js";
import { buildStaticHosts, type StaticHosts } from "../upstream/resolve.js";

export interface TimeoutOptions {
  /** From CONNECT until the guest's TLS handshake (or first plain byte) completes. Default 10 s. */
  readonly handshakeMs?: number;
  /** For the guest to send a complete request head. Default 30 s. */
  readonly headersMs?: number;
  /** A guest connection with no traffic either way is closed after this. Default 120 s. */
  readonly idleMs?: number;
  /** A DNS lookup (504 after). Default 5 s. */
  readonly dnsMs?: number;
  /** TCP + TLS connect to the upstream. Default 10 s. */
  readonly upstreamConnectMs?: number;
  /** Until the upstream's response head arrives (504 after). Default 60 s. */
  readonly upstreamHeadersMs?: number;
  /** Longest silence inside an upstream response body. Default 120 s. */
  readonly upstreamBodyMs?: number;
  /** How long `close()` lets in-flight requests finish before cutting them. Default 10 s. */
  readonly drainMs?: number;
  /** Each hook call must settle within this (504 after). Default 30 s. */
  readonly hookMs?: number;
}

/** What one guest may hold at once; past a limit the answer comes at once (503), never silence. */
export interface ConnectionLimitOptions {
  /** Guest connections open at once, tunnels and upgrades included. Default: half of the open-file limit, at most 16384. */
  readonly connections?: number;
  /** Guest connections open at once from one source address. Default 256. */
  readonly connectionsPerSource?: number;
  /** Requests one connection may have parsed and waiting behind the one being served; then it is not read. Default 16. */
  readonly pipelinedRequests?: number;
}

/** Options for {@link startProxy}. Every CLI flag has the matching option. */
export interface ProxyOptions {
  /** From `createHttpHooks()`. Without it, every request is refused (deny-all). */
  readonly httpHooks?: HttpHooks;
  /** Extra guest environment (the `env` from `createHttpHooks()`), merged into `guestEnv()`. */
  readonly env?: Readonly<Record<string, string>>;
  /** Default `{ host: "127.0.0.1", port: 8080 }`; port 0 picks a free port. */
  readonly listen?: { readonly host?: string; readonly port?: number };
  /** Where `ca.crt`/`ca.key` live. Default `$XDG_CONFIG_HOME/egressgate` or `~/.config/egressgate`. */
  readonly caDir?: string;
  /** Static names: `{ "api.test": ["127.0.0.1"] }`. IP checks still apply. */
  readonly resolve?: Readonly<Record<string, readonly string[]>>;
  /** Extra roots for upstream TLS: PEM text or file paths. */
  readonly upstreamCa?: readonly string[];
  /** Leaf key type: "ecdsa" (P-256, default) or "rsa" (2048, for legacy clients). */
  readonly leafKeyType?: LeafKeyType;
  /** How many leaf certificates to keep. Default 1000. */
  readonly leafCacheSize?: number;
  /** Redirect hops the proxy follows before answering 508. Default 10. */
  readonly maxRedirects?: number;
  /** Largest request body a hook may read (413 beyond). Bodies no hook reads are not limited. Default 64 MiB. */
  readonly maxHttpBodyBytes?: number;
  /** Largest response body a hook may read (502 beyond). Default 64 MiB. */
  readonly maxHttpResponseBodyBytes?: number;
  readonly timeouts?: TimeoutOptions;
  readonly limits?: ConnectionLimitOptions;
  /** Default "info": one line per request decision. */
  readonly logLevel?: LogLevel;
  /** Where log lines go. Default: stderr. */
  readonly logSink?: LogSink;
  /** Write the guest environment (KEY=value lines) to this file once listening. */
  readonly guestEnvFile?: string;
}

export interface ResolvedProxyOptions {
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
  readonly env: Readonly<Record<string, string>>;
  readonly listen: { readonly host: string; readonly port: number };
  readonly caDir: string;
  readonly staticHosts: StaticHosts;
  readonly upstreamCaPems: readonly string[];
  readonly leafKeyType: LeafKeyType;
  readonly leafCacheSize: number;
  readonly maxRedirects: number;
  readonly maxHttpBodyBytes: number;
  readonly maxHttpResponseBodyBytes: number;
  readonly timeouts: Required<TimeoutOptions>;
  readonly limits: Required<ConnectionLimitOptions>;
  readonly logLevel: LogLevel;
  readonly logSink: LogSink | undefined;
  readonly guestEnvFile: string | undefined;
}

export const defaults = Object.freeze({
  listen: Object.freeze({ host: "127.0.0.1", port: 8080 }),
  leafKeyType: "ecdsa" as LeafKeyType,
  leafCacheSize: 1000,
  maxRedirects: 10,
  logLevel: "info" as LogLevel,
  timeouts: Object.freeze({
    handshakeMs: 10_000,
    headersMs: 30_000,
    idleMs: 120_000,
    dnsMs: 5_000,
    upstreamConnectMs: 10_000,
    upstreamHeadersMs: 60_000,
    upstreamBodyMs: 120_000,
    drainMs: 10_000,
    hookMs: 30_000,
  }),
  maxHttpBodyBytes: 64 * 1024 * 1024,
  maxHttpResponseBodyBytes: 64 * 1024 * 1024,
  limits: Object.freeze({ connectionsPerSource: 256, pipelinedRequests: 16 }),
});

/**
 * Half the soft open-file limit (each guest connection may hold an upstream one too), less a
 * reserve for the CA, logs and workers: accepting past it would end in EMFILE, where new guests
 * wait in the kernel's backlog with no answer at all.
 */
function defaultConnectionLimit(): number {
  return Math.max(32, Math.min(16_384, connectionsWithin(openFileLimit())));
}

/** How many guest connections `fds` descriptors carry: two each (guest and upstream), less a reserve. */
export function connectionsWithin(fds: number): number {
  return Math.floor((fds - 64) / 2);
}

/** The soft open-file limit (RLIMIT_NOFILE) of this process; 1024 where it cannot be read. */
export function openFileLimit(): number {
  try {
    const line = /^Max open files\s+(\d+|unlimited)/m.exec(readFileSync("/proc/self/limits", "utf8"))?.[1];
    if (line !== undefined) return line === "unlimited" ? Number.MAX_SAFE_INTEGER : Number(line);
  } catch {
    // Not Linux: keep the common default.
  }
  return 1024;
}

const knownKeys = [
  "httpHooks",
  "env",
  "listen",
  "caDir",
  "resolve",
  "upstreamCa",
  "leafKeyType",
  "leafCacheSize",
  "maxRedirects",
  "maxHttpBodyBytes",
  "maxHttpResponseBodyBytes",
  "timeouts",
  "limits",
  "logLevel",
  "logSink",
  "guestEnvFile",
];

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

function fail(path: string, message: string, value: unknown): never {
  throw new TypeError(`startProxy: ${path} ${message} (got ${JSON.stringify(value) ?? String(value)})`);
}

function integer(value: unknown, path: string, min: number, max: number, fallback: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    if (typeof value === "number") throw new RangeError(`startProxy: ${path} must be an integer from ${min} to ${max} (got ${value})`);
    fail(path, "must be an integer", value);
  }
  return value;
}

function plainObject(value: unknown, path: string): Record<string, unknown> {
  if (typeof value !== "object" || value === null || Array.isArray(value)) fail(path, "must be an object", value);
  return value as Record<string, unknown>;
}

function readCa(entry: unknown, path: string): string {
  if (typeof entry !== "string" || entry === "") fail(path, "must be PEM text or a file path", entry);
  if (entry.includes("-----BEGIN CERTIFICATE-----")) return entry;
  let text: string;
  try {
    text = readFileSync(entry, "utf8");
  } catch (error) {
    throw new TypeError(`startProxy: ${path}: cannot read ${entry}: ${(error as Error).message}`, { cause: error });
  }
  if (!text.includes("-----BEGIN CERTIFICATE-----")) throw new TypeError(`startProxy: ${path}: ${entry} holds no PEM certificate`);
  return text;
}

/**
 * Picks how the declarative tier is enforced. Hooks straight from createHttpHooks carry their
 * configuration and run natively. A spread copy (`{ ...httpHooks, onResponse }`) has lost it but
 * still holds both generated functions: then the proxy calls those instead (slower, same
 * answers). If a spread copy replaced one of them, the configuration recovered from the other is
 * enforced natively, so replacing a hook can never switch the allowlist or the internal-range
 * block off. Hooks with no configuration at all are deny-all.
 */
function declarativeMode(hooks: HttpHooks): Pick<ResolvedProxyOptions, "declarative" | "checkHooks"> {
  const generatedAllow = configOf(hooks.isRequestAllowed);
  const generatedIp = configOf(hooks.isIpAllowed);
  const native = declarativeConfigOf(hooks);
  const delegated = native === undefined && generatedAllow !== undefined && generatedIp !== undefined;
  const checkHooks: HttpHooks = {};
  const allow = hooks.isRequestAllowed === undefined || delegated || generatedAllow === undefined ? hooks.isRequestAllowed : userPartOf(hooks.isRequestAllowed);
  const ip = hooks.isIpAllowed === undefined || delegated || generatedIp === undefined ? hooks.isIpAllowed : userPartOf(hooks.isIpAllowed);
  if (allow !== undefined) checkHooks.isRequestAllowed = allow;
  if (ip !== undefined) checkHooks.isIpAllowed = ip;
  if (hooks.onRequest !== undefined) checkHooks.onRequest = hooks.onRequest;
  if (hooks.onResponse !== undefined) checkHooks.onResponse = hooks.onResponse;
  if (delegated) return { declarative: delegatedConfig(generatedAllow), checkHooks };
  return { declarative: native ?? generatedAllow ?? generatedIp ?? denyAll, checkHooks };
}

function configOf(fn: object | undefined): DeclarativeConfig | undefined {
  return fn === undefined ? undefined : declarativeConfigOf(fn);
}

/** Validates startProxy options once; errors name the option and the bad value. */
export function resolveProxyOptions(options: ProxyOptions = {}): ResolvedProxyOptions {
  const o = plainObject(options, "options");
  for (const key of Object.keys(o)) {
    if (!knownKeys.includes(key)) throw new TypeError(`startProxy: unknown option "${key}" (known: ${knownKeys.join(", ")})`);
  }
  const hooks = (o["httpHooks"] === undefined ? {} : plainObject(o["httpHooks"], "httpHooks")) as HttpHooks;
  for (const [key, value] of Object.entries(hooks)) {
    if ((hookNames as readonly string[]).includes(key)) {
      if (value !== undefined && typeof value !== "function") fail(`httpHooks.${key}`, "must be a function", value);
      continue;
    }
    // Anything else would be ignored, and a policy spread in here (`...createDjsHooks(p)`)
    // would then never run: refused, with the way that works.
    const hint = key === "djsHooks" ? "; pass a tier-2 policy through createHttpHooks({ ...createDjsHooks(policy) })" : "";
    throw new TypeError(`startProxy: unknown option "httpHooks.${key}" (known: ${hookNames.join(", ")})${hint}`);
  }

  const env: Record<string, string> = {};
  if (o["env"] !== undefined) {
    for (const [k, v] of Object.entries(plainObject(o["env"], "env"))) {
      if (typeof v !== "string") fail(`env.${k}`, "must be a string", v);
      env[k] = v;
    }
  }

  const listenIn = o["listen"] === undefined ? {} : plainObject(o["listen"], "listen");
  for (const key of Object.keys(listenIn)) {
    if (key !== "host" && key !== "port") throw new TypeError(`startProxy: unknown option "listen.${key}" (known: host, port)`);
  }
  const host = listenIn["host"] ?? defaults.listen.host;
  if (typeof host !== "string" || (isIP(host) === 0 && !/^[a-zA-Z0-9.-]+$/.test(host))) fail("listen.host", "must be an IP address or hostname", host);
  const port = integer(listenIn["port"], "listen.port", 0, 65535, defaults.listen.port);

  const caDir = o["caDir"] ?? defaultCaDir();
  if (typeof caDir !== "string" || caDir === "") fail("caDir", "must be a directory path", caDir);

  const resolveIn = o["resolve"] === undefined ? {} : plainObject(o["resolve"], "resolve");
  const staticHosts = buildStaticHosts(resolveIn as Record<string, string[]>, "startProxy: resolve");

  const upstreamCa = o["upstreamCa"] ?? [];
  if (!Array.isArray(upstreamCa)) fail("upstreamCa", "must be an array of PEM strings or paths", upstreamCa);
  const upstreamCaPems = upstreamCa.map((entry, i) => readCa(entry, `upstreamCa[${i}]`));

  const leafKeyType = o["leafKeyType"] ?? defaults.leafKeyType;
  if (leafKeyType !== "ecdsa" && leafKeyType !== "rsa") fail("leafKeyType", 'must be "ecdsa" or "rsa"', leafKeyType);

  const logLevel = o["logLevel"] ?? defaults.logLevel;
  if (!logLevels.includes(logLevel as LogLevel)) fail("logLevel", `must be one of ${logLevels.join(", ")}`, logLevel);
  const logSink = o["logSink"];
  if (logSink !== undefined && typeof logSink !== "function") fail("logSink", "must be a function", logSink);

  const timeoutsIn = o["timeouts"] === undefined ? {} : plainObject(o["timeouts"], "timeouts");
  const timeouts: { -readonly [K in keyof Required<TimeoutOptions>]: number } = { ...defaults.timeouts };
  for (const key of Object.keys(timeoutsIn)) {
    if (!(key in timeouts)) throw new TypeError(`startProxy: unknown option "timeouts.${key}" (known: ${Object.keys(timeouts).join(", ")})`);
    const k = key as keyof typeof timeouts;
    timeouts[k] = integer(timeoutsIn[key], `timeouts.${key}`, 1, 24 * 3600_000, timeouts[k]);
  }

  const limitsIn = o["limits"] === undefined ? {} : plainObject(o["limits"], "limits");
  const knownLimits = ["connections", "connectionsPerSource", "pipelinedRequests"];
  for (const key of Object.keys(limitsIn)) {
    if (!knownLimits.includes(key)) throw new TypeError(`startProxy: unknown option "limits.${key}" (known: ${knownLimits.join(", ")})`);
  }
  const limits = {
    connections: integer(limitsIn["connections"], "limits.connections", 1, 1_000_000, defaultConnectionLimit()),
    connectionsPerSource: integer(limitsIn["connectionsPerSource"], "limits.connectionsPerSource", 1, 1_000_000, defaults.limits.connectionsPerSource),
    pipelinedRequests: integer(limitsIn["pipelinedRequests"], "limits.pipelinedRequests", 0, 10_000, defaults.limits.pipelinedRequests),
  };

  const guestEnvFile = o["guestEnvFile"];
  if (guestEnvFile !== undefined && (typeof guestEnvFile !== "string" || guestEnvFile === "")) fail("guestEnvFile", "must be a file path", guestEnvFile);

  return {
    hooks,
    ...declarativeMode(hooks),
    djs: djsHooksOf(hooks)?.engine,
    env,
    listen: { host, port },
    caDir,
    staticHosts,
    upstreamCaPems,
    leafKeyType,
    leafCacheSize: integer(o["leafCacheSize"], "leafCacheSize", 1, 1_000_000, defaults.leafCacheSize),
    maxRedirects: integer(o["maxRedirects"], "maxRedirects", 0, 100, defaults.maxRedirects),
    maxHttpBodyBytes: integer(o["maxHttpBodyBytes"], "maxHttpBodyBytes", 0, Number.MAX_SAFE_INTEGER, defaults.maxHttpBodyBytes),
    maxHttpResponseBodyBytes: integer(
      o["maxHttpResponseBodyBytes"],
      "maxHttpResponseBodyBytes",
      0,
      Number.MAX_SAFE_INTEGER,
      defaults.maxHttpResponseBodyBytes,
    ),
    timeouts,
    limits,
    logLevel: logLevel as LogLevel,
    logSink: logSink as LogSink | undefined,
    guestEnvFile: guestEnvFile as string | undefined,
  };
}
