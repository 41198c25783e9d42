import { isIP } from "node:net";
import { domainToASCII, domainToUnicode } from "node:url";
import { badRequest } from "./errors.js";

/** A URL hostname without the brackets of an IPv6 literal (`[::1]` → `::1`), as resolvers and SNI want it. */
export function bareHostname(hostname: string): string {
  return hostname.startsWith("[") && hostname.endsWith("]") ? hostname.slice(1, -1) : hostname;
}

/**
 * `isIP(name) !== 0`, without its two regular expressions for a name that cannot be an address:
 * every IPv4 address starts with a digit and every IPv6 one holds a colon. A request's host name
 * is asked twice (the resolver, the address check), and is rarely a literal.
 */
export function isIPAddress(name: string): boolean {
  const first = name.charCodeAt(0);
  if (!(first >= 48 && first <= 57) && !name.includes(":")) return false;
  return isIP(name) !== 0;
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

/**
 * The IPv4 address an IPv4-mapped IPv6 address is (`::ffff:7f00:1`, `::FFFF:127.0.0.1`, any
 * spelling: `127.0.0.1`), or undefined for any other text. RFC 4291 §2.5.5.2: a dual-stack socket
 * dials it as that IPv4 address, and Node reports a peer's address in the dotted form. The other
 * forms that carry an IPv4 address (compatible, NAT64, 6to4, Teredo) are other addresses.
 */
export function mappedIPv4(ip: string): string | undefined {
  if (!ip.includes(":") || ip.includes("%") || isIP(ip) !== 6) return undefined;
  // The URL parser's spelling of a mapped address is always `::ffff:HHHH:HHHH`.
  const groups = /^\[::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})\]$/.exec(new URL(`http://[${ip}]/`).hostname);
  if (groups === null) return undefined;
  const high = parseInt(groups[1]!, 16);
  const low = parseInt(groups[2]!, 16);
  return `${high >>> 8}.${high & 255}.${low >>> 8}.${low & 255}`;
}

/** The same address in its other spelling: the IPv4-mapped form of an IPv4 address, as the URL parser spells it (`::ffff:7f00:1`), and the IPv4 address of a mapped one; undefined for anything else. */
export function mappedCounterpart(ip: string): string | undefined {
  if (isIP(ip) === 4) {
    const [a, b, c, d] = ip.split(".").map(Number) as [number, number, number, number];
    return `::ffff:${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  return mappedIPv4(ip);
}

/**
 * A host name's Unicode spelling when some label of it is punycode (`xn--psswrd-bfb7y.test` →
 * `pässwörd.test`), else undefined. The URL parser turns a host written outside ASCII into
 * punycode, which says the same thing in other letters: a reader who sees one sees the other.
 */
export function unicodeHostname(host: string): string | undefined {
  if (!host.includes("xn--")) return undefined;
  const unicode = domainToUnicode(host);
  return unicode === "" || unicode === host ? undefined : unicode;
}

/**
 * `text` as the URL parser would spell it inside a host name (UTS #46 mapping: lowercase, NFC,
 * full-width forms made narrow), in Unicode; undefined when it is ASCII or could not be a host's
 * labels. What an upstream writes into an internationalised host comes out of the parser so, and
 * its case mapping reaches letters beyond Latin-1 that a case-insensitive search does not fold.
 */
export function hostSpelling(text: string): string | undefined {
  if (!/[\u0080-\uffff]/.test(text)) return undefined;
  const ascii = domainToASCII(text);
  if (ascii === "") return undefined;
  const unicode = domainToUnicode(ascii);
  return unicode === "" ? undefined : unicode;
}
