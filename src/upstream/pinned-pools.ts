import { isIP, type Socket } from "node:net";
import type { SecureContext } from "node:tls";
import { Pool, buildConnector } from "undici";
import { EgressError } from "../errors.js";
import type { ResolvedAddress } from "./resolve.js";
import { bareHostname } from "../hostname.js";

export interface PinnedPoolsOptions {
  readonly upstreamContext: SecureContext;
  readonly maxPools: number;
  readonly connectionsPerPool: number;
  readonly connectTimeoutMs: number;
  readonly headersTimeoutMs: number;
  readonly bodyTimeoutMs: number;
  readonly keepAliveTimeoutMs: number;
  /** Judges the connected socket's remote address again; returns a reason to refuse it. */
  readonly recheck: (hostname: string, remote: ResolvedAddress, port: number) => string | undefined;
}

/**
 * Textual IPs can differ (`::ffff:1.2.3.4` vs `1.2.3.4`, zero runs, case); compare what they
 * mean. Never throws: anything unparsable is simply not the same address.
 */
export function sameAddress(a: string, b: string): boolean {
  if (a === b) return true;
  const strip = (ip: string): string => (ip.toLowerCase().startsWith("::ffff:") && isIP(ip.slice(7)) === 4 ? ip.slice(7) : ip);
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
  private readonly base: buildConnector.connector;

  constructor(private readonly options: PinnedPoolsOptions) {
    // allowHalfOpen: an upstream's FIN must not close the socket under a paused parser (see
    // deferEndWhileParserPaused); undici destroys the socket itself once the response is done.
    this.base = buildConnector({ timeout: options.connectTimeoutMs, secureContext: options.upstreamContext, allowHalfOpen: true });
  }

  get size(): number {
    return this.pools.size;
  }

  get(origin: URL, address: ResolvedAddress): Pool {
    const key = `${origin.protocol}//${origin.host}|${address.ip}`;
    const found = this.pools.get(key);
    if (found !== undefined) {
      this.pools.delete(key);
      this.pools.set(key, found);
      return found;
    }
    const pool = this.create(origin, address);
    this.pools.set(key, pool);
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
    const connect: buildConnector.connector = (opts, callback) => {
      const pinned: buildConnector.Options = { ...opts, hostname: address.ip };
      if (servername !== undefined) pinned.servername = servername;
      base(pinned, (error, socket) => {
        if (error !== null) {
          callback(error, null);
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

  async close(): Promise<void> {
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.close().catch(() => undefined)));
  }

  async destroy(): Promise<void> {
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.destroy().catch(() => undefined)));
  }
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
