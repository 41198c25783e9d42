import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { isIP, type Socket } from "node:net";
import { networkInterfaces } from "node:os";
import { EgressError, denied, guestError } from "../errors.js";
import { declarativeConfigOf } from "../hooks/http-hooks.js";
import { createLogger, type Logger } from "../log.js";
import { GuestGone } from "../pipeline/exchange.js";
import { Pipeline } from "../pipeline/pipeline.js";
import { DeclarativePolicy, type ListenAddress } from "../policy/declarative-policy.js";
import { createTlsAuthority } from "../tls/authority.js";
import { PinnedPools } from "../upstream/pinned-pools.js";
import { Resolver, type ResolvedAddress } from "../upstream/resolve.js";
import { parseAuthority } from "./authority.js";
import { guestEnvironment, writeGuestEnvFile } from "./guest-env.js";
import { loggableTarget, toOutboundRequest } from "./guest-request.js";
import { connectionsWithin, openFileLimit, resolveProxyOptions, type ProxyOptions, type ResolvedProxyOptions } from "./options.js";
import { sendError, sendResponse, writeRawError } from "./respond.js";
import { serveTunnel, tunnelOf } from "./tunnel.js";
import { serveUpgrade, type UpgradeDeps } from "./upgrade.js";
import { ThrottledWarning } from "./throttled-log.js";
import { bareHostname } from "../hostname.js";

/** A running proxy, as returned by {@link startProxy}. */
export interface RunningProxy {
  /** `http://HOST:PORT`, the value for a guest's HTTPS_PROXY. */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  readonly caCertPath: string;
  readonly caCertPem: string;
  /** System roots plus the CA (for SSL_CERT_FILE); undefined if the CA dir is read-only and has none. */
  readonly caBundlePath: string | undefined;
  /** HTTPS_PROXY, HTTP_PROXY (both cases), SSL_CERT_FILE, NODE_EXTRA_CA_CERTS, … plus `env`. */
  guestEnv(): Record<string, string>;
  /** Stops accepting, lets in-flight requests finish (up to `timeouts.drainMs`), then closes. */
  close(): Promise<void>;
}

const maxHeaderBytes = 64 * 1024;
/** What a guest may send after a CONNECT or an upgrade while it waits its turn. */
const maxEarlyBytes = 64 * 1024;

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
  const config = resolveProxyOptions(options);
  const secrets = config.declarative.secrets;
  const redact = secrets === undefined ? undefined : (text: string): string => secrets.redact(text);
  const log = createLogger(config.logLevel, config.logSink, redact);
  const authority = await createTlsAuthority({
    caDir: config.caDir,
    leafKeyType: config.leafKeyType,
    leafCacheSize: config.leafCacheSize,
    leafValidityDays: 365,
    upstreamCaPems: config.upstreamCaPems,
  });
  const selfAddresses: ListenAddress[] = [];
  const policy = new DeclarativePolicy(config.declarative, () => selfAddresses);
  // Every upstream connection is judged again once connected (DESIGN §3 step 5).
  const recheck = (hostname: string, remote: ResolvedAddress, port: number): string | undefined => {
    const decision = policy.checkAddress(hostname, remote, port);
    return decision.allowed ? undefined : decision.reason;
  };
  const pools = new PinnedPools({
    upstreamContext: authority.upstreamContext,
    maxPools: 512,
    // A pool is shared by every guest: with a small cap, the guests that hold its connections
    // (long downloads nobody reads; 64 was enough) make every other guest's request to that
    // origin wait without an answer. Each guest connection has at most one request in flight
    // (pipelined ones run one at a time), so upstream connections follow guest connections,
    // and the cap only bounds what one origin can take.
    connectionsPerPool: 1024,
    connectTimeoutMs: config.timeouts.upstreamConnectMs,
    headersTimeoutMs: config.timeouts.upstreamHeadersMs,
    bodyTimeoutMs: config.timeouts.upstreamBodyMs,
    keepAliveTimeoutMs: 4_000,
    recheck,
  });
  const pipeline = new Pipeline({
    policy,
    hooks: config.checkHooks,
    djs: config.djs,
    log,
    resolver: new Resolver(config.staticHosts, config.timeouts.dnsMs),
    pools,
    maxRedirects: config.maxRedirects,
    limits: {
      requestBodyBytes: config.maxHttpBodyBytes,
      responseBodyBytes: config.maxHttpResponseBodyBytes,
      hookMs: config.timeouts.hookMs,
    },
  });

  const guest = new GuestSide(config, log, pipeline, policy, redact, {
    pipeline,
    log,
    idleMs: config.timeouts.idleMs,
    headersMs: config.timeouts.upstreamHeadersMs,
    redact,
    connect: { upstreamContext: authority.upstreamContext, timeoutMs: config.timeouts.upstreamConnectMs, recheck },
  });
  const inner = guest.createServer();
  const outer = guest.createServer();
  outer.on("connection", (socket: Socket) => guest.track(socket));
  outer.on("connect", (req: IncomingMessage, socket: Socket, head: Buffer) => {
    guest.connect(req, socket, head, (target, early) =>
      serveTunnel(socket, early, target, { inner, leaves: authority.leaves, log, handshakeMs: config.timeouts.handshakeMs }),
    );
  });
  inner.on("connect", (_req: IncomingMessage, socket: Socket) => {
    writeRawError(socket, new EgressError("EG_METHOD_NOT_ALLOWED", 405, "CONNECT inside a tunnel is not allowed"));
  });
  // An unlistened server never starts its header/request timeout checks; "listening" does it.
  inner.emit("listening");

  await new Promise<void>((resolve, reject) => {
    outer.once("error", reject);
    outer.listen(config.listen.port, config.listen.host, () => {
      outer.off("error", reject);
      resolve();
    });
  });
  // Listener errors could come once per connection: summarised, not a line each. (EMFILE at
  // accept does not come here: libuv meets it by closing the connection itself.)
  outer.on("error", (error: NodeJS.ErrnoException) => guest.warnings.warn(`listener:${error.code ?? ""}`, "listener error", { error }));
  const address = outer.address();
  if (address === null || typeof address === "string") throw new Error("unexpected listen address");
  selfAddresses.push(...listenAddresses(address.address, address.port));
  const host = address.family === "IPv6" ? `[${address.address}]` : address.address;
  const url = `http://${host}:${address.port}`;
  const guestEnv = (): Record<string, string> =>
    guestEnvironment({
      proxyUrl: url,
      caCertPath: authority.ca.certPath,
      caBundlePath: authority.ca.bundlePath,
      extra: config.env,
    });
  let closing: Promise<void> | undefined;
  const close = (): Promise<void> =>
    (closing ??= (async () => {
      const closed = new Promise<void>((resolve) => outer.close(() => resolve()));
      inner.close(() => undefined);
      await guest.drain(config.timeouts.drainMs);
      outer.closeAllConnections();
      guest.destroyAll();
      guest.warnings.clear();
      await closed;
      // Every guest is gone, so nothing in the pools is still wanted: a request that will
      // never end (a body nobody reads) must not hold close() open.
      await pools.destroy();
    })());
  if (config.guestEnvFile !== undefined) {
    try {
      await writeGuestEnvFile(config.guestEnvFile, guestEnv());
    } catch (error) {
      // Listening already: a proxy whose start failed must not stay open behind the caller's back.
      await close();
      const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
      throw new Error(`startProxy: guestEnvFile: cannot write ${config.guestEnvFile} (${code})`, { cause: error });
    }
  }
  log.info("listening", { url, caDir: config.caDir, allowedHosts: config.declarative.allowedHosts });
  const fds = openFileLimit();
  if (config.limits.connections > connectionsWithin(fds)) {
    // libuv meets EMFILE by accepting and closing at once: the guests past it get a reset, and
    // nothing reaches this process to log.
    log.warn("limits.connections is more than the open-file limit carries", {
      connections: config.limits.connections,
      openFileLimit: fds,
      carries: connectionsWithin(fds),
      consequence: "past it, new guests are reset without an answer or a log line; raise the limit (ulimit -n, LimitNOFILE) or lower limits.connections",
    });
  }

  return {
    url,
    host: address.address,
    port: address.port,
    caCertPath: authority.ca.certPath,
    caCertPem: authority.ca.certPem,
    caBundlePath: authority.ca.bundlePath,
    guestEnv,
    close,
  };
}

/** The loopback and interface addresses a wildcard listener answers on, or the bound one. */
function listenAddresses(bound: string, port: number): ListenAddress[] {
  if (bound !== "0.0.0.0" && bound !== "::") return [{ ip: bound, port }];
  const ips = new Set<string>(["127.0.0.1", "::1", bound]);
  for (const list of Object.values(networkInterfaces())) for (const nic of list ?? []) ips.add(nic.address);
  return [...ips].map((ip) => ({ ip, port }));
}

/**
 * The requests of one guest connection. Pipelined requests are served one at a time, in order:
 * their responses must leave in order anyway, and one connection must not fan out into a
 * thousand upstream requests. When the connection closes, every request on it ends: Node 20
 * never emits `close` on a queued pipelined response whose socket died.
 */
interface Lane {
  tail: Promise<void>;
  readonly ends: Set<() => void>;
  /** Requests parsed on this connection and not yet ended, the one being served included. */
  waiting: number;
  /** The connection is not read until the waiting requests drop back (see `pause`). */
  paused: boolean;
}

/** Guest-facing request handling shared by the listener and the in-tunnel server. */
class GuestSide {
  private readonly sockets = new Set<Socket>();
  private readonly perSource = new Map<string, number>();
  /** Connections answered 503 at accept: Node's parser is already on them, so nothing they send is served. */
  private readonly refused = new WeakSet<Socket>();
  readonly warnings: ThrottledWarning;
  private readonly lanes = new WeakMap<Socket, Lane>();
  private inFlight = 0;
  private idle: (() => void) | undefined;
  private nextId = 1;

  constructor(
    private readonly config: ResolvedProxyOptions,
    private readonly log: Logger,
    private readonly pipeline: Pipeline,
    private readonly policy: DeclarativePolicy,
    private readonly redact: ((text: string) => string) | undefined,
    private readonly upgradeDeps: UpgradeDeps,
  ) {
    // A spread copy of createHttpHooks' hooks delegates the allowlist to its generated
    // functions; the configuration they carry still answers the CONNECT, so it gets the same
    // verdict as on the native path.
    this.warnings = new ThrottledWarning(log);
    const generated = config.checkHooks.isRequestAllowed;
    const recovered = generated === undefined ? undefined : declarativeConfigOf(generated);
    this.connectPolicy = recovered === undefined ? policy : new DeclarativePolicy(recovered, () => []);
  }

  private readonly connectPolicy: DeclarativePolicy;

  createServer(): Server {
    const { timeouts } = this.config;
    const server = createServer({
      maxHeaderSize: maxHeaderBytes,
      headersTimeout: timeouts.headersMs,
      // Node enforces headersTimeout only when it sweeps its connections, every 30 s by default,
      // which let a slow head run up to 30 s past the limit.
      connectionsCheckingInterval: Math.max(250, Math.min(1_000, timeouts.headersMs)),
      // Uploads may legitimately take long; idle sockets are bounded by the socket timeout instead.
      requestTimeout: 0,
      keepAliveTimeout: 5_000,
      // The destination comes from the URL or the CONNECT target; a missing Host is judged by
      // toOutboundRequest and answered in the proxy's own error format.
      requireHostHeader: false,
    });
    server.setTimeout(timeouts.idleMs, (socket: Socket) => socket.destroy());
    server.on("request", (req: IncomingMessage, res: ServerResponse) => this.guard(this.handle(req, res, false), req.socket));
    // With this listener Node no longer answers `Expect: 100-continue` by itself: we send 100
    // only once the checks pass, so a refused upload never starts.
    server.on("checkContinue", (req: IncomingMessage, res: ServerResponse) => this.guard(this.handle(req, res, true), req.socket));
    server.on("checkExpectation", (req: IncomingMessage, res: ServerResponse) => {
      sendError(res, new EgressError("EG_BAD_REQUEST", 417, `unsupported Expect: ${JSON.stringify(req.headers.expect)}`), true);
    });
    server.on("clientError", (error: NodeJS.ErrnoException, socket: Socket) => this.onClientError(error, socket));
    server.on("upgrade", (req: IncomingMessage, socket: Socket, head: Buffer) => this.guard(this.upgrade(req, socket, head), socket));
    return server;
  }

  /**
   * The handlers answer every failure themselves; this catches a bug in that answering, which as
   * an unhandled rejection would end the process for every guest: that one connection goes.
   */
  private guard(work: Promise<void>, socket: Socket): void {
    work.catch((error: unknown) => {
      this.log.error("internal error", { error, stack: (error as Error)?.stack });
      socket.destroy();
    });
  }

  /**
   * Every guest connection is counted, overall and per source address, and one past either
   * limit is answered 503 at once: a guest holding hundreds of idle tunnels would otherwise
   * run the process out of descriptors, and every later guest would wait unanswered.
   */
  track(socket: Socket): void {
    // One guest's reset must never become an uncaught exception.
    socket.on("error", (error) => this.log.debug("guest socket error", { error }));
    const source = socket.remoteAddress ?? "";
    const fromSource = this.perSource.get(source) ?? 0;
    const { connections, connectionsPerSource } = this.config.limits;
    const over =
      this.sockets.size >= connections
        ? `the proxy already has ${connections} guest connections open (limits.connections)`
        : fromSource >= connectionsPerSource
          ? `${source} already has ${connectionsPerSource} connections open (limits.connectionsPerSource)`
          : undefined;
    if (over !== undefined) {
      this.refused.add(socket);
      this.warnings.warn(`limit:${source}`, "connection refused", { client: source, reason: over });
      writeRawError(socket, new EgressError("EG_LIMIT", 503, `too many connections: ${over}`));
      return;
    }
    this.sockets.add(socket);
    this.perSource.set(source, fromSource + 1);
    socket.once("close", () => {
      this.sockets.delete(socket);
      const left = (this.perSource.get(source) ?? 1) - 1;
      if (left <= 0) this.perSource.delete(source);
      else this.perSource.set(source, left);
    });
  }

  /** A CONNECT waits its turn behind the requests before it on its connection, as an upgrade does. */
  connect(req: IncomingMessage, socket: Socket, head: Buffer, serve: (target: { hostname: string; port: number }, early: Buffer) => void): void {
    if (this.refused.has(socket)) return;
    this.guard(
      this.takeOver(socket, head).then((early) => {
        if (early !== undefined) this.onConnect(req, socket, early, serve);
      }),
      socket,
    );
  }

  private onConnect(req: IncomingMessage, socket: Socket, head: Buffer, serve: (target: { hostname: string; port: number }, early: Buffer) => void): void {
    const started = performance.now();
    let target: { hostname: string; port: number };
    try {
      target = parseAuthority(req.url ?? "", "CONNECT target");
      // While no onRequest hook (of either tier) could answer or rewrite the request, a host the allowlist
      // refuses (or an internal IP literal) is refused before any TLS work. Every request inside
      // the tunnel is still judged on its own.
      if (!this.pipeline.hasOnRequest) {
        const decision = this.connectPolicy.checkHost(target.hostname);
        if (!decision.allowed) throw denied(decision.reason);
        const literal = bareHostname(target.hostname);
        if (isIP(literal) !== 0) {
          const address = this.connectPolicy.checkAddress(literal, { ip: literal, family: isIP(literal) === 6 ? 6 : 4 }, target.port);
          if (!address.allowed) throw denied(address.reason);
        }
      }
    } catch (error) {
      const err = asEgressError(error);
      this.logDecision({
        id: this.nextId++,
        method: "CONNECT",
        target: loggableTarget(req.url ?? ""),
        status: err.status,
        reason: err.message,
        code: err.code,
        ...(err.detail !== undefined ? { detail: err.detail } : {}),
        started,
      });
      writeRawError(socket, err);
      return;
    }
    socket.write("HTTP/1.1 200 Connection Established\r\n\r\n");
    this.log.debug("tunnel opened", { target: `${target.hostname}:${target.port}` });
    serve(target, head);
  }

  private onClientError(error: NodeJS.ErrnoException, socket: Socket): void {
    const code = error.code ?? "";
    this.log.info("bad request", { error, client: socket.remoteAddress });
    const rawPacket = (error as { rawPacket?: Buffer }).rawPacket;
    if (code === "HPE_INVALID_METHOD" && rawPacket?.subarray(0, 6).toString("latin1") === "TRACK ") {
      // llhttp does not know TRACK, but it is refused for the same reason as TRACE, not as garbage.
      writeRawError(socket, new EgressError("EG_METHOD_NOT_ALLOWED", 405, "method TRACK is not allowed: it would echo credentials back"));
    } else if (code === "HPE_HEADER_OVERFLOW") {
      writeRawError(socket, new EgressError("EG_HEADERS_TOO_LARGE", 431, `request head is larger than ${maxHeaderBytes} bytes`));
    } else if (code.startsWith("HPE_")) {
      writeRawError(socket, new EgressError("EG_BAD_REQUEST", 400, `malformed request (${code.slice(4).toLowerCase().replaceAll("_", " ")})`));
    } else if (code === "ERR_HTTP_REQUEST_TIMEOUT") {
      writeRawError(socket, new EgressError("EG_BAD_REQUEST", 408, "request head not received in time"));
    } else {
      socket.destroy();
    }
  }

  private laneOf(socket: Socket): Lane {
    let lane = this.lanes.get(socket);
    if (lane === undefined) {
      const created: Lane = { tail: Promise.resolve(), ends: new Set(), waiting: 0, paused: false };
      socket.once("close", () => {
        for (const end of created.ends) end();
      });
      this.lanes.set(socket, created);
      lane = created;
    }
    return lane;
  }

  /**
   * Node parses pipelined requests as fast as they arrive and pauses a connection only for
   * responses it cannot write, and nothing is written while the first request waits: a guest
   * could queue a hundred thousand requests (50 times their size in memory) behind one slow one.
   * Past `limits.pipelinedRequests` waiting, the connection is not read until half have gone.
   */
  private enter(lane: Lane, socket: Socket): void {
    lane.waiting += 1;
    if (lane.waiting <= this.config.limits.pipelinedRequests + 1) return;
    if (!lane.paused) {
      lane.paused = true;
      // Node's own write backpressure (socketOnDrain) resumes any socket whose `_paused` is set,
      // ours too, as soon as a response drains: the pause is taken back each time.
      socket.on("resume", () => {
        const state = pausable(socket);
        if (!lane.paused || socket.destroyed || state.parser == null) return;
        state._paused = true;
        state.parser.pause();
        socket.pause();
      });
    }
    // As Node's own server does for write backpressure: `_paused` makes it pause its parser once
    // the chunk being parsed is done (pausing it inside this callback would drop the chunk's
    // rest), so requests still in the buffer stay bytes, not request objects.
    const state = pausable(socket);
    if (state._paused === true) return;
    state._paused = true;
    socket.pause();
  }

  private leave(lane: Lane, socket: Socket): void {
    lane.waiting -= 1;
    if (!lane.paused || lane.waiting > Math.floor(this.config.limits.pipelinedRequests / 2)) return;
    lane.paused = false;
    const state = pausable(socket);
    // No parser: an upgrade or a CONNECT owns the socket now, and reads it itself.
    if (socket.destroyed || state._paused !== true || state.parser == null) return;
    state._paused = false;
    state.parser.resume();
    socket.resume();
  }

  /**
   * An upgrade waits its turn behind the requests before it on the connection: their responses
   * must reach the guest before the 101, never inside the upgraded stream.
   */
  private async upgrade(req: IncomingMessage, socket: Socket, head: Buffer): Promise<void> {
    if (this.refused.has(socket)) return;
    const early = await this.takeOver(socket, head);
    if (early !== undefined) await serveUpgrade(req, socket, early, this.upgradeDeps);
  }

  /**
   * For an upgrade or a CONNECT, which take the connection over once the requests before it are
   * answered. Until then the guest's bytes (frames, a ClientHello) are kept, up to 64 KiB, and
   * returned after `head`; undefined when the connection closed meanwhile.
   */
  private async takeOver(socket: Socket, head: Buffer): Promise<Buffer | undefined> {
    const lane = this.laneOf(socket);
    const previous = lane.tail;
    // Nothing follows on this connection.
    lane.tail = new Promise<void>(() => undefined);
    // A pause set while the requests before it were parsed stopped the socket's handle, and
    // Node's hand-over never restarts it: reading is ours from here.
    lane.paused = false;
    pausable(socket)._paused = false;
    const handle = (socket as unknown as { _handle?: { reading: boolean; readStart(): number } | null })._handle;
    if (handle && !handle.reading) {
      handle.reading = true;
      handle.readStart();
    }
    const early: Buffer[] = [head];
    let bytes = head.length;
    const keep = (chunk: Buffer): void => {
      bytes += chunk.length;
      if (bytes > maxEarlyBytes) socket.destroy();
      else early.push(chunk);
    };
    socket.on("data", keep);
    await previous;
    // A plain tunnel serves requests on this same socket again: they start a lane of their own.
    this.lanes.delete(socket);
    // The next owner adds its own listener in this same turn, so no byte falls between.
    socket.off("data", keep);
    if (socket.destroyed) return undefined;
    return early.length === 1 ? head : Buffer.concat(early);
  }

  private async handle(req: IncomingMessage, res: ServerResponse, expectsContinue: boolean): Promise<void> {
    if (this.refused.has(req.socket)) {
      req.socket.destroy();
      return;
    }
    const id = this.nextId++;
    const started = performance.now();
    this.inFlight += 1;
    let target = loggableTarget(req.url ?? "");
    const abort = new GuestGone();
    const socket = req.socket;
    const lane = this.laneOf(socket);
    const previous = lane.tail;
    let release!: () => void;
    lane.tail = new Promise<void>((resolve) => (release = resolve));
    this.enter(lane, socket);
    // Ends once, from the response's close or the connection's, whichever comes first.
    const end = (): void => {
      if (!lane.ends.delete(end)) return;
      release();
      this.leave(lane, socket);
      this.inFlight -= 1;
      if (this.inFlight === 0) this.idle?.();
      // The guest left before the response finished: cancel the upstream side too.
      if (!res.writableFinished) abort.abort();
    };
    lane.ends.add(end);
    res.once("close", end);
    try {
      await previous;
      // The connection closed while an earlier request on it was served: answered below as 499.
      if (abort.aborted) throw abort.reason;
      const request = toOutboundRequest(req, tunnelOf(req.socket));
      target = loggableUrl(request.url, this.redact);
      const response = await this.pipeline.handle(request, {
        id: String(id),
        signal: abort,
        ...(expectsContinue ? { beforeBody: once(() => res.writeContinue()) } : {}),
      });
      if (response.body?.destroyed === true) {
        // The upstream body broke while hooks ran (a reset during an onResponse call): undici has
        // already reported the error to its own listener, so a pipe would wait for ever for an
        // end or an error that never comes. Nothing was sent yet, so the guest gets a 502.
        response.cleanup?.();
        const cause = response.body.errored;
        throw new EgressError("EG_UPSTREAM", 502, `the upstream response body from ${response.url.host} failed before it could be sent`, {
          ...(cause !== null ? { cause, detail: cause.message } : {}),
        });
      }
      sendResponse(res, response, !req.complete, (error) => {
        response.cleanup?.();
        this.logDecision({
          id,
          method: req.method ?? "",
          target,
          status: response.status,
          reason: response.decision.reason,
          rule: response.decision.rule,
          redirects: response.redirects,
          started,
          ...(error ? { error: this.explainCut(error) } : {}),
        });
      });
    } catch (error) {
      if (abort.aborted) {
        // Nobody is left to answer; 499 is nginx's "client closed request", for the log only.
        this.logDecision({ id, method: req.method ?? "", target, status: 499, reason: "guest closed the connection", started });
        return;
      }
      const raw = asEgressError(error);
      if (raw.status >= 500 && !(error instanceof EgressError)) this.log.error("internal error", { id, error });
      // Error bodies are built from messages that may quote upstream errors: never let a value through.
      const err = guestError(raw, this.redact);
      sendError(res, err, !req.complete);
      this.logDecision({
        id,
        method: req.method ?? "",
        target,
        status: err.status,
        reason: err.message,
        code: err.code,
        ...(err.detail !== undefined ? { detail: err.detail } : {}),
        started,
      });
    }
  }

  /** Why a response was cut after its head, in words an operator reads in the log. */
  private explainCut(error: Error): Error | string {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "UND_ERR_BODY_TIMEOUT") return `upstream body timed out after ${this.config.timeouts.upstreamBodyMs} ms of silence; the guest connection was cut`;
    return error;
  }

  private logDecision(fields: { started: number } & Record<string, unknown>): void {
    if (!this.log.enabled("info")) return;
    const { started, ...rest } = fields;
    this.log.info("request", { ...rest, ms: Math.round((performance.now() - started) * 10) / 10 });
  }

  /** Resolves once no request is in flight, or after `ms`. */
  drain(ms: number): Promise<void> {
    if (this.inFlight === 0) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      timer.unref();
      this.idle = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  }

  destroyAll(): void {
    for (const socket of this.sockets) socket.destroy();
  }
}

/**
 * What Node's HTTP server keeps on a guest connection for its own backpressure: `_paused`, which
 * it checks after each parse to pause `parser` (null once it lets go of the socket).
 */
function pausable(socket: Socket): { _paused?: boolean; parser?: { pause(): void; resume(): void } | null } {
  return socket as unknown as { _paused?: boolean; parser?: { pause(): void; resume(): void } | null };
}

function once(fn: () => void): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}

/**
 * The URL for the decision log: no query (it can carry credentials), and the path cut like {@link loggableTarget} cuts a
 * raw target, so a crafted 60 KB path cannot make every line that long. Redacted before the
 * cut, which could otherwise leave part of a value that the logger's redaction no longer sees.
 */
function loggableUrl(url: URL, redact: ((text: string) => string) | undefined, maxLength = 512): string {
  const path = redact === undefined ? url.pathname : redact(url.pathname);
  return `${url.origin}${path.length > maxLength ? `${path.slice(0, maxLength)}…` : path}`;
}

function asEgressError(error: unknown): EgressError {
  if (error instanceof EgressError) return error;
  const detail = (error as Error)?.message ?? String(error);
  return new EgressError("EG_UPSTREAM", 502, "internal error (see the proxy log)", { cause: error, detail });
}

