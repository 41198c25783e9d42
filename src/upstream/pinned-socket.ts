import { connect as netConnect, isIP, type Socket } from "node:net";
import { connect as tlsConnect, type SecureContext } from "node:tls";
import { EgressError } from "../errors.js";
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
    const timer = setTimeout(() => socket.destroy(new EgressError("EG_UPSTREAM_TIMEOUT", 504, `upstream ${url.host} did not connect in time`)), options.timeoutMs);
    socket.once("error", (error) => {
      clearTimeout(timer);
      reject(error);
    });
    socket.once(url.protocol === "https:" ? "secureConnect" : "connect", () => {
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
