import { isIP } from "node:net";
import { badRequest } from "../errors.js";

export interface Authority {
  /** Normalised: lowercase, no trailing dot, IPv4 in dotted-quad, IPv6 in brackets. */
  readonly hostname: string;
  readonly port: number;
}

// Letters, digits, dot, hyphen and underscore: no userinfo (`@`), path, CR, LF, NUL or backslash
// can slip into a hostname and confuse the URL parser or a log reader.
const hostChars = /^[A-Za-z0-9._-]+$/;
const ipv6Literal = /^\[[0-9A-Fa-f:.]+\]$/;

/**
 * Normalises a hostname with the WHATWG URL parser, which is what undici and the guest's own
 * URL handling use: `127.1`, `0x7f000001` and `2130706433` all become `127.0.0.1`, so policy
 * and connection see one spelling. Throws a 400 EgressError for anything else.
 */
export function normalizeHost(raw: string): string {
  const text = raw.endsWith(".") ? raw.slice(0, -1) : raw;
  if (text.length > 300) throw badRequest(`host name too long (${raw.length} characters; at most 253)`);
  // An empty label (`a..b`, `.a`, or a second trailing dot) is no host name: the URL parser keeps
  // it, and `api.test..` went upstream as `api.test.` in Host.
  if (text === "" || text.startsWith(".") || text.endsWith(".") || text.includes("..") || !(hostChars.test(text) || (ipv6Literal.test(text) && isIP(text.slice(1, -1)) === 6))) {
    throw badRequest(`invalid host ${JSON.stringify(raw)}`);
  }
  let hostname: string;
  try {
    hostname = new URL(`http://${text}/`).hostname;
  } catch {
    throw badRequest(`invalid host ${JSON.stringify(raw)}`);
  }
  if (hostname === "") throw badRequest(`invalid host ${JSON.stringify(raw)}`);
  // RFC 1035 §2.3.4: 253 characters, 63 per label. Longer names cannot resolve and only cost
  // matching time and log space.
  if (hostname.length > 253) throw badRequest(`host name too long (${hostname.length} characters; at most 253)`);
  const longest = Math.max(...hostname.split(".").map((label) => label.length));
  if (longest > 63) throw badRequest(`host name has a label of ${longest} characters; at most 63`);
  return hostname;
}

export function parsePort(raw: string, what: string): number {
  if (!/^[0-9]{1,5}$/.test(raw)) throw badRequest(`invalid port ${JSON.stringify(raw)} in ${what}`);
  const port = Number(raw);
  if (port < 1 || port > 65535) throw badRequest(`invalid port ${port} in ${what}`);
  return port;
}

/** Splits `host:port` (or `[v6]:port`); the port is optional only when `defaultPort` is given. */
export function parseAuthority(raw: string, what: string, defaultPort?: number): Authority {
  const match = /^(\[[^\]]*\]|[^:[\]]*)(?::([^:]*))?$/.exec(raw);
  if (match === null) throw badRequest(`invalid ${what} ${JSON.stringify(raw)}`);
  const host = match[1]!;
  const portText = match[2];
  if (portText === undefined && defaultPort === undefined) throw badRequest(`${what} ${JSON.stringify(raw)} has no port`);
  return {
    hostname: normalizeHost(host),
    port: portText === undefined ? defaultPort! : parsePort(portText, what),
  };
}
