import { connect as netConnect, isIP, type Socket } from "node:net";
import { connect as tlsConnect, type SecureContext } from "node:tls";
import { afterReads } from "../after-reads.js";
import { EgressError } from "../errors.js";
import { connectTimeoutReason } from "./h2-connect.js";
import { sameAddress } from "./pinned-pools.js";
import type { ResolvedAddress } from "./resolve.js";
import { bareHostname } from "../hostname.js";

export interface PinnedSocketOptions {
  readonly url: URL;
  readonly address: ResolvedAddress;
  readonly upstreamContext: SecureContext;
  readonly timeoutMs: number;
  /** Judges the connected socket's remote address again; returns a reason to refuse it. */
  readonly recheck: (hostname: string, remote: ResolvedAddress, port: number) => string | undefined;
}

/**
 * One raw connection to an approved address, for protocols that leave HTTP after the handshake
 * (WebSocket). Same rules as the pools: dial only the pinned IP, SNI and certificate checks for
 * the hostname, and the remote address checked again once connected.
 */
export function connectPinned(options: PinnedSocketOptions): Promise<Socket> {
  const { url, address } = options;
  const hostname = bareHostname(url.hostname);
  const port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
  return new Promise((resolve, reject) => {
    const socket: Socket =
      url.protocol === "https:"
        ? tlsConnect({
            host: address.ip,
            port,
            secureContext: options.upstreamContext,
            // Node checks the certificate against servername when set (the hostname), else host.
            ...(isIP(hostname) === 0 ? { servername: hostname } : {}),
            ALPNProtocols: ["http/1.1"],
          })
        : netConnect({ host: address.ip, port });
    // Judged after the turn's reads, as connectAlpn's (h2-connect.ts).
    let settled = false;
    const timer = setTimeout(
      () =>
        afterReads(() => {
          if (!settled) socket.destroy(new EgressError("EG_UPSTREAM_TIMEOUT", 504, connectTimeoutReason(url.host, options.timeoutMs)));
        }),
      options.timeoutMs,
    );
    socket.once("error", (error) => {
      settled = true;
      clearTimeout(timer);
      reject(error);
    });
    socket.once(url.protocol === "https:" ? "secureConnect" : "connect", () => {
      settled = true;
      clearTimeout(timer);
      const remote = socket.remoteAddress ?? "";
      const refusal = sameAddress(remote, address.ip)
        ? options.recheck(hostname, { ip: remote, family: isIP(remote) === 6 ? 6 : 4 }, port)
        : `connected to ${remote}, not the approved ${address.ip}`;
      if (refusal !== undefined) {
        socket.destroy();
        reject(new EgressError("EG_DENIED", 403, `upstream ${url.host}: ${refusal}`));
        return;
      }
      resolve(socket);
    });
  });
}
