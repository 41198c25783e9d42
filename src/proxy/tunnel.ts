import type { Server } from "node:http";
import type { Socket } from "node:net";
import { TLSSocket, type SecureContext } from "node:tls";
import type { Logger } from "../log.js";
import type { LeafCertCache } from "../tls/leaf-cert-cache.js";
import type { Authority } from "./authority.js";
import { normalizeHost } from "./authority.js";
import type { TunnelTarget } from "./guest-request.js";
import { bareHostname } from "../hostname.js";

const tunnelKey = Symbol("egressgate.tunnel");

interface TunnelSocket {
  [tunnelKey]?: TunnelTarget;
}

/** The CONNECT target a socket inside a tunnel belongs to; undefined for plain proxy sockets. */
export function tunnelOf(socket: Socket): TunnelTarget | undefined {
  return (socket as TunnelSocket)[tunnelKey];
}

export interface TunnelDeps {
  readonly inner: Server;
  readonly leaves: LeafCertCache;
  readonly log: Logger;
  readonly handshakeMs: number;
}

const tlsHandshakeRecord = 0x16;

/**
 * After `200 Connection Established`, the first bytes decide: a TLS handshake record is
 * terminated with our leaf, an HTTP request line is parsed as plain HTTP, and anything else
 * (SSH, a raw protocol) is closed, because it cannot be inspected.
 */
export function serveTunnel(socket: Socket, head: Buffer, target: Authority, deps: TunnelDeps): void {
  const deadline = setTimeout(() => socket.destroy(), deps.handshakeMs);
  deadline.unref();
  socket.once("close", () => clearTimeout(deadline));
  let buffered = head;
  const decide = (): boolean => {
    const kind = sniff(buffered);
    if (kind === "more") return false;
    socket.pause();
    socket.unshift(buffered);
    if (kind === "tls") void terminateTls(socket, target, deps, deadline);
    else if (kind === "http") servePlain(socket, target, deps, deadline);
    else {
      deps.log.info("tunnel closed", { target: `${target.hostname}:${target.port}`, reason: "neither TLS nor HTTP" });
      socket.destroy();
    }
    return true;
  };
  if (buffered.length > 0 && decide()) return;
  const onData = (chunk: Buffer): void => {
    buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
    if (decide()) socket.off("data", onData);
  };
  socket.on("data", onData);
  socket.resume();
}

/** A request line may arrive in pieces (`GET` then ` / HTTP/1.1`): wait until it can be told. */
function sniff(bytes: Buffer): "tls" | "http" | "other" | "more" {
  if (bytes.length === 0) return "more";
  if (bytes[0] === tlsHandshakeRecord) return "tls";
  const start = bytes.subarray(0, 17).toString("latin1");
  if (/^[A-Z]{3,16} /.test(start)) return "http";
  return /^[A-Z]{0,16}$/.test(start) && bytes.length < 17 ? "more" : "other";
}

function servePlain(socket: Socket, target: Authority, deps: TunnelDeps, deadline: NodeJS.Timeout): void {
  clearTimeout(deadline);
  (socket as TunnelSocket)[tunnelKey] = { ...target, protocol: "http:" };
  // The HTTP server reads straight from the socket's handle when it can, which would skip the
  // bytes we unshifted while sniffing. Marking the handle consumed keeps it on the stream path.
  const handle = (socket as unknown as { _handle?: { _consumed?: boolean } })._handle;
  if (handle) handle._consumed = true;
  deps.inner.emit("connection", socket);
  socket.resume();
}

/** An SNI of `host:port` (sent by some Go programs) names just `host`. */
function sniHostname(servername: string): string {
  const colon = servername.lastIndexOf(":");
  return colon > 0 && !servername.includes("]") ? servername.slice(0, colon) : servername;
}


async function terminateTls(socket: Socket, target: Authority, deps: TunnelDeps, deadline: NodeJS.Timeout): Promise<void> {
  let context: SecureContext;
  try {
    context = await deps.leaves.get(bareHostname(target.hostname));
  } catch (error) {
    deps.log.error("leaf certificate failed", { host: target.hostname, error });
    socket.destroy();
    return;
  }
  if (socket.destroyed) return;
  const tunnel: { -readonly [K in keyof TunnelTarget]: TunnelTarget[K] } = { ...target, protocol: "https:" };
  const tlsSocket = new TLSSocket(socket, {
    isServer: true,
    secureContext: context,
    // ALPN leaves room for h2 later; today the inner server speaks HTTP/1.1 only.
    ALPNProtocols: ["http/1.1"],
    SNICallback: (servername, callback) => {
      let name: string;
      try {
        name = normalizeHost(sniHostname(servername));
      } catch {
        tunnel.sni = servername.toLowerCase();
        callback(null, context);
        return;
      }
      tunnel.sni = name;
      if (name === target.hostname) callback(null, context);
      else deps.leaves.get(bareHostname(name)).then((c) => callback(null, c), (e: Error) => callback(e, undefined));
    },
  });
  (tlsSocket as TunnelSocket)[tunnelKey] = tunnel;
  tlsSocket.once("secure", () => clearTimeout(deadline));
  tlsSocket.on("error", (error) => {
    deps.log.debug("guest TLS error", { target: `${target.hostname}:${target.port}`, error });
  });
  deps.inner.emit("connection", tlsSocket);
}
