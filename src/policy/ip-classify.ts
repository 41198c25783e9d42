import { isIPv4, isIPv6 } from "node:net";
import { withFields } from "../objects.js";

/**
 * Classifies resolved IP addresses (never hostnames as text). IPv6 forms that carry an IPv4
 * address (mapped, compatible, NAT64, 6to4, Teredo) are judged by the IPv4 inside, because a
 * gateway or the kernel turns them back into that IPv4 address: `::ffff:127.0.0.1` reaches
 * loopback just like `127.0.0.1` does.
 */
export type IpCategory =
  | "public"
  | "unspecified"
  | "loopback"
  | "private"
  | "cgnat"
  | "link-local"
  | "multicast"
  | "broadcast"
  | "reserved"
  | "unique-local"
  | "metadata";

export interface IpClassification {
  /** The address in canonical text form. */
  readonly ip: string;
  readonly family: 4 | 6;
  readonly category: IpCategory;
  /** True for every category but "public". */
  readonly internal: boolean;
  /** A cloud metadata address: refused even for allowedInternalHosts. */
  readonly metadata: boolean;
  /** For IPv6 forms that embed IPv4: the IPv4 address that decided the category. */
  readonly embeddedIPv4?: string;
}

interface V4Range {
  readonly base: number;
  readonly bits: number;
  readonly category: IpCategory;
}

function v4(text: string): number {
  const parts = text.split(".").map(Number);
  return (((parts[0]! << 24) | (parts[1]! << 16) | (parts[2]! << 8) | parts[3]!) >>> 0);
}

function range(cidr: string, category: IpCategory): V4Range {
  const [addr, bits] = cidr.split("/");
  return { base: v4(addr!), bits: Number(bits), category };
}

// IANA IPv4 Special-Purpose Address Registry, minus the globally reachable anycast entries.
const v4Ranges: readonly V4Range[] = [
  range("0.0.0.0/8", "unspecified"),
  range("10.0.0.0/8", "private"),
  range("100.64.0.0/10", "cgnat"),
  range("127.0.0.0/8", "loopback"),
  range("169.254.0.0/16", "link-local"),
  range("172.16.0.0/12", "private"),
  range("192.0.0.0/24", "reserved"),
  range("192.0.2.0/24", "reserved"),
  range("192.88.99.0/24", "reserved"),
  range("192.168.0.0/16", "private"),
  range("198.18.0.0/15", "reserved"),
  range("198.51.100.0/24", "reserved"),
  range("203.0.113.0/24", "reserved"),
  range("224.0.0.0/4", "multicast"),
  range("255.255.255.255/32", "broadcast"),
  range("240.0.0.0/4", "reserved"),
];

/**
 * Cloud metadata and host-agent endpoints, refused even for allowedInternalHosts:
 * - 169.254.169.254: AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean IMDS;
 * - 169.254.170.2: AWS ECS task metadata; 169.254.169.253: AWS Route 53 resolver;
 * - 169.254.169.123: AWS time sync; 169.254.42.42: Scaleway; 100.100.100.200: Alibaba Cloud;
 * - 168.63.129.16: Azure WireServer (a public address, so the internal-range block misses it);
 * - 192.0.0.192: Oracle Cloud;
 * - IPv6: AWS fd00:ec2::254/253/23, GCP fd20:ce::254, Scaleway fd00:42::42,
 *   OpenStack fe80::a9fe:a9fe.
 */
const metadataV4 = new Set([
  "169.254.169.254",
  "169.254.170.2",
  "169.254.169.253",
  "169.254.169.123",
  "169.254.42.42",
  "100.100.100.200",
  "168.63.129.16",
  "192.0.0.192",
]);
const metadataV6 = new Set([
  "fd00:ec2:0:0:0:0:0:254",
  "fd00:ec2:0:0:0:0:0:253",
  "fd00:ec2:0:0:0:0:0:23",
  "fd20:ce:0:0:0:0:0:254",
  "fd00:42:0:0:0:0:0:42",
  "fe80:0:0:0:0:0:a9fe:a9fe",
]);

function inV4(n: number, r: V4Range): boolean {
  if (r.bits === 0) return true;
  const mask = r.bits === 32 ? 0xffffffff : (~((1 << (32 - r.bits)) - 1)) >>> 0;
  return ((n & mask) >>> 0) === r.base;
}

function v4Text(n: number): string {
  return `${n >>> 24}.${(n >>> 16) & 255}.${(n >>> 8) & 255}.${n & 255}`;
}

function classifyV4Number(n: number): IpCategory {
  for (const r of v4Ranges) if (inV4(n, r)) return r.category;
  return "public";
}

/** Parses IPv6 text into eight 16-bit groups. The caller has already checked isIPv6. */
function parseV6(text: string): number[] {
  let s = text;
  const zone = s.indexOf("%");
  if (zone >= 0) s = s.slice(0, zone);
  const lastColon = s.lastIndexOf(":");
  const last = s.slice(lastColon + 1);
  if (last.includes(".")) {
    // A dotted IPv4 tail (::ffff:1.2.3.4) stands for the last two groups.
    const n = v4(last);
    s = `${s.slice(0, lastColon + 1)}${(n >>> 16).toString(16)}:${(n & 0xffff).toString(16)}`;
  }
  const toGroups = (part: string): number[] => (part === "" ? [] : part.split(":").map((x) => parseInt(x, 16)));
  const gap = s.indexOf("::");
  if (gap < 0) return toGroups(s);
  const head = toGroups(s.slice(0, gap));
  const tail = toGroups(s.slice(gap + 2));
  return [...head, ...new Array<number>(8 - head.length - tail.length).fill(0), ...tail];
}

function v6Text(groups: readonly number[]): string {
  return groups.map((g) => g.toString(16)).join(":");
}

function fromV4(ip: string, n: number, embeddedIn?: string): IpClassification {
  const text = v4Text(n);
  const metadata = metadataV4.has(text);
  const category = metadata ? "metadata" : classifyV4Number(n);
  const base = { family: embeddedIn ? 6 : 4, category, internal: category !== "public", metadata } as const;
  return embeddedIn ? withFields(base, { ip, embeddedIPv4: text }) : withFields(base, { ip: text });
}

/** Classifies one IP address. Throws a TypeError if `ip` is not an IPv4 or IPv6 address. */
export function classifyIp(input: string): IpClassification {
  const ip = input.startsWith("[") && input.endsWith("]") ? input.slice(1, -1) : input;
  if (isIPv4(ip)) return fromV4(ip, v4(ip));
  if (!isIPv6(ip)) throw new TypeError(`not an IP address: ${JSON.stringify(input)}`);
  const g = parseV6(ip);
  const canonical = v6Text(g);
  const lowV4 = (((g[6]! << 16) | g[7]!) >>> 0);
  const topZero = g[0] === 0 && g[1] === 0 && g[2] === 0 && g[3] === 0 && g[4] === 0;

  // ::ffff:a.b.c.d (mapped) and ::a.b.c.d (deprecated compatible). :: and ::1 are their own.
  if (topZero && (g[5] === 0xffff || (g[5] === 0 && lowV4 > 1))) return fromV4(canonical, lowV4, canonical);
  // 64:ff9b::/96, NAT64 well-known prefix (RFC 6052).
  if (g[0] === 0x64 && g[1] === 0xff9b && g[2] === 0 && g[3] === 0 && g[4] === 0 && g[5] === 0) {
    return fromV4(canonical, lowV4, canonical);
  }
  // ::ffff:0:a.b.c.d, IPv4-translated (SIIT, RFC 6145).
  if (g[0] === 0 && g[1] === 0 && g[2] === 0 && g[3] === 0 && g[4] === 0xffff && g[5] === 0) return fromV4(canonical, lowV4, canonical);
  // 64:ff9b:1::/48, NAT64 for local use (RFC 8215): stays "reserved", but a translator may put
  // the IPv4 address in any of RFC 6052's places, and a metadata address in one is refused.
  if (g[0] === 0x64 && g[1] === 0xff9b && g[2] === 1) {
    for (const n of localNat64Candidates(g)) if (metadataV4.has(v4Text(n))) return fromV4(canonical, n, canonical);
  }
  // 2002::/16, 6to4: the IPv4 address is in bits 16..48.
  if (g[0] === 0x2002) return fromV4(canonical, ((g[1]! << 16) | g[2]!) >>> 0, canonical);
  // 2001::/32, Teredo: the client's IPv4 address is the last 32 bits, inverted.
  if (g[0] === 0x2001 && g[1] === 0) return fromV4(canonical, (~lowV4) >>> 0, canonical);

  const base = { ip: canonical, family: 6 as const };
  if (metadataV6.has(canonical)) return withFields(base, { category: "metadata", internal: true, metadata: true } as const);
  const category = classifyV6(g);
  return withFields(base, { category, internal: category !== "public", metadata: false });
}

/** The IPv4 addresses RFC 6052's formats for a /48, /56, /64 and /96 prefix would read (bits 64..71 are skipped). */
function localNat64Candidates(g: readonly number[]): number[] {
  return [
    ((g[3]! << 16) | ((g[4]! & 0xff) << 8) | (g[5]! >>> 8)) >>> 0,
    (((g[3]! & 0xff) << 24) | ((g[4]! & 0xff) << 16) | g[5]!) >>> 0,
    (((g[4]! & 0xff) << 24) | (g[5]! << 8) | (g[6]! >>> 8)) >>> 0,
    ((g[6]! << 16) | g[7]!) >>> 0,
  ];
}

function classifyV6(g: readonly number[]): IpCategory {
  const first = g[0]!;
  if (g.every((x) => x === 0)) return "unspecified";
  if (g.slice(0, 7).every((x) => x === 0) && g[7] === 1) return "loopback";
  if ((first & 0xfe00) === 0xfc00) return "unique-local";
  if ((first & 0xffc0) === 0xfe80) return "link-local";
  if ((first & 0xffc0) === 0xfec0) return "reserved"; // deprecated site-local
  if ((first & 0xff00) === 0xff00) return "multicast";
  // Only 2000::/3 is global unicast; 100::/64 (discard), 64:ff9b:1::/48 (local NAT64) and
  // every other unassigned block fall here.
  if ((first & 0xe000) !== 0x2000) return "reserved";
  if (first === 0x2001 && g[1] === 0x0db8) return "reserved"; // documentation
  if (first === 0x2001 && (g[1]! & 0xfff0) === 0x0010) return "reserved"; // ORCHID
  if (first === 0x2001 && (g[1]! & 0xfff0) === 0x0020) return "reserved"; // ORCHIDv2
  if (first === 0x2001 && g[1]! < 0x0200) return "reserved"; // IETF protocol assignments
  if (first === 0x3fff && (g[1]! & 0xf000) === 0) return "reserved"; // 3fff::/20, documentation
  return "public";
}
