import type { IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import { makeIssue, OptionError } from "../option-error.js";
import { createLogger } from "../log.js";
import type { ListenAddress } from "../policy/declarative-policy.js";
import { createTlsAuthority, type TlsAuthority } from "../tls/authority.js";
import { AuditLogFile } from "../metrics/audit-log.js";
import { createAuditSink } from "../metrics/audit-sink.js";
import { createProxyMetrics } from "../metrics/metrics.js";
import { startMetricsServer, type MetricsServer } from "../metrics/metrics-server.js";
import { randomKey } from "./auth.js";
import { AuthGate } from "./auth-gate.js";
import { ConnectionLimits } from "./connection-limits.js";
import { HandshakeGate } from "./handshake-gate.js";
import { createDecisionLog } from "./decision-log.js";
import { guestEnvironment, modeText, writeGuestEnvFile } from "./guest-env.js";
import { resolveGuestOptions, type GuestOptions } from "./guest-options.js";
import { GuestSide } from "./guest-side.js";
import { checkGuestName, closeUnbound, guestNameError, GuestRegistry, type RetiredGuestSecrets } from "./guests.js";
import { ProxyClosedError } from "./closed-error.js";
import { listenAddresses } from "./listen-addresses.js";
import { withInspector } from "./inspector-address.js";
import { checkGuestOptions, checkSourcesApart, connectionsWithin, isLoopback, openFileLimit, resolveProxyOptions, settingsNotReloaded, type ProxyOptions } from "./options.js";
import { GuestRedactor } from "./redactor.js";
import { ThrottledWarning } from "./throttled-log.js";
import { serveTunnel } from "./tunnel.js";
import { startRecordedNetwork } from "../record/network.js";
import { withFields } from "../objects.js";

/** A running proxy, as returned by {@link startProxy}. */
/** What `reload` resolves to. */
export interface ReloadResult {
  /** Resolves once no request that began under the replaced configuration is still in its pipeline. */
  readonly idle: Promise<void>;
}

export interface RunningProxy {
  /** `http://HOST:PORT`, the value for a guest's HTTPS_PROXY (without credentials). */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  readonly caCertPath: string;
  readonly caCertPem: string;
  /** System roots plus the CA (for SSL_CERT_FILE); undefined if the CA dir is read-only and has none. */
  readonly caBundlePath: string | undefined;
  /**
   * HTTPS_PROXY, HTTP_PROXY (both cases), SSL_CERT_FILE, NODE_EXTRA_CA_CERTS, … plus the guest's
   * `env`. Where the guest authenticates, the proxy URLs carry its credentials
   * (`http://NAME:TOKEN@HOST:PORT`) and GIT_HTTP_PROXY_AUTHMETHOD=basic is set. `name` may be
   * left out when the proxy has one guest.
   */
  guestEnv(name?: string): Record<string, string>;
  /** The names of the guests served now. */
  guestNames(): string[];
  /** Serves one more guest from now on; its options are validated like `guests.NAME`. */
  addGuest(name: string, options: GuestOptions): void;
  /** Stops serving a guest: its credentials get 407 from now on, and its open tunnels are closed. */
  removeGuest(name: string): Promise<void>;
  /**
   * Swaps the whole guest configuration at once (guests, allowlists, secrets, policies) for
   * `options`' (validated like startProxy's; its proxy-wide options, such as `listen`, `caDir`
   * and the limits, are not changed). Requests in flight finish under the configuration they
   * started with; open tunnels take the new one from their next request; a removed guest's
   * tunnels are closed. Invalid options throw, and the old configuration keeps serving. Guest
   * tokens stay the same for unchanged names (they derive from the deployment key).
   *
   * Resolves to `{ idle }`: a promise that resolves once no request or upgrade that began under
   * the replaced configuration is still in its pipeline, where its hooks, policies and deciders
   * may be called. Close the replaced `createDjsHooks()` results then, not before.
   */
  reload(options: ProxyOptions): Promise<ReloadResult>;
  /**
   * With `upstream.record` (or `upstream.replay.recordMissing`): writes the HAR file from what is
   * recorded so far, atomically (the CLI does on SIGTERM, before the drain). `close()` writes it
   * again with everything. Without a recording, nothing.
   */
  flushRecording(): Promise<void>;
  /**
   * The Prometheus text of every series (what `/metrics` serves), with `metrics: true` or
   * `metricsListen`; without either it rejects with an `OptionError` (a TypeError, code
   * `EG_INVALID_OPTION`, path `metrics`): nothing is counted.
   */
  metrics(): Promise<string>;
  /** `http://HOST:PORT` of the metrics listener, with `metricsListen`. */
  readonly metricsUrl: string | undefined;
  /** Stops accepting, lets in-flight requests finish (up to `timeouts.drainMs`), then closes. */
  close(): Promise<void>;
}

/**
 * Starts an egress proxy.
 *
 * @example
 * ```ts
 * const { httpHooks, env } = createHttpHooks({ allowedHosts: ["api.github.com"] });
 * const proxy = await startProxy({ httpHooks, env, listen: { port: 0 } });
 * console.log(proxy.guestEnv()); // HTTPS_PROXY=http://127.0.0.1:PORT, SSL_CERT_FILE=…
 * await proxy.close();
 * ```
 */
export async function startProxy(options: ProxyOptions = {}): Promise<RunningProxy> {
  return (await launchProxy(options)).proxy;
}

/**
 * A cluster worker's hold on its proxy's retired secret values (src/cli/cluster.ts): the
 * values it retired, for the other workers, and theirs, taken in. Not public.
 */
export interface RetiredSecretsExchange {
  /** Every guest's values retired by a rotation or delete, and not current again. */
  current(): RetiredGuestSecrets[];
  /**
   * Refuses and redacts another worker's retired values from now on (nothing once closing).
   * Returns the guests that took a value they did not hold; a bad list throws, and changes nothing.
   */
  adopt(retired: readonly RetiredGuestSecrets[]): string[];
}

/**
 * startProxy for the CLI's `--workers` workers: `retired` are the values the other workers
 * retired, which the guests' stores hold before the proxy listens (a replacement must not
 * serve a request with a value the others refuse). Not public.
 */
export async function launchProxy(
  options: ProxyOptions = {},
  retired: readonly RetiredGuestSecrets[] = [],
): Promise<{ readonly proxy: RunningProxy; readonly retiredSecrets: RetiredSecretsExchange }> {
  const config = resolveProxyOptions(options);
  const redactor = new GuestRedactor();
  const redact = (text: string): string => redactor.redact(text);
  const log = createLogger(config.logLevel, config.logSink, redact);
  // Only when asked for: without metrics the request path traces nothing for them.
  // A scrape can come while the proxy starts (a cluster's primary asks every worker): what it
  // reads is there once made, and empty before.
  const made: { authority?: TlsAuthority; guests?: GuestRegistry; auditFile?: AuditLogFile } = {};
  const metrics = config.metrics
    ? createProxyMetrics({
        certificates: () => ({ hits: made.authority?.leaves.hits ?? 0, misses: made.authority?.leaves.signed ?? 0 }),
        guests: () => made.guests?.names() ?? [],
        ...(config.auditLog !== undefined ? { auditDropped: () => made.auditFile?.dropped ?? 0 } : {}),
      })
    : undefined;
  const network = config.upstream === undefined ? undefined : await startRecordedNetwork(config.upstream, log);
  const warnings = new ThrottledWarning(log);
  const auditFile =
    config.auditLog === undefined
      ? undefined
      : await openAuditLog(config.auditLog, warnings).catch(async (error: unknown) => {
          await network?.abandon();
          throw error;
        });
  if (auditFile !== undefined) made.auditFile = auditFile;
  const auditing = auditFile !== undefined || config.onDecision !== undefined;
  const decide = createDecisionLog(
    log,
    auditing ? { write: createAuditSink(auditFile, config.onDecision, (kind, msg, fields) => warnings.warn(kind, msg, fields)), redact } : undefined,
    { metrics, redact },
  );
  // logrotate's postrotate sends SIGUSR1: each proxy in the process reopens its own file. Only
  // with an audit log: an embedder owns its process's signals, and without one the signal keeps
  // whatever meaning the process gives it (Node's own: open the inspector). The CLI takes it
  // always (src/cli/sigusr1.ts); an inspector that is open is refused as a target either way.
  const onRotate = (): void => {
    auditFile?.reopen(() => log.info("audit log reopened", { file: config.auditLog }));
  };
  if (auditFile !== undefined) process.on("SIGUSR1", onRotate);
  /**
   * A start that fails must not keep its files open (the audit log, the recording's journal),
   * nor its handler on the process, nor leave a recording's journal and folder behind.
   */
  const abandon = async (error: unknown): Promise<never> => {
    process.off("SIGUSR1", onRotate);
    await network?.abandon();
    await auditFile?.close(config.timeouts.drainMs);
    throw error;
  };
  /** Set when a start fails once listening: close() then lets the recording go without writing it. */
  let startFailed = false;
  const authority = await createTlsAuthority({
    caDir: config.caDir,
    leafKeyType: config.leafKeyType,
    leafCacheSize: config.leafCacheSize,
    leafValidityDays: 365,
    upstreamCaPems: config.upstreamCaPems,
  }).catch(abandon);
  made.authority = authority;
  const selfAddresses: ListenAddress[] = [];
  const guests: GuestRegistry = new GuestRegistry(config.deploymentKey ?? randomKey(), config.open, {
    config,
    log,
    authority,
    selfAddresses: withInspector(selfAddresses),
    redact,
    decide,
    foreignSecret: (self, request) => guests.foreignSecret(self, request),
    neighbourSecrets: (self) => guests.neighbourSecrets(self),
    guestCount: () => guests.size,
    network,
    upstreamConnection: metrics?.upstreamConnection,
  });
  made.guests = guests;
  try {
    for (const guest of config.guests) guests.add(guest, retired.filter((entry) => entry.guest === guest.name).flatMap((entry) => entry.secrets));
  } catch (error) {
    await abandon(error);
  }
  redactor.update(guests);

  const limits = new ConnectionLimits(config.limits, log, warnings);
  const handshakes = new HandshakeGate();
  const side = new GuestSide({ config, log, decide, guests, auth: new AuthGate(guests, warnings), limits, redact });
  const inner = side.createServer();
  const outer = side.createServer();
  outer.on("connection", (socket: Socket) => limits.track(socket));
  outer.on("connect", (req: IncomingMessage, socket: Socket, head: Buffer) => {
    side.connect(req, socket, head, (target, early) => {
      metrics?.tunnel(socket);
      serveTunnel(socket, early, target, { inner, h2: (tls) => side.serveH2(tls), leaves: authority.leaves, handshakes, log, handshakeMs: config.timeouts.handshakeMs });
    });
  });
  inner.on("connect", (req: IncomingMessage, socket: Socket, head: Buffer) => side.refuseConnect(req, socket, head));
  // An unlistened server never starts its header/request timeout checks; "listening" does it.
  inner.emit("listening");

  await new Promise<void>((resolve, reject) => {
    outer.once("error", reject);
    outer.listen(config.listen.port, config.listen.host, () => {
      outer.off("error", reject);
      resolve();
    });
  }).catch(abandon);
  // Listener errors could come once per connection: summarised, not a line each. (EMFILE at
  // accept does not come here: libuv meets it by closing the connection itself.)
  outer.on("error", (error: NodeJS.ErrnoException) => warnings.warn(`listener:${error.code ?? ""}`, "listener error", { error }));
  const address = outer.address();
  if (address === null || typeof address === "string") throw new Error("unexpected listen address");
  selfAddresses.push(...listenAddresses(address.address, address.port));
  for (const own of config.ownAddresses) selfAddresses.push(...listenAddresses(own.host, own.port));
  const host = address.family === "IPv6" ? `[${address.address}]` : address.address;
  const url = `http://${host}:${address.port}`;
  let metricsServer: MetricsServer | undefined;

  const guestEnv = (name?: string): Record<string, string> => {
    const names = guests.names();
    if (name === undefined && names.length !== 1) throw guestNameError("guestEnv", undefined, `name a guest (served: ${names.join(", ") || "none"})`);
    const guest = guests.get(name === undefined ? names[0]! : checkGuestName("guestEnv", name));
    if (guest === undefined) throw guestNameError("guestEnv", name, `no guest named "${name}" (served: ${names.join(", ") || "none"})`);
    return guestEnvironment({
      proxyUrl: url,
      ...(guests.open ? {} : { credentials: { user: guest.name, password: guest.token } }),
      caCertPath: authority.ca.certPath,
      caBundlePath: authority.ca.bundlePath,
      extra: guest.env,
    });
  };
  let closing: Promise<void> | undefined;
  const close = (): Promise<void> =>
    (closing ??= (async () => {
      const closed = new Promise<void>((resolve) => outer.close(() => resolve()));
      inner.close(() => undefined);
      // The metrics listener stays through the drain: /readyz answers 503 from now on (a
      // balancer's probe sees the instance leave while it finishes), and /metrics can still be
      // scraped for the requests that drain.
      await side.drain(config.timeouts.drainMs);
      // In the same turn as the drain's end: no guest connection may start a request after it
      // (which the pools' close below would cut).
      side.endDrain();
      outer.closeAllConnections();
      limits.destroyAll();
      await metricsServer?.close();
      warnings.clear();
      await closed;
      // Every guest is gone, so nothing in the pools is still wanted: a request that will
      // never end (a body nobody reads) must not hold close() open.
      await guests.closeAll();
      // Once every exchange that drained is in it. A start that failed served nothing: an
      // empty HAR must not replace the file a previous run wrote.
      await (startFailed ? network?.abandon() : network?.close());
      // A response the drain's end cut is decided once its guest connection or its upstream is
      // gone, and an upgrade cut while it waited for its 101 once its upstream socket is.
      await side.settled(config.timeouts.drainMs);
      // Last, so the records of the requests that drained are in it.
      process.off("SIGUSR1", onRotate);
      await auditFile?.close(config.timeouts.drainMs);
      warnings.clear();
    })());
  if (config.guestEnvFile !== undefined) {
    const file = config.guestEnvFile;
    const several = config.form === "guests";
    try {
      for (const name of guests.names()) {
        const path = several ? `${file}.${name}` : file;
        const replaced = await writeGuestEnvFile(path, guestEnv(name), () =>
          log.warn("the guest environment file is a FIFO with no reader; the start waits for one to open it", { file: path }),
        );
        if (replaced !== undefined) {
          log.warn("the guest environment file could be read by other users; the proxy took that away before writing the credentials", { file: path, mode: modeText(replaced.was), now: modeText(replaced.now) });
        }
      }
    } catch (error) {
      // Listening already: a proxy whose start failed must not stay open behind the caller's back.
      startFailed = true;
      await close();
      const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
      throw new OptionError(makeIssue(["guestEnvFile"], `cannot write ${file} (${code})`), { prefix: "startProxy: ", cause: error });
    }
  }
  if (metrics !== undefined && config.metricsListen !== undefined) {
    try {
      metricsServer = await startMetricsServer(
        withFields(config.metricsListen, {
          scrape: async () => ({ text: await metrics.text(), contentType: metrics.registry.contentType }),
          ready: () => closing === undefined,
          log,
        }),
      );
    } catch (error) {
      startFailed = true;
      await close();
      const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
      throw new OptionError(makeIssue(["metricsListen"], `cannot listen on ${config.metricsListen.host}:${config.metricsListen.port} (${code})`), { prefix: "startProxy: ", cause: error });
    }
    // A guest must not reach the metrics through the proxy either (the allowlist could allow
    // loopback): its address is one of the proxy's own, which are always refused.
    selfAddresses.push(...listenAddresses(metricsServer.host, metricsServer.port));
  }
  log.info("listening", {
    url,
    caDir: config.caDir,
    guests: guests.names(),
    authentication: authenticationText(guests.open, address.address, address.port),
    ...(metricsServer !== undefined ? { metrics: metricsServer.url } : {}),
    ...(guests.size === 1 ? allowedHostsFields(guests.get(guests.names()[0]!)!.policy.config) : {}),
  });
  warnPastFileLimit(config.limits.connections, log);

  const retiredSecrets: RetiredSecretsExchange = {
    current: () => guests.retiredSecrets(),
    adopt: (others) => {
      if (closing !== undefined) return [];
      const { replaced, changed } = guests.adoptRetired(others);
      if (replaced.length > 0) redactor.update(guests);
      for (const guest of replaced) void guest.retire().catch((error: unknown) => log.warn("closing a replaced guest's pools failed", { guest: guest.name, error }));
      return changed;
    },
  };
  const proxy: RunningProxy = {
    url,
    host: address.address,
    port: address.port,
    caCertPath: authority.ca.certPath,
    caCertPem: authority.ca.certPem,
    caBundlePath: authority.ca.bundlePath,
    guestEnv,
    guestNames: () => guests.names(),
    addGuest: (name, guestOptions) => {
      if (closing !== undefined) throw new ProxyClosedError("addGuest");
      if (guests.open) throw openProxyError("addGuest", name, "start it with guests, or with auth: true");
      // What was checked, read once, is what is used.
      const checked = checkGuestOptions(checkGuestName("addGuest", name), guestOptions);
      const resolved = resolveGuestOptions(name, checked, ["guests", name], config.resolve, "addGuest");
      // Reading the options ran the caller's getters, which may have begun close().
      if (closing !== undefined) throw new ProxyClosedError("addGuest");
      checkSourcesApart([...guests.all(), resolved], "addGuest");
      guests.add(resolved);
      redactor.update(guests);
      log.info("guest added", { guest: name });
    },
    reload: async (next) => {
      // Requests draining keep the configuration they started with; so do the guests.
      if (closing !== undefined) throw new ProxyClosedError("reload");
      const resolved = resolveProxyOptions(next, "reload");
      // Reading the options ran the caller's getters, which may have begun close(): a drain
      // serves the guests it began with, so the new ones must not replace them now.
      if (closing !== undefined) throw new ProxyClosedError("reload");
      if (resolved.open !== guests.open) {
        // The options that make the difference: `guests` (always with credentials), or `auth` in the single-guest form.
        const reason = "a proxy that serves one guest without credentials stays that way (and one with credentials too); restart it to change";
        throw new OptionError(makeIssue([resolved.form === "guests" ? "guests" : "auth"], reason, "clause"), { prefix: "reload: ", describe: () => reason });
      }
      checkSourcesApart(resolved.guests, "reload");
      const ignored = settingsNotReloaded(config, resolved);
      const { replaced, removed, unbound } = guests.replaceAll(resolved.guests);
      redactor.update(guests);
      log.info("configuration reloaded", { guests: guests.names(), ...(removed.length > 0 ? { removed: removed.map((guest) => guest.name) } : {}) });
      if (ignored.length > 0) log.warn("reload: these settings apply only at a restart, and keep their values until then", { settings: ignored });
      // A tunnel known by an address the guest's sources no longer hold is closed, as a removed guest's are.
      for (const [guest, connections] of unbound) {
        const reasons = closeUnbound(guest, connections);
        log.info("tunnels closed", { guest, tunnels: connections.length, reason: reasons.join("; ") });
      }
      await Promise.all(removed.map((guest) => guest.close()));
      // Not awaited: an old pool closes once its last in-flight request has finished.
      for (const guest of replaced) void guest.retire().catch((error: unknown) => log.warn("closing a replaced guest's pools failed", { guest: guest.name, error }));
      const idle = Promise.all([...replaced, ...removed].map((guest) => guest.pipeline.idle())).then(() => undefined);
      return { idle };
    },
    removeGuest: async (name) => {
      if (closing !== undefined) throw new ProxyClosedError("removeGuest");
      // Its only guest gone, such a proxy would answer 407 to everything, with no credentials that could work.
      if (guests.open) throw openProxyError("removeGuest", name, "close it instead, or start it with guests, or with auth: true");
      await guests.remove(name);
      redactor.update(guests);
      log.info("guest removed", { guest: name });
    },
    flushRecording: async () => {
      await network?.flush();
    },
    metrics: async () => {
      if (metrics === undefined) throw metricsOffError();
      return metrics.text();
    },
    metricsUrl: metricsServer?.url,
    close,
  };
  return { proxy, retiredSecrets };
}

/**
 * addGuest or removeGuest on the open single-guest proxy: an option error at the guest's path,
 * as every other refusal of these calls is (it was a plain TypeError, without code or path).
 */
function openProxyError(caller: "addGuest" | "removeGuest", name: unknown, way: string): OptionError {
  const reason = `this proxy serves one guest without credentials; ${way}`;
  const segments = typeof name === "string" ? ["guests", name] : ["guests"];
  // The message as before (the call, not the name, is what is refused); the path for code that reads it.
  return new OptionError(makeIssue(segments, reason, "clause"), { prefix: `${caller}: `, describe: () => reason });
}

/**
 * metrics() on a proxy started without metrics: an option error at `metrics`, the option that
 * turns them on, as every other misuse of the running proxy's calls is (it was a plain
 * TypeError, without code or path). The message is as before.
 */
function metricsOffError(): OptionError {
  const reason = "start the proxy with metrics: true or metricsListen";
  return new OptionError(makeIssue(["metrics"], reason, "clause"), { prefix: "metrics: ", describe: () => reason });
}

/**
 * The listening line's word on who may use the proxy. An open proxy on every interface (auth:
 * false, --no-auth) was logged "single guest on loopback" (black-box finding).
 */
function authenticationText(open: boolean, bound: string, port: number): string {
  if (!open) return "required";
  if (isLoopback(bound)) return "none (single guest on loopback)";
  const where = bound === "0.0.0.0" || bound === "::" ? "every interface" : bound;
  return `none (open proxy on ${where}: auth is off, so anyone who can reach port ${port} can use it)`;
}

/**
 * The one guest's allowed hosts as the listening line shows them: allowedInternalHosts count
 * too, and `--allow-internal-host '*'` (every host, internal addresses included) was logged
 * `allowedHosts: []`.
 */
function allowedHostsFields(declarative: { readonly allowedHosts: readonly string[]; readonly allowedInternalHosts: readonly string[] }): Record<string, readonly string[]> {
  return {
    allowedHosts: declarative.allowedHosts,
    ...(declarative.allowedInternalHosts.length > 0 ? { allowedInternalHosts: declarative.allowedInternalHosts } : {}),
  };
}

/** Opened before anything listens: a path that cannot be written fails the start, naming the option. */
async function openAuditLog(file: string, warnings: ThrottledWarning): Promise<AuditLogFile> {
  try {
    return await AuditLogFile.open({ file, warn: (kind, msg, fields) => warnings.warn(kind, msg, fields) });
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
    throw new OptionError(makeIssue(["auditLog"], `cannot open ${file} for appending (${code})`), { prefix: "startProxy: ", cause: error });
  }
}

function warnPastFileLimit(connections: number, log: ReturnType<typeof createLogger>): void {
  const fds = openFileLimit();
  if (connections <= connectionsWithin(fds)) return;
  // libuv meets EMFILE by accepting and closing at once: the guests past it get a reset, and
  // nothing reaches this process to log.
  log.warn("limits.connections is more than the open-file limit carries", {
    connections,
    openFileLimit: fds,
    carries: connectionsWithin(fds),
    consequence: "past it, new guests are reset without an answer or a log line; raise the limit (ulimit -n, LimitNOFILE) or lower limits.connections",
  });
}
