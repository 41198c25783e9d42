import { connect as h2Connect, type ClientHttp2Session, type IncomingHttpHeaders, type OutgoingHttpHeaders } from "node:http2";
import type { Socket } from "node:net";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { onTestFinished } from "vitest";
import { openTunnel } from "./raw.js";

/** CONNECT `target` through the proxy (from `localAddress`, 127.0.0.x, when given), then TLS offering `alpn`; resolves once the handshake is done. */
export async function openH2Tls(proxyPort: number, target: string, ca: string, alpn: readonly string[] = ["h2"], localAddress?: string): Promise<TLSSocket> {
  const plain = await openTunnel(proxyPort, target, localAddress !== undefined ? { localAddress } : {});
  const servername = target.slice(0, target.lastIndexOf(":"));
  const socket = tlsConnect({ socket: plain.detach(), servername, ca, ALPNProtocols: [...alpn] });
  onTestFinished(() => {
    socket.destroy();
  });
  await new Promise<void>((resolve, reject) => {
    socket.once("secureConnect", resolve);
    socket.once("error", reject);
  });
  return socket;
}

/**
 * An HTTP/2 session to `target` through the proxy's CONNECT tunnel, as a guest opens one: one
 * connection, any number of streams. Destroyed when the test finishes.
 */
export async function h2Session(
  proxyPort: number,
  target: string,
  ca: string,
  settings: Record<string, number> = {},
  options: { readonly maxHeaderListPairs?: number; readonly localAddress?: string } = {},
): Promise<ClientHttp2Session> {
  const { localAddress, ...sessionOptions } = options;
  const socket = await openH2Tls(proxyPort, target, ca, ["h2"], localAddress);
  if (socket.alpnProtocol !== "h2") throw new Error(`ALPN chose ${String(socket.alpnProtocol)}, not h2`);
  const session = h2Connect(`https://${target}`, { createConnection: () => socket, settings, ...sessionOptions });
  session.on("error", () => undefined);
  onTestFinished(() => {
    session.destroy();
  });
  return session;
}

export interface H2Answer {
  readonly status: number;
  readonly headers: IncomingHttpHeaders;
  readonly body: Buffer;
  readonly trailers: IncomingHttpHeaders | undefined;
}

/** One request on `session`; rejects when the stream is reset. */
export function h2Request(session: ClientHttp2Session, headers: OutgoingHttpHeaders, body?: string | Buffer): Promise<H2Answer> {
  return new Promise((resolve, reject) => {
    const stream = session.request({ ":method": "GET", ...headers }, { endStream: body === undefined });
    let head: IncomingHttpHeaders | undefined;
    let trailers: IncomingHttpHeaders | undefined;
    const chunks: Buffer[] = [];
    stream.on("response", (h) => (head = h));
    stream.on("trailers", (t) => (trailers = t));
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("error", reject);
    stream.on("close", () => {
      if (head === undefined) reject(new Error(`stream closed without a response (code ${stream.rstCode})`));
      else if (stream.rstCode !== 0) reject(new Error(`stream reset with code ${stream.rstCode}`));
      else resolve({ status: Number(head[":status"]), headers: head, body: Buffer.concat(chunks), trailers });
    });
    if (body !== undefined) stream.end(body);
  });
}

/**
 * An h2 session through a plain CONNECT tunnel whose TCP socket the test keeps (`plain`), to end
 * or reset it by hand as a guest that crashed would.
 */
export async function h2SessionOnSocket(proxyPort: number, target: string, ca: string): Promise<{ session: ClientHttp2Session; plain: Socket }> {
  const plain = (await openTunnel(proxyPort, target)).detach() as Socket;
  const host = target.slice(0, target.lastIndexOf(":"));
  const socket = tlsConnect({ socket: plain, servername: host, ca, ALPNProtocols: ["h2"] });
  socket.on("error", () => undefined);
  await new Promise<void>((resolve) => socket.once("secureConnect", () => resolve()));
  const session = h2Connect(`https://${target}`, { createConnection: () => socket });
  session.on("error", () => undefined);
  onTestFinished(() => {
    session.destroy();
    plain.destroy();
  });
  return { session, plain };
}
