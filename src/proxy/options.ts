import { readFileSync } from "node:fs";
import { X509Certificate } from "node:crypto";
import { isDeepStrictEqual } from "node:util";
import { defaults } from "../config/defaults.js";
import { makeIssue, OptionError, optionError, type OptionIssue, type Segment } from "../config/option-error.js";
import { apiOptionsSchema } from "../config/schema.js";
import { snapshotOptions } from "../config/snapshot.js";
import { validate, type MapNode } from "../config/validate.js";
import { parseHostPort } from "../config/nodes.js";
import type { HttpHooks } from "../hooks/http-hooks.js";
import type { LogLevel, LogSink } from "../log.js";
import { cidrsOverlap } from "../policy/cidr.js";
import { defaultCaDir } from "../tls/ca-store.js";
import type { LeafKeyType } from "../tls/x509.js";
import type { UpstreamOptions } from "../record/network.js";
import { maxTextFileBytes, readFailure, readRegularFileSync } from "../regular-file.js";
import { homePath as expandHome } from "../home-path.js";
import { withFields } from "../objects.js";
import type { AuditRecord } from "../metrics/audit-record.js";
import { plainObject, resolveGuestOptions, type GuestOptions, type OptionCaller, type ResolvedGuest } from "./guest-options.js";
import { h2StreamCharge } from "./h2-settings.js";

export interface TimeoutOptions {
  /** From CONNECT until the guest's TLS handshake (or first plain byte) completes. Default 10 s. */
  readonly handshakeMs?: number;
  /** For the guest to send a complete request head. Default 30 s. */
  readonly headersMs?: number;
  /**
   * A guest connection with no traffic either way is closed after this. Default 120 s. An
   * HTTP/1.1 connection whose request is read whole and whose answer has nothing left to write
   * is waiting on its upstream (a long-poll, an SSE stream): `upstreamHeadersMs` and
   * `upstreamBodyMs` end that, not this; so is an HTTP/2 stream whose response does not wait on
   * the guest's window.
   */
  readonly idleMs?: number;
  /**
   * An HTTP/2 guest connection silent this long is sent a PING, and closed if the answer takes
   * as long again (each at most `idleMs`). A guest that has not acknowledged the proxy's SETTINGS
   * this long after connecting gets GOAWAY(SETTINGS_TIMEOUT). Default 10 s.
   */
  readonly h2PingMs?: number;
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
  /**
   * A request that passes through layers (`handle`), over all its `next()` descents and
   * sleeps, until its response head is ready (504 after). Default 300 s.
   */
  readonly requestMs?: number;
}

/** What one guest may hold at once; past a limit the answer comes at once (503), never silence. */
export interface ConnectionLimitOptions {
  /** Guest connections open at once, tunnels and upgrades included. Default: half the soft open-file limit less 64, at least 32, at most 16384. */
  readonly connections?: number;
  /** Guest connections open at once from one source address. Default 256. */
  readonly connectionsPerSource?: number;
  /** Requests one connection may have parsed and waiting behind the one being served; then it is not read. Default 16. */
  readonly pipelinedRequests?: number;
  /** HTTP/2 streams one guest connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS), and pipeline work running, resets counted: a stream past it waits for room. Default 100. */
  readonly h2Streams?: number;
  /** Bytes of one HTTP/2 request's decoded header list (SETTINGS_MAX_HEADER_LIST_SIZE); the stream reset, or 431, beyond. Default 65536. */
  readonly h2HeaderListBytes?: number;
  /** MiB of HTTP/2 state and queued frames per guest connection; new streams are refused beyond. Default 10. */
  readonly h2SessionMemoryMiB?: number;
  /** HTTP/2 streams one guest connection may reset in 10 s, each within 1 s of opening it and before its response ended, before GOAWAY(ENHANCE_YOUR_CALM). Default 200. */
  readonly h2ResetsPer10s?: number;
  /**
   * HTTP/2 flow control, both sides (the upstream sessions' SETTINGS_INITIAL_WINDOW_SIZE, and the
   * guest sessions'): bytes one stream may send ahead of its reader, so the most the proxy holds
   * for a stream whose reader has stopped (a guest behind on a download, an upstream behind on an
   * upload). A guest connection's window is at most `h2ConnectionBufferBytes` ÷ `h2Streams`
   * (`h2ConnectionBufferBytes`), an upstream connection's lowered while many of its responses are
   * held. Default 1048575 (1 MiB less one byte: see docs/performance.md, "HTTP/2 flow-control
   * windows"); RFC 9113's 65,535 held a download from an h2 upstream 20 ms away to 1.6 MB/s.
   */
  readonly h2StreamWindowBytes?: number;
  /**
   * Bytes one HTTP/2 connection may send ahead of the proxy, over all its streams. Node gives the
   * connection's window back as data arrives, whether or not its stream is read, so this paces a
   * connection and never bounds what the proxy holds. Default 1073741823 (1 GiB less one byte; Go's
   * HTTP/2 client gives 1 GiB): no connection waits on it.
   */
  readonly h2ConnectionWindowBytes?: number;
  /**
   * Bytes the stream windows of one HTTP/2 connection (a guest's, or one of the proxy's upstream
   * connections) may add up to: the most the proxy holds for a connection whose readers have all
   * stopped, as Go's server bounds uploads with `MaxUploadBufferPerConnection`. A guest connection
   * is given a fixed SETTINGS_INITIAL_WINDOW_SIZE, this ÷ `h2Streams` (the largest value one byte
   * under a power of two within that, at most `h2StreamWindowBytes`, never below 65,535): it never
   * changes, so a guest that keeps to its windows can never pass the budget. An upstream
   * connection's window is `h2StreamWindowBytes` until more than this ÷ `h2StreamWindowBytes`
   * responses are coming at once, then lowered so that their windows together stay within it
   * (never below 65,535 bytes each; the proxy sends the lower value before the stream's HEADERS).
   * Default 16777216 (16 MiB: a guest's window 128 KiB for its 100 streams, an upstream's 1 MiB
   * for 16 of them; see docs/performance.md, "What a stopped HTTP/2 reader holds").
   */
  readonly h2ConnectionBufferBytes?: number;
  /**
   * Bytes the HTTP/2 streams under way from one source address may make the proxy hold together
   * in flow-control windows, across all its connections (a body a hook reads is bounded by
   * `maxHttpBodyBytes`, not by this). Each stream is charged, as it arrives, the most its windows let
   * the proxy hold for it: `h2StreamWindowBytes` (within `h2ConnectionBufferBytes`) for its
   * response, plus the guest connection's stream window when a request body may come; it gives
   * the charge back when it closes. A stream whose charge does not fit is answered 503
   * (`EG_LIMIT`; a gRPC call UNAVAILABLE) before any work, and its body let go; the streams under
   * way are never reset or slowed. Must be at least one request with a body's charge. Default
   * 268435456 (256 MiB: 256 requests at 1,048,575 bytes, 227 uploads at 1,179,646; see
   * docs/performance.md, "What one source holds").
   */
  readonly sourceBufferBytes?: number;
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
  /**
   * A CONNECT to a host the allowlist refuses (or to an internal IP literal) is answered 403 at
   * once by default. `true` opens the tunnel instead and refuses every request inside it with
   * the same reason, which reaches clients that report a refused CONNECT without its reason:
   * grpc-js fails such a call UNAVAILABLE ("No connection established"), and with this option
   * PERMISSION_DENIED with the reason. Nothing is sent upstream either way. Default false.
   */
  readonly refuseInTunnel?: boolean;
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
   * `HOST:PORT` of a listener of its own serving Prometheus text at `/metrics`, plus `/healthz`
   * and `/readyz`. Guests cannot reach it through the proxy: its address is refused as a target
   * like the proxy's own. Implies `metrics`.
   */
  readonly metricsListen?: string;
  /** Collect the Prometheus series (for `proxy.metrics()`) without a listener. Default: false, which costs nothing per request. */
  readonly metrics?: boolean;
  /**
   * `HOST:PORT` of other listeners of this deployment (an admin server, a cluster primary's
   * metrics): refused as targets, like the proxy's own listen and metrics addresses.
   */
  readonly ownAddresses?: readonly string[];
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
  /**
   * A recorded network (README, "Recorded network"): `{ record: { path } }` writes every
   * exchange to a HAR file, secrets never in it; `{ replay: { path } }` answers from one with no
   * DNS, TCP or TLS, every check still running. Default: the real network.
   */
  readonly upstream?: UpstreamOptions;
  /**
   * Append one JSON line per decision to this file (an {@link AuditRecord}), whatever the log
   * level: requests, CONNECT refusals and upgrades, each with every source that spoke, the rule
   * that allowed, and the body bytes both ways. Written through a buffered stream and flushed by
   * `close()`; SIGUSR1 reopens it (for logrotate). A file that cannot be opened fails the start.
   */
  readonly auditLog?: string;
  /**
   * Called with every decision's {@link AuditRecord}, the same object the audit log writes a
   * line for, with or without `auditLog`. What it returns or throws never reaches a guest: a
   * throw or a rejected promise is logged (rate-limited) and the proxy carries on.
   */
  readonly onDecision?: (record: AuditRecord) => unknown;
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
  readonly refuseInTunnel: boolean;
  readonly maxHttpBodyBytes: number;
  readonly maxHttpResponseBodyBytes: number;
  readonly timeouts: Required<TimeoutOptions>;
  readonly limits: Required<ConnectionLimitOptions>;
  readonly logLevel: LogLevel;
  readonly logSink: LogSink | undefined;
  readonly guestEnvFile: string | undefined;
  readonly metricsListen: { readonly host: string; readonly port: number } | undefined;
  readonly metrics: boolean;
  readonly ownAddresses: readonly { readonly host: string; readonly port: number }[];
  readonly upstream: UpstreamOptions | undefined;
  readonly auditLog: string | undefined;
  readonly onDecision: ((record: AuditRecord) => unknown) | undefined;
}

/** The one table of defaults (src/config/defaults.ts), here for the imports that found it here. */
export { defaults };

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

/** The name of the one guest in the single-guest form. */
export const defaultGuest = "default";

/** A problem the schema cannot see (it needs more than one option, or a file's contents). */
function fail(path: readonly string[], reason: string, caller: OptionCaller = "startProxy"): never {
  throw new OptionError(makeIssue(path, reason), { prefix: `${caller}: ` });
}

/**
 * A path option as written, with a leading `~` or `~/` made $HOME, as the config file and the
 * flags have it (home-path.ts); `~user/…` is refused. No shell stands between a program and
 * startProxy to expand it: `caDir: "~/ca"` made a folder named `~` in the working directory.
 */
function homePath(segments: readonly Segment[], written: string, caller: OptionCaller): string {
  return expandHome(written, process.env, (reason) => {
    throw new OptionError(makeIssue(segments, reason), { prefix: `${caller}: ` });
  });
}

/** The record and replay files' paths, each through {@link homePath}. */
function upstreamPaths(upstream: UpstreamOptions | undefined, caller: OptionCaller): UpstreamOptions | undefined {
  if (upstream === undefined) return undefined;
  const out: { -readonly [K in keyof UpstreamOptions]: UpstreamOptions[K] } = { ...upstream };
  if (upstream.record !== undefined) out.record = withFields(upstream.record, { path: homePath(["upstream", "record", "path"], upstream.record.path, caller) });
  if (upstream.replay !== undefined) out.replay = withFields(upstream.replay, { path: homePath(["upstream", "replay", "path"], upstream.replay.path, caller) });
  return out;
}

/** Checks the options against the one schema; the first problem is thrown with its path and code. */
function checkOptions(options: unknown, caller: OptionCaller): asserts options is ProxyOptions {
  const issues: OptionIssue[] = [];
  validate(apiOptionsSchema, options, [], issues);
  if (issues.length > 0) throw optionError(issues[0]!, { prefix: `${caller}: ` });
}

/**
 * Checks one guest's options through the same schema, for `addGuest` at run time: an error names
 * `guests.NAME.…`, with code EG_INVALID_OPTION, as it would at start. Returns what was checked,
 * read once (see resolveProxyOptions), for the caller to use instead of `options`.
 */
export function checkGuestOptions(name: string, options: unknown, caller = "addGuest"): GuestOptions {
  const guestNode = (apiOptionsSchema.fields["guests"] as MapNode).values;
  const guest = snapshotOptions(guestNode, options, ["guests", name], `${caller}: `);
  const issues: OptionIssue[] = [];
  validate(apiOptionsSchema, { guests: { [name]: guest } }, [], issues);
  if (issues.length > 0) throw optionError(issues[0]!, { prefix: `${caller}: ` });
  return guest as GuestOptions;
}

const pemMarker = "-----BEGIN CERTIFICATE-----";

function readCa(entry: string, path: string): string {
  if (entry.includes(pemMarker)) {
    const bad = unparsedCertificate(entry);
    if (bad !== undefined) failCa(path, `holds a PEM certificate that cannot be read (${bad})`);
    return entry;
  }
  let text: string;
  try {
    // Not a plain read: a FIFO there would hold the start until written to, /dev/zero forever.
    text = readRegularFileSync(entry, maxTextFileBytes).toString("utf8");
  } catch (error) {
    throw new OptionError(makeIssue(["upstreamCa", Number(path)], `cannot read ${entry}: ${readFailure(error)}`), { prefix: "startProxy: ", cause: error });
  }
  if (!text.includes(pemMarker)) failCa(path, `names ${entry}, which holds no PEM certificate`);
  const bad = unparsedCertificate(text);
  if (bad !== undefined) failCa(path, `names ${entry}, which holds a PEM certificate that cannot be read (${bad})`);
  return text;
}

/** `upstreamCa[i]` as the path of the error, as every other option error names its entry. */
function failCa(index: string, reason: string): never {
  throw new OptionError(makeIssue(["upstreamCa", Number(index)], reason), { prefix: "startProxy: " });
}

/**
 * Which PEM certificate in `text` cannot be parsed, and why; undefined when every one can. Only
 * the marker was checked, and TLS skips a block it cannot read: a damaged CA was taken in
 * silence and every upstream it should have vouched for failed with 502
 * DEPTH_ZERO_SELF_SIGNED_CERT (black-box finding).
 */
function unparsedCertificate(text: string): string | undefined {
  const blocks = text.match(/-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g) ?? [];
  const begun = text.split("-----BEGIN CERTIFICATE-----").length - 1;
  for (const [i, block] of blocks.entries()) {
    try {
      new X509Certificate(block);
    } catch (error) {
      return `certificate ${i + 1}: ${(error as Error).message}`;
    }
  }
  return blocks.length < begun ? `certificate ${blocks.length + 1}: no -----END CERTIFICATE-----` : undefined;
}

/** The table's values with the given ones over them; a key given as undefined keeps its default. */
function overDefaults<T extends Record<string, number>>(table: T, given: Partial<Record<keyof T, number | undefined>> | undefined): T {
  const out: Record<string, number> = { ...table };
  for (const [key, value] of Object.entries(given ?? {})) if (value !== undefined) out[key] = value;
  return out as T;
}

/**
 * What a reload does not apply: every option outside the guests, read once at the start. The
 * ones that `next` changes, named as the options name them, for the reload's warning (a changed
 * `logLevel` or `timeouts` was accepted in silence, and kept its old value).
 */
const notReloaded = [
  "listen",
  "caDir",
  "upstreamCaPems",
  "leafKeyType",
  "leafCacheSize",
  "maxRedirects",
  "refuseInTunnel",
  "maxHttpBodyBytes",
  "maxHttpResponseBodyBytes",
  "timeouts",
  "limits",
  "logLevel",
  // The logger and the decision sink are built once, at the start: a reload that changed either
  // kept the old function in silence (black-box finding). Compared by identity, as given.
  "logSink",
  "onDecision",
  "guestEnvFile",
  "metricsListen",
  "metrics",
  "ownAddresses",
  "upstream",
  "auditLog",
  "deploymentKey",
] as const;

export function settingsNotReloaded(current: ResolvedProxyOptions, next: ResolvedProxyOptions): string[] {
  return notReloaded
    .filter((key) => (key === "listen" ? !sameListen(current.listen, next.listen) : !isDeepStrictEqual(current[key], next[key])))
    .map((key) => (key === "upstreamCaPems" ? "upstreamCa" : key));
}

/** Port 0 asks for any free port: the one the proxy (or a `--workers` primary) took is that. */
function sameListen(current: ResolvedProxyOptions["listen"], next: ResolvedProxyOptions["listen"]): boolean {
  return current.host === next.host && (next.port === 0 || current.port === next.port);
}

/**
 * Validates startProxy options once, through the one schema; errors carry the option's path and
 * code. The options are read once first, own data only, and only that copy is checked and used:
 * an inherited option or a getter's next value would have passed unchecked (config/snapshot.ts).
 */
export function resolveProxyOptions(given: ProxyOptions = {}, caller: OptionCaller = "startProxy"): ResolvedProxyOptions {
  const options = snapshotOptions(apiOptionsSchema, given, [], `${caller}: `) as ProxyOptions;
  checkOptions(options, caller);
  const resolveIn = options.resolve ?? {};
  const guests = resolveGuests(options as Record<string, unknown>, resolveIn, caller);
  const host = options.listen?.host ?? defaults.listen.host;
  // No accidental open proxy: a listener others can reach serves only guests that authenticate,
  // unless the caller said otherwise in so many words.
  if (options.guests === undefined && options.auth === undefined && !isLoopback(host)) {
    fail(
      ["auth"],
      `is needed to listen on ${host}: without guests, anyone who can reach the port could use the proxy with its allowlist and secrets; set auth: true (CLI --auth) to require credentials, or auth: false (CLI --no-auth) to run an open proxy on purpose`,
      caller,
    );
  }
  const listen = { host, port: options.listen?.port ?? defaults.listen.port };
  const metricsListen = options.metricsListen === undefined ? undefined : parseHostPort(options.metricsListen, defaults.listen.host);
  if (metricsListen !== undefined && sharePort(listen, metricsListen)) {
    fail(["metricsListen"], `is ${options.metricsListen}, the proxy's own listen address (${host}:${listen.port}): the metrics listener needs a port of its own`, caller);
  }
  return {
    guests,
    open: options.guests === undefined && options.auth !== true,
    form: options.guests === undefined ? "single" : "guests",
    resolve: resolveIn,
    deploymentKey: options.deploymentKey,
    listen,
    caDir: options.caDir === undefined ? defaultCaDir() : homePath(["caDir"], options.caDir, caller),
    upstreamCaPems: (options.upstreamCa ?? []).map((entry, i) => readCa(entry.includes(pemMarker) ? entry : homePath(["upstreamCa", i], entry, caller), String(i))),
    leafKeyType: options.leafKeyType ?? defaults.leafKeyType,
    leafCacheSize: options.leafCacheSize ?? defaults.leafCacheSize,
    maxRedirects: options.maxRedirects ?? defaults.maxRedirects,
    refuseInTunnel: options.refuseInTunnel ?? defaults.refuseInTunnel,
    maxHttpBodyBytes: options.maxHttpBodyBytes ?? defaults.maxHttpBodyBytes,
    maxHttpResponseBodyBytes: options.maxHttpResponseBodyBytes ?? defaults.maxHttpResponseBodyBytes,
    timeouts: overDefaults(defaults.timeouts, options.timeouts),
    limits: sourceBudgetChecked(overDefaults({ connections: defaultConnectionLimit(), ...defaults.limits }, options.limits), caller),
    logLevel: options.logLevel ?? defaults.logLevel,
    logSink: options.logSink,
    guestEnvFile: options.guestEnvFile === undefined ? undefined : homePath(["guestEnvFile"], options.guestEnvFile, caller),
    metricsListen,
    metrics: options.metrics === true || options.metricsListen !== undefined,
    ownAddresses: (options.ownAddresses ?? []).map((address) => parseHostPort(address, defaults.listen.host)!),
    upstream: upstreamPaths(options.upstream, caller),
    auditLog: options.auditLog === undefined ? undefined : homePath(["auditLog"], options.auditLog, caller),
    onDecision: options.onDecision,
  };
}

/**
 * `limits.sourceBufferBytes` under one upload's charge (h2StreamCharge) would refuse every HTTP/2
 * upload from every source: refused at start, as a mistake, rather than served so.
 */
function sourceBudgetChecked<T extends Required<ConnectionLimitOptions>>(limits: T, caller: OptionCaller): T {
  const upload = h2StreamCharge(limits, true);
  if (limits.sourceBufferBytes < upload) {
    fail(["limits", "sourceBufferBytes"], `is ${limits.sourceBufferBytes}, less than what one HTTP/2 request with a body is charged at these limits (${upload}: limits.h2StreamWindowBytes and the guest connection's stream window), so every upload would be refused`, caller);
  }
  return limits;
}

/** Whether two listeners would take the same port: a fixed port on the same host, or on a wildcard address. */
function sharePort(a: { readonly host: string; readonly port: number }, b: { readonly host: string; readonly port: number }): boolean {
  if (a.port === 0 || a.port !== b.port) return false;
  const wildcard = (host: string): boolean => host === "0.0.0.0" || host === "::" || host === "[::]";
  return a.host === b.host || wildcard(a.host) || wildcard(b.host);
}

/** The guests of either form: `guests`, or the top-level `httpHooks`/`env` as the one named `default`. */
function resolveGuests(o: Record<string, unknown>, proxyResolve: Record<string, readonly string[]>, caller: OptionCaller): ResolvedGuest[] {
  if (o["guests"] === undefined) {
    return [resolveGuestOptions(defaultGuest, { resolve: proxyResolve, ...(o["httpHooks"] !== undefined ? { httpHooks: o["httpHooks"] } : {}), ...(o["env"] !== undefined ? { env: o["env"] } : {}) } as GuestOptions, [], {}, caller)];
  }
  for (const key of ["httpHooks", "env"]) {
    if (o[key] !== undefined) fail([key], `cannot be combined with guests: give each guest its own (guests.NAME.${key})`, caller);
  }
  const list = Object.entries(plainObject(o["guests"], ["guests"], caller)).map(([name, guest]) => resolveGuestOptions(name, guest as GuestOptions, ["guests", name], proxyResolve, caller));
  if (list.length === 0) fail(["guests"], "must name at least one guest", caller);
  checkSourcesApart(list, caller);
  return list;
}

/** Two guests bound to overlapping source ranges would make a connection's guest a matter of order. */
export function checkSourcesApart(all: readonly Pick<ResolvedGuest, "name" | "sources">[], caller: OptionCaller = "startProxy"): void {
  // Only guests with sources can overlap: every pair of 1000 guests without any cost each
  // addGuest 7 ms (black-box finding, with the redactor's cost per guest).
  const guests = all.filter((guest) => guest.sources.length > 0);
  for (let i = 0; i < guests.length; i++) {
    for (let j = i + 1; j < guests.length; j++) {
      for (const a of guests[i]!.sources) {
        const b = guests[j]!.sources.find((other) => cidrsOverlap(a, other));
        if (b !== undefined) fail(["guests", guests[j]!.name, "sources"], `overlaps guests.${guests[i]!.name}.sources (${a.text}) with ${JSON.stringify(b.text)}`, caller);
      }
    }
  }
}

/** Loopback by name or address: the only listeners that need no word on authentication. */
export function isLoopback(host: string): boolean {
  if (host === "localhost" || host === "::1") return true;
  return /^127\.\d+\.\d+\.\d+$/.test(host) || /^::ffff:127\./i.test(host);
}
