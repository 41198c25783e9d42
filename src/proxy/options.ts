import { readFileSync } from "node:fs";
import { isIP } from "node:net";
import type { HttpHooks } from "../hooks/http-hooks.js";
import { logLevels, type LogLevel, type LogSink } from "../log.js";
import { cidrsOverlap } from "../policy/cidr.js";
import { defaultCaDir } from "../tls/ca-store.js";
import type { LeafKeyType } from "../tls/x509.js";
import { plainObject, resolveGuestOptions, type GuestOptions, type ResolvedGuest } from "./guest-options.js";

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
  /**
   * Write the guest environment (KEY=value lines) to this file once listening. With several
   * guests, one file per guest: `FILE.<guest>`, each with only that guest's variables.
   */
  readonly guestEnvFile?: string;
  /**
   * Several guests, each with its own allowlist, secrets, policy and names, each known by its
   * credentials (`Proxy-Authorization: Basic`, from the proxy URL that `guestEnv(name)` gives)
   * or its source addresses. Not together with the top-level `httpHooks`/`env`.
   */
  readonly guests?: Readonly<Record<string, GuestOptions>>;
  /**
   * The single-guest form (no `guests`): `true` makes its one guest, named `default`, send
   * credentials. A listener on an address other than loopback needs it said either way
   * (`false` runs an open proxy there, on purpose).
   */
  readonly auth?: boolean;
  /**
   * The per-deployment key (at least 32 characters; the CLI's EGRESSGATE_PLACEHOLDER_KEY): a
   * guest's token is HMAC-SHA256(key, name), so every process given it accepts the same
   * credentials. Without it, tokens are random per start.
   */
  readonly deploymentKey?: string;
}

export interface ResolvedProxyOptions {
  /** Every guest; the single-guest form has one, named `default`. */
  readonly guests: readonly ResolvedGuest[];
  /** The single-guest form without `auth`: every connection is its guest, no credentials asked. */
  readonly open: boolean;
  /** Whether the options named `guests` (one env file per guest) or described one guest at the top level. */
  readonly form: "single" | "guests";
  /** The proxy-wide `resolve`, which every guest's own map starts from (also for addGuest). */
  readonly resolve: Readonly<Record<string, readonly string[]>>;
  readonly deploymentKey: string | undefined;
  readonly listen: { readonly host: string; readonly port: number };
  readonly caDir: string;
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
  "guests",
  "auth",
  "deploymentKey",
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

/** The name of the one guest in the single-guest form. */
export const defaultGuest = "default";

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

/** Validates startProxy options once; errors name the option and the bad value. */
export function resolveProxyOptions(options: ProxyOptions = {}): ResolvedProxyOptions {
  const o = plainObject(options, "options");
  for (const key of Object.keys(o)) {
    if (!knownKeys.includes(key)) throw new TypeError(`startProxy: unknown option "${key}" (known: ${knownKeys.join(", ")})`);
  }
  const resolveIn = (o["resolve"] === undefined ? {} : plainObject(o["resolve"], "resolve")) as Record<string, readonly string[]>;
  const guests = resolveGuests(o, resolveIn);
  const deploymentKey = o["deploymentKey"];
  if (deploymentKey !== undefined && (typeof deploymentKey !== "string" || deploymentKey.length < 32)) fail("deploymentKey", "must be a string of at least 32 characters", "…");
  const auth = o["auth"];
  if (auth !== undefined && typeof auth !== "boolean") fail("auth", "must be a boolean", auth);
  if (auth !== undefined && o["guests"] !== undefined) fail("auth", "applies to the single-guest form only: every one of several guests authenticates", auth);

  const listenIn = o["listen"] === undefined ? {} : plainObject(o["listen"], "listen");
  for (const key of Object.keys(listenIn)) {
    if (key !== "host" && key !== "port") throw new TypeError(`startProxy: unknown option "listen.${key}" (known: host, port)`);
  }
  const host = listenIn["host"] ?? defaults.listen.host;
  if (typeof host !== "string" || (isIP(host) === 0 && !/^[a-zA-Z0-9.-]+$/.test(host))) fail("listen.host", "must be an IP address or hostname", host);
  const port = integer(listenIn["port"], "listen.port", 0, 65535, defaults.listen.port);

  const caDir = o["caDir"] ?? defaultCaDir();
  if (typeof caDir !== "string" || caDir === "") fail("caDir", "must be a directory path", caDir);

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

  // No accidental open proxy: a listener others can reach serves only guests that authenticate,
  // unless the caller said otherwise in so many words.
  if (o["guests"] === undefined && auth === undefined && !isLoopback(host)) {
    fail("auth", `is needed to listen on ${host}: without guests, anyone who can reach the port could use the proxy with its allowlist and secrets; set auth: true (CLI --auth) to require credentials, or auth: false (CLI --no-auth) to run an open proxy on purpose`, auth);
  }
  return {
    guests,
    open: o["guests"] === undefined && auth !== true,
    form: o["guests"] === undefined ? "single" : "guests",
    resolve: resolveIn,
    deploymentKey: deploymentKey as string | undefined,
    listen: { host, port },
    caDir,
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

/** The guests of either form: `guests`, or the top-level `httpHooks`/`env` as the one named `default`. */
function resolveGuests(o: Record<string, unknown>, proxyResolve: Record<string, readonly string[]>): ResolvedGuest[] {
  if (o["guests"] === undefined) {
    return [resolveGuestOptions(defaultGuest, { ...(o["httpHooks"] !== undefined ? { httpHooks: o["httpHooks"] } : {}), ...(o["env"] !== undefined ? { env: o["env"] } : {}), resolve: proxyResolve } as GuestOptions, "")];
  }
  for (const key of ["httpHooks", "env"]) {
    if (o[key] !== undefined) fail(key, "cannot be combined with guests: give each guest its own (guests.NAME.httpHooks)", "…");
  }
  const list = Object.entries(plainObject(o["guests"], "guests")).map(([name, guest]) => resolveGuestOptions(name, guest as GuestOptions, `guests.${name}`, proxyResolve));
  if (list.length === 0) fail("guests", "must name at least one guest", {});
  checkSourcesApart(list);
  return list;
}

/** Two guests bound to overlapping source ranges would make a connection's guest a matter of order. */
export function checkSourcesApart(guests: readonly Pick<ResolvedGuest, "name" | "sources">[]): void {
  for (let i = 0; i < guests.length; i++) {
    for (let j = i + 1; j < guests.length; j++) {
      for (const a of guests[i]!.sources) {
        const b = guests[j]!.sources.find((other) => cidrsOverlap(a, other));
        if (b !== undefined) fail(`guests.${guests[j]!.name}.sources`, `overlaps guests.${guests[i]!.name}.sources (${a.text})`, b.text);
      }
    }
  }
}

/** Loopback by name or address: the only listeners that need no word on authentication. */
export function isLoopback(host: string): boolean {
  if (host === "localhost" || host === "::1") return true;
  return /^127\.\d+\.\d+\.\d+$/.test(host) || /^::ffff:127\./i.test(host);
}
