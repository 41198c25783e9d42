import { sameAddress } from "../upstream/pinned-pools.js";
import type { ResolvedAddress } from "../upstream/resolve.js";
import { allow, deny, type Decision } from "./decision.js";
import { compileHostPatterns, type HostMatcher } from "./host-pattern.js";
import { classifyIp, type IpClassification } from "./ip-classify.js";
import type { SecretStore } from "./secrets.js";
import { bareHostname, isIPAddress } from "../hostname.js";

/** The declarative tier, validated. */
export interface DeclarativeConfig {
  readonly allowedHosts: readonly string[];
  readonly allowedInternalHosts: readonly string[];
  readonly blockInternalRanges: boolean;
  /** Live: secretManager changes apply to the next request. */
  readonly secrets?: SecretStore;
}

/** An address the proxy listens on: dialling it would loop the proxy into itself. */
export interface ListenAddress {
  readonly ip: string;
  readonly port: number;
}

const tier = "declarative";

/**
 * Evaluates the declarative tier natively: the allowlist on the destination hostname, then the
 * internal-range block on every resolved address. No user code runs here.
 */
export class DeclarativePolicy {
  private readonly hosts: HostMatcher;
  private readonly internalHosts: HostMatcher;
  private readonly classifications = new Map<string, IpClassification>();

  constructor(
    readonly config: DeclarativeConfig,
    private readonly selfAddresses: () => readonly ListenAddress[],
  ) {
    this.hosts = compileHostPatterns(config.allowedHosts);
    this.internalHosts = compileHostPatterns(config.allowedInternalHosts);
  }

  /** The same few upstream IPs come back on every request; classifying is pure, so memoise it. */
  private classify(ip: string): IpClassification {
    let c = this.classifications.get(ip);
    if (c === undefined) {
      c = classifyIp(ip);
      if (this.classifications.size >= classificationCacheSize) this.classifications.clear();
      this.classifications.set(ip, c);
    }
    return c;
  }

  checkHost(hostname: string): Decision {
    const name = bareHostname(hostname);
    const pattern = this.hosts.match(name) ?? this.internalHosts.match(name);
    if (pattern !== undefined) return allow(tier, `allowedHosts:${pattern}`, `host "${name}" matches "${pattern}"`);
    if (this.hosts.patterns.length === 0 && this.internalHosts.patterns.length === 0) {
      return deny(
        tier,
        "default-deny",
        `no hosts are allowed (the default is deny-all); allow "${name}" with --allow-host ${name} or createHttpHooks({ allowedHosts: ["${name}"] })`,
      );
    }
    return deny(
      tier,
      "allowedHosts",
      `host "${name}" is not in allowedHosts; allow it with --allow-host ${name} or createHttpHooks({ allowedHosts: ["${name}"] })`,
    );
  }

  checkAddress(hostname: string, address: ResolvedAddress, port: number): Decision {
    const name = bareHostname(hostname);
    const c = this.classify(address.ip);
    const shown = c.embeddedIPv4 !== undefined ? `${address.ip} (${c.embeddedIPv4})` : address.ip;
    // A name's resolved address goes to the log only; a literal the guest wrote is no news to it.
    const literal = isIPAddress(name);
    const target = literal ? `${shown}` : `host "${name}" resolves to`;
    const what = (kind: string): string => (literal ? `${target} is ${kind}` : `${target} ${kind}`);
    const detail = literal ? undefined : `${name} -> ${shown}`;
    if (this.isSelf(c, address.ip, port)) {
      return deny(tier, "self", `${what("egressgate's own listening address")} (port ${port})`, detail);
    }
    if (c.metadata) return deny(tier, "metadata", what("a cloud metadata address"), detail);
    if (!c.internal) return allow(tier, "public", `${shown} is public`);
    if (!this.config.blockInternalRanges) return allow(tier, "blockInternalRanges:false", `${shown} is ${c.category}`);
    const pattern = this.internalHosts.match(name);
    if (pattern !== undefined) {
      return allow(tier, `allowedInternalHosts:${pattern}`, `host "${name}" may reach ${c.category} ${shown}`);
    }
    const hint = literal ? "" : `; allow it with --allow-internal-host ${name}`;
    const article = c.category.startsWith("u") ? "an" : "a";
    return deny(tier, `internal:${c.category}`, `${what(`${article} ${c.category} address`)}${hint}`, detail);
  }

  /**
   * Dialling the proxy's own port would loop it into itself. Loopback and unspecified addresses
   * all reach a loopback or wildcard listener (0.0.0.0:PORT and 127.0.0.2:PORT included).
   */
  private isSelf(c: IpClassification, ip: string, port: number): boolean {
    for (const self of this.selfAddresses()) {
      if (self.port !== port) continue;
      if (sameAddress(self.ip, ip)) return true;
      const selfClass = this.classify(self.ip);
      const local = (k: IpClassification): boolean => k.category === "loopback" || k.category === "unspecified";
      if (local(selfClass) && local(c)) return true;
    }
    return false;
  }
}

const classificationCacheSize = 4096;
