import { isIP } from "node:net";
import { connect as tlsConnect, type SecureContext, type TLSSocket } from "node:tls";
import { afterReads } from "../after-reads.js";
import { EgressError } from "../errors.js";
import { bareHostname } from "../hostname.js";
import type { ResolvedAddress } from "./resolve.js";

export interface AlpnConnectOptions {
  readonly upstreamContext: SecureContext;
  readonly timeoutMs: number;
  /**
   * Judges the connected socket's remote address (that it is the pinned one, and that it is
   * still allowed); returns a reason to refuse it. May throw.
   */
  readonly check: (remote: string, family: 4 | 6, hostname: string, port: number, approved: string) => string | undefined;
}

/** What a guest is told of an upstream that did not finish its TCP and TLS connect in time: the limit by name. */
export function connectTimeoutReason(host: string, timeoutMs: number): string {
  return `upstream ${host} did not connect within ${timeoutMs} ms (timeouts.upstreamConnectMs)`;
}

/**
 * Whether a TLS connection failed because the server accepts none of the protocols offered in
 * ALPN (RFC 7301 §3.2, the no_application_protocol alert): nothing was sent over it.
 */
export function refusedAlpn(error: unknown): boolean {
  return (error as NodeJS.ErrnoException | null | undefined)?.code === "ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL";
}

/**
 * One TLS connection to an approved address offering ALPN `h2, http/1.1`, under the same rules
 * as the pools' connector (pinned-pools.ts): only the pinned IP is dialled, SNI and the
 * certificate check use the hostname, the upstream CA is the pools' own, and the remote address
 * is judged again once connected. The caller reads `alpnProtocol` to choose the client.
 */
export function connectAlpn(origin: URL, address: ResolvedAddress, options: AlpnConnectOptions): Promise<TLSSocket> {
  const hostname = bareHostname(origin.hostname);
  const port = Number(origin.port || 443);
  return new Promise((resolve, reject) => {
    const socket = tlsConnect({
      host: address.ip,
      port,
      secureContext: options.upstreamContext,
      ...(isIP(hostname) === 0 ? { servername: hostname } : {}),
      ALPNProtocols: ["h2", "http/1.1"],
      // As undici's own connector is set up in pinned-pools.ts: this socket may become a pool's.
      // (tls.connect takes net's options; its types leave this one out.)
      ...({ allowHalfOpen: true } as object),
    });
    // The cause carries undici's code, so the pipeline moves on to the next approved address as it does for the pools.
    // Judged after the turn's reads: a server's handshake that came while the proxy was held (a
    // starved host, a long parse) completes in that poll rather than being cut as late.
    let settled = false;
    const timer = setTimeout(
      () =>
        afterReads(() => {
          if (settled) return;
          const cause = Object.assign(new Error(`connect timeout after ${options.timeoutMs} ms`), { code: "UND_ERR_CONNECT_TIMEOUT" });
          socket.destroy(new EgressError("EG_UPSTREAM_TIMEOUT", 504, connectTimeoutReason(origin.host, options.timeoutMs), { cause }));
        }),
      options.timeoutMs,
    );
    const onError = (error: Error): void => {
      settled = true;
      clearTimeout(timer);
      reject(error);
    };
    socket.once("error", onError);
    socket.once("secureConnect", () => {
      settled = true;
      clearTimeout(timer);
      socket.off("error", onError);
      const remote = socket.remoteAddress ?? "";
      let refusal: string | undefined;
      try {
        refusal = options.check(remote, isIP(remote) === 6 ? 6 : 4, hostname, port, address.ip);
      } catch (error) {
        refusal = `cannot re-check ${remote}: ${(error as Error).message}`;
      }
      if (refusal !== undefined) {
        socket.destroy();
        reject(new EgressError("EG_DENIED", 403, `upstream ${origin.host}: ${refusal}`));
        return;
      }
      socket.setNoDelay(true);
      socket.setKeepAlive(true, 60_000);
      resolve(socket);
    });
  });
}
