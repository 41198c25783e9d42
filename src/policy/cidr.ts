import { isIP } from "node:net";

/**
 * One address range from `10.88.0.2/32` or `fd00::/64`: its family, first address and prefix length.
 * `text` is as written; an IPv4-mapped range (`::ffff:10.88.0.2/128`) is family 4 (`10.88.0.2/32`).
 */
export interface Cidr {
  readonly text: string;
  readonly family: 4 | 6;
  readonly first: bigint;
  readonly last: bigint;
  readonly prefix: number;
}

function toBigInt(address: string, family: 4 | 6): bigint {
  // A zone (`fe80::1%eth0`) names an interface, not part of the address.
  const ip = address.split("%")[0]!;
  if (family === 4) return ip.split(".").reduce((n, part) => (n << 8n) | BigInt(Number(part)), 0n);
  // Expand "::" and an embedded IPv4 tail into eight 16-bit groups.
  let text = ip;
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (v4 !== null) {
    const n = toBigInt(v4[1]!, 4);
    text = `${text.slice(0, v4.index)}${(n >> 16n).toString(16)}:${(n & 0xffffn).toString(16)}`;
  }
  const [head, tail] = text.includes("::") ? text.split("::") : [text, undefined];
  const left = head === "" ? [] : head!.split(":");
  const right = tail === undefined || tail === "" ? [] : tail.split(":");
  const groups = tail === undefined ? left : [...left, ...Array<string>(8 - left.length - right.length).fill("0"), ...right];
  return groups.reduce((n, g) => (n << 16n) | BigInt(parseInt(g, 16)), 0n);
}

/** The range `text` spells, or why it spells none; messages read after an option's path. */
function readCidr(text: string): Cidr | string {
  const slash = text.indexOf("/");
  const ip = slash < 0 ? text : text.slice(0, slash);
  const family = isIP(ip) as 0 | 4 | 6;
  if (family === 0) return `is not an address range such as 10.88.0.2/32 or fd00::/64 (got ${JSON.stringify(text)})`;
  const bits = family === 4 ? 32 : 128;
  const prefixText = slash < 0 ? String(bits) : text.slice(slash + 1);
  const prefix = /^\d{1,3}$/.test(prefixText) ? Number(prefixText) : NaN;
  if (!(prefix >= 0 && prefix <= bits)) return `the prefix length of ${JSON.stringify(text)} must be 0 to ${bits}`;
  const n = toBigInt(ip, family);
  // A connection's address is matched as the family it really is (plainAddress), so an IPv4 guest
  // never meets an IPv6 range: an IPv4-mapped range is read as the IPv4 range it spells, or it
  // would pass every check and never match, nor be seen to overlap its IPv4 spelling. The mapped
  // block is ::ffff:0:0/96 (RFC 4291 §2.5.5.2).
  if (family === 6 && n >> 32n === 0xffffn) {
    if (prefix < 96) {
      return `${JSON.stringify(text)} is IPv4-mapped with a prefix under 96, so it reaches past ::ffff:0:0/96 into IPv6 addresses: write the IPv4 range it means (::ffff:a.b.c.d/N is a.b.c.d/N-96), or an IPv6 range`;
    }
    return range(text, n & 0xffffffffn, 4, prefix - 96);
  }
  return range(text, n, family, prefix);
}

function range(text: string, address: bigint, family: 4 | 6, prefix: number): Cidr {
  const bits = family === 4 ? 32 : 128;
  const host = (1n << BigInt(bits - prefix)) - 1n;
  const first = address & ~host & ((1n << BigInt(bits)) - 1n);
  return { text, family, first, last: first | host, prefix };
}

/**
 * Parses `IP/PREFIX` (or a bare IP, a single address); throws a TypeError naming `path`. An
 * IPv4-mapped range (`::ffff:a.b.c.d/N`, N of 96 or more) is the IPv4 range `a.b.c.d/(N-96)`;
 * one under /96 is refused, since it spans IPv6 addresses too.
 */
export function parseCidr(text: string, path: string): Cidr {
  const parsed = readCidr(text);
  if (typeof parsed === "string") throw new TypeError(`${path}: ${parsed}`);
  return parsed;
}

/** Why `text` is no address range parseCidr takes, or undefined when it is one. */
export function cidrProblem(text: string): string | undefined {
  const parsed = readCidr(text);
  return typeof parsed === "string" ? parsed : undefined;
}

/**
 * The address a socket reports, as the family it really is: a dual-stack listener reports IPv4
 * guests as `::ffff:10.88.0.2`, which must match `10.88.0.2/32`.
 */
export function plainAddress(address: string): { ip: string; family: 4 | 6 } | undefined {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  if (mapped !== null) return { ip: mapped[1]!, family: 4 };
  const family = isIP(address);
  return family === 0 ? undefined : { ip: address, family: family as 4 | 6 };
}

export function cidrContains(range: Cidr, address: { ip: string; family: 4 | 6 }): boolean {
  if (range.family !== address.family) return false;
  const n = toBigInt(address.ip, address.family);
  return n >= range.first && n <= range.last;
}

export function cidrsOverlap(a: Cidr, b: Cidr): boolean {
  return a.family === b.family && a.first <= b.last && b.first <= a.last;
}
