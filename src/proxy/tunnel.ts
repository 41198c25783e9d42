import type { Server } from "node:http";
import { isIP, type Socket } from "node:net";
import { TLSSocket, type SecureContext } from "node:tls";
import type { Logger } from "../log.js";
import { alertRecord, alerts, ClientHelloReader } from "../tls/client-hello.js";
import type { LeafCertCache } from "../tls/leaf-cert-cache.js";
import { SigningLimitError } from "../tls/signing-queue.js";
import type { Authority } from "./authority.js";
import type { HandshakeGate } from "./handshake-gate.js";
import { parseWhatWasRead } from "./lanes.js";
import type { TunnelTarget } from "./guest-request.js";
import { bareHostname, normalizeHost } from "../hostname.js";
import { withFields } from "../objects.js";

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
  /** Takes TLS sockets whose ALPN chose `h2`; without it only `http/1.1` is offered. */
  readonly h2?: ((socket: TLSSocket) => void) | undefined;
  readonly leaves: LeafCertCache;
  /** Turns for TLS handshakes per guest address (see HandshakeGate). */
  readonly handshakes: HandshakeGate;
  readonly log: Logger;
  readonly handshakeMs: number;
}

const tlsHandshakeRecord = 0x16;

/**
 * After `200 Connection Established`, the first bytes decide: a TLS handshake record is
 * terminated with our leaf, an HTTP request line is parsed as plain HTTP, and anything else
 * (SSH, a raw protocol) is closed, because it cannot be inspected.
 */
export function serveTunnel(socket: Socket, head: Buffer, target: Authority & { readonly guest: string; readonly refusedHost?: boolean }, deps: TunnelDeps): void {
  const deadline = setTimeout(() => socket.destroy(), deps.handshakeMs);
  deadline.unref();
  socket.once("close", () => clearTimeout(deadline));
  // The socket is half-open (the HTTP server's), and a guest that sends its FIN before there is
  // anything to answer has left: it is let go at once, not at the deadline, with its place under
  // the connection limits (a FIN after a whole ClientHello is seen by the TLS socket).
  const left = (): void => void socket.destroy();
  socket.once("end", left);
  // Until the first bytes tell TLS from HTTP: at most a request line's first 17 bytes.
  let buffered = head;
  // Once they say TLS, every chunk goes to the reader, which keeps them (no copy per chunk).
  let reader: ClientHelloReader | undefined;
  const decide = (chunk: Buffer): boolean => {
    if (reader === undefined) {
      buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
      const kind = sniff(buffered);
      if (kind === "more") return false;
      if (kind !== "tls") {
        socket.pause();
        socket.unshift(buffered);
        socket.off("end", left);
        if (kind === "http") servePlain(socket, target, deps, deadline);
        else {
          deps.log.info("tunnel closed", { target: `${target.hostname}:${target.port}`, reason: "neither TLS nor HTTP" });
          socket.destroy();
        }
        return true;
      }
      reader = new ClientHelloReader();
      chunk = buffered;
    }
    // The whole ClientHello first: its SNI decides whether anything is signed at all.
    const hello = reader.push(chunk);
    if (hello.kind === "more") return false;
    if (hello.kind === "invalid") {
      refuseTls(socket, reader.first, alerts.decodeError, target, hello.reason, deps);
      return true;
    }
    const sni = hello.servername === undefined ? undefined : sniName(hello.servername);
    if (sni !== undefined && sni !== target.hostname) {
      // Issue 14: a leaf for any name the guest asks for would cost a signing each (and evict
      // the names in use), only to be answered 421 afterwards. unrecognized_name ends the
      // handshake before any certificate work (RFC 6066 §3).
      const shown = hello.servername!.length > 256 ? `${hello.servername!.slice(0, 256)}…` : hello.servername!;
      refuseTls(
        socket,
        reader.first,
        alerts.unrecognizedName,
        target,
        `TLS SNI names ${JSON.stringify(shown)} but the tunnel was opened with CONNECT ${target.hostname}:${target.port}`,
        deps,
      );
      return true;
    }
    const bytes = reader.bytes();
    socket.pause();
    socket.unshift(bytes);
    socket.off("end", left);
    void terminateTls(socket, target, sni, deps, deadline, bytes);
    return true;
  };
  if (head.length > 0 && decide(Buffer.alloc(0))) return;
  const onData = (chunk: Buffer): void => {
    if (decide(chunk)) socket.off("data", onData);
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

function servePlain(socket: Socket, target: Authority & { readonly guest: string }, deps: TunnelDeps, deadline: NodeJS.Timeout): void {
  clearTimeout(deadline);
  (socket as TunnelSocket)[tunnelKey] = withFields(target, { protocol: "http:" as const, connection: socket });
  // The HTTP server reads straight from the socket's handle when it can, which would skip the
  // bytes we unshifted while sniffing. Marking the handle consumed keeps it on the stream path.
  const handle = (socket as unknown as { _handle?: { _consumed?: boolean } })._handle;
  if (handle) handle._consumed = true;
  deps.inner.emit("connection", socket);
  socket.resume();
}

/**
 * An SNI of `host:port` (sent by some Go programs) names just `host`. RFC 6066 §3 allows no IP
 * literal, but clients send one (Node does, with a warning, for `servername: "::1"`): an IPv6 one
 * comes bare, and its colons are no port; it is read as the bracketed form the CONNECT target
 * has, as `127.0.0.1` already matched `CONNECT 127.0.0.1:443`.
 */
function sniHostname(servername: string): string {
  if (isIP(servername) === 6) return `[${servername}]`;
  const bracketed = /^(\[[^\]]*\])(?::[0-9]*)?$/.exec(servername);
  if (bracketed !== null) return bracketed[1]!;
  const colon = servername.lastIndexOf(":");
  return colon > 0 && !servername.includes("]") ? servername.slice(0, colon) : servername;
}

/** The SNI as a normalised hostname, to compare with the CONNECT target; a name that is not one stays as sent, lowercased. */
function sniName(servername: string): string {
  try {
    return normalizeHost(sniHostname(servername));
  } catch {
    return servername.toLowerCase();
  }
}

/** Ends a handshake before it starts: a fatal alert in the clear, and the tunnel closed. */
function refuseTls(socket: Socket, hello: Buffer, alert: number, target: Authority, reason: string, deps: TunnelDeps): void {
  deps.log.info("tunnel closed", { target: `${target.hostname}:${target.port}`, reason });
  socket.end(alertRecord(alert, hello));
  socket.resume();
  closeSoon(socket);
}

/** A client that never closes its side after our alert does not hold the socket. */
function closeSoon(socket: Socket): void {
  const timer = setTimeout(() => socket.destroy(), 1_000);
  timer.unref();
  socket.once("close", () => clearTimeout(timer));
}

/**
 * Terminates the guest's TLS with the leaf for the CONNECT target, the only name it may serve:
 * `sni` has been checked against it already. The signing, on a cache miss, waits for this
 * guest's turn (see SigningQueue).
 */
async function terminateTls(
  socket: Socket,
  target: Authority & { readonly guest: string; readonly refusedHost?: boolean },
  sni: string | undefined,
  deps: TunnelDeps,
  deadline: NodeJS.Timeout,
  hello: Buffer,
): Promise<void> {
  // This address's turn first: its signing and handshake then run beside at most a few of its own.
  const leave = await deps.handshakes.enter(socket.remoteAddress ?? "", new Promise((resolve) => socket.once("close", () => resolve())));
  if (leave === undefined) return;
  // Closed as its turn came: the turn goes on at once (a close listener added now would never run).
  if (socket.destroyed) return leave();
  socket.once("close", leave);
  let context: SecureContext;
  try {
    // A host the allowlist refuses gets its leaf from the refused names' LRU (see LeafCertCache).
    context = await deps.leaves.get(bareHostname(target.hostname), socket.remoteAddress ?? "", target.refusedHost === true);
  } catch (error) {
    if (error instanceof SigningLimitError) {
      deps.log.info("tunnel closed", { target: `${target.hostname}:${target.port}`, reason: error.message });
    } else {
      deps.log.error("leaf certificate failed", { host: target.hostname, error });
    }
    if (!socket.destroyed) {
      // The hello was put back for the TLS socket that is not coming: it is dropped with the alert.
      socket.end(alertRecord(alerts.internalError, hello));
      socket.resume();
      closeSoon(socket);
    }
    return;
  }
  if (socket.destroyed) return;
  const tunnel: TunnelTarget = withFields(target, sni === undefined ? { protocol: "https:" as const, connection: socket } : { protocol: "https:" as const, sni, connection: socket });
  const tlsSocket = new TLSSocket(socket, {
    isServer: true,
    secureContext: context,
    // http/1.0 too: a guest that offers only it (`curl --http1.0`) got a no_application_protocol
    // alert, where the HTTP/1.1 server serves its requests. The first of these the guest offers wins.
    ALPNProtocols: deps.h2 === undefined ? ["http/1.1", "http/1.0"] : ["h2", "http/1.1", "http/1.0"],
    // The first ClientHello was checked above; a renegotiation's is not seen there, so it is
    // held to the same rule here, and never signs anything either.
    SNICallback: (servername, callback) => {
      if (sniName(servername) === target.hostname) callback(null, context);
      else callback(new Error(`TLS SNI names ${JSON.stringify(servername)} but the tunnel was opened with CONNECT ${target.hostname}:${target.port}`));
    },
  });
  (tlsSocket as TunnelSocket)[tunnelKey] = tunnel;
  tlsSocket.on("error", (error) => {
    deps.log.debug("guest TLS error", { target: `${target.hostname}:${target.port}`, error });
  });
  // The TLS socket is the tunnel now: its close is the raw socket's too (whatever ended it).
  tlsSocket.once("close", () => socket.destroy());
  const left = (): void => void tlsSocket.destroy();
  tlsSocket.once("end", left);
  // Routed by the protocol ALPN chose, once known: h2 to the HTTP/2 side, anything else (no
  // ALPN at all included) to the HTTP/1.1 server, whose timeouts and error handling stay its own.
  tlsSocket.once("secure", () => {
    clearTimeout(deadline);
    leave();
    tlsSocket.off("end", left);
    if (tlsSocket.alpnProtocol === "h2" && deps.h2 !== undefined) deps.h2(tlsSocket);
    else {
      // Node's parser reads the TLS socket's handle itself (no Buffer a read, about 4% of the
      // proxy's CPU an HTTP/1.1 request), and goes on parsing what a paused connection's last
      // read decrypted, rather than failing it as a malformed request ("paused"): see lanes.ts.
      deps.inner.emit("connection", tlsSocket);
      parseWhatWasRead(tlsSocket);
    }
  });
}
