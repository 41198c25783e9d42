import { collectDefaultMetrics, Counter, Gauge, Registry } from "prom-client";
import { tallyCounter, tallyHistogram } from "./tally.js";
import type { Socket } from "node:net";
import type { AuditFacts, AuditInput, AuditRecord, AuditSource } from "./audit-record.js";
import { upstreamTimeOf } from "../pipeline/trace.js";
import { shareWithPrimary } from "./cluster-metrics.js";

/** What the registry reads at scrape time from the parts of the proxy that keep their own counts. */
export interface MetricsProbes {
  /** Leaf certificates served from the cache, and signed (misses). */
  readonly certificates?: () => { readonly hits: number; readonly misses: number };
  /**
   * The guests configured now: a removed guest's series go, its request counts once no more of
   * its requests are being counted, its upstream-connections gauge once its connections have closed.
   */
  readonly guests?: () => readonly string[];
  /** With an audit log: the records it has lost so far (a full disk, a FIFO without a reader, a queue past its bound). */
  readonly auditDropped?: () => number;
}

/**
 * The proxy's Prometheus series. Every series is fed from the decision record (the audit log's
 * {@link AuditRecord}), so metrics, the audit log and `onDecision` can never disagree; only
 * tunnels and the certificate cache, which make no decision, are counted where they happen.
 *
 * Cardinality is bounded by the configuration, never by traffic: a host appears only as the
 * allowlist rule that matched it (`allowedHosts:*.example.com`), a denial as the phase and the
 * source that refused, a secret by its configured name, a guest by its name while it is served
 * (a removed guest's series are dropped, as prom-client's remove() drops one).
 */
export interface ProxyMetrics {
  readonly registry: Registry;
  /** Counts one decision from its audit record. */
  observe(record: AuditRecord): void;
  /**
   * Counts one decision from what its record would be built from (the decision log's fields and
   * the sources' trace), without building the record: the proxy's path when nothing else (an
   * audit log, onDecision, a channel subscriber) wants one. The same counts as {@link observe}.
   */
  observeDecision(input: AuditInput, facts: AuditFacts | undefined): void;
  /** Counts an open tunnel (CONNECT) until its socket closes. */
  tunnel(socket: Socket): void;
  /** Counts an open upstream connection of a guest's pools until it closes. */
  upstreamConnection(guest: string, protocol: "h1" | "h2", connection: { readonly destroyed?: boolean; once(event: "close", listener: () => void): unknown }): void;
  /** The Prometheus text exposition of every series. */
  text(): Promise<string>;
}

/** How often the event-loop delay histogram samples (prom-client's `eventLoopMonitoringPrecision`). */
const eventLoopSampleMs = 100;

/** prom-client's default buckets stop at 10 s; a proxied download can take longer. */
const durationBuckets = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
const hookBuckets = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5];

export function createProxyMetrics(probes: MetricsProbes = {}, options: { readonly defaultMetrics?: boolean } = {}): ProxyMetrics {
  const registry = new Registry();
  shareWithPrimary(registry);
  // The event-loop delay is sampled every 100 ms, not prom-client's 10: its timer firing 100 times
  // a second cost about 5% of the CPU of a small proxied GET (bench side-by-side scenario,
  // docs/performance.md), and a stall still shows in the sample it delays.
  if (options.defaultMetrics !== false) collectDefaultMetrics({ register: registry, prefix: "egressgate_", eventLoopMonitoringPrecision: eventLoopSampleMs });
  // Counted per request through tallies (see tally.ts): prom-client's own inc()/observe() hash
  // their labels on every call.
  const requests = tallyCounter({
    name: "egressgate_requests_total",
    help: "Decisions, by guest, allow or deny, status class and the rule that decided (never a raw hostname).",
    labelNames: ["guest", "decision", "status_class", "rule"],
    registry,
    beforeCollect: () => forgetRemovedGuests(),
  });
  const duration = tallyHistogram({
    name: "egressgate_request_duration_seconds",
    help: "From a request's arrival until the guest had all of the answer.",
    labelNames: ["decision"],
    buckets: durationBuckets,
    registry,
  });
  const upstream = tallyHistogram({
    name: "egressgate_upstream_duration_seconds",
    help: "Upstream time alone of an allowed request: from sending it upstream until the response body's last byte arrived, summed over redirect hops.",
    labelNames: [],
    buckets: durationBuckets,
    registry,
  });
  const hookDuration = tallyHistogram({
    name: "egressgate_hook_duration_seconds",
    help: "One hook source's call, by source (a policy file, hooks[N], a decider, declarative) and phase.",
    labelNames: ["source", "phase"],
    buckets: hookBuckets,
    registry,
  });
  const hookFailures = tallyCounter({
    name: "egressgate_hook_failures_total",
    help: "Hook calls that failed (502, or an allow from a failOpen decider), by source and kind: time, memory, stack, throw, invalid, busy.",
    labelNames: ["source", "kind"],
    registry,
  });
  const bytes = tallyCounter({
    name: "egressgate_bytes_total",
    help: "Body bytes: up (from guests) and down (to guests).",
    labelNames: ["direction"],
    registry,
  });
  const secretRefusals = tallyCounter({
    name: "egressgate_secret_refusals_total",
    help: "Requests refused for carrying a secret (its placeholder or value) where it may not go, by secret name.",
    labelNames: ["secret"],
    registry,
  });
  let openTunnels = 0;
  new Gauge({
    name: "egressgate_open_tunnels",
    help: "CONNECT tunnels open now.",
    registers: [registry],
    collect() {
      this.set(openTunnels);
    },
  });
  // By guest and protocol: pools are per guest, origin and pinned IP, and the last two grow with
  // traffic; a guest's name and h1/h2 come from the configuration and the protocol.
  const upstreamOpen = new Map<string, { guest: string; protocol: string; open: number }>();
  new Gauge({
    name: "egressgate_upstream_connections",
    help: "Upstream connections open now in the guests' pools, by guest and protocol (h1: undici's pools, h2: HTTP/2 sessions).",
    labelNames: ["guest", "protocol"] as const,
    registers: [registry],
    collect() {
      // A guest a reload removed keeps its series while its connections close, then loses it.
      const configured = probes.guests === undefined ? undefined : new Set(probes.guests());
      this.reset();
      for (const [key, { guest, protocol, open }] of upstreamOpen) {
        if (open <= 0 && configured !== undefined && !configured.has(guest)) upstreamOpen.delete(key);
        else this.set({ guest, protocol }, open);
      }
    },
  });
  // A guest the configuration no longer has (removeGuest, a reload that dropped it), with its
  // requests counted when it was last looked at. Its series go at the next look that finds no
  // more counted: the requests it had under way at its removal (cut, or refused 403) are counted
  // first. Without this every guest ever added kept its series: an embedder that adds and
  // removes a guest per job grew the exposition and the heap without bound (black-box finding).
  let leaving = new Map<string, number>();
  /**
   * Looks for removed guests' series: at each scrape, and whenever a request makes a new series
   * (a new guest's first request, say), so that series stay bounded by the guests served without
   * a scrape too. Its cost, a pass over the series, is paid only then.
   */
  const forgetRemovedGuests = (): void => {
    if (probes.guests === undefined) return;
    const configured = new Set(probes.guests());
    const quiet = new Set<string>();
    const still = new Map<string, number>();
    for (const [guest, total] of requests.totalsBy(0)) {
      // "" counts the decisions made before a guest was known.
      if (guest === "" || configured.has(guest)) continue;
      if (leaving.get(guest) === total) quiet.add(guest);
      else still.set(guest, total);
    }
    leaving = still;
    requests.forget(0, quiet);
    for (const [key, { guest, open }] of upstreamOpen) if (open <= 0 && !configured.has(guest)) upstreamOpen.delete(key);
  };
  const certificates = probes.certificates;
  const seen = { hits: 0, misses: 0 };
  const certCounter = (name: "hits" | "misses", help: string): Counter =>
    new Counter({
      name: `egressgate_certificate_cache_${name}_total`,
      help,
      registers: [registry],
      collect() {
        if (certificates === undefined) return;
        const now = certificates()[name];
        if (now > seen[name]) this.inc(now - seen[name]);
        seen[name] = now;
      },
    });
  certCounter("hits", "Leaf certificates served from the cache.");
  certCounter("misses", "Leaf certificates signed because the cache had none.");
  const auditDropped = probes.auditDropped;
  if (auditDropped !== undefined) {
    // The audit log carries on when its file cannot be written (README, "Audit log"); what it
    // lost must show where an operator's alerts look, not only in a rate-limited warning.
    let counted = 0;
    new Counter({
      name: "egressgate_audit_records_dropped_total",
      help: "Audit records that could not be written to the audit log's file (a full disk, a path that cannot be opened, a FIFO without a reader, a queue past its bound).",
      registers: [registry],
      collect() {
        const now = auditDropped();
        if (now > counted) this.inc(now - counted);
        counted = now;
      },
    });
  }

  // Label arrays that never change, made once rather than per request.
  const byDecision = { allow: ["allow"], deny: ["deny"], error: ["error"], gone: ["gone"] } as const;
  const up = ["up"] as const;
  const down = ["down"] as const;
  const none = [] as const;

  // The record's parts as arguments rather than an object: with metrics alone this runs per
  // request on facts that are not a record yet, and building one only to read it cost a share
  // of a small GET.
  const count = (
    guest: string | null | undefined,
    status: number,
    code: string | undefined,
    rule: CountedRule | undefined,
    sources: readonly CountedSource[],
    bytesUp: number,
    bytesDown: number,
    ms: number,
    upstreamMs: number | undefined,
  ): void => {
    const decision = decisionFrom(status, rule);
    if (requests.inc([guest ?? "", decision, statusClass(status), ruleFrom(rule, sources, code)])) forgetRemovedGuests();
    duration.observe(byDecision[decision], ms / 1000);
    for (const source of sources) {
      hookDuration.observe([source.source, source.phase], source.ms / 1000);
      // A failOpen decider's failure allowed, and is counted all the same: the metric is where an operator finds a decider that is down.
      if (source.decision === "error" || source.failOpen === true) hookFailures.inc([source.source, failureKind(source)]);
      const secret = secretOf(source);
      if (secret !== undefined) secretRefusals.inc([secret]);
    }
    // Measured at the executor, not derived: a request a hook answered itself sent nothing upstream.
    if (decision === "allow" && upstreamMs !== undefined) upstream.observe(none, upstreamMs / 1000);
    if (bytesUp > 0) bytes.inc(up, bytesUp);
    if (bytesDown > 0) bytes.inc(down, bytesDown);
  };

  return {
    registry,
    observe(record) {
      count(record.guest, record.status, record.code, record.rule, record.sources, record.bytesUp, record.bytesDown, record.ms, record.upstreamMs);
    },
    observeDecision(input, facts) {
      const trace = facts?.trace;
      const code = input.code;
      count(
        input.guest,
        typeof input.status === "number" ? input.status : 0,
        code !== undefined ? String(code) : undefined,
        facts?.rule,
        trace ?? none,
        facts?.bytesUp ?? 0,
        facts?.bytesDown ?? 0,
        performance.now() - input.started,
        trace === undefined ? undefined : upstreamTimeOf(trace),
      );
    },
    tunnel(socket) {
      openTunnels += 1;
      socket.once("close", () => (openTunnels -= 1));
    },
    upstreamConnection(guest, protocol, connection) {
      // One that closed already (an h2 session handed out as it went) would never count down.
      if (connection.destroyed === true) return;
      const key = `${guest}\0${protocol}`;
      let entry = upstreamOpen.get(key);
      if (entry === undefined) upstreamOpen.set(key, (entry = { guest, protocol, open: 0 }));
      const counted = entry;
      counted.open += 1;
      connection.once("close", () => (counted.open -= 1));
    },
    text: () => registry.metrics(),
  };
}

const statusClasses = ["0xx", "1xx", "2xx", "3xx", "4xx", "5xx"];

/** `2xx` for 200: the label, without a new string per request. */
function statusClass(status: number): string {
  return statusClasses[Math.floor(status / 100)] ?? `${Math.floor(status / 100)}xx`;
}

/** One source's part as the counts read it: an audit record's source, or the trace entry it is made from. */
interface CountedSource {
  readonly source: string;
  readonly phase: string;
  readonly decision: string;
  readonly reason?: string | undefined;
  readonly failure?: string | undefined;
  readonly failOpen?: true | undefined;
  readonly secret?: string | undefined;
  readonly ms: number;
}

/** The rule that let a request out, as the counts read it (a record's, or the decision's before one). */
interface CountedRule {
  readonly tier: string;
  readonly rule: string;
  readonly source?: string | undefined;
}

/** What the counts read of a decision: an {@link AuditRecord}, or the same facts before one is built. */
export interface CountedDecision {
  readonly guest: string | null;
  readonly status: number;
  readonly code?: string;
  readonly rule?: { readonly tier: string; readonly rule: string; readonly source?: string };
  readonly sources: readonly CountedSource[];
  readonly bytesUp: number;
  readonly bytesDown: number;
  readonly ms: number;
  readonly upstreamMs?: number;
}

/** allow (a rule let it out), deny (a 4xx refusal), error (5xx: a hook or the upstream failed), gone (the guest left: 499). */
export function decisionOf(record: CountedDecision | AuditRecord): "allow" | "deny" | "error" | "gone" {
  return decisionFrom(record.status, record.rule);
}

function decisionFrom(status: number, rule: CountedRule | undefined): "allow" | "deny" | "error" | "gone" {
  if (status === 499) return "gone";
  if (rule !== undefined && status < 500) return "allow";
  return status >= 500 ? "error" : rule !== undefined ? "allow" : "deny";
}

/**
 * The rule label: for an allowed request the allowlist pattern (or the source) that let it out;
 * for a refusal the phase and source that refused; otherwise the error code. Never a hostname,
 * never a reason text (both grow with traffic).
 */
export function ruleOf(record: CountedDecision | AuditRecord): string {
  return ruleFrom(record.rule, record.sources, record.code);
}

function ruleFrom(rule: CountedRule | undefined, sources: readonly CountedSource[], code: string | undefined): string {
  if (rule !== undefined) return rule.tier === "declarative" ? rule.rule : `${rule.tier}:${rule.source ?? rule.rule}`;
  // The last source that refused, answered or failed.
  for (let i = sources.length - 1; i >= 0; i--) {
    const source = sources[i]!;
    if (source.decision === "block" || source.decision === "error" || source.decision === "answer") return `${source.source}:${source.phase}`;
  }
  return code ?? "none";
}

/**
 * The kind a failed call is counted under: the `failure` its runner carried, never read from
 * its message (the README's promise; a decider's "busy" reason was read as "throw"). A record
 * without one (a failure past the hook, such as the upstream under a layer's next(), or a record
 * built elsewhere) counts as a throw.
 */
export function failureKind(source: CountedSource | AuditSource): string {
  return source.failure ?? "throw";
}

/** The secret a secrets-phase refusal is about, as the refusal carried it: a configured name, so bounded. */
function secretOf(source: CountedSource): string | undefined {
  return source.phase === "secrets" && source.decision === "block" ? source.secret : undefined;
}
