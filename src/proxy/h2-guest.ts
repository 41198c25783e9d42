import { createServer, type Http2Server, type ServerHttp2Session, type ServerHttp2Stream } from "node:http2";
import { requestStart, type RequestStartMessage } from "../metrics/channels.js";
import type { Socket } from "node:net";
import type { TLSSocket } from "node:tls";
import type { Readable } from "node:stream";
import { afterReads } from "../after-reads.js";
import { EgressError, asEgressError, guestError } from "../errors.js";
import { getHeader } from "../headers.js";
import type { Logger } from "../log.js";
import { countPushed, type ByteCount } from "../metrics/byte-counter.js";
import { GuestGone, type TraceEntry } from "../pipeline/exchange.js";
import { bodyFailedUnsent } from "../pipeline/upstream-errors.js";
import { madeBodyFailedUnsent, madeBodyStarted, replayStarted } from "../pipeline/made-start.js";
import { authenticationRequired } from "./auth.js";
import { errorFields, resentField, type DecisionLog } from "./decision-log.js";
import { loggableMethod, loggableRequestTarget, maxRequestFields, type TunnelTarget } from "./guest-request.js";
import { boundGuest, removedCut, unboundCut, wasRemoved, type Guest, type GuestRegistry } from "./guests.js";
import { h2ExpectsContinue, h2OutboundRequest } from "./h2-request.js";
import { h2ContinueOnce, sendH2Error, sendH2Response, type ResponseCloseHook, type StallWatch } from "./h2-respond.js";
import { GuestClosedMidResponse, GuestLeftFirst } from "./respond.js";
import { h2Codes, h2Limits, h2ServerOptions, h2StreamCharge, type H2ConfiguredLimits } from "./h2-settings.js";
import { SourceBudgets, type SourceAccount } from "./source-budget.js";
import { tunnelOf } from "./tunnel.js";
import { resetH2Stream } from "../streams.js";
import { requestBodyOf } from "./h2-upload.js";
import { h2CodeName } from "../upstream/h2-close-reason.js";
import { raiseConnectionWindow } from "../upstream/h2-windows.js";
import { keepOwnBytes } from "../upstream/h2-window-share.js";
import type { DrainCuts } from "./drain-cut.js";

export interface H2GuestDeps {
  readonly log: Logger;
  readonly decide: DecisionLog;
  readonly guests: GuestRegistry;
  readonly redact: (text: string) => string;
  readonly idleMs: number;
  /** `timeouts.h2PingMs`: silence before a PING, and how long its answer may take. */
  readonly pingMs: number;
  /** `limits.h2*`: the stream cap, the header list, the session memory, the reset rate. */
  readonly limits: H2ConfiguredLimits;
  /** The decision log's request ids, shared with the HTTP/1.1 side. */
  readonly nextId: () => number;
  /** A stream's pipeline work started and ended (its line written): the proxy's drain waits for these too. */
  readonly started: () => void;
  readonly ended: () => void;
  /** Ends the pipeline wait of a stream still in it when the drain ends. */
  readonly pipelineCuts: DrainCuts;
  /** Why a response was cut after its head, as the log says it. */
  /** Why a response was cut after its head; `body`, the response's, to say whose body failed (see bodyCutReason). */
  readonly explainCut: (error: Error, body: Readable | null) => Error | string;
  /** The proxy's drain is over: what it cuts from now on is the proxy's doing, not the guest's. */
  readonly drainEnded: () => boolean;
  /** What the log says of a request the drain's end cut. */
  readonly drainCut: string;
}

/** What one guest connection has done that the limits count. */
interface SessionState {
  readonly tunnel: TunnelTarget;
  /** Streams whose pipeline work has not finished, reset ones included. */
  running: number;
  /** Streams still in the pipeline, not yet answering: what a guest that leaves abandons. */
  readonly unanswered: Map<ServerHttp2Stream, StreamWatch>;
  /** Streams that arrived while `running` was at the cap, in order: each starts when a slot frees. */
  readonly waiting: WaitingStream[];
  readonly resets: WindowCounter;
  /** Header lists over limits.h2HeaderListBytes that reached onStream (Node checks none before the guest's SETTINGS ACK). */
  readonly oversized: WindowCounter;
  /** Why the proxy ended the connection (calm()), once it has: what it cut is logged as that. */
  closedFor: string | undefined;
  /** How nghttp2 ended the connection, when a frame of the guest's broke HTTP/2. */
  failure: string | undefined;
  readonly pings: WindowCounter;
  readonly settings: WindowCounter;
  /** The guest's TLS socket, which a destroyed session may never close by itself. */
  readonly socket: TLSSocket | undefined;
  /** The charges of the connection's source address (limits.sourceBufferBytes). */
  readonly budget: SourceAccount;
  /** When `running` last fell to 0 (or the session began): the idle limit counts from here. */
  idleSince: number;
  /** Ends the session once it has had no request for idleMs, whatever else the guest sends. */
  idleTimer: NodeJS.Timeout | undefined;
  /** A PING of the liveness probe awaits its acknowledgement. */
  probing: boolean;
  /** The guest closed its side (FIN): what is still owed goes out, then the session ends. */
  guestEnded: boolean;
}

/** Events per fixed window: deterministic for a flood (it fills a window at once), cheap otherwise. */
class WindowCounter {
  private count = 0;
  private since = 0;
  constructor(private readonly max: number) {}

  /** Counts one; true once the window holds more than the maximum. */
  over(now: number): boolean {
    if (now - this.since > h2Limits.windowMs) {
      this.since = now;
      this.count = 0;
    }
    return ++this.count > this.max;
  }
}

const stateKey = Symbol("egressgate.h2state");

type TrackedSession = ServerHttp2Session & { [stateKey]?: SessionState };

/**
 * Guests that negotiated `h2` inside a CONNECT tunnel. Each stream is one request through the
 * guest's pipeline, on its own: no lanes (they would serialise streams), its own abort signal,
 * its own answer. The connection-wide limits (concurrency, resets, floods) end only the
 * connection that broke them.
 */
export class H2Guests {
  private readonly server: Http2Server;
  private readonly sessions = new Set<ServerHttp2Session>();
  private closing = false;
  /** The TLS socket being handed to the server, for track(): `session.socket` is Node's proxy of it, whose `once` is the session's. */
  private arriving: TLSSocket | undefined;
  /** What each source's streams under way are charged (limits.sourceBufferBytes). */
  private readonly budgets: SourceBudgets;
  /** h2StreamCharge at these limits: a stream without a request body, and one with. */
  private readonly charges: { readonly bodiless: number; readonly upload: number };

  constructor(private readonly deps: H2GuestDeps) {
    this.budgets = new SourceBudgets(deps.limits.sourceBufferBytes);
    this.charges = { bodiless: h2StreamCharge(deps.limits, false), upload: h2StreamCharge(deps.limits, true) };
    this.server = createServer(h2ServerOptions(deps.limits));
    this.server.on("session", (session: ServerHttp2Session) => this.track(session));
    this.server.on("stream", (stream: ServerHttp2Stream, _headers: unknown, _flags: number, raw: string[]) => this.onStream(stream, raw));
    this.server.on("sessionError", (error: Error) => deps.log.debug("guest h2 session error", { error }));
  }

  /**
   * Takes a guest TLS socket whose ALPN chose `h2`, after its handshake.
   *
   * `h2server.emit("connection", tlsSocket)` alone hangs for ever on Node 20: a TLSSocket made
   * with `new TLSSocket(socket, { isServer: true })` keeps `secureConnecting` true after its
   * handshake (only tls.Server resets it), so the session waits for a `secureConnect` that a
   * server-side socket never emits. The handshake is done when this is called.
   */
  serve(socket: TLSSocket): void {
    if (this.closing) {
      socket.destroy();
      return;
    }
    (socket as unknown as { secureConnecting: boolean }).secureConnecting = false;
    // The server makes the session and emits `session` within this call (track() takes the socket).
    this.arriving = socket;
    try {
      this.server.emit("connection", socket);
    } finally {
      this.arriving = undefined;
    }
  }

  /** GOAWAY to every session: streams in flight finish, new ones go to a new connection. */
  goAway(): void {
    this.closing = true;
    for (const session of this.sessions) {
      if (session.closed || session.destroyed) continue;
      // Streams not started yet go to the guest's next connection, which REFUSED_STREAM allows (RFC 9113 §8.7).
      const state = (session as TrackedSession)[stateKey];
      if (state !== undefined) dropWaiting(state, h2Codes.refusedStream);
      try {
        session.goaway(h2Codes.noError);
        session.close();
      } catch (error) {
        this.deps.log.debug("guest h2 goaway failed", { error });
        session.destroy();
      }
    }
  }

  /**
   * Resolves once every guest connection has written its last bytes, or after `ms`. goAway()
   * closed each session gracefully: once its last stream has gone, Node writes what is still
   * queued (the GOAWAY; a response's last frame, END_STREAM or trailers, which Node writes in a
   * later turn than the stream's close) and ends the TLS socket with close_notify and a FIN; its
   * `finish` (or its close) is the sign. `ms` bounds the wait for a session Node keeps open: one
   * with a stream whose request body nobody read, which Node lets go only at the body's end.
   */
  written(ms: number): Promise<void> {
    const pending: Promise<void>[] = [];
    for (const session of this.sessions) {
      const state = (session as TrackedSession)[stateKey];
      const socket = state?.socket;
      const raw = state?.tunnel.connection;
      if (socket === undefined || socket.destroyed || socket.writableFinished || raw?.destroyed === true) continue;
      pending.push(
        new Promise<void>((resolve) => {
          socket.once("finish", resolve);
          socket.once("close", resolve);
          raw?.once("close", resolve);
        }),
      );
    }
    if (pending.length === 0) return Promise.resolve();
    return new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, ms);
      timer.unref();
      void Promise.all(pending).then(() => {
        clearTimeout(timer);
        resolve();
      });
    });
  }

  private track(session: TrackedSession): void {
    const tunnel = tunnelOf(session.socket as unknown as Socket);
    if (tunnel === undefined) {
      session.destroy();
      return;
    }
    // The source is the CONNECT's own connection's, as limits.connectionsPerSource counts it.
    const budget = this.budgets.open(tunnel.connection.remoteAddress ?? "");
    const state: SessionState = {
      tunnel,
      budget,
      running: 0,
      unanswered: new Map(),
      waiting: [],
      resets: new WindowCounter(this.deps.limits.h2ResetsPer10s),
      oversized: new WindowCounter(h2Limits.maxOversizedHeaderLists),
      closedFor: undefined,
      failure: undefined,
      pings: new WindowCounter(h2Limits.maxPingsPerWindow),
      settings: new WindowCounter(h2Limits.maxSettingsPerWindow),
      socket: this.arriving,
      idleSince: performance.now(),
      idleTimer: undefined,
      probing: false,
      guestEnded: false,
    };
    session[stateKey] = state;
    this.sessions.add(session);
    // Uploads from HTTP/2 guests: the connection's window paces them (limits.h2ConnectionWindowBytes).
    raiseConnectionWindow(session, this.deps.limits.h2ConnectionWindowBytes);
    // A guest that closes its connection (FIN) without GOAWAY: Node's session neither reads on nor
    // closes, and the socket sat in CLOSE-WAIT until the idle timeout (2 min by default). Streams
    // still in the pipeline are abandoned, as an HTTP/1.1 guest's requests are at its FIN: their
    // upstream requests must not go out once the hooks return. Responses under way still
    // finish; then the session closes the socket.
    const { socket } = state;
    // Node's session, destroyed, ends its socket and destroys it only once that end has been
    // written; closed gracefully, it waits until its queued frames are. A guest that is gone
    // never lets either happen (nothing asks to write, or its window is shut), and the tunnel
    // stayed open for good: 256 guests that dropped connections with streams open locked their
    // address out (black-box finding). Every way a session ends goes through destroy(). After
    // one that may leave a live guest reading the last frames (a graceful close that finished, a
    // drain's GOAWAY), the socket is closed once idleMs has passed, or as soon as its last writes
    // stall (closeWhenStalled); after the timeouts below and ENHANCE_YOUR_CALM, whose guest is
    // gone or refused, once its GOAWAY has had a moment.
    const destroy = session.destroy.bind(session);
    let closing = false;
    session.destroy = ((error?: Error, code?: number) => {
      // Node leaves a destroyed session's timer in the list (setTimeout() does nothing once
      // destroyed): it held the session, its nghttp2 state and its socket until it fired.
      if (!session.destroyed) session.setTimeout(0);
      destroy(error, code ?? guestExcessCode(error));
      if (closing || socket === undefined || socket.destroyed) return;
      closing = true;
      closeSocketAfter(socket, this.deps.idleMs);
      // A guest that has sent its FIN takes what is left within the FIN's spell; a live one
      // within a PING's round (silence, then as long again for the answer), as onSilence asks.
      closeWhenStalled(socket, tunnel.connection, state.guestEnded ? Math.min(this.deps.idleMs, h2Limits.afterGuestEndMs) : 2 * this.silenceMs());
    }) as typeof session.destroy;
    const end = (): void => {
      session.destroy();
      if (socket !== undefined) closeSocketAfter(socket, h2Limits.destroyLingerMs);
    };
    socket?.once("end", () => {
      state.guestEnded = true;
      for (const [stream, watch] of state.unanswered) {
        watch.ours = true;
        resetH2Stream(stream, h2Codes.cancel, "the guest closed its connection");
      }
      dropWaiting(state, h2Codes.cancel);
      if (!session.closed && !session.destroyed) session.close();
      // The guest can send nothing more, WINDOW_UPDATE included: what it does not take within a
      // short spell of silence it never will (onSilence ends a session whose guest has ended).
      session.setTimeout(Math.min(this.deps.idleMs, h2Limits.afterGuestEndMs));
    });
    session.once("close", () => {
      this.sessions.delete(session);
      this.budgets.close(budget);
      clearTimeout(state.idleTimer);
      state.waiting.length = 0;
    });
    session.on("error", (error: NodeJS.ErrnoException) => {
      // nghttp2 ended the connection for a frame that broke HTTP/2 (ERR_HTTP2_ERROR), or for
      // invalid frames past maxSessionInvalidFrames: said as calm() says its own closes. A socket's
      // own error (a guest that vanished) stays a debug line.
      if (state.closedFor === undefined && state.failure === undefined && isSessionFailure(error)) {
        state.failure = guestBroke(error);
        this.deps.log.info("guest h2 connection closed", { reason: state.failure, target: `${tunnel.hostname}:${tunnel.port}`, guest: tunnel.guest });
      } else this.deps.log.debug("guest h2 session error", { error });
    });
    session.on("frameError", (type: number, code: number, id: number) => this.deps.log.debug("guest h2 frame error", { type, code, stream: id }));
    // Silence on the connection: a PING, or the end of an idle or abandoned session (onSilence).
    // Node's setTimeout(ms, callback) listens once; this listener stays, and each call re-arms.
    session.on("timeout", () => this.onSilence(session, state, end));
    session.setTimeout(this.silenceMs());
    this.armIdle(session, state, end);
    session.on("ping", () => {
      if (state.pings.over(performance.now())) this.calm(session, "PING flood", { flood: true });
    });
    session.on("remoteSettings", () => {
      if (state.settings.over(performance.now())) this.calm(session, "SETTINGS flood", { flood: true });
    });
    this.awaitSettingsAck(session);
    if (this.closing) this.goAway();
  }

  private silenceMs(): number {
    return Math.min(this.deps.idleMs, this.deps.pingMs);
  }

  /**
   * RFC 9113 §6.5.3: a guest that has not acknowledged the proxy's SETTINGS within
   * {@link silenceMs} gets GOAWAY(SETTINGS_TIMEOUT). Until it does, none of them binds it (nghttp2
   * applies the proxy's settings only from the ACK): Node checks no header-list size, and the
   * proxy's own count refuses lists over limits.h2HeaderListBytes only after nghttp2 has decoded
   * them, 1 MB from 300 bytes sent. Every client library acknowledges at once, as the RFC asks.
   */
  private awaitSettingsAck(session: ServerHttp2Session): void {
    const ms = this.silenceMs();
    // Each deadline below is judged after that turn's reads (afterReads): once the proxy has been
    // paused past it (SIGSTOP, a paused VM), its timer fires before the poll that reads the
    // guest's answer, or the request it sent in time.
    const deadline = setTimeout(afterReads, ms, () => {
      if (session.destroyed || !session.pendingSettingsAck) return;
      this.calm(session, `the guest did not acknowledge the proxy's SETTINGS within timeouts.h2PingMs (${ms} ms)`, { code: h2Codes.settingsTimeout });
    });
    deadline.unref();
    const settled = (): void => clearTimeout(deadline);
    session.once("localSettings", settled);
    session.once("close", settled);
  }

  /**
   * The connection has been silent for {@link silenceMs}: the guest is sent a PING, which a live
   * guest answers even while every stream waits for its window, and a session whose PING goes
   * unanswered for as long again is closed. nghttp2 needs this: once it has sent
   * GOAWAY(PROTOCOL_ERROR) it stops reading and Node never learns, so the guest's FIN goes
   * unseen, and a guest that vanished without a FIN is heard from no more than a stalled one.
   * Both held their tunnel until idleMs (2 minutes by default). A session the proxy's drain is
   * closing is not asked (its deadline is the drain's), nor one whose guest sent its FIN (the FIN's
   * own). One that Node closes at the guest's GOAWAY(NO_ERROR) is: its streams go on, and a guest
   * that vanished after that GOAWAY held its tunnel until each stream's idleMs.
   */
  private onSilence(session: ServerHttp2Session, state: SessionState, end: () => void): void {
    if (session.destroyed) return;
    if (state.guestEnded) {
      end();
      return;
    }
    // Node re-arms the timer only on traffic: a session nobody hears from would not be asked again.
    session.setTimeout(this.silenceMs());
    if (state.probing || (session.closed && this.closing)) return;
    state.probing = true;
    let answered = false;
    const deadline = setTimeout(afterReads, this.silenceMs(), () => {
      if (answered || session.destroyed) return;
      this.deps.log.debug("guest h2 connection closed", { reason: "no answer to PING", guest: state.tunnel.guest });
      end();
    });
    deadline.unref();
    const onAnswer = (): void => {
      answered = true;
      clearTimeout(deadline);
      state.probing = false;
    };
    try {
      // An error is a PING cancelled by the session's own end, which the deadline outlives.
      if (session.closed) pingClosed(session, onAnswer);
      else
        session.ping((error) => {
          if (error === null) onAnswer();
        });
    } catch {
      // Too many unanswered already, or the session is going: the deadline decides.
    }
  }

  /**
   * The idle limit, on a timer of its own: the session's timeout is refreshed by anything the
   * guest sends, and a guest sending PING or SETTINGS every few seconds, with no request, held
   * its connection and its place under connectionsPerSource for good.
   */
  private armIdle(session: ServerHttp2Session, state: SessionState, end: () => void): void {
    const timer = setTimeout(afterReads, this.deps.idleMs, () => {
      if (session.destroyed || state.running > 0) return;
      if (performance.now() - state.idleSince >= this.deps.idleMs) end();
      else timer.refresh();
    });
    timer.unref();
    state.idleTimer = timer;
  }

  /**
   * GOAWAY(ENHANCE_YOUR_CALM), or `code`, and the connection closed, as Go answers rapid reset.
   *
   * `session.destroy(error, code)` alone lost the GOAWAY (black-box finding: the guest saw its
   * streams reset and the connection closed, never the frame): called from a `stream` or `ping`
   * event, it runs inside nghttp2's read of the guest's bytes, where Node only schedules the
   * write, and the socket was ended before that write came. The GOAWAY is submitted first, and
   * the session destroyed a turn later, once nghttp2 has written it; meanwhile the streams the
   * guest still opens are refused (onStream).
   */
  private calm(session: ServerHttp2Session, reason: string, { flood = false, code = h2Codes.enhanceYourCalm }: { flood?: boolean; code?: number } = {}): void {
    const state = (session as TrackedSession)[stateKey];
    if (session.destroyed || state?.closedFor !== undefined) return;
    if (state !== undefined) state.closedFor = reason;
    const tunnel = state?.tunnel;
    this.deps.log.info("guest h2 connection closed", { reason, ...(tunnel !== undefined ? { target: `${tunnel.hostname}:${tunnel.port}`, guest: tunnel.guest } : {}) });
    if (flood) {
      // A SETTINGS or PING flood is destroyed within the read: nghttp2 would otherwise go on
      // through the rest of the guest's bytes and end the session itself (GOAWAY(INTERNAL_ERROR),
      // "Flooding was detected", its outbound queue of ACKs full) before our GOAWAY went. Its
      // GOAWAY may be lost, as before; the log line is the record.
      session.destroy(new Error(reason), code);
      if (state?.socket !== undefined) closeSocketAfter(state.socket, h2Limits.destroyLingerMs);
      return;
    }
    // Out of the read first: session.goaway() called within it (from this `stream` event) made
    // the process abort with heap corruption once the session was destroyed (Node 20.20, nghttp2).
    setImmediate(() => {
      if (session.destroyed) return;
      try {
        session.goaway(code);
      } catch {
        // The session is closing already: destroy() below still sends its own GOAWAY.
      }
      // Node writes the frame from an immediate of its own, which runs before the next of ours.
      setImmediate(() => {
        // destroy(undefined, code) would send GOAWAY(NO_ERROR): Node takes a missing error as code 0.
        if (!session.destroyed) session.destroy(new Error(reason), code);
        // Its GOAWAY gets a moment to go out before the socket is closed.
        if (state?.socket !== undefined) closeSocketAfter(state.socket, h2Limits.destroyLingerMs);
      });
    });
  }

  private onStream(stream: ServerHttp2Stream, raw: string[]): void {
    // One watch per stream, for the reset count and the request's own reaction (watch.onClose).
    const watch: StreamWatch = { ours: false, onClose: undefined, onResponseClose: undefined, cut: undefined, failure: undefined };
    stream.on("error", (error) => {
      // Node destroys a stream with the session's error, or with its own for a stream nghttp2
      // reset: the log line of a stream gone before its answer names it (leftReason).
      watch.failure ??= error;
      this.deps.log.debug("guest h2 stream error", { error });
    });
    const session = stream.session as TrackedSession | undefined;
    const state = session?.[stateKey];
    if (session === undefined || state === undefined || state.closedFor !== undefined) {
      stream.close(h2Codes.refusedStream);
      return;
    }
    // A request body holds what its window lets in until it is read, waiting for the running-work
    // cap or refused included: the fixed window (h2GuestWindow) bounds that to
    // limits.h2ConnectionBufferBytes over the connection's streams; the chunks that stay are
    // copied so that they hold no more than their own bytes.
    if (!stream.endAfterHeaders) keepOwnBytes(stream);
    // The head's bounds before any wait for the running work: a refused head is answered at once
    // and its list let go, never held in the waiting list (review finding).
    const maxHeaderList = this.deps.limits.h2HeaderListBytes;
    if (headerListSize(raw) > maxHeaderList) {
      this.refuseHeaderList(stream, raw, session, state);
      return;
    }
    if (regularFieldCount(raw) > maxRequestFields) {
      this.refuseHead(stream, raw, state, new EgressError("EG_HEADERS_TOO_LARGE", 431, `request head has more than ${maxRequestFields} header fields`));
      return;
    }
    // Charged as it arrives, before any wait for the running work: a stream waiting for a slot
    // holds its window of request body too. Refused, its body is let go as the stream closes.
    const charge = stream.endAfterHeaders ? this.charges.bodiless : this.charges.upload;
    if (!state.budget.take(charge)) {
      this.refuseOverBudget(stream, raw, state);
      return;
    }
    const budget = state.budget;
    const opened = performance.now();
    // The stream's one close listener, from here on: the charge given back, the guest's reset
    // counted (waiting or running alike), then the request's own reaction (watch.onClose) and
    // a bodiless stream's response's (watch.onResponseClose). on(), not once(): a stream closes once, and once()
    // wraps the listener in a bound function and a state object, then takes it off again (an
    // Http2Stream tells its `removeListener` listener of that too); and each listener added to an
    // Http2Stream emits `newListener` to Node's own. Three listeners were added per stream (the
    // charge's, the running work's and the response's), each with that cost.
    stream.on("close", () => {
      budget.give(charge);
      this.countReset(stream, watch, session, state, opened);
      watch.onClose?.();
      watch.onResponseClose?.();
    });
    if (state.running < this.deps.limits.h2Streams) {
      this.admit(stream, raw, session, state, watch);
      return;
    }
    // The stream limit counts open streams only; a guest that resets each stream at once keeps
    // it free while the work behind every reset still runs (CVE-2023-44487). A stream past the
    // running work's cap waits for a slot, as Go's server queues a handler past
    // MaxConcurrentStreams. Refused, it failed a gRPC client's calls: 100 calls missing their
    // deadline together are 100 resets, and grpc-js sends the calls it queued in the same write,
    // read before the work of the reset ones has ended; past 100 refusals the connection was
    // closed with every call on it (interop finding). A guest that never resets keeps fewer
    // streams waiting than the stream limit; one that resets them as it opens them does not.
    state.waiting.push({ stream, raw, watch });
    if (state.waiting.length > this.deps.limits.h2Streams) {
      this.calm(session, `more than ${this.deps.limits.h2Streams} streams waiting for the running-work cap, reset ones included (rapid reset)`);
    }
  }

  /** Starts the streams waiting for the running-work cap while it has room (see onStream). */
  private admitWaiting(session: ServerHttp2Session, state: SessionState): void {
    while (state.running < this.deps.limits.h2Streams && state.waiting.length > 0) {
      const next = state.waiting.shift()!;
      // Reset while it waited (its close counted by onStream's listener): never started, as a refused stream never is.
      if (next.stream.closed || next.stream.destroyed) continue;
      if (session.destroyed || state.closedFor !== undefined) {
        next.watch.ours = true;
        next.stream.close(h2Codes.refusedStream);
        continue;
      }
      this.admit(next.stream, next.raw, session, state, next.watch);
    }
  }

  /**
   * The guest's reset of a stream, against `limits.h2ResetsPer10s`: one the proxy did not make,
   * before the proxy ended its response, within prematureResetMs of the stream's start.
   *
   * `aborted`: closed before the proxy ended its response, whatever the code (a reset with
   * NO_ERROR counts too). Node ends a reset stream's writable side itself, so writableFinished
   * cannot tell a reset from a response sent whole. A reset with an error code after the proxy
   * ended its answer (a refusal the guest's RST_STREAM overtook) counts too: nghttp2 dropped the
   * answer unsent.
   */
  private countReset(stream: ServerHttp2Stream, watch: StreamWatch, session: ServerHttp2Session, state: SessionState, opened: number): void {
    if (watch.ours || !(stream.aborted || (stream.rstCode !== undefined && stream.rstCode !== h2Codes.noError))) return;
    const now = performance.now();
    if (now - opened >= h2Limits.prematureResetMs) return;
    if (state.resets.over(now)) this.calm(session, "stream resets past the limit (rapid reset)");
  }

  /** A stream whose head passed its bounds (onStream), once the running work has room: its request through the pipeline. */
  private admit(stream: ServerHttp2Stream, raw: string[], session: ServerHttp2Session, state: SessionState, watch: StreamWatch): void {
    // Its close is onStream's listener's: the reset counted, then watch.onClose.
    state.running += 1;
    this.deps.started();
    const abort = new GuestGone();
    const done = (): void => {
      state.running -= 1;
      try {
        this.admitWaiting(session, state);
      } catch (error) {
        // Runs inside another stream's settling, whose promise nobody awaits: a throw there would
        // end the process. Nothing below throws today; should it, this connection alone goes.
        this.deps.log.error("starting a waiting HTTP/2 stream failed", { error });
        this.calm(session, "a waiting stream could not be started", { code: h2Codes.internalError });
      }
      if (state.running === 0) {
        state.idleSince = performance.now();
        // From now: refresh() re-arms the one timer for idleMs (no new timer per request).
        state.idleTimer?.refresh();
      }
    };
    const settled = (): void => {
      // A hook's call the reset let go still runs: it counts as running work until it settles
      // (or its own deadline passes), or each reset would start one more without limit.
      const held = abort.held();
      if (held === undefined) done();
      else void held.then(done);
      this.deps.ended();
    };
    // One reaction for both outcomes, rather than catch() then finally(): a promise and a turn
    // of the microtask queue fewer per stream.
    void this.handle(stream, raw, state, watch, abort).then(settled, (error: unknown) => {
      try {
        this.deps.log.error("internal error", { error, stack: (error as Error)?.stack });
        watch.ours = true;
        resetH2Stream(stream, h2Codes.internalError, "internal error");
      } finally {
        settled();
      }
    });
  }

  /**
   * A header list over `limits.h2HeaderListBytes`. nghttp2 decodes whatever the table references
   * (an HPACK bomb is small on the wire), and Node resets a stream past
   * SETTINGS_MAX_HEADER_LIST_SIZE only once the guest has acknowledged our SETTINGS: before that,
   * the list is refused here, as an HTTP/1.1 head over 64 KiB is, before any pipeline work. Each
   * refusal is a decision like any other; past a few per window the connection is closed, or a
   * guest that never acknowledges could have the proxy decode a megabyte per 300 bytes it sends
   * for as long as it liked (black-box finding: 1,031 such streams, no log line, RSS 108 → 348 MiB).
   */
  private refuseHeaderList(stream: ServerHttp2Stream, raw: string[], session: ServerHttp2Session, state: SessionState): void {
    const maxHeaderList = this.deps.limits.h2HeaderListBytes;
    this.refuseHead(stream, raw, state, new EgressError("EG_HEADERS_TOO_LARGE", 431, `the request's header list exceeds ${maxHeaderList} bytes`));
    if (state.oversized.over(performance.now())) this.calm(session, `header lists over limits.h2HeaderListBytes (${maxHeaderList} bytes) past ${h2Limits.maxOversizedHeaderLists} per ${h2Limits.windowMs / 1000} s`);
  }

  /**
   * A stream whose charge does not fit in its source's budget (limits.sourceBufferBytes): 503
   * before any work, as a connection past limits.connectionsPerSource is, and its body let go.
   * Only new work is refused: the source's streams under way keep their windows, and each one
   * that ends makes room again. A gRPC call gets UNAVAILABLE, which its client may retry.
   */
  private refuseOverBudget(stream: ServerHttp2Stream, raw: string[], state: SessionState): void {
    const { source, held, limitBytes } = state.budget;
    this.refuseHead(
      stream,
      raw,
      state,
      new EgressError("EG_LIMIT", 503, `too many requests under way: ${source} already has ${held} bytes of windows charged to its requests (limits.sourceBufferBytes, ${limitBytes})`),
    );
  }

  /**
   * A stream refused on its head alone, before any pipeline work (431, or 503 past the source's
   * budget): answered, its request body (if any) left unread, and its line written. Only the
   * stream is answered here, inside nghttp2's read: the session is never ended or destroyed from
   * this call. A gRPC request gets its Trailers-Only answer, as every other refusal does: the
   * 431s were plain HTTP, which grpc-js reports as UNKNOWN "Received HTTP status code 431",
   * the reason lost (issue 20 audit).
   */
  private refuseHead(stream: ServerHttp2Stream, raw: string[], state: SessionState, err: EgressError): void {
    const started = performance.now();
    const bytesDown = sendH2Error(stream, err, isGrpc(raw));
    if (!stream.endAfterHeaders && !stream.destroyed) stream.close(h2Codes.noError);
    const { method, target } = this.loggable(raw, state.tunnel);
    const guest = boundGuest(state.tunnel.connection)?.name;
    this.deps.decide(
      { id: this.deps.nextId(), guest, method, target, ...errorFields(err), http: "2", started },
      this.deps.decide.auditing ? { bytesUp: 0, bytesDown } : undefined,
    );
  }

  /** The method and request target a stream's line gives, from its raw header list; a CONNECT's is its authority, as an HTTP/1.1 guest's line says it. */
  private loggable(raw: readonly string[], tunnel: TunnelTarget): { method: string; target: string } {
    let method = "";
    let path: string | undefined;
    let authority: string | undefined;
    for (let i = 0; i < raw.length; i += 2) {
      if (raw[i] === ":method") method = loggableMethod(raw[i + 1]!);
      else if (raw[i] === ":path") path = raw[i + 1]!;
      else if (raw[i] === ":authority") authority = raw[i + 1]!;
    }
    // A CONNECT has no :path (RFC 9113 §8.5): its target is the authority, never a "/" it did not send.
    if (method === "CONNECT" && path === undefined) return { method, target: loggableRequestTarget(authority ?? "", undefined) };
    // As an HTTP/1.1 guest's line says it in a tunnel: a path on the tunnel's origin, anything
    // else (`OPTIONS *`) as sent, never glued to the origin ("https://host:443*").
    return { method, target: loggableRequestTarget(path ?? "/", tunnel) };
  }

  /** One stream: settles once its response is sent, cut, or the guest reset it. */
  private async handle(stream: ServerHttp2Stream, raw: string[], state: SessionState, watch: StreamWatch, abort: GuestGone): Promise<void> {
    const tunnel = state.tunnel;
    const resetByUs = (): void => {
      watch.ours = true;
    };
    const { decide } = this.deps;
    const id = this.deps.nextId();
    const started = performance.now();
    const auditing = decide.auditing;
    const trace: TraceEntry[] | undefined = auditing ? [] : undefined;
    const up: ByteCount | undefined = auditing && !stream.endAfterHeaders ? countPushed(stream) : undefined;
    let down: ByteCount | undefined;
    const method = loggableMethod(rawMethod(raw));
    /** The request's URL for its line once it is built; until then, what `loggable()` makes of the raw head (only a line that needs it builds it). */
    let target: string | undefined;
    let finished = false;
    watch.onClose = () => {
      // A response sent whole closes its stream before sendH2Response's own listener settles it:
      // aborting then would only build an Error that nobody reads, about 2% of the proxy's CPU.
      if (!finished && !(stream.writableFinished && stream.rstCode === h2Codes.noError && !stream.aborted)) abort.abort();
    };
    let guestName: string | undefined;
    /** The guest served, once known: a removal under way is the reason the log gives for what it cut. */
    let served: Guest | undefined;
    /** An exchange went upstream twice (its pooled connection turned out closed): every line of the request says so. */
    let resent: { readonly resent: true } | undefined;
    try {
      // Removal, or a reload that takes the tunnel from its guest, closes it: a stream already read finds it gone.
      const guest = boundGuest(tunnel.connection);
      if (guest === undefined) throw authenticationRequired();
      guestName = guest.name;
      served = guest;
      // The proxy's own cut of a stream the guest stopped moving: logged as the proxy's.
      const cutStalled = (what: string): StallWatch => ({
        ms: this.deps.idleMs,
        onStall: () => {
          watch.cut = `the guest ${what} for timeouts.idleMs (${this.deps.idleMs} ms)`;
          resetByUs();
          resetH2Stream(stream, h2Codes.cancel, watch.cut);
        },
      });
      // An Expect the proxy cannot meet is refused before anything else, as Node's HTTP/1.1 server refuses it.
      const expectsContinue = h2ExpectsContinue(raw);
      const continued = expectsContinue && !stream.endAfterHeaders ? h2ContinueOnce(stream) : undefined;
      const request = h2OutboundRequest(raw, tunnel, stream.endAfterHeaders ? null : requestBodyOf(stream, cutStalled("sent nothing of its request body"), continued?.sent));
      target = `${request.url.origin}${cutPath(this.deps.redact(request.url.pathname))}`;
      if (requestStart.hasSubscribers) requestStart.publish({ id, guest: guestName, method, url: target, time: new Date().toISOString() } satisfies RequestStartMessage);
      state.unanswered.set(stream, watch);
      let response: Awaited<ReturnType<typeof guest.pipeline.handle>>;
      try {
        response = await this.deps.pipelineCuts.until(
          guest.pipeline.handle(request, {
            id,
            signal: abort,
            onResend: () => (resent = resentField),
            // A guest that waits for 100 before its body (curl waits 1 s, Node's client for good) and
            // a proxy that waits for the body deadlocked until hookMs or idleMs (black-box finding).
            ...(continued !== undefined && request.body !== null ? { beforeBody: continued.send } : {}),
            ...(trace !== undefined ? { trace } : {}),
          }),
          abort,
        );
        // The head of a Response a hook made waits for its body's first chunk: one that fails
        // before it is answered 502 with its reason, not a 200 whose stream is reset. So does the
        // head of an upstream body a hook read part of (see replayStarted).
        const starting = madeBodyStarted(response, method, abort, trace) ?? replayStarted(response, method, abort);
        if (starting !== undefined) response = await this.deps.pipelineCuts.until(starting, abort);
      } finally {
        state.unanswered.delete(stream);
      }
      if (response.body?.destroyed === true) {
        response.cleanup?.();
        throw madeBodyFailedUnsent(response, response.body.errored, trace) ?? bodyFailedUnsent(response.url.host, response.body.errored);
      }
      // A bodiless stream's response reacts from onStream's close listener, where it came next
      // anyway; an upload's keeps a listener of its own, after requestBodyOf's (which cuts the body).
      const closes = stream.endAfterHeaders ? watch : undefined;
      // A window that never opens (or a guest that stops reading) stalls only this stream's
      // writes; past the idle limit the stream is reset and its upstream body let go.
      await new Promise<void>((resolve) => {
        down = sendH2Response(stream, response, (error) => {
          finished = true;
          response.cleanup?.();
          if (error !== undefined) resetByUs();
          this.finishRequestBody(stream, resetByUs);
          if (error instanceof GuestLeftFirst) {
            decide({ id, guest: guestName, method, target: target ?? this.loggable(raw, tunnel).target, status: 499, reason: this.leftReason(watch, served, tunnel, stream, state), http: "2", ...resent, started }, auditing ? { bytesUp: up?.bytes ?? 0, bytesDown: 0, ...(trace !== undefined ? { trace } : {}) } : undefined);
            resolve();
            return;
          }
          decide({
            id,
            guest: guestName,
            method,
            target: target ?? this.loggable(raw, tunnel).target,
            status: response.status,
            reason: response.decision.reason,
            rule: response.decision.rule,
            ...(response.decision.source !== undefined ? { source: response.decision.source } : {}),
            redirects: response.redirects,
            http: "2",
            ...resent,
            started,
            ...(error ? { error: this.cutReason(watch, error, served, tunnel, stream, state, response.body) } : {}),
          }, auditing ? { bytesUp: up?.bytes ?? 0, bytesDown: down?.bytes ?? 0, rule: response.decision, ...(trace !== undefined ? { trace } : {}) } : undefined);
          resolve();
        }, cutStalled("read nothing"), auditing, closes);
      });
    } catch (error) {
      // Gone before its answer: the guest's reset, or the proxy's own cut (an upload that stalled,
      // the end of the drain, whose closing of the upstream pools fails what is still waiting).
      // A removed guest's tunnels are closed with it (their close events may come a turn later).
      // A stream closed by now that the proxy did not reset is the guest's reset (or nghttp2's
      // answer to its broken frames), whose close event comes a turn after Node marks it closed:
      // a refusal decided within that turn (HEADERS and RST_STREAM in one write) was logged 403
      // as if sent, and the reset went uncounted, as the refusal's own reset was the proxy's.
      if (abort.aborted || (stream.closed && !watch.ours) || this.deps.drainEnded() || wasRemoved(served)) {
        decide(
          { id, guest: guestName, method, target: target ?? this.loggable(raw, tunnel).target, status: 499, reason: this.leftReason(watch, served, tunnel, stream, state), http: "2", ...resent, started },
          auditing ? { bytesUp: up?.bytes ?? 0, bytesDown: down?.bytes ?? 0, ...(trace !== undefined ? { trace } : {}) } : undefined,
        );
        return;
      }
      const raw502 = asEgressError(error);
      if (raw502.status >= 500 && !(error instanceof EgressError)) this.deps.log.error("internal error", { id, error });
      const err = guestError(raw502, this.deps.redact);
      finished = true;
      const errorBytes = sendH2Error(stream, err, isGrpc(raw));
      // The reset of a stream whose head went out, or the one sendH2Error makes when Node refuses
      // to encode the answer, is ours.
      if (stream.closed || stream.destroyed) resetByUs();
      this.finishRequestBody(stream, resetByUs);
      // The answer is only handed to nghttp2: a refusal decided in the turn its HEADERS arrived
      // goes before the guest's RST_STREAM in the same read is seen, and nghttp2 then drops it
      // unsent. Logged 403 as if delivered, and the reset uncounted (1,000 refused streams reset in
      // under a second, no GOAWAY: black-box finding). The line waits for the stream's close: a
      // reset that is not the proxy's means the guest never got the answer. Only for a request
      // without a body: the close of a stream whose unread body sits in its buffer waits for a
      // read that never comes (Node destroys it at the readable side's end).
      if (!watch.ours && !stream.closed && stream.endAfterHeaders) await closedOrAfter(stream, this.deps.idleMs);
      if (!watch.ours && stream.rstCode !== undefined && stream.rstCode !== h2Codes.noError) {
        decide(
          { id, guest: guestName, method, target: target ?? this.loggable(raw, tunnel).target, status: 499, reason: this.leftReason(watch, served, tunnel, stream, state), http: "2", ...resent, started },
          auditing ? { bytesUp: up?.bytes ?? 0, bytesDown: 0, ...(trace !== undefined ? { trace } : {}) } : undefined,
        );
        return;
      }
      decide({
        id,
        guest: guestName,
        method,
        target: target ?? this.loggable(raw, tunnel).target,
        ...errorFields(err),
        http: "2",
        ...resent,
        started,
      }, auditing ? { bytesUp: up?.bytes ?? 0, bytesDown: errorBytes, ...(trace !== undefined ? { trace } : {}) } : undefined);
    }
  }

  /** Why a stream went before its answer, as the log says it. */
  private leftReason(watch: StreamWatch, guest: Guest | undefined, tunnel: TunnelTarget, stream: ServerHttp2Stream, state: SessionState): string {
    if (watch.cut !== undefined) return watch.cut;
    if (this.deps.drainEnded()) return this.deps.drainCut;
    const cut = unboundCut(tunnel.connection) ?? (wasRemoved(guest) ? removedCut(guest.name) : undefined);
    if (cut !== undefined) return cut;
    if (state.closedFor !== undefined) return `the proxy closed the connection: ${state.closedFor}`;
    if (state.failure !== undefined) return `the connection failed: ${state.failure}`;
    return h2StreamEnd(stream, watch.failure);
  }

  /**
   * Why a response was cut after its head: the proxy's own reason when it cut it (explainCut knows
   * the drain's), whose body failed when one did, or how the stream ended under it. A stream
   * nghttp2 reset for a frame that broke HTTP/2 (a request body past its content-length), or
   * whose session failed, was logged "guest reset the stream", as a guest's own reset is.
   */
  private cutReason(watch: StreamWatch, error: Error, guest: Guest | undefined, tunnel: TunnelTarget, stream: ServerHttp2Stream, state: SessionState, body: Readable | null): Error | string {
    if (watch.cut === undefined) {
      const cut = unboundCut(tunnel.connection) ?? (wasRemoved(guest) ? removedCut(guest.name) : undefined);
      if (cut !== undefined) return `${cut} before the response was complete`;
    }
    if (watch.cut !== undefined) return watch.cut;
    if (error instanceof GuestClosedMidResponse && !this.deps.drainEnded()) return `${this.leftReason(watch, guest, tunnel, stream, state)} before the response was complete`;
    return this.deps.explainCut(error, body);
  }

  /**
   * A request body nobody read (a refusal, a hook that answered) must not keep coming: once the
   * answer is out, RST_STREAM(NO_ERROR) tells the guest to stop sending (RFC 9113 §8.1).
   */
  private finishRequestBody(stream: ServerHttp2Stream, resetByUs: () => void): void {
    if (stream.endAfterHeaders || stream.readableEnded || stream.destroyed) return;
    const close = (): void => {
      if (stream.destroyed || stream.readableEnded) return;
      resetByUs();
      stream.close(h2Codes.noError);
      // Then let go of the stream: Node destroys a closed stream only at its readable side's end,
      // which a body its reader had paused (the pipe to requestBodyOf's body, full) never reached
      // (nor resume() after unpipe(): the end Node pushes at nghttp2's close never came). The
      // stream stayed open for the connection's life, with its buffer, its upload watch and its
      // limits.sourceBufferBytes charge: 227 such answers at the defaults refused every later
      // stream of the source 503 (review finding). The answer is out (writableFinished) and the
      // RST_STREAM queued in the session, so destroying the stream cuts neither. The body's reader
      // learns of the cut from the unpipe (requestBodyOf).
      stream.unpipe();
      stream.destroy();
    };
    if (stream.writableFinished) close();
    else stream.once("finish", close);
  }
}

/** What a stream's one close listener (onStream) needs from its request: whether the proxy reset it, and the request's own reaction. */
interface StreamWatch extends ResponseCloseHook {
  /** Set before the proxy itself resets the stream: such a reset does not count against the guest. */
  ours: boolean;
  onClose: (() => void) | undefined;
  /** Why the proxy cut the stream, when it did (an upload or a download that stalled). */
  cut: string | undefined;
  /** The error Node destroyed the stream with: the session's, or nghttp2's reset of the stream. */
  failure: Error | undefined;
}

/** A stream that arrived while its connection's running work was at its cap (onStream). */
interface WaitingStream {
  readonly stream: ServerHttp2Stream;
  readonly raw: string[];
  readonly watch: StreamWatch;
}

/** Resets the streams still waiting for the running-work cap, which never started: the guest has gone, or the proxy is draining. */
function dropWaiting(state: SessionState, code: number): void {
  for (const { stream, watch } of state.waiting.splice(0)) {
    if (stream.closed || stream.destroyed) continue;
    watch.ours = true;
    stream.close(code);
  }
}

/** Resolves at the stream's close, or after `ms` (a guest whose window stays shut); the timer keeps no process alive. */
function closedOrAfter(stream: ServerHttp2Stream, ms: number): Promise<void> {
  return new Promise<void>((resolve) => {
    const timer = setTimeout(done, ms);
    timer.unref();
    stream.once("close", done);
    function done(): void {
      clearTimeout(timer);
      stream.off("close", done);
      resolve();
    }
  });
}

/**
 * Closes `socket` after `ms`, whatever Node's end of it still waits for; the timer keeps no
 * process alive, and goes with the socket's close. Left in the timer list for idleMs (2 min by
 * default), it held the closed socket and through it the session, its nghttp2 state and HPACK
 * tables: a guest that reconnected 60 times a second kept 7,000 dead connections in memory.
 */
function closeSocketAfter(socket: TLSSocket, ms: number): void {
  if (socket.destroyed) return;
  const timer = setTimeout(() => socket.destroy(), ms);
  timer.unref();
  socket.once("close", () => clearTimeout(timer));
}

/**
 * A PING on a session Node has closed (at the guest's GOAWAY(NO_ERROR)), whose `ping()` cancels
 * at once and sends nothing: the session's native handle, which `ping()` itself calls, still
 * sends one while its streams go on. Without that handle (another Node) nothing is sent, and the
 * PING's deadline closes the session, as for a guest that does not answer.
 */
function pingClosed(session: ServerHttp2Session, onAnswer: () => void): void {
  const key = Object.getOwnPropertySymbols(session).find((symbol) => symbol.description === "kHandle");
  const handle = key === undefined ? undefined : (session as unknown as Record<symbol, { ping?: unknown } | undefined>)[key];
  if (typeof handle?.ping !== "function") return;
  (handle.ping as (payload: undefined, callback: (ack: boolean) => void) => boolean).call(handle, undefined, (ack) => {
    if (ack) onAnswer();
  });
}

/**
 * Closes `socket` once the writes a destroyed session left behind have made no progress for
 * `ms`. Node ends the socket of a session that closed only after its last frames are written,
 * and nothing else watches it (the session is gone, PING with it). Those writes can stall for
 * good: after the guest's FIN, a write that meets its reset fails with EPIPE, and Node's TLS
 * layer (`TLSWrap`) reports that failure to the session but keeps the write marked in progress,
 * so every later write, the session's closing GOAWAY included, waits for ever and the session
 * never ends its socket (nodejs/node#55804 is the same leak seen in production). Reading had
 * stopped at the FIN, so the reset is never read either. The tunnel then stayed open until
 * idleMs: 10 minutes in `http2.test.ts`'s drop test, which failed now and then under load.
 * Progress is what the guest's TCP connection still has queued (`writeQueueSize`, libuv's
 * count): a socket still open with nothing queued, or no less than `ms` before, is stuck.
 */
function closeWhenStalled(socket: TLSSocket, raw: Socket, ms: number): void {
  if (socket.destroyed) return;
  let queued = queuedBytes(raw);
  const timer = setInterval(() => {
    const now = queuedBytes(raw);
    if (now === 0 || now >= queued) socket.destroy();
    queued = now;
  }, ms);
  timer.unref();
  socket.once("close", () => clearInterval(timer));
}

/** Bytes the socket's handle has taken but not yet handed to the kernel; 0 without a handle. */
function queuedBytes(raw: Socket): number {
  return (raw as unknown as { _handle?: { writeQueueSize?: number } | null })._handle?.writeQueueSize ?? 0;
}

/**
 * How a stream the proxy did not reset ended, as the log says it. Node destroys every stream of a
 * session that failed with the session's error (ERR_HTTP2_ERROR: nghttp2 ended the connection for
 * a frame that broke HTTP/2, a stream past SETTINGS_MAX_CONCURRENT_STREAMS, DATA after
 * END_STREAM; or ERR_HTTP2_TOO_MANY_INVALID_FRAMES); a stream reset with an error code (nghttp2's
 * own PROTOCOL_ERROR for a body that does not match its content-length) carries that code. All
 * were logged "guest reset the stream".
 */
function h2StreamEnd(stream: { readonly rstCode: number | undefined }, failure: Error | undefined): string {
  // A stream still pending when its session went is destroyed with ERR_HTTP2_STREAM_CANCEL, the session's error its cause.
  const sessionError = failure !== undefined && isSessionFailure(failure) ? failure : failure?.cause instanceof Error && isSessionFailure(failure.cause) ? failure.cause : undefined;
  if (sessionError !== undefined) return `the connection failed: ${guestBroke(sessionError)}`;
  const rstCode = stream.rstCode;
  if (rstCode === undefined || rstCode === h2Codes.cancel || rstCode === h2Codes.noError) return "guest reset the stream";
  return `the stream was reset (${h2CodeName(rstCode)}): a protocol error on it, nghttp2's answer to a frame that broke HTTP/2 or the guest's own reset`;
}

/**
 * The GOAWAY code for a session nghttp2 ended because the guest sent a header list in more than 8
 * CONTINUATION frames (its answer to CVE-2024-27983, so any list over about 144 KiB at the default
 * frame size, whatever limits.h2HeaderListBytes says, before any stream the proxy could answer
 * 431). Node destroys such a session with INTERNAL_ERROR, which tells the guest the proxy failed.
 * Only the code changes: the destroy is Node's own, within the read.
 */
function guestExcessCode(error: Error | undefined): number | undefined {
  const failure = error as NodeJS.ErrnoException | undefined;
  return failure?.code === "ERR_HTTP2_ERROR" && failure.errno === nghttp2TooManyContinuations ? h2Codes.enhanceYourCalm : undefined;
}

/** NGHTTP2_ERR_TOO_MANY_CONTINUATIONS (nghttp2.h), which Node's http2 constants do not list. */
const nghttp2TooManyContinuations = -905;

/** nghttp2 ended the session for a frame of the guest's, or for too many invalid ones. */
function isSessionFailure(error: Error): boolean {
  const code = (error as NodeJS.ErrnoException).code;
  return code === "ERR_HTTP2_ERROR" || code === "ERR_HTTP2_TOO_MANY_INVALID_FRAMES";
}

function guestBroke(error: Error): string {
  return `the guest broke HTTP/2 (${error.message})`;
}

/** A stream's header fields besides its pseudo-headers, as an HTTP/1.1 head counts its fields. */
function regularFieldCount(raw: readonly string[]): number {
  let count = 0;
  let cookies = false;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.startsWith(":")) continue;
    // A cookie split into crumbs (RFC 9113 §8.2.3) is one field, as it is sent on (h2-request.ts)
    // and as an HTTP/1.1 guest sends it: a browser's 300 crumbs got 431.
    if (name === "cookie") {
      if (cookies) continue;
      cookies = true;
    }
    count++;
  }
  return count;
}

/** The stream's `:method`, as `loggable()` reads it (nghttp2 refuses a repeated one). */
function rawMethod(raw: readonly string[]): string {
  let method = "";
  for (let i = 0; i < raw.length; i += 2) if (raw[i] === ":method") method = raw[i + 1]!;
  return method;
}

/** RFC 9113 §6.5.2: each field counts its name and value octets plus 32. */
function headerListSize(raw: readonly string[]): number {
  let size = 0;
  for (let i = 0; i < raw.length; i += 2) size += raw[i]!.length + raw[i + 1]!.length + 32;
  return size;
}

/** A gRPC request (`content-type: application/grpc*`): the proxy's own answers to it are Trailers-Only. Read only for those. */
function isGrpc(raw: readonly string[]): boolean {
  return /^application\/grpc/i.test(getHeader(raw, "content-type") ?? "");
}

function cutPath(path: string, max = 512): string {
  return path.length > max ? `${path.slice(0, max)}…` : path;
}
