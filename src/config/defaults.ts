import { defaultDjsLimits } from "../djs/create-djs-hooks.js";
import type { LogLevel } from "../log.js";
import type { SecretRedirects } from "../policy/secrets.js";
import type { LeafKeyType } from "../tls/x509.js";

/**
 * The one table of defaults. startProxy, the config file and the CLI all read their defaults
 * here (the schema points at these values, and yargs shows them), so a default is changed in
 * one place. Values that depend on the machine (the CA folder, the connection limit) are
 * computed at start-up; `computedDefaults` says how, for the docs and `--help`.
 */
export const defaults = Object.freeze({
  listen: Object.freeze({ host: "127.0.0.1", port: 8080 }),
  leafKeyType: "ecdsa" as LeafKeyType,
  leafCacheSize: 1000,
  maxRedirects: 10,
  refuseInTunnel: false,
  logLevel: "info" as LogLevel,
  timeouts: Object.freeze({
    handshakeMs: 10_000,
    headersMs: 30_000,
    idleMs: 120_000,
    h2PingMs: 10_000,
    dnsMs: 5_000,
    upstreamConnectMs: 10_000,
    upstreamHeadersMs: 60_000,
    upstreamBodyMs: 120_000,
    drainMs: 10_000,
    hookMs: 30_000,
    requestMs: 300_000,
  }),
  maxHttpBodyBytes: 64 * 1024 * 1024,
  maxHttpResponseBodyBytes: 64 * 1024 * 1024,
  limits: Object.freeze({
    connectionsPerSource: 256,
    pipelinedRequests: 16,
    h2Streams: 100,
    h2HeaderListBytes: 64 * 1024,
    h2SessionMemoryMiB: 10,
    h2ResetsPer10s: 200,
    // docs/performance.md, "HTTP/2 flow-control windows": what each costs and buys, and why one
    // byte under a power of two, as Node's own 65,535.
    h2StreamWindowBytes: 1024 * 1024 - 1,
    h2ConnectionWindowBytes: 1024 * 1024 * 1024 - 1,
    // docs/performance.md, "What a stopped HTTP/2 reader holds": 16 streams at the full window,
    // 100 at 128 KiB, where a connection's 100 stopped streams held 100 MiB.
    h2ConnectionBufferBytes: 16 * 1024 * 1024,
    // docs/performance.md, "What one source holds": 256 streams' windows at the defaults (as many
    // requests as 256 HTTP/1.1 connections carry), where 64 connections of stopped uploads held 1.1 GiB.
    sourceBufferBytes: 256 * 1024 * 1024,
  }),
  /** A recorded network's choices (README, "Recorded network"). */
  upstream: Object.freeze({
    record: Object.freeze({ cookies: false }),
    replay: Object.freeze({ exhausted: "repeat-last" as "repeat-last" | "error", latency: "none" as "none" | "recorded", recordMissing: false, anyGuest: false }),
  }),
  /** CLI and config file: processes sharing the port. */
  workers: 1,
  /** CLI and config file: reload when the files the configuration was read from change. */
  watch: false,
  /** A guest's declarative tier, as createHttpHooks applies it. */
  guest: Object.freeze({
    blockInternalRanges: true,
    replaceSecretsInQuery: false,
    secretRedirects: "scan" as SecretRedirects,
    /** The time limit of one tier-2 policy call. */
    hooksTimeoutMs: defaultDjsLimits.timeoutMs,
  }),
});

/** Defaults worked out at start-up, described for the docs and `--help`. */
export const computedDefaults = Object.freeze({
  caDir: "$XDG_CONFIG_HOME/egressgate, or ~/.config/egressgate",
  "limits.connections": "half the soft open-file limit less 64, at least 32, at most 16384",
});
