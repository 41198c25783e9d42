import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { requestStart, type RequestStartMessage } from "../metrics/channels.js";
import { isIP, type Socket } from "node:net";
import { afterReads } from "../after-reads.js";
import { countHead, headsParsed, isTakenOver } from "./parsed-heads.js";
import { EgressError, asEgressError, denied, guestError } from "../errors.js";
import type { Logger } from "../log.js";
import { GuestGone, type TraceEntry } from "../pipeline/exchange.js";
import { countPushed, type ByteCount } from "../metrics/byte-counter.js";
import { claimUpstreamBody, deferUpstreamEnd } from "../pipeline/trace.js";
import { bodyFailedUnsent } from "../pipeline/upstream-errors.js";
import { madeBodyFailedUnsent, madeBodyStarted } from "../pipeline/made-start.js";
import { bareHostname } from "../hostname.js";
import type { AuthGate } from "./auth-gate.js";
import { authenticationRequired } from "./auth.js";
import { parseAuthority } from "./authority.js";
import type { ConnectionLimits } from "./connection-limits.js";
import { errorFields, resentField, type DecisionLog } from "./decision-log.js";
import { checkConnectHead, checkHttpVersion, connectInTunnel, fieldCountRefusal, GuestMessage, loggableAuthority, loggableRequestTarget, loggableUrl, maxRequestFields, toOutboundRequest, unmetExpectation } from "./guest-request.js";
import { boundGuest, removedCut, removedError, unboundCut, wasRemoved, type Guest, type Binding, type GuestRegistry } from "./guests.js";
import { answerClientError, maxHeaderBytes } from "./client-error.js";
import { Lanes, maxEarlyBytes, type LaneRequest } from "./lanes.js";
import { closeBegun, isLingering } from "./linger.js";
import type { ResolvedProxyOptions } from "./options.js";
import { AnsweredInstead, bodyCutReason, errorBody, GuestClosedMidResponse, GuestLeftFirst, sendError, sendResponse, sentWhole, writeRawError } from "./respond.js";
import { tunnelOf } from "./tunnel.js";
import { serveUpgrade, tooEarly } from "./upgrade.js";
import { H2Guests } from "./h2-guest.js";
import { DrainCuts } from "./drain-cut.js";
import { h2Limits } from "./h2-settings.js";
import { readBeforeAnswer, upstreamFailure } from "./read-before-answer.js";
import type { TLSSocket } from "node:tls";
import type { Readable } from "node:stream";
import { withFields } from "../objects.js";


export interface GuestSideDeps {
  readonly config: ResolvedProxyOptions;
  readonly log: Logger;
  readonly decide: DecisionLog;
  readonly guests: GuestRegistry;
  readonly auth: AuthGate;
  readonly limits: ConnectionLimits;
  readonly redact: (text: string) => string;
}

/**
 * A CONNECT that passed: the tunnel is its guest's, bound to it until either ends. `refusedHost`:
 * the allowlist (or the address rules, for an IP literal) refuse the host, and the tunnel opened
 * only because the refusal is answered inside it, or because an onRequest hook may serve it.
 */
export type ServeTunnel = (target: { hostname: string; port: number; guest: string; refusedHost: boolean }, early: Buffer) => void;

/**
 * Guest-facing request handling, shared by the listener and the in-tunnel server: who the guest
 * is, the order of requests on a connection, and the answer for every outcome.
 */
export class GuestSide {
  private readonly lanes: Lanes;
  private inFlight = 0;
  private idle: (() => void) | undefined;
  private draining = false;
  private drainEnded = false;
  private nextId = 1;
  /** What the log says of a request the end of the drain cut, on either protocol. */
  private readonly drainCut: string;
  /**
   * Connections the proxy cut with a request on them, for idleness or for the bytes behind a
   * CONNECT or an upgrade waiting its turn: why, for that request's line.
   */
  private readonly cuts = new WeakMap<Socket, string>();
  /** Upgrades not yet relayed or refused: their lines must be written before close() closes the audit log. */
  private readonly upgrading = new Set<Promise<void>>();
  /**
   * Requests (either protocol) not yet decided: their lines must be written before close()
   * closes the audit log too. Unlike `inFlight`, an HTTP/1.1 request counts until its line is
   * written, which comes after its connection's close when the drain's end cut it.
   */
  private undecided = 0;
  private allDecided: (() => void) | undefined;
  /** Requests still in their pipeline, for the drain's end to cut. */
  private readonly pipelineCuts = new DrainCuts();

  private readonly h2: H2Guests;

  constructor(private readonly deps: GuestSideDeps) {
    this.lanes = new Lanes(deps.config.limits.pipelinedRequests);
    this.drainCut = `the proxy closed the connection at the end of its drain (timeouts.drainMs, ${deps.config.timeouts.drainMs} ms)`;
    this.h2 = new H2Guests({
      log: deps.log,
      decide: deps.decide,
      guests: deps.guests,
      redact: deps.redact,
      idleMs: deps.config.timeouts.idleMs,
      pingMs: deps.config.timeouts.h2PingMs,
      limits: deps.config.limits,
      nextId: () => this.nextId++,
      started: () => {
        this.inFlight += 1;
        this.undecided += 1;
      },
      ended: () => {
        this.inFlight -= 1;
        if (this.inFlight === 0) this.idle?.();
        this.decided();
      },
      pipelineCuts: this.pipelineCuts,
      explainCut: (error, body) => this.explainCut(error, undefined, undefined, body),
      drainEnded: () => this.drainEnded,
      drainCut: this.drainCut,
    });
  }

  /** A tunnel's TLS socket whose ALPN chose `h2`, after its handshake: each stream is one request. */
  serveH2(socket: TLSSocket): void {
    this.h2.serve(socket);
  }

  createServer(): Server {
    const { timeouts } = this.deps.config;
    const server = createServer({
      maxHeaderSize: maxHeaderBytes,
      // An HTTP/1.0 request's Upgrade is not an upgrade (RFC 9110 §7.8).
      IncomingMessage: GuestMessage,
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
    // One field past the proxy's limit: a head over it is seen as one and refused (431), where
    // Node's own cut (about 1,000) dropped the rest without a word (see maxRequestFields).
    server.maxHeadersCount = maxRequestFields + 1;
    server.setTimeout(timeouts.idleMs, (socket: Socket) => this.onIdle(socket));
    server.on("request", (req: IncomingMessage, res: ServerResponse) => {
      countHead(req.socket);
      this.guard(this.handle(req, res, false), req.socket);
    });
    // With this listener Node no longer answers `Expect: 100-continue` by itself: we send 100
    // only once the checks pass, so a refused upload never starts.
    server.on("checkContinue", (req: IncomingMessage, res: ServerResponse) => {
      countHead(req.socket);
      this.guard(this.handle(req, res, true), req.socket);
    });
    // Any other expectation gets 417, as a request the proxy refuses: in its turn, once its guest
    // is known (one without credentials gets its 407 first), and with its line, as on HTTP/2.
    // Answered by Node itself (or by sendError here), it had no line, record or metric.
    server.on("checkExpectation", (req: IncomingMessage, res: ServerResponse) => {
      countHead(req.socket);
      this.guard(this.handle(req, res, false, unmetExpectation(String(req.headers.expect))), req.socket);
    });
    server.on("clientError", (error: NodeJS.ErrnoException, socket: Socket) => {
      if (error.code !== "ERR_HTTP_REQUEST_TIMEOUT") {
        this.clientError(error, socket);
        return;
      }
      // Node's sweep of heads past headersMs is a timer too: once the proxy had been paused past
      // the deadline (SIGSTOP, a paused VM), it ran before the poll, and a head the guest had
      // finished in time got 408 "not received in time" (black-box finding). Judged after the
      // reads, a head completed meanwhile has been counted (parsed-heads.ts) and goes on; an
      // unfinished one gets its 408 as before.
      const before = headsParsed(socket);
      afterReads(() => {
        if (socket.destroyed) return;
        if (headsParsed(socket) === before) this.clientError(error, socket);
        else if (!isTakenOver(socket)) this.routeSocketErrors(server, socket);
      });
    });
    server.on("upgrade", (req: IncomingMessage, socket: Socket, head: Buffer) => {
      countHead(socket, true);
      this.guard(this.upgrade(req, socket, head), socket);
    });
    return server;
  }

  /**
   * A 408 not given: Node's `socketOnError` had already taken its own `error` listener off the
   * socket (its "ignore further errors", for a socket about to be destroyed) before it emitted
   * the `clientError`, so the connection, which lives on, would have its later errors (a reset)
   * go past `clientError` and {@link answerClientError}. This puts that routing back, once, as
   * the first listener, where Node's stood. A CONNECT or an upgrade has taken the socket from
   * the server (Node took the listener off for that too): its errors are the tunnel's.
   */
  private routeSocketErrors(server: Server, socket: Socket): void {
    if (errorsRouted.has(socket)) return;
    errorsRouted.add(socket);
    // Checked when it fires: a CONNECT or an upgrade that takes the socket later handles its errors itself (review finding).
    socket.prependOnceListener("error", (error: Error) => {
      if (!isTakenOver(socket)) server.emit("clientError", error, socket);
    });
  }

  /** What Node's parser refused ({@link answerClientError}), with the lanes' bookkeeping. */
  private clientError(error: NodeJS.ErrnoException, socket: Socket): void {
    answerClientError(
      error,
      socket,
      this.deps.log,
      (answer, guestLeft) => {
        const place = this.lanes.placeParseError(socket, answer, guestLeft);
        // The parser's "bad request" line is written already.
        if (place.answer === "none" && !guestLeft) this.cutForBrokenBody(socket, answer);
        return place;
      },
      (answer) => this.cutForBrokenBody(socket, answer, error),
    );
    // A body that broke while its request was served: the parser's answer took the place of
    // that request's, which is over (its upstream exchange aborted, its line written) while
    // the connection lingers.
    if (closeBegun(socket)) this.lanes.endAll(socket);
  }

  /**
   * The socket's timer fired: timeouts.idleMs with no byte either way, or Node's keep-alive
   * timeout after a response (the 5 s the proxy advertises, and the 1 s Node adds). Timers run
   * before the poll that reads the sockets, so once the event loop had been held past a deadline
   * (a reload parsing a large config file: seconds), what the guest sent in time was still in
   * the kernel, unread, and the destroy answered it with a reset: a keep-alive request sent 3 s
   * into the 5 s got ECONNRESET. The verdict now waits for that poll (an immediate runs after
   * it): a socket that read anything meanwhile was not silent, and the read has re-armed Node's
   * timer, which counts again from it. So is one the proxy wrote to meanwhile: an answer given in
   * that turn (the upstream's head deadline, judged after the same poll, answers 504) was still in
   * the TLS socket's queue when judged, and read as a guest that stopped reading, which cut the
   * connection with the pipelined request behind it unanswered (fuzzer finding).
   */
  private onIdle(socket: Socket): void {
    const bytesRead = socket.bytesRead;
    const bytesWritten = socket.bytesWritten;
    setImmediate(() => {
      if (socket.destroyed || socket.bytesRead !== bytesRead) return;
      if (socket.bytesWritten !== bytesWritten) socket.setTimeout(this.deps.config.timeouts.idleMs);
      else this.judgeIdle(socket);
    });
  }

  /**
   * timeouts.idleMs with no byte either way. While every request on the connection has been read
   * and nothing waits to be written to the guest, the proxy is the one waiting, on the upstream:
   * a long-poll or an SSE stream with a silent upstream is for upstreamHeadersMs and
   * upstreamBodyMs to end, not for this. A guest that stops reading leaves bytes queued, and one
   * that stops mid-upload leaves its request unread: those are cut, and their line says the
   * proxy cut them (it said "guest closed the connection").
   */
  private judgeIdle(socket: Socket): void {
    const lane = this.lanes.find(socket);
    const inFlight = lane !== undefined && lane.ends.size > 0;
    // A guest waiting for the `100 Continue` it asked for sends nothing until it comes, however
    // long the hooks before it take: the proxy is the one waiting (a chain slower than idleMs cut it).
    const unread = lane?.last?.req.complete === false && lane.last.awaitingContinue !== true;
    const idleMs = this.deps.config.timeouts.idleMs;
    if (inFlight && !unread && socket.writableLength === 0) {
      // Node's socket timeout fires once; re-armed, it counts idleMs again from now.
      socket.setTimeout(idleMs);
      return;
    }
    if (inFlight) {
      const what = unread ? "sent nothing of its request" : "read nothing";
      this.cuts.set(socket, `the proxy closed the connection: the guest ${what} for timeouts.idleMs (${idleMs} ms)`);
    }
    socket.destroy();
  }

  /**
   * The handlers answer every failure themselves; this catches a bug in that answering, which as
   * an unhandled rejection would end the process for every guest: that one connection goes.
   */
  private guard(work: Promise<void>, socket: Socket): void {
    work.catch((error: unknown) => {
      this.deps.log.error("internal error", { error, stack: (error as Error)?.stack });
      socket.destroy();
    });
  }

  /**
   * The guest of a request: the tunnel's (fixed when the CONNECT authenticated; any
   * `Proxy-Authorization` inside is ignored, and stripped as hop-by-hop), or, on the listener
   * itself, the one its own credentials or source address name (with how: `binding`). A head
   * with more fields than the proxy takes is refused (431) before its credentials are read: the
   * ones past the fields Node kept were never seen. Inside a tunnel, toOutboundRequest refuses it.
   */
  private guestOf(req: IncomingMessage): { readonly guest: Guest; readonly binding?: Binding } | EgressError {
    const tunnel = tunnelOf(req.socket);
    if (tunnel === undefined) return fieldCountRefusal(req.rawHeaders) ?? this.deps.auth.identify(req, req.socket);
    // Removal, or a reload that takes the tunnel from its guest, closes it; a request parsed in
    // the same turn still finds it gone.
    const guest = boundGuest(tunnel.connection);
    return guest === undefined ? authenticationRequired() : { guest };
  }

  /** A CONNECT waits its turn behind the requests before it on its connection, as an upgrade does. */
  connect(req: IncomingMessage, socket: Socket, head: Buffer, serve: ServeTunnel): void {
    countHead(socket, true);
    if (this.deps.limits.refused(socket)) return;
    const started = performance.now();
    let overflowed = false;
    this.guard(
      this.lanes.takeOver(socket, head, () => (overflowed = this.cutWhileWaiting(socket, "a CONNECT"))).then((early) => {
        if (overflowed) {
          const err = new EgressError("EG_BAD_REQUEST", 400, `the guest sent more than ${maxEarlyBytes / 1024} KiB before the tunnel opened; the proxy closed the connection`);
          this.decideCut(this.deps.auth.identify(req, socket), { id: this.nextId++, method: "CONNECT", target: loggableAuthority(req.url ?? "") }, err, started);
          return;
        }
        // Behind an answer that closed the connection: never processed, as a request is not.
        if (early !== undefined && !isLingering(socket) && !socket.writableEnded) this.onConnect(req, socket, early, serve);
      }),
      socket,
    );
  }

  /**
   * The body of the request being served broke in the parser (a chunk size that is not hex, a
   * Content-Length in the trailer) after its response had begun, the upstream having answered
   * before the upload's end: no answer can take the response's place, and the proxy closes the
   * connection. Its line said "guest closed the connection before the response was complete";
   * it now says the proxy closed it, and why, and the parser's "bad request" line is written, as
   * for a body that broke before the response.
   */
  private cutForBrokenBody(socket: Socket, answer: EgressError, unlogged?: Error): void {
    const lane = this.lanes.find(socket);
    // A request answered whole before its body broke (a refusal in its lingering close) has its line.
    if (lane === undefined || lane.ends.size === 0) return;
    if (unlogged !== undefined) this.deps.log.info("bad request", { error: unlogged, client: socket.remoteAddress });
    this.cuts.set(socket, `the proxy closed the connection: the guest's request body broke mid-upload (${answer.message})`);
  }

  /**
   * The guest sent more than 64 KiB behind a CONNECT or an upgrade waiting its turn, and the
   * connection is about to be cut: the requests in front were cut by the proxy, not left by the guest.
   */
  private cutWhileWaiting(socket: Socket, what: string): true {
    this.cuts.set(socket, `the proxy closed the connection: the guest sent more than ${maxEarlyBytes / 1024} KiB behind ${what} waiting its turn`);
    return true;
  }

  /** The line of a CONNECT or an upgrade cut while it waited its turn: the guest gets no answer, so nothing counts as sent. */
  private decideCut(found: { readonly guest: Guest } | EgressError, fields: { id?: number; method: string; target: string; upgrade?: true }, err: EgressError, started: number): void {
    // Logged by the gate (see onConnect).
    if (found instanceof EgressError) return;
    this.deps.decide(
      withFields(fields, { guest: found.guest.name, ...errorFields(err), started }),
      this.deps.decide.auditing ? { bytesDown: 0 } : undefined,
    );
  }

  private onConnect(req: IncomingMessage, socket: Socket, head: Buffer, serve: ServeTunnel): void {
    const started = performance.now();
    let target: { hostname: string; port: number };
    // The early check's refusal, for the audit record's sources.
    let refusal: TraceEntry | undefined;
    let refusedHost: boolean;
    // Before the credentials are read: the ones past the fields Node kept were never seen.
    const found = fieldCountRefusal(req.rawHeaders) ?? this.deps.auth.identify(req, socket);
    try {
      if (found instanceof EgressError) throw found;
      const { guest } = found;
      // `CONNECT host:443 HTTP/2.0` is no HTTP/1.x CONNECT either: 505, as a request is.
      checkHttpVersion(req.httpVersion);
      checkConnectHead(req.rawHeaders);
      target = parseAuthority(req.url ?? "", "CONNECT target");
      // While no onRequest hook (of either tier) could answer or rewrite the request, a host the
      // allowlist refuses (or an internal IP literal) is refused before any TLS work, unless
      // refuseInTunnel asks for the refusal inside the tunnel. Every request inside the tunnel
      // is judged on its own either way.
      // Otherwise the tunnel opens, and a refused host's leaf is kept apart from the others'.
      const inTunnel = guest.pipeline.mayRewrite || this.deps.config.refuseInTunnel;
      const decision = guest.connectPolicy.checkHost(target.hostname);
      const literal = bareHostname(target.hostname);
      const address = decision.allowed && isIP(literal) !== 0 ? guest.connectPolicy.checkAddress(literal, { ip: literal, family: isIP(literal) === 6 ? 6 : 4 }, target.port) : undefined;
      refusedHost = !decision.allowed || address?.allowed === false;
      if (refusedHost && !inTunnel) {
        refusal = !decision.allowed ? connectRefusal("allowlist", decision, started) : connectRefusal("address", address!, started);
        throw denied(!decision.allowed ? decision.reason : address!.reason);
      }
    } catch (error) {
      const err = guestError(asEgressError(error), this.deps.redact);
      const bytesDown = writeRawError(socket, err, refusal !== undefined ? { reasonPhrase: connectReasonPhrase(err) } : {});
      // Failed authentications are logged by the gate, once per source and then summarised: a
      // flood of them must not write a line each.
      if (err.code === "EG_AUTH") return;
      this.deps.decide({
        id: this.nextId++,
        guest: found instanceof EgressError ? undefined : found.guest.name,
        method: "CONNECT",
        target: loggableAuthority(req.url ?? ""),
        ...errorFields(err),
        started,
      }, this.deps.decide.auditing ? { bytesDown, ...(refusal !== undefined ? { trace: [refusal] } : {}) } : undefined);
      return;
    }
    const { guest, binding } = found;
    // The tunnel's guest is fixed for its life, while what identified it holds (see GuestRegistry.replaceAll).
    guest.bind(socket, binding);
    socket.write("HTTP/1.1 200 Connection Established\r\n\r\n");
    this.deps.log.debug("tunnel opened", { guest: guest.name, target: `${target.hostname}:${target.port}` });
    serve(withFields(target, { guest: guest.name, refusedHost }), head);
  }

  /**
   * A CONNECT inside a tunnel is refused (405) as TRACE is: in its turn behind the requests
   * before it, logged and audited. Node's parser lets go of the connection at a CONNECT, so
   * nothing after it can be read as HTTP: the answer closes the connection.
   */
  refuseConnect(req: IncomingMessage, socket: Socket, head: Buffer): void {
    countHead(socket, true);
    if (this.deps.limits.refused(socket)) return;
    const started = performance.now();
    const id = this.nextId++;
    const guest = tunnelOf(socket)?.guest;
    this.guard(
      this.lanes.takeOver(socket, head, () => this.cutWhileWaiting(socket, "a CONNECT")).then((early) => {
        // Behind an answer that closed the connection: never processed, as a request is not.
        if (early === undefined || isLingering(socket) || socket.writableEnded) return;
        const err = connectInTunnel();
        const bytesDown = writeRawError(socket, err);
        this.deps.decide(
          { id, guest, method: "CONNECT", target: loggableAuthority(req.url ?? ""), ...errorFields(err), started },
          this.deps.decide.auditing ? { bytesDown } : undefined,
        );
      }),
      socket,
    );
  }

  /** An upgrade waits its turn behind the requests before it on the connection. */
  private async upgrade(req: IncomingMessage, socket: Socket, head: Buffer): Promise<void> {
    if (this.deps.limits.refused(socket)) return;
    const started = performance.now();
    let overflowed = false;
    const early = await this.lanes.takeOver(socket, head, () => (overflowed = this.cutWhileWaiting(socket, "an upgrade")));
    if (overflowed) {
      this.decideCut(this.guestOf(req), { method: req.method ?? "", target: loggableRequestTarget(req.url ?? "", tunnelOf(socket)), upgrade: true }, tooEarly(), started);
      return;
    }
    if (early === undefined || isLingering(socket) || socket.writableEnded) return;
    const found = this.guestOf(req);
    if (found instanceof EgressError) {
      const bytesDown = writeRawError(socket, found, { method: req.method });
      // Failed authentications are logged by the gate (see onConnect); a request it refuses
      // before asking who it is from (two Proxy-Authorization headers) is logged here.
      if (found.code !== "EG_AUTH") {
        this.deps.decide(
          { id: this.nextId++, guest: undefined, method: req.method ?? "", target: loggableRequestTarget(req.url ?? "", tunnelOf(socket)), upgrade: true, ...errorFields(found), started },
          this.deps.decide.auditing ? { bytesDown } : undefined,
        );
      }
      return;
    }
    const { guest } = found;
    // Until the 101 the upgrade's own handler holds the socket; after it, the relay is the guest's.
    // Inside a tunnel (no binding of its own), the CONNECT's connection is the one bound.
    if (found.binding !== undefined) guest.bind(socket, found.binding);
    const serving = serveUpgrade(req, socket, early, guest.upgradeDeps, () => this.leftReason(socket));
    this.upgrading.add(serving);
    try {
      await serving;
    } finally {
      this.upgrading.delete(serving);
    }
  }

  /** @param unmet the refusal of an expectation the proxy cannot meet, answered once the guest is known. */
  private async handle(req: IncomingMessage, res: ServerResponse, expectsContinue: boolean, unmet?: EgressError): Promise<void> {
    if (this.deps.limits.refused(req.socket)) {
      req.socket.destroy();
      return;
    }
    // Pipelined behind an answer that closes the connection: never processed (RFC 9112 §9.6).
    if (isLingering(req.socket)) {
      req.resume();
      return;
    }
    const id = this.nextId++;
    const started = performance.now();
    // Only with an audit log or onDecision: the sources' trace and the body bytes both ways.
    const auditing = this.deps.decide.auditing;
    const trace: TraceEntry[] | undefined = auditing ? [] : undefined;
    // The body this side sends is watched anyway: its close ends the upstream time (sendResponse).
    if (trace !== undefined) deferUpstreamEnd(trace);
    // Installed before the first await: the parser pushes the body's first bytes right after this turn.
    // Only a request framed with a body has one (RFC 9112 §6.3): a GET without Content-Length or
    // Transfer-Encoding keeps its IncomingMessage as Node made it, without a patched push().
    const up: ByteCount | undefined = auditing && hasBodyFraming(req) ? countPushed(req) : undefined;
    let down: ByteCount | undefined;
    this.inFlight += 1;
    let target = loggableRequestTarget(req.url ?? "", tunnelOf(req.socket));
    const abort = new GuestGone();
    const socket = req.socket;
    const lane = this.lanes.of(socket);
    const inLane: LaneRequest = expectsContinue ? { req, res, started: false, awaitingContinue: true, ahead: headBytes(req) } : { req, res, started: false, ahead: headBytes(req) };
    lane.last = inLane;
    const previous = lane.tail;
    let release!: () => void;
    lane.tail = new Promise<void>((resolve) => (release = resolve));
    this.lanes.enter(lane, socket, inLane);
    // Ends once, from the response's close or the connection's, whichever comes first.
    const end = (): void => {
      if (!lane.ends.delete(end)) return;
      release();
      this.lanes.leave(lane, socket, inLane);
      this.inFlight -= 1;
      if (this.inFlight === 0) this.idle?.();
      // The guest left before the response finished: cancel the upstream side too.
      if (!sentWhole(res)) abort.abort();
    };
    lane.ends.add(end);
    res.once("close", end);
    let guestName: string | undefined;
    /** The guest served, once known: a removal under way is the reason the log gives for what it cut. */
    let served: Guest | undefined;
    /** An exchange went upstream twice (its pooled connection turned out closed): every line of the request says so. */
    let resent: { readonly resent: true } | undefined;
    this.undecided += 1;
    try {
      await previous;
      // Pipelined behind an answer that closed the connection (Connection: close, a drain):
      // never processed (RFC 9112 §9.6), and nothing to log, even once the close has aborted
      // it. Counted until the socket closes.
      if (socket.writableEnded) {
        req.resume();
        return;
      }
      this.lanes.begin(lane, socket, inLane);
      // The connection closed while an earlier request on it was served: answered below as 499.
      if (abort.aborted) throw abort.reason;
      const found = this.guestOf(req);
      if (found instanceof EgressError) throw found;
      const { guest } = found;
      guestName = guest.name;
      served = guest;
      // Its body broke in the parser while it waited (a bad chunk): answered here, in order, and
      // as its guest's. Only once the guest is known: one without credentials gets its 407 first,
      // and a line never names a guest that did not authenticate.
      if (inLane.broken !== undefined) throw inLane.broken;
      if (unmet !== undefined) throw unmet;
      const request = toOutboundRequest(req, tunnelOf(req.socket));
      target = loggableUrl(request.url, this.deps.redact);
      if (requestStart.hasSubscribers) requestStart.publish({ id, guest: guestName, method: req.method ?? "", url: target, time: new Date().toISOString() } satisfies RequestStartMessage);
      let response = await this.pipelineCuts.until(
        guest.pipeline.handle(request, {
          id,
          signal: abort,
          onResend: () => (resent = resentField),
          ...(expectsContinue
            ? {
                beforeBody: once(() => {
                  res.writeContinue();
                  // The guest's silence is its own from now (judgeIdle); the write restarted idleMs.
                  inLane.awaitingContinue = false;
                }),
              }
            : {}),
          ...(trace !== undefined ? { trace } : {}),
        }),
        abort,
      );
      // The head of a Response a hook made waits for its body's first chunk: one that fails
      // before it is answered 502 with its reason, not a 200 cut with no byte of body.
      const starting = madeBodyStarted(response, req.method ?? "", abort, trace);
      if (starting !== undefined) response = await this.pipelineCuts.until(starting, abort);
      if (response.body?.destroyed === true) {
        // The upstream body broke while hooks ran (a reset during an onResponse call): undici has
        // already reported the error to its own listener, so a pipe would wait for ever for an
        // end or an error that never comes. Nothing was sent yet, so the guest gets a 502.
        response.cleanup?.();
        throw madeBodyFailedUnsent(response, response.body.errored, trace) ?? bodyFailedUnsent(response.url.host, response.body.errored);
      }
      // While the proxy drains, every answer closes its connection: a guest told "keep-alive"
      // would send its next request into the end of the drain.
      if (this.draining) res.shouldKeepAlive = false;
      // A guest already gone gets no body: the upstream's is then timed by its own end.
      const claimed = trace !== undefined && claimUpstreamBody(trace, res.destroyed ? null : response.body);
      // Settles once its line is written: until then the request counts as undecided.
      await new Promise<void>((decided) => {
        down = sendResponse(res, response, !req.complete, (error) => {
          try {
            response.cleanup?.();
            if (inLane.answered !== undefined) {
              this.decideAnswered(inLane.answered, { id, guest: guestName, method: req.method ?? "", target, started }, up, trace);
              return;
            }
            if (error instanceof AnsweredInstead) {
              // The answer closed the connection, which lingers: the request is over now.
              end();
              this.deps.decide(
                { id, guest: guestName, method: req.method ?? "", target, ...errorFields(error.answer), ...resent, started },
                trace !== undefined ? { trace, bytesUp: up?.bytes ?? 0, bytesDown: Buffer.byteLength(errorBody(error.answer)) } : undefined,
              );
              return;
            }
            if (error instanceof GuestLeftFirst) {
              this.deps.decide({ id, guest: guestName, method: req.method ?? "", target, status: 499, reason: this.leftReason(socket, served), ...resent, started }, trace !== undefined ? { trace, bytesUp: up?.bytes ?? 0, bytesDown: 0 } : undefined);
              return;
            }
            this.deps.decide({
              id,
              guest: guestName,
              method: req.method ?? "",
              target,
              status: response.status,
              reason: response.decision.reason,
              rule: response.decision.rule,
              ...(response.decision.source !== undefined ? { source: response.decision.source } : {}),
              redirects: response.redirects,
              ...resent,
              started,
              ...(error ? { error: this.explainCut(error, socket, served, response.body) } : {}),
            }, trace !== undefined ? { trace, bytesUp: up?.bytes ?? 0, bytesDown: down?.bytes ?? 0, rule: response.decision } : undefined);
          } finally {
            decided();
          }
        }, auditing, claimed ? trace : undefined, (cause) => guestError(madeBodyFailedUnsent(response, cause, trace) ?? bodyFailedUnsent(response.url.host, cause), this.deps.redact));
      });
    } catch (error) {
      // An upstream body left pending and never sent (a hook failed on it, or it broke): timed by its own end.
      if (trace !== undefined) claimUpstreamBody(trace, null);
      // The upstream failed under an upload that had not ended: the rest of it is read (and
      // dropped) before the answer, so that a guest that left while the proxy held its upload
      // back is seen gone, not answered (see readBeforeAnswer).
      const left =
        upstreamFailure(error) && !req.complete && !res.headersSent && !abort.aborted && inLane.answered === undefined && !this.drainEnded && (await readBeforeAnswer(req, socket, abort, inLane));
      // Its body broke while it was served: the parser's 400 went out in its place, and the
      // connection's close that followed aborted it. That 400 is its answer, not a guest that left.
      if (inLane.answered !== undefined) {
        this.decideAnswered(inLane.answered, { id, guest: guestName, method: req.method ?? "", target, started }, up, trace);
        return;
      }
      // At the drain's end the proxy closes guest connections and upstream pools alike: a request
      // still waiting sees either first, and nobody is left to answer either way.
      // A removed guest's tunnels are closed with it (their close events may come a turn later).
      if (left || abort.aborted || this.drainEnded || (wasRemoved(served) && tunnelOf(socket) !== undefined)) {
        // Nobody is left to answer; 499 is nginx's "client closed request", for the log only.
        this.deps.decide(
          { id, guest: guestName, method: req.method ?? "", target, status: 499, reason: this.leftReason(socket, served), ...resent, started },
          auditing ? { bytesUp: up?.bytes ?? 0, bytesDown: down?.bytes ?? 0, ...(trace !== undefined ? { trace } : {}) } : undefined,
        );
        return;
      }
      // The removal of its guest closed its upstream connections under it: the removal is the reason.
      const raw = wasRemoved(served) && !(error instanceof EgressError) ? removedError(served.name, error) : asEgressError(error);
      if (raw.status >= 500 && !(error instanceof EgressError)) this.deps.log.error("internal error", { id, error });
      // Error bodies are built from messages that may quote upstream errors: never let a value through.
      const err = guestError(raw, this.deps.redact);
      // A 407 or 429 ends the connection (as RFC 9110 lets a proxy do): a client retries on a new one.
      if (this.draining) res.shouldKeepAlive = false;
      // An HTTP/1.0 guest's keep-alive ends at an error: its framing may be the error. So does one
      // that named a version the proxy does not speak (505): nothing it sends next can be trusted.
      // sendError cuts the connection instead when the head is already out: then there is no error body.
      const errorBytes = sendError(res, err, !req.complete || err.code === "EG_AUTH" || req.httpVersion === "1.0" || err.status === 505);
      // Logged by the gate (see onConnect); a request in a removed guest's tunnel never met it.
      if (err.code === "EG_AUTH" && tunnelOf(req.socket) === undefined) return;
      this.deps.decide({
        id,
        guest: guestName,
        method: req.method ?? "",
        target,
        ...errorFields(err),
        ...resent,
        started,
      }, auditing ? { bytesUp: up?.bytes ?? 0, bytesDown: errorBytes, ...(trace !== undefined ? { trace } : {}) } : undefined);
    } finally {
      this.decided();
    }
  }

  /**
   * The line of a request whose body broke in the parser while it was served, before its
   * response began: the parser's answer (client-error.ts) went out in its place and closed the
   * connection: the refusal is its decision, not a guest that left (499, metrics "gone", as it was logged).
   */
  private decideAnswered(answer: Error, fields: { id: number; guest: string | undefined; method: string; target: string; started: number }, up: ByteCount | undefined, trace: TraceEntry[] | undefined): void {
    const err = asEgressError(answer);
    this.deps.decide(
      { id: fields.id, guest: fields.guest, method: fields.method, target: fields.target, ...errorFields(err), started: fields.started },
      this.deps.decide.auditing ? { bytesUp: up?.bytes ?? 0, bytesDown: Buffer.byteLength(errorBody(err)), ...(trace !== undefined ? { trace } : {}) } : undefined,
    );
  }

  /** One request's line is written (or it had none to write: never processed, or logged by the gate). */
  private decided(): void {
    this.undecided -= 1;
    if (this.undecided === 0) this.allDecided?.();
  }

  /**
   * Why a response was cut after its head, in words an operator reads in the log. `body`: the
   * response's, to say whose body failed when it was the body that did (bodyCutReason).
   */
  private explainCut(error: Error, socket?: Socket, guest?: Guest, body?: Readable | null): Error | string {
    const cut = (socket === undefined ? undefined : (this.cuts.get(socket) ?? unboundCutOf(socket))) ?? (wasRemoved(guest) ? removedCut(guest.name) : undefined);
    if (cut !== undefined) return `${cut} before the response was complete`;
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "UND_ERR_BODY_TIMEOUT") return `upstream body timed out after ${this.deps.config.timeouts.upstreamBodyMs} ms of silence; the guest connection was cut`;
    // After the drain the proxy closes what is left, guest connections and upstream pools alike:
    // either may be what the response saw first.
    if (this.drainEnded) {
      const seen = error instanceof GuestClosedMidResponse ? "" : ` (${error.message})`;
      return `${this.leftReason()} before the response was complete${seen}`;
    }
    return (body !== undefined ? bodyCutReason(body, error) : undefined) ?? error;
  }

  /** Why a request's connection went before its answer: the guest, the proxy's idle timeout, or the end of its drain. */
  private leftReason(socket?: Socket, guest?: Guest): string {
    if (this.drainEnded) return this.drainCut;
    return (socket !== undefined ? (this.cuts.get(socket) ?? unboundCutOf(socket)) : undefined) ?? (wasRemoved(guest) ? removedCut(guest.name) : "guest closed the connection");
  }

  /**
   * The drain is over: the connections still open are the proxy's to close, and a cut response is
   * logged as its doing. A request still in its pipeline (a hook, a policy call, an upstream yet
   * to answer) is ended now, and decided as the drain's cut.
   */
  endDrain(): void {
    this.drainEnded = true;
    this.pipelineCuts.end(new Error(this.drainCut));
  }

  /**
   * Resolves once every request and every upgrade still waiting for its 101 has been decided, or
   * after `ms`. Once the drain has ended their connections are closed, and the lines of what it
   * cut (a response still streaming, an upgrade's 499) come a few turns later, once the guest's
   * connection and the upstream's are gone: the audit log must still take them.
   */
  settled(ms: number): Promise<void> {
    if (this.upgrading.size === 0 && this.undecided === 0) return Promise.resolve();
    const decisions = this.undecided === 0 ? undefined : new Promise<void>((resolve) => (this.allDecided = resolve));
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      timer.unref();
      void Promise.all([Promise.allSettled(this.upgrading), decisions]).then(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  /**
   * Resolves once no request is in flight and every HTTP/2 guest connection has written its last
   * bytes (H2Guests.written, at most h2Limits.destroyLingerMs), or after `ms`.
   */
  drain(ms: number): Promise<void> {
    // HTTP/2 guests learn of the close from GOAWAY; their streams in flight still finish.
    // HTTP/1.1 answers from now on say Connection: close.
    this.draining = true;
    this.h2.goAway();
    return new Promise((resolve) => {
      const timer = setTimeout(resolve, ms);
      timer.unref();
      // The drain's end destroys every guest socket: an HTTP/2 session's last frames (an idle
      // one's GOAWAY, a response's END_STREAM), which Node writes turns after its last stream's
      // close, went with it before this waited for them (see H2Guests.written).
      const idle = (): void =>
        void this.h2.written(h2Limits.destroyLingerMs).then(() => {
          // A request begun meanwhile (an HTTP/1.1 one already read) calls this again at its end.
          if (this.inFlight > 0) return;
          clearTimeout(timer);
          resolve();
        });
      this.idle = idle;
      if (this.inFlight === 0) idle();
    });
  }
}

/**
 * The reason phrase of a CONNECT the early check refused: `Forbidden: host "x.test" is not in
 * allowedHosts`, the reason's first clause (without the how-to-allow hint). Many clients report a
 * refused CONNECT by its status line and never read its body (Python's http.client, Go's
 * net/http, Java, wget), so the status line is where they can show why. Cut to 100 characters
 * after redaction, and only visible ASCII (RFC 9112 §4 reason-phrase).
 */
function connectReasonPhrase(error: EgressError): string {
  const clause = error.message.split(";")[0] ?? "";
  return `${error.statusText}: ${clause}`.replace(/[^\t\x20-\x7e]/g, "?").slice(0, 100).trim();
}

/** The early CONNECT check's refusal, as the audit record lists it among the sources. */
function connectRefusal(phase: string, decision: { tier: string; reason: string; detail?: string }, started: number): TraceEntry {
  return {
    source: "declarative",
    tier: decision.tier,
    phase,
    decision: "block",
    reason: decision.reason,
    ...(decision.detail !== undefined ? { detail: decision.detail } : {}),
    status: 403,
    ms: Math.round((performance.now() - started) * 1000) / 1000,
  };
}

/** Why the proxy closed a connection (or the tunnel it is inside) that a reload took from its guest. */
function unboundCutOf(socket: Socket): string | undefined {
  return unboundCut(tunnelOf(socket)?.connection ?? socket);
}

function once(fn: () => void): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}

/** Whether the request's head announces a body: a Content-Length other than 0, or a Transfer-Encoding. */
function hasBodyFraming(req: IncomingMessage): boolean {
  const length = req.headers["content-length"];
  return req.headers["transfer-encoding"] !== undefined || (length !== undefined && length !== "0");
}

/**
 * About the bytes of the request's head as the guest sent it, as Node keeps it: the request line
 * and each field's name and value (Node reads them as Latin-1, a character a byte), with their
 * separators. What a request waiting its turn holds of the proxy (lanes.ts, `maxAheadBytes`).
 */
function headBytes(req: IncomingMessage): number {
  let bytes = (req.method?.length ?? 0) + (req.url?.length ?? 0) + 13;
  for (const item of req.rawHeaders) bytes += item.length + 2;
  return bytes;
}

/** Sockets whose errors go to `clientError` again after a 408 not given ({@link GuestSide.routeSocketErrors}). */
const errorsRouted = new WeakSet<Socket>();
