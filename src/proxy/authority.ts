import { badRequest } from "../errors.js";
import { normalizeHost } from "../hostname.js";

export interface Authority {
  /** Normalised: lowercase, no trailing dot, IPv4 in dotted-quad, IPv6 in brackets. */
  readonly hostname: string;
  readonly port: number;
}

export function parsePort(raw: string, what: string): number {
  if (!/^[0-9]{1,5}$/.test(raw)) throw badRequest(`invalid port ${JSON.stringify(raw)} in ${what}`);
  const port = Number(raw);
  if (port < 1 || port > 65535) throw badRequest(`invalid port ${port} in ${what}`);
  return port;
}

/** Splits `host:port` (or `[v6]:port`); the port is optional only when `defaultPort` is given. */
export function parseAuthority(raw: string, what: string, defaultPort?: number): Authority {
  // No host name holds "@" (RFC 3986 reg-name): what comes before it is userinfo, credentials
  // that the answer and the log line would have quoted (`CONNECT user:pw@api.test:443`).
  const at = raw.lastIndexOf("@");
  if (at >= 0) throw badRequest(`${what} ${JSON.stringify(`…@${raw.slice(at + 1)}`)} has userinfo, which is not allowed (proxy credentials go in Proxy-Authorization)`);
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
