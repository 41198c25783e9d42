import type { Socket } from "node:net";
import { EgressError } from "../errors.js";
import { declarativeConfigOf } from "../hooks/http-hooks.js";
import type { Logger } from "../log.js";
import { hookSources } from "../pipeline/hook-source.js";
import { Pipeline } from "../pipeline/pipeline.js";
import { cidrContains, plainAddress, type Cidr } from "../policy/cidr.js";
import { DeclarativePolicy, type ListenAddress } from "../policy/declarative-policy.js";
import { SecretStore, type RetiredValues, type SecretTarget } from "../policy/secrets.js";
import type { TlsAuthority } from "../tls/authority.js";
import { PinnedPools, type UpstreamConnection } from "../upstream/pinned-pools.js";
import { Resolver, type ResolvedAddress } from "../upstream/resolve.js";
import { guestToken, parseBasic, tokenDigest, tokenMatches } from "./auth.js";
import { foreignSecret } from "./foreign-secret.js";
import type { ResolvedGuest } from "./guest-options.js";
import type { ResolvedProxyOptions } from "./options.js";
import type { UpgradeDeps } from "./upgrade.js";
import type { DecisionLog } from "./decision-log.js";
import type { RecordedNetwork } from "../record/network.js";
import { withFields } from "../objects.js";
import { makeIssue, OptionError } from "../option-error.js";
import { deny } from "../policy/decision.js";
import { cutRelay, OpenRelays, type OpenRelay, type RefusedRelay, type RelayRefusal } from "./open-relays.js";

export interface GuestDeps {
  readonly config: ResolvedProxyOptions;
  readonly log: Logger;
  readonly authority: TlsAuthority;
  readonly selfAddresses: () => readonly ListenAddress[];
  readonly redact: (text: string) => string;
  readonly decide: DecisionLog;
  /** The placeholder of another guest's secret in a request, by secret name. */
  readonly foreignSecret: (self: Guest, request: SecretTarget) => string | undefined;
  /** The secrets of every other guest: a policy's console line is redacted with them too. */
  readonly neighbourSecrets: (self: Guest) => Iterable<SecretStore | undefined>;
  /** How many guests the proxy serves now (a recording marks a `default` guest with neighbours as named). */
  readonly guestCount: () => number;
  /** `upstream.record`/`upstream.replay`: the recorded network every guest's pipeline ends in. */
  readonly network?: RecordedNetwork | undefined;
  /** With metrics: each upstream connection a guest's pools open, until it closes. */
  readonly upstreamConnection?: ((guest: string, protocol: "h1" | "h2", connection: UpstreamConnection) => void) | undefined;
}

/**
 * One guest's retired secret values ({@link SecretStore.retiredValues}): what the workers of a
 * cluster pass on to each other through the primary (src/cli/cluster.ts).
 */
export interface RetiredGuestSecrets {
  readonly guest: string;
  readonly secrets: readonly RetiredValues[];
}

/**
 * One guest at run time: its own policy, pipeline and upstream pools (a keep-alive connection
 * opened for one guest is never lent to another), its token, and the connections bound to it.
 */
export class Guest {
  readonly name: string;
  readonly token: string;
  readonly policy: DeclarativePolicy;
  /** What answers a CONNECT before any TLS work (see GuestSide.onConnect). */
  readonly connectPolicy: DeclarativePolicy;
  readonly pipeline: Pipeline;
  readonly upgradeDeps: UpgradeDeps;
  readonly env: Readonly<Record<string, string>>;
  readonly sources: readonly Cidr[];
  /** What it was built from: rebuilt with a secret store when it takes retired values without one. */
  readonly resolved: ResolvedGuest;
  /** Tunnels and upgraded connections of this guest, with how each was known as it: closed when it is removed. */
  readonly connections = new Map<Socket, Binding>();
  /** Its upgrades relayed now: a reload judges each again (see refusesRelay). */
  readonly relays = new OpenRelays();
  removed = false;
  /** Removed by removeGuest or a reload, not by the proxy's close (whose drain reports its own cuts). */
  dropped = false;
  private readonly digest: Buffer;
  private readonly pools: PinnedPools;
  /** The external deciders of the guest's chain: ended with the guest (their calls and processes). */
  private readonly deciders: readonly { close(): Promise<void> }[];
  /** The guest that took over from this one at a reload: where an upgrade checked by this one is judged as it opens. */
  private successor: Guest | undefined;
  private readonly log: Logger;

  constructor(resolved: ResolvedGuest, key: string, deps: GuestDeps) {
    const { config, log, authority } = deps;
    this.name = resolved.name;
    this.log = log;
    this.resolved = resolved;
    this.token = guestToken(key, resolved.name);
    this.digest = tokenDigest(this.token);
    this.env = resolved.env;
    this.sources = resolved.sources;
    this.deciders = resolved.chain.flatMap((entry) => (entry.kind === "decider" ? [entry.decider] : []));
    const policy = new DeclarativePolicy(resolved.declarative, deps.selfAddresses);
    this.policy = policy;
    // A spread copy of createHttpHooks' hooks delegates the allowlist to its generated
    // functions; the configuration they carry still answers the CONNECT, so it gets the same
    // verdict as on the native path.
    const generated = resolved.checkHooks.isRequestAllowed;
    const recovered = generated === undefined ? undefined : declarativeConfigOf(generated);
    this.connectPolicy = recovered === undefined ? policy : new DeclarativePolicy(recovered, () => []);
    // Every upstream connection is judged again once connected (DESIGN §3 step 5).
    const recheck = (hostname: string, remote: ResolvedAddress, port: number): string | undefined => {
      const decision = policy.checkAddress(hostname, remote, port);
      return decision.allowed ? undefined : decision.reason;
    };
    this.pools = new PinnedPools({
      upstreamContext: authority.upstreamContext,
      maxPools: 512,
      // A pool is shared by every connection of this guest: with a small cap, the ones that hold
      // its connections (long downloads nobody reads; 64 was enough) make every other request to
      // that origin wait without an answer. Each guest connection has at most one request in
      // flight (pipelined ones run one at a time), so upstream connections follow guest
      // connections, and the cap only bounds what one origin can take.
      connectionsPerPool: 1024,
      connectTimeoutMs: config.timeouts.upstreamConnectMs,
      headersTimeoutMs: config.timeouts.upstreamHeadersMs,
      bodyTimeoutMs: config.timeouts.upstreamBodyMs,
      keepAliveTimeoutMs: 4_000,
      h2PingMs: config.timeouts.h2PingMs,
      h2Windows: { streamBytes: config.limits.h2StreamWindowBytes, connectionBytes: config.limits.h2ConnectionWindowBytes, budgetBytes: config.limits.h2ConnectionBufferBytes },
      recheck,
      ...(deps.upstreamConnection !== undefined ? { onConnection: (protocol: "h1" | "h2", connection: UpstreamConnection) => deps.upstreamConnection!(this.name, protocol, connection) } : {}),
    });
    this.pipeline = new Pipeline({
      guest: this.name,
      policy,
      sources: hookSources(resolved.djs, resolved.chain, resolved.checkHooks, log, policy.config.secrets, () => deps.neighbourSecrets(this)),
      resolver: deps.network?.resolver(this.name, resolved.staticHosts, config.timeouts.dnsMs) ?? new Resolver(resolved.staticHosts, config.timeouts.dnsMs),
      pools: this.pools,
      maxRedirects: config.maxRedirects,
      limits: {
        requestBodyBytes: config.maxHttpBodyBytes,
        responseBodyBytes: config.maxHttpResponseBodyBytes,
        hookMs: config.timeouts.hookMs,
        bodySilenceMs: config.timeouts.upstreamBodyMs,
      },
      requestMs: config.timeouts.requestMs,
      foreignSecret: (request) => deps.foreignSecret(this, request),
      // Another guest's values are searched for too: one file holds every guest's entries. A guest
      // called `default` is a named one (its entries answer only it on replay) under `guests`, or
      // once others are served beside it: only a proxy's lone single guest records for anyone.
      executor: deps.network?.executor(
        this.name,
        () => config.form === "guests" || deps.guestCount() > 1,
        () => policy.config.secrets,
        () => deps.neighbourSecrets(this),
      ),
    });
    this.upgradeDeps = {
      guest: this.name,
      pipeline: this.pipeline,
      decide: deps.decide,
      idleMs: config.timeouts.idleMs,
      headersMs: config.timeouts.upstreamHeadersMs,
      redact: deps.redact,
      connect: { upstreamContext: authority.upstreamContext, timeoutMs: config.timeouts.upstreamConnectMs, recheck },
      offline: deps.network?.replaying === true ? "a WebSocket or other upgrade cannot be answered from a recording (--replay)" : undefined,
      admit: (relay) => this.admit(relay),
    };
  }

  /** Whether `token` is this guest's, compared in constant time over SHA-256 digests. */
  accepts(token: string): boolean {
    return tokenMatches(token, this.digest);
  }

  /** Whether a connection from `address` is this guest's by its source binding. */
  owns(address: { ip: string; family: 4 | 6 }): boolean {
    return this.sources.some((range) => cidrContains(range, address));
  }

  /**
   * Whether a connection this guest's predecessor (the same name, before a reload) knew as
   * `binding` is still this guest's: credentials it accepts, or an address its `sources` hold.
   */
  holds(binding: Binding, previous: Guest): boolean {
    switch (binding.by) {
      case "open":
        return true;
      // The token derives from the deployment key and the name, which a reload keeps: checked
      // all the same, as what the connection sent was the predecessor's token.
      case "credentials":
        return this.accepts(previous.token);
      case "source":
        return this.owns(binding.address);
    }
  }

  /** Binds a tunnel or upgraded connection, known as this guest by `binding`: it ends when the guest is removed. */
  bind(socket: Socket, binding: Binding): void {
    this.connections.set(socket, binding);
    // One listener per socket, whichever guest holds it now: one per reload held every replaced
    // guest (its pipeline, pools and secrets) for the tunnel's life, and Node warned at the 11th.
    if (!ownerOf.has(socket)) socket.once("close", () => ownerOf.get(socket)?.connections.delete(socket));
    ownerOf.set(socket, this);
  }

  /**
   * Takes over another guest's bound connections (the same name, after a reload): its removal
   * closes them from now on. A connection that no longer identifies as this guest (its address
   * left the guest's `sources`) is not taken: it is returned, for the reload to close.
   */
  adopt(previous: Guest): Unbound[] {
    previous.successor = this;
    const unbound: Unbound[] = [];
    for (const [socket, binding] of previous.connections) {
      if (this.holds(binding, previous)) this.bind(socket, binding);
      else {
        ownerOf.delete(socket);
        unbound.push({ socket, binding });
      }
    }
    previous.connections.clear();
    // A relay's guest was checked as it opened, and its traffic is never judged again: without
    // this, a host the reload took away stayed reachable through it for as long as it stayed open.
    this.cutRefused(this.relays.takeOver(previous.relays, (relay) => this.refusesRelay(relay)));
    // The values the reload rotated or removed stay refused and redacted.
    const before = previous.policy.config.secrets;
    if (before !== undefined) this.policy.config.secrets?.inherit(before);
    return unbound;
  }

  /**
   * Whether this guest's configuration refuses a relay opened under an earlier one: the
   * allowlist for its host, and the address rules (internal ranges, allowedInternalHosts, the
   * proxy's own addresses) for the address it is connected to. Only these are judged again:
   * hooks, policies and deciders judge a request, and a relay has none left to show them. Its
   * guest's identity is the binding's (see holds), judged with the tunnels.
   */
  refusesRelay(relay: OpenRelay): RelayRefusal | undefined {
    const { url, address } = relay;
    const port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
    // A spread copy of createHttpHooks' hooks leaves the native policy open and its rules to the
    // generated functions; the configuration they carry (connectPolicy) is the one to judge by.
    for (const policy of this.connectPolicy === this.policy ? [this.policy] : [this.policy, this.connectPolicy]) {
      const host = policy.checkHost(url.hostname);
      if (!host.allowed) return { phase: "allowlist", decision: host };
      const reach = policy.checkAddress(url.hostname, address, port);
      if (!reach.allowed) return { phase: "address", decision: reach };
    }
    return undefined;
  }

  /**
   * Takes a relay that this guest checked as it opens. When a reload replaced the guest while the
   * upgrade was checked, the guest that serves now judges it first: the checks before the reload
   * must not open a relay that the reload's configuration refuses, for as long as it stays open.
   */
  private admit(relay: OpenRelay): RelayRefusal | undefined {
    const holder = this.current();
    if (holder.removed) return { phase: "guest", decision: deny("declarative", "removed", removedRefusal(holder.name)) };
    const refusal = holder === this ? undefined : holder.refusesRelay(relay);
    if (refusal === undefined) holder.relays.add(relay);
    return refusal;
  }

  /** The guest of this name that serves now: this one, or the last to take over from it. */
  private current(): Guest {
    let guest = this.successor;
    if (guest === undefined) return this;
    while (guest.successor !== undefined) guest = guest.successor;
    return guest;
  }

  /** Closes the relays a reload no longer allows, with one line that says why. */
  private cutRefused(refused: readonly RefusedRelay[]): void {
    if (refused.length === 0) return;
    for (const { relay } of refused) cutRelay(relay);
    const reasons = new Set(refused.map(({ refusal }) => refusal.decision.reason));
    const targets = [...new Set(refused.map(({ relay }) => relay.target))];
    this.log.info("relays closed", {
      guest: this.name,
      relays: refused.length,
      reason: `closed by a reload: ${[...reasons].join("; ")}`,
      targets: targets.length > maxListedTargets ? [...targets.slice(0, maxListedTargets), `… ${targets.length - maxListedTargets} more`] : targets,
    });
  }

  /** After a reload replaced it: its upstream pools close once their in-flight requests finish. */
  async retire(): Promise<void> {
    await this.pools.close();
  }

  /**
   * Closes what this guest holds: its bound connections, its upstream pools, and what its
   * external deciders have under way (a command still running, a webhook call unanswered), which
   * held `close()` for the decider's timeoutMs.
   */
  async close(why: "removed" | "proxy closing" = "removed"): Promise<void> {
    this.removed = true;
    this.dropped = why === "removed";
    for (const socket of this.connections.keys()) socket.destroy();
    this.relays.cutAll();
    // At the proxy's close, what is still under way is the drain's to report. A removal refuses
    // what has not gone out and lets what has finish (its pools close after it): not awaited, as
    // a download the guest reads slowly could hold removeGuest for as long.
    if (why === "removed") void this.pools.stop(removedRefusal(this.name));
    await Promise.all([why === "removed" ? undefined : this.pools.destroy(), ...this.deciders.map((decider) => decider.close())]);
  }
}

/** The relays' targets a "relays closed" line names; past them, it says how many more. */
const maxListedTargets = 16;

/** The answer to a request whose guest was removed (removeGuest, a reload) before it went out. */
export function removedRefusal(name: string): string {
  return `guest "${name}" was removed while its request was under way`;
}

/** Whether `guest` (the one a request started with, if known) has been removed since, by removeGuest or a reload. */
export function wasRemoved(guest: Guest | undefined): guest is Guest {
  return guest?.dropped === true;
}

/** The same answer for a request whose upstream connection the removal closed under it. */
export function removedError(name: string, cause: unknown): EgressError {
  return new EgressError("EG_DENIED", 403, removedRefusal(name), { cause, detail: (cause as Error)?.message ?? String(cause) });
}

/** The log's reason for a request of a removed guest whose connection the removal closed. */
export function removedCut(name: string): string {
  return `the proxy closed the connection: the guest "${name}" was removed`;
}

/** `resolved` with an empty secret store: one to hold the values a predecessor or another worker retired. */
function withEmptyStore(resolved: ResolvedGuest): ResolvedGuest {
  return withFields(resolved, { declarative: withFields(resolved.declarative, { secrets: new SecretStore({}, false, () => []) }) });
}

/** The guest a bound connection belongs to now (a reload hands it to the guest's successor). */
const ownerOf = new WeakMap<Socket, Guest>();

/**
 * How a connection was known as its guest when it was bound, which a reload checks again before
 * it hands the connection to the guest's successor: the credentials it sent, the source address
 * that a guest's `sources` held, or the single guest without credentials.
 */
export type Binding =
  | { readonly by: "open" | "credentials" }
  | { readonly by: "source"; readonly address: { readonly ip: string; readonly family: 4 | 6 } };

/** A guest and how the connection was known as it (see GuestRegistry.identify). */
export interface Identified {
  readonly guest: Guest;
  readonly binding: Binding;
}

/** A connection a reload took from its guest: its binding no longer holds under the new configuration. */
export interface Unbound {
  readonly socket: Socket;
  readonly binding: Binding;
}

/** Why the proxy closed the connections a reload took from their guest, by connection. */
const unboundCuts = new WeakMap<Socket, string>();

/**
 * The guest a tunnel's CONNECT connection is bound to now: undefined once the guest was removed,
 * or once a reload took the connection from it. Its name alone would find the guest's successor
 * for a request parsed in the same turn as the reload that closed the tunnel.
 */
export function boundGuest(connection: Socket): Guest | undefined {
  const guest = ownerOf.get(connection);
  return guest === undefined || guest.removed ? undefined : guest;
}

/** The log's reason for a request on a connection that a reload took from its guest; undefined for any other. */
export function unboundCut(connection: Socket | undefined): string | undefined {
  return connection === undefined ? undefined : unboundCuts.get(connection);
}

/**
 * Closes connections a reload took from `guest`, recording why for the lines of their requests
 * under way (499, as a removed guest's). Returns the distinct reasons, for the reload's log line.
 */
export function closeUnbound(guest: string, unbound: readonly Unbound[]): string[] {
  const reasons = new Set<string>();
  for (const { socket, binding } of unbound) {
    const why = binding.by === "source" ? `a reload took ${binding.address.ip} out of the guest "${guest}"'s sources` : `a reload left the guest "${guest}" without the credentials it was opened with`;
    reasons.add(why);
    unboundCuts.set(socket, `the proxy closed the connection: ${why}`);
    socket.destroy();
  }
  return [...reasons];
}

/**
 * A call that names a guest (`addGuest`, `removeGuest`, `guestEnv`) with what cannot name one,
 * or one that is not (or already) served: code EG_INVALID_OPTION, at the guest's path.
 */
export function guestNameError(caller: string, name: unknown, reason: string): OptionError {
  const segments = typeof name === "string" ? ["guests", name] : ["guests"];
  return new OptionError(makeIssue(segments, reason, "clause"), { prefix: `${caller}: ` });
}

/** `name`, if it is a string; otherwise the caller's OptionError. */
export function checkGuestName(caller: string, name: unknown): string {
  if (typeof name !== "string") throw guestNameError(caller, name, `a guest name must be a string (got ${name === null ? "null" : typeof name})`);
  return name;
}

/** Why a connection has no guest; the guest itself only ever hears 407 (see GuestRegistry.identify). */
export type AuthFailure = "missing" | "malformed" | "unknown guest" | "wrong token" | "removed";

/**
 * The guests of one proxy, and who a connection is. The single-guest form without `auth` is
 * open: every connection is its one guest. Otherwise a connection is the guest whose
 * credentials it sends, or else the guest whose source range holds its address.
 */
export class GuestRegistry {
  private readonly guests = new Map<string, Guest>();

  constructor(
    private readonly key: string,
    readonly open: boolean,
    private readonly deps: GuestDeps,
  ) {}

  get size(): number {
    return this.guests.size;
  }

  names(): string[] {
    return [...this.guests.keys()];
  }

  get(name: string): Guest | undefined {
    return this.guests.get(name);
  }

  all(): IterableIterator<Guest> {
    return this.guests.values();
  }

  /** `retired`: values another process retired for this guest, refused and redacted here too. */
  add(resolved: ResolvedGuest, retired: readonly RetiredValues[] = []): Guest {
    if (this.guests.has(resolved.name)) throw guestNameError("addGuest", resolved.name, `a guest named "${resolved.name}" is already served`);
    const guest = this.build(resolved, retired);
    this.guests.set(guest.name, guest);
    return guest;
  }

  /** A guest whose store holds `retired` too; one without secrets gets an empty store to hold them. */
  private build(resolved: ResolvedGuest, retired: readonly RetiredValues[]): Guest {
    const holds = retired.some((secret) => secret.values.length > 0);
    const guest = new Guest(holds && resolved.declarative.secrets === undefined ? withEmptyStore(resolved) : resolved, this.key, this.deps);
    if (holds) guest.policy.config.secrets?.adoptRetired(retired);
    return guest;
  }

  /** Every guest's retired secret values, for the other workers of a cluster. */
  retiredSecrets(): RetiredGuestSecrets[] {
    return [...this.guests.values()].flatMap((guest) => {
      const secrets = guest.policy.config.secrets?.retiredValues() ?? [];
      return secrets.length === 0 ? [] : [{ guest: guest.name, secrets }];
    });
  }

  /**
   * Takes the values another worker retired, guest by guest; those of a guest not served here
   * are left (a removed guest's values are not kept by a reload either). A guest without a
   * secret store is rebuilt with one, as a reload that removed its last secret does: the
   * guests replaced so are returned, for their pools to retire, with the names of the guests
   * that took a value. Every list is checked before anything changes.
   */
  adoptRetired(retired: readonly RetiredGuestSecrets[]): { readonly replaced: Guest[]; readonly changed: string[] } {
    for (const entry of retired) {
      if (typeof entry?.guest !== "string" || !Array.isArray(entry.secrets)) throw new TypeError("retired values: expected { guest, secrets }");
      // A dry run on an empty store: the same checks, and nothing to change.
      new SecretStore({}, false, () => []).adoptRetired(entry.secrets);
    }
    const replaced: Guest[] = [];
    const changed = new Set<string>();
    for (const { guest: name, secrets } of retired) {
      const guest = this.guests.get(name);
      if (guest === undefined) continue;
      const store = guest.policy.config.secrets;
      if (store !== undefined) {
        if (store.adoptRetired(secrets)) changed.add(name);
        continue;
      }
      if (!secrets.some((secret) => secret.values.length > 0)) continue;
      const successor = this.build(guest.resolved, secrets);
      successor.adopt(guest);
      this.guests.set(name, successor);
      replaced.push(guest);
      changed.add(name);
    }
    return { replaced, changed: [...changed] };
  }

  /**
   * Swaps every guest at once (a reload). Every new guest is built before anything changes, so a
   * failure leaves the old set serving. A kept name's tunnels move to its new guest and take the
   * new configuration from their next request; requests in flight keep the guest they started
   * with. A tunnel known by its source address alone stays only while the guest's new `sources`
   * hold that address: one they no longer hold has no claim on the guest (nor on the address's
   * new guest, if any: a tunnel's guest is fixed for its life). Returns the guests that were
   * replaced (their pools to retire) and removed (to close), and the connections no longer
   * their guest's (to close), by guest name.
   */
  replaceAll(resolved: readonly ResolvedGuest[]): { readonly replaced: Guest[]; readonly removed: Guest[]; readonly unbound: Map<string, Unbound[]> } {
    const next = new Map<string, Guest>();
    for (const entry of resolved) {
      // A reload that removed every secret of a guest that had some still needs a store: the
      // old values stay refused and redacted (see Guest.adopt).
      const carried = this.guests.get(entry.name)?.policy.config.secrets;
      const kept = carried !== undefined && carried.size > 0 && entry.declarative.secrets === undefined ? withEmptyStore(entry) : entry;
      next.set(entry.name, new Guest(kept, this.key, this.deps));
    }
    const replaced: Guest[] = [];
    const removed: Guest[] = [];
    const unbound = new Map<string, Unbound[]>();
    for (const [name, previous] of this.guests) {
      const successor = next.get(name);
      if (successor === undefined) removed.push(previous);
      else {
        const lost = successor.adopt(previous);
        if (lost.length > 0) unbound.set(name, lost);
        replaced.push(previous);
      }
    }
    this.guests.clear();
    for (const [name, guest] of next) this.guests.set(name, guest);
    return { replaced, removed, unbound };
  }

  /** Removes a guest: from now on its credentials get 407, and its open tunnels are closed. */
  async remove(name: string): Promise<void> {
    const guest = this.guests.get(checkGuestName("removeGuest", name));
    if (guest === undefined) throw guestNameError("removeGuest", name, `no guest named "${name}" (served: ${this.names().join(", ") || "none"})`);
    this.guests.delete(name);
    await guest.close();
  }

  /**
   * The guest a request is from, given its `Proxy-Authorization` and its connection's address;
   * or why not. Credentials, when sent, decide (a wrong one is never rescued by a source
   * binding); without them, the source binding does.
   */
  identify(authorization: string | undefined, remoteAddress: string | undefined): Identified | AuthFailure {
    if (this.open) {
      const only = this.guests.values().next().value;
      return only === undefined ? "removed" : { guest: only, binding: { by: "open" } };
    }
    if (authorization !== undefined) {
      const credentials = parseBasic(authorization);
      if (credentials === undefined) return "malformed";
      const guest = this.guests.get(credentials.user);
      // An unknown name still costs one comparison, so its answer takes as long as a wrong token's.
      if (guest === undefined) {
        tokenMatches(credentials.password, tokenDigest(""));
        return "unknown guest";
      }
      return guest.accepts(credentials.password) ? { guest, binding: { by: "credentials" } } : "wrong token";
    }
    const address = remoteAddress === undefined ? undefined : plainAddress(remoteAddress);
    if (address !== undefined) {
      for (const guest of this.guests.values()) if (guest.owns(address)) return { guest, binding: { by: "source", address } };
    }
    return "missing";
  }

  /** Every guest's token, and its Basic form, for the log redactor. */
  credentialNeedles(): string[] {
    const needles: string[] = [];
    for (const guest of this.guests.values()) {
      needles.push(guest.token, Buffer.from(`${guest.name}:${guest.token}`).toString("base64"));
    }
    return needles;
  }

  /** The placeholder of a secret that another guest holds, anywhere in the request: its name. */
  foreignSecret(self: Guest, request: SecretTarget): string | undefined {
    // One guest has no neighbours: nothing to scan on the single-guest path.
    if (this.guests.size <= 1) return undefined;
    return foreignSecret(request, this.neighbourSecrets(self));
  }

  /** The secrets of every guest but `self`. */
  *neighbourSecrets(self: Guest): Generator<SecretStore | undefined> {
    for (const guest of this.guests.values()) if (guest !== self) yield guest.policy.config.secrets;
  }

  async closeAll(): Promise<void> {
    await Promise.all([...this.guests.values()].map((guest) => guest.close("proxy closing")));
  }
}
