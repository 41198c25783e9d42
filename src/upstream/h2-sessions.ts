import { connect as h2Connect, constants as h2constants, type ClientHttp2Session, type ClientHttp2Stream } from "node:http2";
import type { TLSSocket } from "node:tls";
import { afterReads } from "../after-reads.js";
import { EgressError } from "../errors.js";
import type { AlpnConnectOptions } from "./h2-connect.js";
import { H2SessionLost, type H2LossKind } from "./h2-close-reason.js";
import { connectAlpn } from "./h2-connect.js";
import { defaultWindow, raiseConnectionWindow, type H2Windows } from "./h2-windows.js";
import { WindowShare, windowShares } from "./h2-window-share.js";
import { goawayLastStream, sessionBodyBytes, sessionStreams } from "./h2-exchange.js";
import type { ResolvedAddress } from "./resolve.js";

export interface H2SessionsOptions extends AlpnConnectOptions {
  /** Sessions per origin and pinned IP at least; streams beyond them share the least busy one. */
  readonly sessionsPerOrigin: number;
  /**
   * Streams per origin and pinned IP that may run before a stream waits for a slot: more sessions
   * open, past `sessionsPerOrigin`, while the ones there are full (the HTTP/1.1 pool's connection cap).
   */
  readonly streamsPerOrigin: number;
  /** Origins whose ALPN answer is remembered (least recently used first out). */
  readonly maxOrigins: number;
  /** A session silent this long with no stream is closed; one with streams is sent a PING this often (and as it is reused). */
  readonly idleMs: number;
  /** `timeouts.h2PingMs`: how long the answer to that PING may take before the session is given up. */
  readonly pingMs: number;
  /**
   * How long the answer may take, from the proxy's last write to the session, once more request
   * body than an upstream's default window has gone out since the upstream last answered one
   * (`timeouts.upstreamHeadersMs`: see watchLiveness).
   */
  readonly drainMs: number;
  /** The sessions' receive windows: what one response may send ahead of its reader, and the whole connection. */
  readonly windows: H2Windows;
}

/** What a first connection to an origin found out: h2 (a session), or HTTP/1.1 (the connected socket, for undici). */
export type Negotiated =
  | { readonly protocol: "h2"; readonly session: ClientHttp2Session }
  /** `socket` is the connection that asked, for the first caller only; the others let the pool connect. */
  | { readonly protocol: "h1"; readonly socket: TLSSocket | undefined };

interface Entry {
  readonly session: ClientHttp2Session;
  /** Streams handed out (acquire) and not yet ended (release), whether or not Node has sent them. */
  active: number;
  /** close() retired the session while it had streams: it closes when the last one ends. */
  retiring: boolean;
  /** Called as acquire() puts a stream on the session again (watchLiveness: a PING at reuse). */
  reused: () => void;
}

/** How long after the upstream's FIN a session's streams are judged (see H2Sessions.upstreamEnded). */
const finGraceMs = 100;

/** Sessions whose connection the upstream ended, or that stopped answering: they take no new streams. */
const ended = new WeakSet<ClientHttp2Session>();

/** Each session's stream count, whether or not its origin's list still holds it (a GOAWAY, a reload's close()). */
const entryOf = new WeakMap<ClientHttp2Session, Entry>();

/** A session reused is sent a PING at most this often (watchLiveness). */
const reusePingMs = 1_000;

/** Node's default when the peer has not said: RFC 9113 §6.5.2 recommends at least 100. */
const defaultPeerStreams = 100;

/**
 * `node:http2` client sessions per origin **and** pinned IP, on connections made by
 * {@link connectAlpn} (pinned, SNI, upstream CA, re-checked). The ALPN answer is cached per key,
 * so an HTTP/1.1 origin pays for the question once and stays on undici afterwards.
 *
 * undici 7's own h2 client is not used: it loses response trailers and can end a paused body
 * early without an error.
 */
export class H2Sessions {
  private readonly alpn = new Map<string, "h1" | "h2">();
  private readonly sessions = new Map<string, Entry[]>();
  /** Every session not yet closed, those that take no new streams too (after a GOAWAY or a FIN). */
  private readonly unclosed = new Set<ClientHttp2Session>();
  private readonly connecting = new Map<string, Promise<Negotiated>>();
  /** destroy() or close(true) was called: the guest or the proxy is gone, and nothing new is opened. */
  private destroyed = false;

  constructor(private readonly options: H2SessionsOptions) {}

  /** The cached ALPN answer for a key; undefined until a connection has asked. */
  protocolOf(key: string): "h1" | "h2" | undefined {
    return this.alpn.get(key);
  }

  /**
   * A session with room for one more stream, opening one when none has room (and the key has
   * fewer than `sessionsPerOrigin`). When the origin answers `http/1.1`, that connection comes
   * back instead, for the HTTP/1.1 pool to use.
   */
  async acquire(key: string, origin: URL, address: ResolvedAddress): Promise<Negotiated> {
    const entries = this.live(key);
    // A session whose upstream says SETTINGS_MAX_CONCURRENT_STREAMS 0 takes no new stream (RFC
    // 9113 §5.1.2): Node would hold one unsent until the limit rises, its request waiting for its
    // head timeout.
    let best: Entry | undefined;
    for (const entry of entries) if (peerStreams(entry.session) > 0 && (best === undefined || entry.active < best.active)) best = entry;
    // Downloads nobody reads hold their streams: with a fixed 4 sessions, 4 × the upstream's
    // SETTINGS_MAX_CONCURRENT_STREAMS of them made every other request to the origin wait.
    if (best !== undefined && (best.active < peerStreams(best.session) || entries.length >= this.sessionCap(best.session))) {
      const session = this.claim(best);
      best.reused();
      return { protocol: "h2", session };
    }
    // Every session says 0. New ones would too (a request each got a connection of its own, to
    // 1,024 of them, only the stream sent before the upstream's SETTINGS arrived getting
    // through): `sessionsPerOrigin` of them, then 502 until the upstream raises its limit.
    if (best === undefined && entries.length >= this.options.sessionsPerOrigin) {
      throw new EgressError("EG_UPSTREAM", 502, `upstream ${origin.host} accepts no streams: its HTTP/2 connections say SETTINGS_MAX_CONCURRENT_STREAMS 0`);
    }
    // Concurrent first requests share one connection attempt.
    let pending = this.connecting.get(key);
    if (pending === undefined) {
      pending = this.open(key, origin, address).finally(() => this.connecting.delete(key));
      this.connecting.set(key, pending);
      const negotiated = await pending;
      if (negotiated.protocol === "h1") return negotiated;
      const entry = this.live(key).find((e) => e.session === negotiated.session);
      return { protocol: "h2", session: entry === undefined ? negotiated.session : this.claim(entry) };
    }
    const negotiated = await pending;
    // The socket of an HTTP/1.1 answer belongs to the caller that asked; the others go to undici.
    if (negotiated.protocol === "h1") return { protocol: "h1", socket: undefined };
    return this.acquire(key, origin, address);
  }

  /** Sessions an origin may have: enough for `streamsPerOrigin` streams at the upstream's limit, and at least `sessionsPerOrigin`. */
  private sessionCap(session: ClientHttp2Session): number {
    return Math.max(this.options.sessionsPerOrigin, Math.ceil(this.options.streamsPerOrigin / Math.max(1, peerStreams(session))));
  }

  /** Marks a stream as ended on its session: an idle session may then close, and a retired one does. */
  release(session: ClientHttp2Session, _key: string): void {
    const entry = entryOf.get(session);
    if (entry === undefined || entry.active === 0) return;
    entry.active -= 1;
    if (entry.active === 0 && entry.retiring && !session.closed && !session.destroyed) session.close();
  }

  private claim(entry: Entry): ClientHttp2Session {
    entry.active += 1;
    return entry.session;
  }

  /** Sessions still taking new streams (not closed, not draining after a GOAWAY). */
  private live(key: string): Entry[] {
    const entries = this.sessions.get(key);
    if (entries === undefined) return [];
    const live = entries.filter((e) => !e.session.closed && !e.session.destroyed && !goawayLastStream.has(e.session) && !ended.has(e.session));
    if (live.length !== entries.length) {
      if (live.length === 0) this.sessions.delete(key);
      else this.sessions.set(key, live);
    }
    return live;
  }

  private async open(key: string, origin: URL, address: ResolvedAddress): Promise<Negotiated> {
    const socket = await connectAlpn(origin, address, this.options);
    const protocol = socket.alpnProtocol === "h2" ? "h2" : "h1";
    this.remember(key, protocol);
    if (protocol === "h1" || this.destroyed) {
      if (this.destroyed) socket.destroy();
      return { protocol: "h1", socket };
    }
    const session = h2Connect(origin.origin, {
      createConnection: () => socket,
      // Node's 65,535-byte windows held a response to 64 KiB per round trip: from an upstream
      // 20 ms away, 63–73× the HTTP/1.1 time, and 16–18× in the soak's mix on loopback, where the
      // round trip is the proxy's event loop (docs/performance.md, "HTTP/2 flow-control windows").
      // The stream window is also the most a response whose guest stopped reading puts in memory.
      settings: { enablePush: false, initialWindowSize: this.options.windows.streamBytes },
      // Responses are streamed through, never held: the same bound as the guest side.
      maxSessionMemory: 10,
    });
    session.on("error", () => undefined);
    raiseConnectionWindow(session, this.options.windows.connectionBytes);
    // Responses whose guests stopped reading hold what their windows let in: the streams share
    // `limits.h2ConnectionBufferBytes` (WindowShare). An upstream that leaves a lowered window
    // unacknowledged keeps sending by the old one: the session takes no new streams and closes
    // once those in flight end. Retired, not cut: the acknowledgement may only be late (queued
    // behind megabytes of DATA on a slow link, or unread while the proxy was paused), and what
    // the streams in flight hold is bounded by the windows they had (review finding: giving the
    // session up cut every response on it).
    windowShares.set(
      session,
      new WindowShare(session, {
        streamBytes: this.options.windows.streamBytes,
        budgetBytes: this.options.windows.budgetBytes,
        ackMs: this.options.pingMs,
        onUnacknowledged: () => {
          const entry = entryOf.get(session);
          if (entry === undefined || session.closed || session.destroyed) return;
          entry.retiring = true;
          ended.add(session);
          this.live(key);
          if (entry.active === 0) session.close();
        },
      }),
    );
    // A session that received GOAWAY takes no new streams (live()). A graceful shutdown sends two,
    // the first with the highest id: the lowest counts.
    session.on("goaway", (_code: number, lastStreamID: number) => {
      goawayLastStream.set(session, Math.min(lastStreamID, goawayLastStream.get(session) ?? lastStreamID));
    });
    // connectAlpn opens sockets half-open, as undici's pools want them, and an http2 session
    // never learns on its own that the upstream ended such a socket (a crash, a restart, a cut
    // connection, or a close after its last response). The FIN is acted on here instead of by
    // closing the socket, which would have Node destroy every stream, and with them responses
    // that had arrived whole but were not read yet (a hook holding one, a slower guest).
    socket.once("end", () => this.upstreamEnded(key, session));
    this.unclosed.add(session);
    session.once("close", () => {
      this.unclosed.delete(session);
      this.live(key);
    });
    const entry: Entry = { session, active: 0, retiring: false, reused: () => undefined };
    entryOf.set(session, entry);
    // Idle: closed once silent for idleMs with no stream. Node's setTimeout(ms, callback) listens
    // once: this listener stays, and each call re-arms.
    session.on("timeout", () => {
      if (session.destroyed) return;
      session.setTimeout(this.options.idleMs);
      if (entry.active === 0 && !ended.has(session)) session.close();
    });
    session.setTimeout(this.options.idleMs);
    this.watchLiveness(key, session, socket, entry);
    const entries = this.sessions.get(key) ?? [];
    entries.push(entry);
    this.sessions.set(key, entries);
    return { protocol: "h2", session };
  }

  /**
   * While the session has streams, it is sent a PING every `idleMs`, and given up if an answer
   * takes `pingMs`: once nghttp2 has found a frame it cannot take (a DATA frame over the frame
   * size, DATA before HEADERS, a broken header block) it sends GOAWAY and stops reading, and Node
   * never learns. The response under way waited for upstreamBodyMs (2 minutes by default), and
   * every request to the origin went to the same dead session (black-box finding). A timer of
   * its own, not the session's: Node refreshes that one on what the proxy sends too, so steady
   * requests to a dead session kept it from ever being asked (review finding). The cost is one
   * PING per busy session every `idleMs`, and one at most every {@link reusePingMs} as streams are
   * put on a session again: every request put on a dead session waited the interval and `pingMs`
   * (4 s and 10 s at the defaults) for its 502 or its second try (fuzzer finding), where a PING
   * nghttp2 holds unsent gives the session up in the turn after it was sent.
   *
   * The PING goes out behind what the proxy wrote before it: an upload's DATA, in nghttp2's queue,
   * the socket's and the kernel's buffers. Over a slow uplink to an upstream with large
   * flow-control windows (nothing comes back while it reads), the answer took longer than
   * `pingMs`, and a healthy upload was given up (black-box finding: 4 MiB at 200 KiB/s, 502 at
   * 14 s; HTTP/1.1 took it in 21 s). So any byte read from the upstream is an answer; and since
   * what sits in the kernel's buffers drains unseen (counting the proxy's own writes was tried:
   * a whole upload leaves the process within seconds), once more request body than an upstream's
   * default window has gone out since the upstream last answered a PING (with the default
   * window, its WINDOW_UPDATEs would have been answers), the wait from the PING is `drainMs`: the
   * bound an upload's own stream has anyway (upstreamHeadersMs). An upload whose kernel buffers
   * take longer than that to drain, to an upstream that sends nothing back, is still given up.
   */
  private watchLiveness(key: string, session: ClientHttp2Session, socket: TLSSocket, entry: Entry): void {
    /** The PING waiting for its answer, if any. */
    let round: { deadline: NodeJS.Timeout | undefined } | undefined;
    /** Request body bytes sent on the session before the last PING the upstream answered. */
    let confirmed = 0;
    const bodySent = (): number => sessionBodyBytes.get(session)?.sent ?? 0;
    /** When the last PING went out (performance.now()). */
    let pinged = -Infinity;
    const probe = (): void => {
      // A session Node has closed (it does so itself at the upstream's GOAWAY(NO_ERROR), whose
      // streams up to its last stream id go on) sends no PING: Node cancels it unsent, and the
      // deadline gave up a live upstream's streams as "the proxy's PING never went out". A
      // graceful shutdown (a reload, a rotated connection) cut every response that was silent for
      // `pingMs` within 4 s of it, a long poll or a gRPC stream (black-box finding). Such streams
      // are left to upstreamHeadersMs and upstreamBodyMs, as on an HTTP/1.1 connection.
      if (session.destroyed || session.closed || entry.active === 0 || round !== undefined) return;
      const current: { deadline: NodeJS.Timeout | undefined } = { deadline: undefined };
      round = current;
      const sentBefore = bodySent();
      const read = socket.bytesRead;
      const written = socket.bytesWritten;
      const sent = performance.now();
      pinged = sent;
      const answered = (): void => {
        clearTimeout(current.deadline);
        if (round === current) round = undefined;
      };
      const check = (): void => {
        if (session.destroyed || round !== current) return;
        if (socket.bytesRead !== read) {
          answered();
          return;
        }
        const allowed = bodySent() - confirmed > defaultWindow ? Math.max(this.options.drainMs, this.options.pingMs) : this.options.pingMs;
        const left = sent + allowed - performance.now();
        if (left > 0) {
          current.deadline = setTimeout(afterReads, Math.min(left, this.options.pingMs), check);
          current.deadline.unref();
          return;
        }
        // nghttp2 writes nothing more once it has ended the session on a frame it could not take:
        // then the PING never left, and what the upstream sent may have been a stream's response.
        if (socket.bytesWritten === written) this.giveUp(key, session, "the upstream's HTTP/2 connection stopped (the proxy's PING never went out: its HTTP/2 client had refused a frame from the upstream, or the connection took no more bytes)", "stopped");
        else this.giveUp(key, session, "the upstream's HTTP/2 connection stopped answering (no answer to a PING)", "unanswered");
      };
      // Judged after that turn's reads (afterReads): once the proxy has been paused past the
      // deadline, its timer fires before the poll that reads the answer.
      current.deadline = setTimeout(afterReads, this.options.pingMs, check);
      current.deadline.unref();
      /** Node took the PING (it refuses one past its limit of unanswered ones): only then can it be held. */
      let queued = false;
      try {
        // An error is a PING cancelled by the session's own end, which the deadline outlives.
        queued = session.ping((error) => {
          if (error !== null) return;
          confirmed = Math.max(confirmed, sentBefore);
          answered();
        });
      } catch {
        // Too many unanswered already, or the session is going: the deadline decides.
      }
      // nghttp2 that has ended the session on a frame it could not take (bad padding, DATA where
      // CONTINUATION was due, a broken header block) has sent GOAWAY and from then on neither
      // reads nor writes, and Node tells JavaScript nothing (no error, no close, no frameError):
      // the PING stays in its queue. A live session has written it by the immediate after
      // (Node's own write is a native immediate, run first), unless an earlier write is still
      // under way (an upload into full kernel buffers: the socket's writeQueueSize), which the
      // deadline above judges. Looked at again a turn later, so that a write completing in
      // between has had its chance.
      const held = (): boolean => queued && !session.destroyed && round === current && socket.bytesWritten === written && socket.bytesRead === read && holdsUnsent(session, socket);
      setImmediate(() => {
        if (!held()) return;
        setImmediate(() => {
          if (held()) this.giveUp(key, session, "the proxy's HTTP/2 client had ended the connection on a frame from the upstream it could not take (its PING stayed unsent)", "stopped");
        });
      });
    };
    const interval = setInterval(probe, this.options.idleMs);
    interval.unref();
    // A stream put on a session nghttp2 has ended sits unsent until the PING above (every idleMs,
    // then pingMs) gives the session up: a PING at reuse, judged as soon as it is held, finds it
    // out before the stream waits. At most one a second: one PING each way per busy session.
    entry.reused = () => {
      if (performance.now() - pinged >= reusePingMs) probe();
    };
    session.once("close", () => {
      clearInterval(interval);
      clearTimeout(round?.deadline);
    });
  }

  /** The session takes no new stream, and its streams are settled (settleEnded). */
  private giveUp(key: string, session: ClientHttp2Session, reason: string, kind: H2LossKind): void {
    ended.add(session);
    this.live(key);
    this.settleEnded(session, reason, kind);
  }

  /**
   * The upstream ended the session's connection: no new streams on it. Node may not have handed
   * everything it read before the FIN to the streams yet (it pauses its input while it writes,
   * and a burst of a body, END_STREAM and the FIN is read at once), so the streams are judged a
   * moment later ({@link finGraceMs}, and one more turn of the event loop).
   */
  private upstreamEnded(key: string, session: ClientHttp2Session): void {
    ended.add(session);
    this.live(key);
    const timer = setTimeout(() => setImmediate(() => this.settleEnded(session, "the upstream closed the connection before the end of the response", "ended")), finGraceMs);
    session.once("close", () => clearTimeout(timer));
  }

  /**
   * A stream still waiting for its head (502) or for the end of its body (cut) fails; one that
   * has closed cleanly (END_STREAM both ways: its whole response is in its buffer) stays
   * readable, and the session is destroyed once the last of those is read (or its reader goes:
   * the guest's idleMs and the hooks' limits bound that). `kind`: why; a stream that got nothing
   * of its response may go again elsewhere after a PING went unanswered, or after the upstream's
   * FIN when the stream was not the session's first (closedBeforeResponse).
   */
  private settleEnded(session: ClientHttp2Session, reason: string, kind: H2LossKind): void {
    if (session.destroyed) return;
    const whole: ClientHttp2Stream[] = [];
    for (const stream of sessionStreams.get(session) ?? []) {
      if (stream.closed && stream.rstCode === 0) whole.push(stream);
      // HEADERS nghttp2 never sent (the stream is still idle: the session had ended, or the
      // upstream's FIN came first): the upstream never saw the request, which may go again
      // (H2Refused), whatever its method. Destroyed with the others, a GET put on a session
      // nghttp2 had ended got 502 unless a stream sent earlier was destroyed first (its reset
      // made nghttp2 refuse the held HEADERS).
      else if (stream.state.state === h2constants.NGHTTP2_STREAM_STATE_IDLE) stream.close(h2constants.NGHTTP2_REFUSED_STREAM);
      else stream.destroy(new H2SessionLost(reason, kind));
    }
    let left = whole.length;
    if (left === 0) session.destroy();
    for (const stream of whole) {
      stream.once("close", () => {
        if (--left === 0) session.destroy();
      });
    }
  }

  /**
   * Forgets an "h1" answer once the origin refused HTTP/1.1 in a later handshake (TLS alert
   * no_application_protocol): its server was replaced on the same port by one that speaks only
   * h2, a gRPC server say. The answer had no expiry, and the pool's connector offers only
   * http/1.1, so every request got 502 until a reload (black-box finding). The next request asks
   * ALPN again.
   */
  forgetHttp1(key: string): void {
    if (this.alpn.get(key) === "h1") this.alpn.delete(key);
  }

  private remember(key: string, protocol: "h1" | "h2"): void {
    this.alpn.delete(key);
    this.alpn.set(key, protocol);
    if (this.alpn.size > this.options.maxOrigins) this.alpn.delete(this.alpn.keys().next().value as string);
  }

  /**
   * Each session closes once its streams in flight have finished (a reload retiring a guest's
   * pools: requests under way keep the configuration they started with). Those requests may
   * still need sessions (a redirect, a retry): one opened from now on closes when idle, as any
   * session does.
   *
   * A session with streams handed out is closed only when the last of them ends (release), not
   * now: a stream given its session a few microtasks ago may not be open yet (Node refuses it on
   * a closed session), or open with its HEADERS still unsent (Node sends them in its next write,
   * after the GOAWAY a close() queues, and nghttp2 then refuses a new stream on a session with no
   * other active one: REFUSED_STREAM). A bodiless request went again on another session; an
   * upload, its body already streaming in, failed with 502 (black-box finding: SIGHUPs under
   * small POSTs to an h2 upstream).
   *
   * `final` (the guest was removed): no session is opened from now on either; a connection whose
   * ALPN answer comes later is closed.
   */
  close(final = false): void {
    // A guest removed: nothing new is opened, as after destroy(); what is under way finishes.
    if (final) this.destroyed = true;
    for (const session of this.unclosed) {
      const entry = entryOf.get(session);
      if (entry !== undefined && entry.active > 0) entry.retiring = true;
      else if (!session.closed) session.close();
    }
    this.sessions.clear();
  }

  /** Closes every session at once (streams in flight are cut): the proxy or the guest is going away. */
  destroy(): void {
    this.destroyed = true;
    for (const session of this.unclosed) session.destroy();
    this.sessions.clear();
  }
}

/**
 * Whether nghttp2 holds frames it has not written while the socket has no write under way: a
 * live session writes what it queued by its next turn (see watchLiveness). `writeQueueSize` is
 * the TLS handle's count of bytes still being written, which Node's own net code reads; a Node
 * without it is never judged so (the PING's deadline still is).
 */
function holdsUnsent(session: ClientHttp2Session, socket: TLSSocket): boolean {
  const writing = (socket as unknown as { _handle?: { writeQueueSize?: unknown } | null })._handle?.writeQueueSize;
  return typeof writing === "number" && writing === 0 && (session.state.outboundQueueSize ?? 0) > 0;
}

function peerStreams(session: ClientHttp2Session): number {
  return session.remoteSettings.maxConcurrentStreams ?? defaultPeerStreams;
}
