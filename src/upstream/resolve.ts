import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { descriptorShortage } from "../descriptors.js";
import { EgressError } from "../errors.js";
import { bareHostname, isIPAddress } from "../hostname.js";

export interface ResolvedAddress {
  readonly ip: string;
  readonly family: 4 | 6;
}

/** Static names, lowercased without trailing dot, mapped to their addresses. */
export type StaticHosts = ReadonlyMap<string, readonly ResolvedAddress[]>;

export type LookupAll = (hostname: string) => Promise<readonly ResolvedAddress[]>;

const systemLookup: LookupAll = async (hostname) => {
  const found = await lookup(hostname, { all: true, verbatim: true });
  return found.map((a) => ({ ip: a.address, family: a.family === 6 ? 6 : 4 }));
};

function literal(ip: string): ResolvedAddress {
  return { ip, family: isIP(ip) === 6 ? 6 : 4 };
}

/**
 * Resolves a URL hostname to every address it has: an IP literal stands for itself, a static
 * name for its pinned addresses, and anything else goes to the system resolver. Callers judge
 * every address; nothing here decides whether one may be used.
 */
export class Resolver {
  constructor(
    private readonly staticHosts: StaticHosts,
    private readonly timeoutMs: number,
    private readonly lookupAll: LookupAll = systemLookup,
  ) {}

  async resolve(hostname: string): Promise<readonly ResolvedAddress[]> {
    const bare = bareHostname(hostname);
    if (isIPAddress(bare)) return [literal(bare)];
    const key = bare.endsWith(".") ? bare.slice(0, -1) : bare;
    const pinned = this.staticHosts.get(key);
    if (pinned !== undefined) return pinned;
    let timer: NodeJS.Timeout | undefined;
    // getaddrinfo runs on libuv's small thread pool and has no timeout of its own.
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new EgressError("EG_UPSTREAM_TIMEOUT", 504, `DNS lookup for "${key}" took longer than ${this.timeoutMs} ms`)),
        this.timeoutMs,
      );
    });
    try {
      const found = await Promise.race([this.lookupAll(key), timeout]);
      if (found.length === 0) throw new Error("no addresses");
      return found;
    } catch (error) {
      if (error instanceof EgressError) throw error;
      const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
      // getaddrinfo with no descriptor left (for /etc/hosts, or a socket to the DNS server) says
      // ENOTFOUND, which tells the guest the name does not exist (fd-exhaustion probe).
      const shortage = descriptorShortage();
      if (shortage !== undefined) {
        throw new EgressError("EG_UPSTREAM", 502, `cannot resolve host "${key}": ${shortage} (the proxy is out of file descriptors)`, { cause: error, detail: `the lookup said ${code}` });
      }
      throw new EgressError("EG_UPSTREAM", 502, `cannot resolve host "${key}": ${code}`, { cause: error });
    } finally {
      clearTimeout(timer);
    }
  }
}

/** Parses `--resolve`-style values into a StaticHosts map; throws a TypeError naming `optionName`. */
export function buildStaticHosts(entries: Record<string, readonly string[]>, optionName: string): StaticHosts {
  const map = new Map<string, ResolvedAddress[]>();
  for (const [host, ips] of Object.entries(entries)) {
    const key = host.toLowerCase().replace(/\.$/, "");
    if (key === "" || /[^a-z0-9.\-_]/.test(key)) {
      throw new TypeError(`${optionName}: ${JSON.stringify(host)} is not a hostname`);
    }
    if (!Array.isArray(ips) || ips.length === 0) {
      throw new TypeError(`${optionName}.${host}: expected a non-empty list of IP addresses`);
    }
    map.set(
      key,
      ips.map((ip) => {
        const bare = typeof ip === "string" && ip.startsWith("[") && ip.endsWith("]") ? ip.slice(1, -1) : ip;
        // Zone IDs (fe80::1%eth0) name an interface, not an address this proxy can judge.
        if (typeof bare !== "string" || isIP(bare) === 0 || bare.includes("%")) {
          throw new TypeError(`${optionName}.${host}: ${JSON.stringify(ip)} is not an IP address`);
        }
        return literal(bare);
      }),
    );
  }
  return map;
}
