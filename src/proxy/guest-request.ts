import { IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import { EgressError, badRequest, quoteShort } from "../errors.js";
import { forbiddenMethods, forwardedMethods, spellingHint, type OutboundRequest } from "../pipeline/exchange.js";
import { endToEndHeaders } from "../headers.js";
import { normalizeHost } from "../hostname.js";
import { joinSmallPushes } from "../streams.js";
import { parseAuthority, type Authority } from "./authority.js";

/** What a CONNECT established: every request inside the tunnel must be for this host. */
export interface TunnelTarget extends Authority {
  /** The guest that opened the tunnel: every request inside it is this guest's. */
  readonly guest: string;
  readonly protocol: "http:" | "https:";
  /** The TLS SNI the guest sent, already stripped of a `:port` suffix. */
  readonly sni?: string;
  /** The CONNECT's own connection, the one bound to the guest: whose it is now (see boundGuest). */
  readonly connection: Socket;
}

// The proxy sets Host from the URL on every hop, and answers Expect itself.
const dropOnForward = new Set(["host", "expect"]);

/**
 * The most header fields a guest's request head may have, on both guest protocols; 431 past it.
 * Node's HTTP/1.1 parser keeps about 1,000 (`maxHeadersCount`) and drops the rest without a word:
 * a POST whose Content-Length came past them went upstream as `content-length: 0` without its
 * body, and was logged 200 (black-box finding). The HTTP/1.1 servers keep one field more than
 * this (GuestSide.createServer), so a head past it is always seen as one. Apache takes 100 by
 * default; HTTP/2 header blocks are held to the same count (h2-settings.ts).
 */
export const maxRequestFields = 256;

/** The refusal of a head with more than {@link maxRequestFields} fields, or undefined. `raw` may be cut just past the limit. */
export function fieldCountRefusal(raw: readonly string[]): EgressError | undefined {
  if (raw.length <= maxRequestFields * 2) return undefined;
  return new EgressError("EG_HEADERS_TOO_LARGE", 431, `request head has more than ${maxRequestFields} header fields`);
}

/** What a request head says of its own framing and destination, once {@link checkRequestHead} has passed it. */
export interface RequestHead {
  readonly hostHeader: string | undefined;
  /** A Content-Length other than 0, or any Transfer-Encoding. */
  readonly hasBody: boolean;
  readonly chunked: boolean;
}

/**
 * The checks every HTTP/1.1 request head gets before any tier, and `egressgate check` with them:
 * the field count, a duplicate Host or Content-Length, a non-canonical Content-Length (`010`), both
 * Content-Length and Transfer-Encoding (Node's parser refuses that first on the wire), a
 * Transfer-Encoding in HTTP/1.0, and a coding other than `chunked`.
 *
 * @param raw the head's fields, `[name, value, …]`.
 */
export function checkRequestHead(raw: readonly string[], httpVersion: string): RequestHead {
  const tooMany = fieldCountRefusal(raw);
  if (tooMany !== undefined) throw tooMany;
  let hostHeader: string | undefined;
  let contentLength: string | undefined;
  const codings: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!.toLowerCase();
    if (name === "host") {
      if (hostHeader !== undefined) throw badRequest("duplicate Host header");
      hostHeader = raw[i + 1]!;
    } else if (name === "content-length") {
      if (contentLength !== undefined) throw badRequest("duplicate Content-Length header");
      contentLength = raw[i + 1]!;
      checkContentLength(contentLength);
    } else if (name === "transfer-encoding") {
      codings.push(...raw[i + 1]!.split(",").map((c) => c.trim().toLowerCase()));
    }
  }
  const chunked = codings.length > 0;
  // RFC 9112 §6.1: a sender must not send both; a proxy that forwarded one of them would frame the
  // body otherwise than a server reading the other.
  if (chunked && contentLength !== undefined) throw badRequest("both Content-Length and Transfer-Encoding");
  // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing (an HTTP/1.0
  // hop before this one may have framed it otherwise), and the connection closes after it.
  if (chunked && httpVersion === "1.0") throw badRequest("Transfer-Encoding in an HTTP/1.0 request: its framing cannot be trusted");
  // Node's parser undoes only the final chunked coding. A request body with another coding would
  // leave without its Transfer-Encoding, its bytes still coded: RFC 9112 §6.1 answers 501.
  if (chunked && (codings.length !== 1 || codings[0] !== "chunked")) {
    throw new EgressError("EG_BAD_REQUEST", 501, `unsupported Transfer-Encoding ${JSON.stringify(codings.join(", "))}: only chunked is accepted`);
  }
  return { hostHeader, hasBody: chunked || (contentLength !== undefined && contentLength !== "0"), chunked };
}

/** A guest request's fields as they go on: no hop-by-hop field, no Host (set from the URL), no Expect (answered by the proxy). */
export function forwardedFields(raw: readonly string[]): string[] {
  return endToEndHeaders(raw, dropOnForward);
}

/**
 * Validates a guest request head and turns it into the pipeline's request (DESIGN §3 step 1,
 * §5 strict parsing). Node's parser already rejects CL+TE together, bad chunking and oversized
 * heads; what it lets through and we refuse here is in {@link checkRequestHead}, and hostnames
 * it does not check at all.
 */
export function toOutboundRequest(req: IncomingMessage, tunnel: TunnelTarget | undefined): OutboundRequest {
  checkHttpVersion(req.httpVersion);
  const method = req.method ?? "";
  // Node hands CONNECT to the tunnel and refuses a method that is not a token, so what this
  // refuses here is TRACE or TRACK.
  checkMethod(method);
  const raw = req.rawHeaders;
  const { hostHeader, hasBody, chunked } = checkRequestHead(raw, req.httpVersion);
  const url = destinationUrl(req.url ?? "", hostHeader, tunnel);
  // Chunks of any size come one callback each: joined, so a body of tiny chunks is not read,
  // inspected and sent on a byte at a time. Node's parser pauses the socket the same way.
  if (chunked) joinSmallPushes(req, () => req.socket?.pause());
  return {
    method,
    url,
    headers: forwardedFields(raw),
    body: hasBody ? req : null,
  };
}

/** Where the HTTP/1.1 parser's verdict that a request is an upgrade is kept (see {@link GuestMessage}). */
const parsedUpgrade = Symbol("egressgate.parsedUpgrade");

/**
 * The HTTP/1.1 guest servers' request: an Upgrade in an HTTP/1.0 request is ignored, as RFC 9110
 * §7.8 says it must be (an HTTP/1.0 hop may have passed on a Connection it did not understand).
 * llhttp flags any request with `Connection: upgrade` and Upgrade as one, whatever its version,
 * and Node then hands the socket to the upgrade handler: a WebSocket was relayed for an HTTP/1.0
 * GET (black-box finding). Read as no upgrade, it is served as a plain request, as Node serves
 * any Upgrade nobody listens for: its Upgrade and Connection are dropped as hop-by-hop, and the
 * connection closes after it. A CONNECT stays one in any version.
 */
export class GuestMessage extends IncomingMessage {}

// undici, when a request fails, destroys a streamed body, and for a body whose prototype's
// constructor is IncomingMessage it first detaches the socket, so that the guest's connection
// outlives its request and gets the 502. A subclass failed that check: every upload whose
// upstream failed cut the guest's connection with no answer ("other side closed").
Object.defineProperty(GuestMessage.prototype, "constructor", { configurable: true, writable: true, value: IncomingMessage });

// An accessor, read when Node asks (by then the method is known; it is not yet when Node sets
// the flag). TypeScript has `upgrade` as a plain property, hence no class accessor.
Object.defineProperty(GuestMessage.prototype, "upgrade", {
  configurable: true,
  get(this: { [parsedUpgrade]?: boolean | null; httpVersion: string; method?: string }): boolean | null | undefined {
    const flagged = this[parsedUpgrade];
    return flagged === true && this.httpVersion === "1.0" && this.method !== "CONNECT" ? false : flagged;
  },
  set(this: { [parsedUpgrade]?: boolean | null }, value: boolean | null) {
    this[parsedUpgrade] = value;
  },
});

/**
 * The longest method a log line or an audit record carries. Every method the proxy forwards is
 * far shorter (Node's parser takes none over 12 characters); HTTP/2 carries any token up to the
 * header list's limit, and a 60 KB one, refused, was logged whole, and its lines' redaction held
 * every guest (~35 ms each).
 */
const maxLoggedMethod = 32;

/** A method as log lines and audit records carry it: cut past {@link maxLoggedMethod}, then `…`. */
export function loggableMethod(method: string): string {
  return method.length <= maxLoggedMethod ? method : `${method.slice(0, maxLoggedMethod)}…`;
}

/**
 * Refuses a request line of a version the guest side does not speak (RFC 9110 §15.6.6: 505).
 * llhttp refuses every version but 0.9, 1.0, 1.1 and 2.0 itself (400), and hands the other two
 * on as if they were HTTP/1.x: `GET http://x/ HTTP/2.0` and `HTTP/0.9` were served, a 200 in
 * HTTP/1.1 to a client that had said it spoke neither (black-box finding). An HTTP/0.9 request
 * has no head at all, and HTTP/2 has no request line: a client of it negotiates `h2` by ALPN
 * inside a CONNECT tunnel.
 */
export function checkHttpVersion(httpVersion: string): void {
  if (httpVersion === "1.1" || httpVersion === "1.0") return;
  throw versionNotSupported(`HTTP/${httpVersion}`);
}

/** The 505 for a request line's version, whether llhttp refused it (client-error.ts) or handed it on. */
export function versionNotSupported(version: string): EgressError {
  return new EgressError("EG_BAD_REQUEST", 505, `${version} is not supported in a request line: send HTTP/1.1 or HTTP/1.0 (HTTP/2 is negotiated by ALPN, as h2, inside a CONNECT tunnel)`);
}

/**
 * Refuses a CONNECT whose head announces content. A CONNECT has none (RFC 9110 §9.3.6): what
 * follows its head is the tunnel's, and Node's parser reads it so whatever the head says. A
 * `Content-Length: 5` and `hello` opened the tunnel (200) and then closed it as "neither TLS nor
 * HTTP"; a request sent as the announced body was served inside the tunnel. The guest and the
 * proxy disagree on where the tunnel begins, so the answer is 400 (Envoy answers a Content-Length
 * so); `Content-Length: 0` announces nothing and passes.
 */
export function checkConnectHead(raw: readonly string[]): void {
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!.toLowerCase();
    if (name === "transfer-encoding" || (name === "content-length" && raw[i + 1]!.trim() !== "0")) {
      const field = name === "transfer-encoding" ? "Transfer-Encoding" : "Content-Length";
      throw badRequest(`a CONNECT request has no content, but its head announces some (${field} ${quoteShort(raw[i + 1]!)}): what follows the head is the tunnel's`);
    }
  }
}

/**
 * Refuses a method no request may be forwarded with, as every guest side does before any tier
 * runs (and `egressgate check` with it): CONNECT inside a tunnel, TRACE and TRACK (405), and a
 * method that is not an RFC 9110 token (400).
 */
export function checkMethod(method: string): void {
  // Every request comes this way: the usual method costs one lookup.
  if (forwardedMethods.has(method)) return;
  const upper = method.toUpperCase();
  // RFC 8441 (WebSocket over HTTP/2) is not offered: SETTINGS_ENABLE_CONNECT_PROTOCOL stays 0.
  if (upper === "CONNECT") throw connectInTunnel();
  if (forbiddenMethods.has(upper)) {
    throw new EgressError("EG_METHOD_NOT_ALLOWED", 405, `method ${method} is not allowed: it would echo credentials back`);
  }
  if (!token.test(method)) throw badRequest(`invalid method ${JSON.stringify(method.slice(0, 64))}`);
  // The methods Node's HTTP/1.1 parser takes, in their one spelling, on every guest side. HTTP/2
  // would carry any token: `delete` passed a policy that refuses `DELETE` (methods are
  // case-sensitive), and reached servers that read it as DELETE.
  throw badRequest(`method ${JSON.stringify(method.slice(0, 64))} is not one the proxy forwards${spellingHint(method)}`);
}

/**
 * The refusal of an Expect other than `100-continue` (RFC 9110 §10.1.1: a proxy that cannot meet
 * an expectation answers 417), the same on both protocols.
 */
export function unmetExpectation(expectation: string): EgressError {
  return new EgressError("EG_BAD_REQUEST", 417, `unsupported Expect: ${quoteShort(expectation)}`);
}

/** The refusal of a CONNECT sent inside a tunnel: a tunnel in a tunnel would escape every check. */
export function connectInTunnel(): EgressError {
  return new EgressError("EG_METHOD_NOT_ALLOWED", 405, "CONNECT inside a tunnel is not allowed");
}

/**
 * A Content-Length the proxy can pass on as it came: digits, no leading zero, and no larger than
 * a number holds exactly (a larger one was forwarded rounded, a different framing than judged).
 */
export function checkContentLength(value: string): void {
  if (!/^(0|[1-9][0-9]{0,15})$/.test(value) || Number(value) > Number.MAX_SAFE_INTEGER) throw badRequest(`invalid Content-Length ${JSON.stringify(value.slice(0, 32))}`);
}

/** An RFC 9110 token: a method, or a field name. */
export const token = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/**
 * The destination of an absolute-form request target (`GET http://host/path`), as the proxy
 * takes it (and `egressgate check` with it): the host as written, normalised (normalizeHost),
 * the port checked, no userinfo or fragment. Throws a 400 EgressError otherwise.
 */
export function absoluteFormUrl(target: string): URL {
  // A plain forward-proxy request must be absolute-form; its URL names the destination and
  // the Host header is replaced (RFC 9112 §3.2.2).
  if (!/^https?:\/\//i.test(target)) {
    // `ws://` or `ftp://` is absolute-form too: the scheme is what is refused.
    const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(target)?.[1];
    if (scheme !== undefined && scheme.length <= 32) throw badRequest(`egressgate forwards http:// and https:// requests, not ${scheme.toLowerCase()}:// (ws:// goes as an Upgrade of an http:// request)`);
    if (scheme !== undefined) throw badRequest("egressgate forwards http:// and https:// requests only");
    throw badRequest("egressgate is a forward proxy: send absolute-form requests (GET http://host/path) or CONNECT");
  }
  let url: URL;
  try {
    url = new URL(target);
  } catch {
    throw badRequest(`invalid request target ${JSON.stringify(loggableTarget(target, 200))}`);
  }
  const authority = /^https?:\/\/([^/?#]*)/i.exec(target)![1]!;
  const hostPart = authority.includes("@") ? authority.slice(authority.lastIndexOf("@") + 1) : authority;
  const { hostname, port } = parseAuthority(hostPart, "request target", url.protocol === "https:" ? 443 : 80);
  return build(url.protocol, hostname, port, `${url.pathname}${url.search}`);
}

function destinationUrl(target: string, hostHeader: string | undefined, tunnel: TunnelTarget | undefined): URL {
  if (tunnel === undefined) return absoluteFormUrl(target);

  let path = target;
  if (!target.startsWith("/")) {
    if (target === "*") throw badRequest("OPTIONS * cannot be proxied");
    // absolute-form inside a tunnel: allowed, but it must name the tunnel's host
    let url: URL;
    try {
      url = new URL(target);
    } catch {
      throw badRequest(`invalid request target ${JSON.stringify(loggableTarget(target, 200))}`);
    }
    checkSameHost(normalizeHost(url.hostname), tunnel, "request target");
    const named = explicitPort(target, url);
    if (named !== undefined) checkSamePort(named, url.hostname, tunnel, "request target");
    path = `${url.pathname}${url.search}`;
  }
  if (hostHeader !== undefined) checkTunnelHostHeader(hostHeader, tunnel);
  if (tunnel.sni !== undefined) checkSameHost(tunnel.sni, tunnel, "TLS SNI");
  return build(tunnel.protocol, tunnel.hostname, tunnel.port, path);
}

/**
 * Refuses (421) a Host header inside a tunnel that names another host, or another port, than the
 * CONNECT target. One without a port names the target's (DESIGN.md: "a Host … that differs from
 * the CONNECT target gets 421"; another port was served on the CONNECT target's, Host rewritten).
 */
export function checkTunnelHostHeader(hostHeader: string, tunnel: Authority, what = "Host header"): void {
  const named = parseAuthority(hostHeader, what, tunnel.port);
  checkSameHost(named.hostname, tunnel, what);
  checkSamePort(named.port, named.hostname, tunnel, what);
}

function checkSameHost(hostname: string, tunnel: Authority, what: string): void {
  if (hostname !== tunnel.hostname) {
    throw new EgressError(
      "EG_MISDIRECTED",
      421,
      `${what} names "${hostname}" but the tunnel was opened with CONNECT ${tunnel.hostname}:${tunnel.port}`,
    );
  }
}

/**
 * The port an absolute-form target names, if it names one: the URL parser drops a scheme's
 * default (`https://api.test:443/` has port ""), which still names 443.
 */
function explicitPort(target: string, url: URL): number | undefined {
  if (url.port !== "") return Number(url.port);
  const start = target.indexOf("//") + 2;
  const end = target.slice(start).search(/[/?#]/);
  const authority = end < 0 ? target.slice(start) : target.slice(start, start + end);
  if (!/:\d+$/.test(authority)) return undefined;
  return url.protocol === "https:" ? 443 : url.protocol === "http:" ? 80 : undefined;
}

function checkSamePort(port: number, hostname: string, tunnel: Authority, what: string): void {
  if (port !== tunnel.port) {
    throw new EgressError("EG_MISDIRECTED", 421, `${what} names port ${port} of "${hostname}" but the tunnel was opened with CONNECT ${tunnel.hostname}:${tunnel.port}`);
  }
}

/**
 * One parse of `origin + path`. Safe to concatenate: `path` starts with "/", so the authority
 * is already closed and even `//evil.test/x` stays a path on this origin.
 */
function build(protocol: string, hostname: string, port: number, path: string): URL {
  const defaultPort = protocol === "https:" ? 443 : 80;
  const origin = `${protocol}//${hostname}${port === defaultPort ? "" : `:${port}`}`;
  const url = new URL(`${origin}${path.startsWith("/") ? path : `/${path}`}`);
  url.hash = "";
  return url;
}

/**
 * A raw request target as logs and error messages may show it: no query or fragment (they can
 * carry credentials), no userinfo, bounded length.
 */
export function loggableTarget(target: string, maxLength = 512): string {
  const cut = target.search(/[?#]/);
  const bare = (cut < 0 ? target : target.slice(0, cut)).replace(/^([a-z][a-z0-9+.-]*:\/\/)[^/@]*@/i, "$1");
  return bare.length > maxLength ? `${bare.slice(0, maxLength)}…` : bare;
}

/**
 * A CONNECT target (authority-form) as logs may show it: whatever comes before an `@` is
 * userinfo (no host name holds one), dropped as {@link loggableTarget} drops it from a URL, and
 * before the cut at `?`, which a password may hold.
 */
export function loggableAuthority(target: string): string {
  return loggableTarget(target.slice(target.lastIndexOf("@") + 1));
}

/**
 * The target a decision line names for a request that may not have passed the checks, in the form
 * a request that passed has ({@link loggableUrl}): inside a tunnel an origin-form target is put
 * on the tunnel's origin, since the path alone does not say where the request was for.
 * Otherwise the raw target, as {@link loggableTarget} shows it.
 */
export function loggableRequestTarget(target: string, tunnel: TunnelTarget | undefined): string {
  if (tunnel === undefined || !target.startsWith("/")) return loggableTarget(target);
  const defaultPort = tunnel.protocol === "https:" ? 443 : 80;
  return `${tunnel.protocol}//${tunnel.hostname}${tunnel.port === defaultPort ? "" : `:${tunnel.port}`}${loggableTarget(target)}`;
}

/**
 * The URL for the decision log: no query (it can carry credentials), and the path cut like {@link loggableTarget} cuts a
 * raw target, so a crafted 60 KB path cannot make every line that long. Redacted before the
 * cut, which could otherwise leave part of a value that the logger's redaction no longer sees.
 */
export function loggableUrl(url: URL, redact: (text: string) => string, maxLength = 512): string {
  const path = redact(url.pathname);
  return `${url.origin}${path.length > maxLength ? `${path.slice(0, maxLength)}…` : path}`;
}
