import type { Readable } from "node:stream";
import { EgressError, badRequest } from "../errors.js";
import type { OutboundRequest } from "../pipeline/exchange.js";
import { endToEndHeaders, type HeaderList } from "../headers.js";
import { checkContentLength, checkMethod, checkTunnelHostHeader, unmetExpectation, type TunnelTarget } from "./guest-request.js";
import { h2ConnectionHeaders } from "./h2-settings.js";

// The proxy sets the authority from the URL on every hop, and answers Expect itself.
const dropOnForward = new Set([...h2ConnectionHeaders, "expect"]);

/** RFC 9110 §10.1.1's one expectation, found as Node's HTTP/1.1 server finds it: anywhere in the field, in any case. */
const continueExpectation = /(?:^|\W)100-continue(?:$|\W)/i;

/**
 * What a stream's `expect` asks, judged as the HTTP/1.1 side judges it (guest-side.ts, with Node's
 * checkContinue and checkExpectation): true for `100-continue`, whose guest may hold its body
 * until a `100 Continue`; false with no `expect`. Any other expectation gets 417: dropped, the
 * request was served as if it had been met.
 *
 * @param raw the stream's raw header list, `[name, value, …]`.
 */
export function h2ExpectsContinue(raw: readonly string[]): boolean {
  let expectation: string | undefined;
  for (let i = 0; i < raw.length; i += 2) {
    // Repeated fields joined, as Node's HTTP/1.1 parser joins a repeated Expect.
    if (raw[i] === "expect") expectation = expectation === undefined ? raw[i + 1]! : `${expectation}, ${raw[i + 1]!}`;
  }
  if (expectation === undefined) return false;
  if (continueExpectation.test(expectation)) return true;
  throw unmetExpectation(expectation);
}

/**
 * The last `:authority` (or Host) that passed on each tunnel: a client names the same one on
 * every stream, and parsing it again per stream was a share of the stream's CPU. A tunnel's
 * target never changes, so the same text always gets the same answer.
 */
const passedAuthority = new WeakMap<TunnelTarget, string>();

/**
 * One guest HTTP/2 stream's head as the pipeline's request: the same rules as an HTTP/1.1 request
 * inside a tunnel (guest-request.ts), read from pseudo-headers. `:authority` (or Host, when a
 * client sends that instead) must name the CONNECT target, or the stream gets 421.
 *
 * @param raw the stream's raw header list, `[name, value, …]` as nghttp2 delivered it (names
 *   lowercase; repeated pseudo-headers and connection-specific fields already refused by it).
 * @param body the stream's readable side, or null when the HEADERS frame ended the stream.
 */
export function h2OutboundRequest(raw: readonly string[], tunnel: TunnelTarget, body: Readable | null): OutboundRequest {
  let method = "";
  let path: string | undefined;
  let authority: string | undefined;
  let hostHeader: string | undefined;
  let cookies: string[] | undefined;
  const regular: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    const value = raw[i + 1]!;
    if (name.startsWith(":")) {
      if (name === ":method") method = value;
      else if (name === ":path") path = value;
      else if (name === ":authority") authority = value;
      else if (name !== ":scheme") throw badRequest(`unsupported pseudo-header ${JSON.stringify(name)}`);
    } else if (name === "host") {
      if (hostHeader !== undefined) throw badRequest("duplicate Host header");
      hostHeader = value;
    } else if (name === "content-length") {
      checkContentLength(value);
      regular.push(name, value);
    } else if (name === "cookie") {
      // RFC 9113 §8.2.3: crumbs may arrive as separate fields; HTTP/1.1 upstreams need one line.
      (cookies ??= []).push(value);
    } else {
      regular.push(name, value);
    }
  }
  if (method === "") throw badRequest("missing :method");
  checkMethod(method);
  if (path === undefined || path === "") throw badRequest("missing :path");
  if (!path.startsWith("/")) {
    if (path === "*") throw badRequest("OPTIONS * cannot be proxied");
    throw badRequest(`invalid :path ${JSON.stringify(path.slice(0, 200))}`);
  }
  // RFC 9113 §8.3.1: when both are present, they must agree; either one names the destination.
  const named = authority ?? hostHeader;
  if (named !== undefined && passedAuthority.get(tunnel) !== named) {
    checkTunnelHostHeader(named, tunnel, authority !== undefined ? ":authority" : "Host header");
    passedAuthority.set(tunnel, named);
  }
  if (authority !== undefined && hostHeader !== undefined) checkTunnelHostHeader(hostHeader, tunnel);
  if (tunnel.sni !== undefined) checkSameHost(tunnel.sni, tunnel, "TLS SNI");
  const headers: HeaderList = endToEndHeaders(regular, dropOnForward);
  if (cookies !== undefined) headers.push("cookie", cookies.join("; "));
  return { method, url: destination(tunnel, path), headers, body };
}

function checkSameHost(hostname: string, tunnel: TunnelTarget, what: string): void {
  if (hostname !== tunnel.hostname) {
    throw new EgressError("EG_MISDIRECTED", 421, `${what} names "${hostname}" but the tunnel was opened with CONNECT ${tunnel.hostname}:${tunnel.port}`);
  }
}

/** `origin + path`, safe because `path` starts with "/" (see guest-request.ts). */
function destination(tunnel: TunnelTarget, path: string): URL {
  const defaultPort = tunnel.protocol === "https:" ? 443 : 80;
  const url = new URL(`${tunnel.protocol}//${tunnel.hostname}${tunnel.port === defaultPort ? "" : `:${tunnel.port}`}${path}`);
  // Setting it re-serialises the whole URL: only when there is a fragment to drop.
  if (path.includes("#")) url.hash = "";
  return url;
}
