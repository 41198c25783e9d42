import type { ClientHttp2Session } from "node:http2";
import { isIP, type Socket } from "node:net";
import type { SecureContext, TLSSocket } from "node:tls";
import { Pool, buildConnector } from "undici";
import { EgressError } from "../errors.js";
import type { ResolvedAddress } from "./resolve.js";
import { bareHostname, mappedIPv4 } from "../hostname.js";
import { refusedAlpn } from "./h2-connect.js";
import { H2Sessions } from "./h2-sessions.js";
import { defaultWindow, type H2Windows } from "./h2-windows.js";
import { H2Refused, sendOnSession, type H2ExchangeOptions, type H2UpstreamRequest, type H2UpstreamResponse } from "./h2-exchange.js";
import { withFields } from "../objects.js";

export interface PinnedPoolsOptions {
  readonly upstreamContext: SecureContext;
  readonly maxPools: number;
  readonly connectionsPerPool: number;
  readonly connectTimeoutMs: number;
  readonly headersTimeoutMs: number;
  readonly bodyTimeoutMs: number;
  readonly keepAliveTimeoutMs: number;
  /** `timeouts.h2PingMs`: how long the answer to the PING a busy HTTP/2 session is sent every keepAliveTimeoutMs may take (see H2Sessions). */
  readonly h2PingMs: number;
  /** The HTTP/2 sessions' receive windows (`limits.h2StreamWindowBytes`, `limits.h2ConnectionWindowBytes`); RFC 9113's 65,535 bytes each when not given. */
  readonly h2Windows?: H2Windows | undefined;
  /** Judges the connected socket's remote address again; returns a reason to refuse it. */
  readonly recheck: (hostname: string, remote: ResolvedAddress, port: number) => string | undefined;
  /**
   * Told of every upstream connection a pool takes into use (an HTTP/1.1 socket given to undici,
   * or an HTTP/2 session), which emits `close` once it is gone: the open-connections gauge.
   */
  readonly onConnection?: ((protocol: "h1" | "h2", connection: UpstreamConnection) => void) | undefined;
}

/** What {@link PinnedPoolsOptions.onConnection} is given: enough to see the connection end. */
export interface UpstreamConnection {
  once(event: "close", listener: () => void): unknown;
}

/**
 * Textual IPs can differ (`::ffff:1.2.3.4`, `::ffff:102:304` and `1.2.3.4`, zero runs, case);
 * compare what they mean. Never throws: anything unparsable is simply not the same address.
 */
export function sameAddress(a: string, b: string): boolean {
  if (a === b) return true;
  // Node reports a mapped peer as `::ffff:1.2.3.4`; an approved literal is the URL parser's `::ffff:102:304`.
  const strip = (ip: string): string => mappedIPv4(ip) ?? ip;
  const x = strip(a);
  const y = strip(b);
  if (x === y) return true;
  if (isIP(x) !== 6 || isIP(y) !== 6 || x.includes("%") || y.includes("%")) return false;
  try {
    return new URL(`http://[${x}]`).hostname === new URL(`http://[${y}]`).hostname;
  } catch {
    return false;
  }
}

/**
 * undici pools keyed by origin **and** pinned IP. Each pool's connector dials only its pinned
 * address (DNS is never consulted again here, so a rebinding answer cannot redirect it), sets
 * SNI to the hostname itself (undici passes `servername: null` for IP origins), and checks the
 * socket's remote address once connected. The map is bounded; the least recently used pool is
 * closed gracefully when it overflows.
 */
export class PinnedPools {
  private readonly pools = new Map<string, Pool>();
  /** The key last put at the end of {@link pools}: get() need not move it again. */
  private newest: string | undefined;
  /** close() was called: see get(). */
  private retired = false;
  /** stop() was called (the guest was removed): every request from now on gets it, and no connection opens. */
  private refusal: string | undefined;
  private readonly base: buildConnector.connector;
  /** HTTP/2 sessions, and every https origin's ALPN answer (see {@link PinnedPools.h2Session}). */
  private readonly h2: H2Sessions;
  /** The connection that asked an HTTP/1.1 origin its ALPN: its pool's next connect takes it. */
  private readonly spares = new Map<string, TLSSocket>();

  constructor(private readonly options: PinnedPoolsOptions) {
    // allowHalfOpen: an upstream's FIN must not close the socket under a paused parser (see
    // deferEndWhileParserPaused); undici destroys the socket itself once the response is done.
    this.base = buildConnector({ timeout: options.connectTimeoutMs, secureContext: options.upstreamContext, allowHalfOpen: true });
    this.h2 = new H2Sessions({
      upstreamContext: options.upstreamContext,
      timeoutMs: options.connectTimeoutMs,
      check: (remote, family, hostname, port, approved) => this.check(remote, family, hostname, port, approved),
      sessionsPerOrigin: 4,
      streamsPerOrigin: options.connectionsPerPool,
      maxOrigins: options.maxPools * 2,
      idleMs: options.keepAliveTimeoutMs,
      pingMs: options.h2PingMs,
      drainMs: options.headersTimeoutMs,
      windows: options.h2Windows ?? { streamBytes: defaultWindow, connectionBytes: defaultWindow, budgetBytes: defaultWindow },
    });
  }

  private check(remote: string, family: 4 | 6, hostname: string, port: number, approved: string): string | undefined {
    if (!sameAddress(remote, approved)) return `connected to ${remote}, not the approved ${approved}`;
    return this.options.recheck(hostname, { ip: remote, family }, port);
  }

  /**
   * Whether an https origin at this IP is known to speak h2 ("h2"), known to speak only
   * HTTP/1.1 ("h1", the pool as before), or not asked yet (undefined: ask with h2Session).
   */
  protocolOf(origin: URL, address: ResolvedAddress): "h1" | "h2" | undefined {
    if (origin.protocol !== "https:") return "h1";
    return this.h2.protocolOf(this.keyOf(origin, address));
  }

  /** The last key made, what it was made of, and the URL last asked about: see {@link keyOf}. */
  private lastKey: { readonly origin: string; readonly ip: string; readonly key: string; url: URL; href: string } | undefined;

  /**
   * The key of an origin at a pinned IP. Every request asks it two or three times (protocolOf,
   * then get or sendH2), each time of the same URL object, and built anew each time it was a new
   * string to flatten and hash for each map look-up (about 2k instructions each). The last key is
   * handed out again for the same URL object, or for another URL of the same origin at the same
   * IP, so that its hash is computed once. The same object counts only with the same href (the
   * getter's own string, no copy): a URL changed in place is asked anew.
   */
  private keyOf(origin: URL, address: ResolvedAddress): string {
    const last = this.lastKey;
    if (last !== undefined && last.ip === address.ip) {
      const href = origin.href;
      if (last.url === origin && last.href === href) return last.key;
      if (last.origin === origin.origin) {
        last.url = origin;
        last.href = href;
        return last.key;
      }
    }
    const key = keyOf(origin, address);
    this.lastKey = { origin: origin.origin, ip: address.ip, key, url: origin, href: origin.href };
    return key;
  }

  /**
   * An HTTP/2 session to the origin at the pinned IP, on a connection offering ALPN
   * `h2, http/1.1` (pinned, SNI, upstream CA, re-checked like the pools'); undefined when the
   * origin chose HTTP/1.1, whose connection then goes to the pool.
   */
  private async h2Session(origin: URL, address: ResolvedAddress): Promise<ClientHttp2Session | undefined> {
    const key = this.keyOf(origin, address);
    const negotiated = await this.h2.acquire(key, origin, address);
    if (negotiated.protocol === "h2") {
      // acquire() hands out the same session for many streams: it is counted once.
      if (this.options.onConnection !== undefined && !counted.has(negotiated.session)) {
        counted.add(negotiated.session);
        this.options.onConnection("h2", negotiated.session);
      }
      return negotiated.session;
    }
    if (negotiated.socket !== undefined) this.spare(key, negotiated.socket);
    return undefined;
  }

  /**
   * One request over HTTP/2 when the origin at this IP speaks it; undefined when it chose
   * HTTP/1.1 (send it on {@link get}'s pool then). A stream the upstream refused unprocessed
   * (REFUSED_STREAM, or past a GOAWAY's last stream) goes again on another session, twice at
   * most, unless its body was streamed and cannot be sent again.
   */
  async sendH2(
    request: H2UpstreamRequest,
    address: ResolvedAddress,
    signal: H2ExchangeOptions["signal"],
    noBody: boolean,
    maxInformational: number,
  ): Promise<H2UpstreamResponse | undefined> {
    const { url } = request;
    const key = this.keyOf(url, address);
    for (let attempt = 0; ; attempt++) {
      this.refuseIfDestroyed();
      const session = await this.h2Session(url, address);
      if (session === undefined) return undefined;
      if (this.refusal !== undefined) {
        // Stopped while the session was found or opened: the stream was never opened.
        this.h2.release(session, key);
        this.refuseIfDestroyed();
      }
      try {
        return await sendOnSession(session, request, noBody, {
          headersTimeoutMs: this.options.headersTimeoutMs,
          bodyTimeoutMs: this.options.bodyTimeoutMs,
          maxInformational,
          signal,
          done: () => this.h2.release(session, key),
        });
      } catch (error) {
        const replayable = request.body === null || request.body instanceof Uint8Array;
        if (!(error instanceof H2Refused) || !replayable || attempt >= 2 || signal.aborted) throw error;
      }
    }
  }

  private spare(key: string, socket: TLSSocket): void {
    this.spares.get(key)?.destroy();
    this.spares.set(key, socket);
    socket.on("error", () => undefined);
    // Not taken soon (the pool had a connection already): it goes.
    const timer = setTimeout(() => {
      if (this.spares.get(key) === socket) this.spares.delete(key);
      if (!claimed.has(socket)) socket.destroy();
    }, 1_000);
    timer.unref();
  }

  get size(): number {
    return this.pools.size;
  }

  get(origin: URL, address: ResolvedAddress): Pool {
    this.refuseIfDestroyed();
    const key = this.keyOf(origin, address);
    if (this.retired) {
      // A request under way at a reload (a redirect hop, a retry) still goes out on the
      // configuration it started with; its pool closes once that request is done (the caller
      // dispatches in this turn, and close() waits for what was dispatched).
      const pool = this.create(origin, address);
      queueMicrotask(() => void pool.close().catch(() => undefined));
      return pool;
    }
    const found = this.pools.get(key);
    if (found !== undefined) {
      // Moved to the end (the most recently used), unless it is there already.
      if (this.newest !== key) {
        this.pools.delete(key);
        this.pools.set(key, found);
        this.newest = key;
      }
      return found;
    }
    const pool = this.create(origin, address);
    this.pools.set(key, pool);
    this.newest = key;
    if (this.pools.size > this.options.maxPools) {
      const [oldestKey, oldest] = this.pools.entries().next().value as [string, Pool];
      this.pools.delete(oldestKey);
      void oldest.close().catch(() => undefined);
    }
    return pool;
  }

  private create(origin: URL, address: ResolvedAddress): Pool {
    const { base } = this;
    const hostname = bareHostname(origin.hostname);
    const servername = isIP(hostname) === 0 ? hostname : undefined;
    const port = Number(origin.port || (origin.protocol === "https:" ? 443 : 80));
    const { recheck } = this.options;
    const key = keyOf(origin, address);
    const connect: buildConnector.connector = (opts, callback) => {
      // A request queued in a stopped pool that still needs a connection has not gone out.
      if (this.refusal !== undefined) {
        callback(new EgressError("EG_DENIED", 403, this.refusal), null);
        return;
      }
      const spare = this.spares.get(key);
      if (spare !== undefined) {
        this.spares.delete(key);
        if (!spare.destroyed && spare.writable) {
          claimed.add(spare);
          deferEndWhileParserPaused(spare);
          this.options.onConnection?.("h1", spare);
          // undici is not ready for its socket within its own connect call (a connected socket
          // handed over synchronously is never written to): a turn later, as a real connect is.
          setImmediate(() => callback(null, spare));
          return;
        }
      }
      const pinned: buildConnector.Options = withFields(opts, { hostname: address.ip });
      if (servername !== undefined) pinned.servername = servername;
      base(pinned, (error, socket) => {
        if (error !== null) {
          if (refusedAlpn(error)) this.h2.forgetHttp1(key);
          callback(error, null);
          return;
        }
        // Stopped while it connected (undici calls the connector as the request is dispatched):
        // the request has not gone out, and goes nowhere now.
        if (this.refusal !== undefined) {
          socket.destroy();
          callback(new EgressError("EG_DENIED", 403, this.refusal), null);
          return;
        }
        const remote = socket.remoteAddress ?? "";
        let refusal: string | undefined;
        try {
          refusal = sameAddress(remote, address.ip)
            ? recheck(hostname, { ip: remote, family: isIP(remote) === 6 ? 6 : 4 }, port)
            : `connected to ${remote}, not the approved ${address.ip}`;
        } catch (checkError) {
          // This runs inside undici's socket callback: a throw here would be uncaught.
          refusal = `cannot re-check ${remote}: ${(checkError as Error).message}`;
        }
        if (refusal !== undefined) {
          socket.destroy();
          callback(new EgressError("EG_DENIED", 403, `upstream ${origin.host}: ${refusal}`), null);
          return;
        }
        deferEndWhileParserPaused(socket);
        this.options.onConnection?.("h1", socket);
        callback(null, socket);
      });
    };
    return new Pool(origin.origin, {
      connect,
      connections: this.options.connectionsPerPool,
      pipelining: 1,
      keepAliveTimeout: this.options.keepAliveTimeoutMs,
      headersTimeout: this.options.headersTimeoutMs,
      bodyTimeout: this.options.bodyTimeoutMs,
    });
  }

  /**
   * Retires the pools (a reload): each closes once its requests in flight are done, and a
   * request still under way that needs another one gets a pool of its own that closes after it.
   */
  async close(): Promise<void> {
    this.retired = true;
    this.h2.close();
    this.dropSpares();
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.close().catch(() => undefined)));
  }

  /** Ends every connection now, requests in flight with them: the proxy is closing (after its drain). */
  async destroy(): Promise<void> {
    this.h2.destroy();
    this.dropSpares();
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.destroy().catch(() => undefined)));
  }

  /**
   * The guest was removed: from now on every request that asks for a pool or a connection gets
   * `refusal` (403) and nothing goes out, while requests already sent finish on the connections
   * they have, each pool and session closing after its last. Destroyed at once, those requests
   * failed as the upstream's (502 "UND_ERR_DESTROYED: The client is destroyed"), though the
   * README lets a request already under way finish. The guest's requests end by the proxy's
   * drain at the latest, which closes their guests' connections. Resolves once the pools are
   * closed; nobody needs to wait for it.
   */
  async stop(refusal: string): Promise<void> {
    this.refusal ??= refusal;
    this.h2.close(true);
    this.dropSpares();
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.close().catch(() => undefined)));
  }

  private refuseIfDestroyed(): void {
    if (this.refusal !== undefined) throw new EgressError("EG_DENIED", 403, this.refusal);
  }

  private dropSpares(): void {
    for (const socket of this.spares.values()) socket.destroy();
    this.spares.clear();
  }
}

/** Spare sockets a pool has taken: undici owns them from then on. */
const claimed = new WeakSet<Socket>();
/** HTTP/2 sessions already told to onConnection. */
const counted = new WeakSet<ClientHttp2Session>();

function keyOf(origin: URL, address: ResolvedAddress): string {
  return `${origin.protocol}//${origin.host}|${address.ip}`;
}

interface UndiciParser {
  paused: boolean;
  readMore: () => void;
}

function parserOf(socket: Socket): UndiciParser | undefined {
  const key = Object.getOwnPropertySymbols(socket).find((symbol) => symbol.description === "parser");
  return key === undefined ? undefined : (socket as unknown as Record<symbol, UndiciParser | undefined>)[key];
}

/**
 * Works around undici 7.x issue #5360 (fixed in undici 8, which needs Node 22): when a response
 * without Content-Length framing (or with Connection: close) is paused by backpressure (a slow
 * guest) and the upstream then closes, undici's 'end' handler asserts that its parser is not
 * paused, and the AssertionError is uncatchable: one slow guest could bring the proxy down. Here
 * the 'end' handler undici installs is held back until the parser has resumed.
 *
 * The resume is seen at `readMore`, the last thing the parser's `resume()` does, looked up on
 * the instance at each call. Not at `resume` itself: the response body captured that function,
 * bound, when its head arrived, so a replacement was never called, and a close-delimited body
 * whose FIN came while the guest was behind never ended (all bytes sent, no last chunk).
 */
function deferEndWhileParserPaused(socket: Socket): void {
  const on = socket.on.bind(socket);
  socket.on = ((event: string, listener: (...args: unknown[]) => void) => {
    if (event === "close") {
      // A reset can still close the socket under a paused parser: then let undici fail the
      // response (a truncated body for the guest) rather than assert and take the process down.
      return on("close", (...args: unknown[]) => {
        const parser = parserOf(socket);
        if (parser?.paused === true) parser.paused = false;
        listener.apply(socket, args);
      });
    }
    if (event !== "end") return on(event, listener);
    return on("end", (...args: unknown[]) => {
      const parser = parserOf(socket);
      // undici detaches its listeners (by reference, so not this wrapper) when it lets go.
      if (parser === undefined) return;
      if (!parser.paused) {
        listener.apply(socket, args);
        return;
      }
      const readMore = parser.readMore;
      parser.readMore = function (this: UndiciParser) {
        readMore.call(this);
        if (this.paused || socket.destroyed) return;
        parser.readMore = readMore;
        if (parserOf(socket) === this) listener.apply(socket, args);
      };
    });
  }) as typeof socket.on;
}
