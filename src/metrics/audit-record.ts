import cluster from "node:cluster";
import type { HookFailureKind } from "../errors.js";
import type { SourceVerdict, TraceEntry } from "../pipeline/exchange.js";
import { upstreamTimeOf } from "../pipeline/trace.js";

/** One source's say in a request, as the audit log records it. */
export interface AuditSource {
  /** The source's label: a policy's file, `hooks[N]`, `hooks`, an external decider's; `declarative` for the allowlist, the internal ranges and secrets. */
  readonly source: string;
  /** `declarative`, `tier2` or `tier3`. */
  readonly tier: string;
  /** `onRequest`, `isRequestAllowed`, `isIpAllowed`, `onResponse`, `handle`; for the declarative tier `allowlist`, `address` or `secrets`. */
  readonly phase: string;
  readonly decision: SourceVerdict;
  /** Why it refused or failed (or, for the allowlist, which pattern matched). */
  readonly reason?: string;
  /** For the operator only, as in the decision log: the refused address. */
  readonly detail?: string;
  /** The status its refusal or failure answered with. */
  readonly status?: number;
  /**
   * For a failed call: `time`, `memory`, `stack`, `throw`, `invalid` or `busy` (what
   * `egressgate_hook_failures_total{kind}` counts). Also on an `allow` with `failOpen`.
   */
  readonly failure?: HookFailureKind;
  /**
   * A decider with `failOpen: true` failed and let the request (or response) go on: decision
   * `allow`, with `failure` and a reason `failed open: …` saying what went wrong.
   */
  readonly failOpen?: true;
  /** For a refusal by the secrets: the secret it is about, by its configured name (what `egressgate_secret_refusals_total{secret}` counts). */
  readonly secret?: string;
  /** How long the call took; a layer's includes its `next()` descents. */
  readonly ms: number;
}

/** The decision that let the request out (the final hop's): the allowlist rule, or the source that answered it. */
export interface AuditRule {
  readonly tier: string;
  readonly rule: string;
  readonly reason: string;
  readonly source?: string;
}

/**
 * One line of the audit log (`--audit-log FILE`, `auditLog`), and the record `onDecision` gets:
 * one per decision, for requests, CONNECT refusals and upgrades alike. Strings that could carry a
 * secret's value (the URL, every reason) are redacted; placeholders stay as the guest sent them.
 *
 * @example
 * ```json
 * {"time":"2025-06-01T12:00:00.000Z","id":7,"guest":"default","method":"GET","url":"https://api.github.com/user","status":200,"reason":"host \"api.github.com\" matches \"api.github.com\"","rule":{"tier":"declarative","rule":"allowedHosts:api.github.com","reason":"host \"api.github.com\" matches \"api.github.com\""},"sources":[{"source":"declarative","tier":"declarative","phase":"allowlist","decision":"allow","reason":"host \"api.github.com\" matches \"api.github.com\"","ms":0.004}],"redirects":0,"bytesUp":0,"bytesDown":1510,"ms":84.2}
 * ```
 */
export interface AuditRecord {
  /** When the request (or CONNECT) arrived, ISO 8601 in UTC. */
  readonly time: string;
  /** The decision log line's id, to find the line for the record; absent for upgrades, as in the log. */
  readonly id?: number;
  /**
   * In a cluster worker (`--workers N`): its process id, as on its log lines. Each worker counts
   * `id` from 1, so `worker` and `id` together name one decision.
   */
  readonly worker?: number;
  /** The guest's name; null when the guest was not known (a failed authentication is not recorded). */
  readonly guest: string | null;
  /** As the guest sent it, cut after 32 characters (then `…`): only a refused method is longer. */
  readonly method: string;
  /** The destination as the guest asked for it, without the query (as the decision log has it), redacted; `host:port` for CONNECT. */
  readonly url: string;
  /** The final status the guest got; 499 when it left first, 101 for an upgrade that was relayed. */
  readonly status: number;
  /** The decision's reason, as in the decision log (and, for a refusal, the guest's error body). */
  readonly reason: string;
  /** The error code, when the proxy answered with an error itself. */
  readonly code?: string;
  /** The source that refused, failed or answered, when one did. */
  readonly source?: string;
  /** The decision that let the final hop out, for an answered request. */
  readonly rule?: AuditRule;
  /** Every source that spoke, in call order, over every redirect hop and layer descent. */
  readonly sources: readonly AuditSource[];
  /** Redirect hops the proxy followed. */
  readonly redirects: number;
  /**
   * Present when an exchange of the request went to the upstream twice: its pooled HTTP/1.1
   * connection or HTTP/2 session turned out closed before any answer (or the session stopped
   * answering PINGs), and the request was sent once more on a fresh connection.
   */
  readonly resent?: true;
  /** Request body bytes received from the guest. */
  readonly bytesUp: number;
  /** Response body bytes sent to the guest (an error answer's text included). */
  readonly bytesDown: number;
  /** From arrival to the decision line (for a response: until the guest had all of it). */
  readonly ms: number;
  /**
   * Time spent upstream (ms): from handing each exchange to the upstream (or the recorded
   * network) until its response body's last byte arrived, summed over redirect hops and layer
   * descents. Absent when nothing was sent upstream.
   */
  readonly upstreamMs?: number;
  /** Present on protocol upgrades (WebSocket). The tunnel's own bytes after the 101 are not counted. */
  readonly upgrade?: true;
  /** Why a response was cut after its head was sent. */
  readonly error?: string;
  /** For the operator only, as in the decision log. */
  readonly detail?: string;
}

/** What a decision site knows, beyond the decision log's fields, for the audit record. */
export interface AuditFacts {
  readonly trace?: readonly TraceEntry[];
  readonly bytesUp?: number;
  readonly bytesDown?: number;
  readonly rule?: { readonly tier: string; readonly rule: string; readonly reason: string; readonly source?: string | undefined };
}

/** The decision log's fields an audit record is built from. */
export interface AuditInput {
  readonly started: number;
  readonly guest: string | undefined;
  readonly id?: unknown;
  readonly method?: unknown;
  readonly target?: unknown;
  readonly status?: unknown;
  readonly reason?: unknown;
  readonly code?: unknown;
  readonly source?: unknown;
  readonly detail?: unknown;
  readonly redirects?: unknown;
  readonly resent?: unknown;
  readonly upgrade?: unknown;
  readonly error?: unknown;
}

/** Set in a cluster worker: each worker counts request ids on its own. */
const workerPid = cluster.isWorker ? process.pid : undefined;

/**
 * Builds the record. Every string that could carry a secret's value goes through `redact`: the
 * URL, the reasons (a hook's HttpRequestBlockedError message is the hook's own text), the
 * details and the cut's error.
 */
export function buildAuditRecord(input: AuditInput, facts: AuditFacts | undefined, redact: (text: string) => string): AuditRecord {
  const text = (value: unknown): string => redact(value instanceof Error ? value.message : String(value));
  const rule = facts?.rule;
  const upstreamMs = facts?.trace === undefined ? undefined : upstreamTimeOf(facts.trace);
  return {
    // The wall clock now, less the monotonic time since the start: timeOrigin plus the start
    // was the wall clock of the process's start advanced by monotonic time, which stands still
    // while a machine sleeps and ignores a step of the clock (NTP, a VM restored from a
    // snapshot), so every record after either was stamped that far off the log's lines.
    time: new Date(Date.now() - (performance.now() - input.started)).toISOString(),
    ...(typeof input.id === "number" ? { id: input.id } : {}),
    ...(workerPid !== undefined ? { worker: workerPid } : {}),
    guest: input.guest ?? null,
    method: typeof input.method === "string" ? input.method : "",
    url: cut(text(input.target ?? "")),
    status: typeof input.status === "number" ? input.status : 0,
    reason: text(input.reason ?? ""),
    ...(input.code !== undefined ? { code: String(input.code) } : {}),
    ...(input.source !== undefined ? { source: text(input.source) } : {}),
    ...(rule !== undefined
      ? { rule: { tier: rule.tier, rule: redact(rule.rule), reason: redact(rule.reason), ...(rule.source !== undefined ? { source: redact(rule.source) } : {}) } }
      : {}),
    sources: (facts?.trace ?? []).map((entry) => sourceOf(entry, redact)),
    redirects: typeof input.redirects === "number" ? input.redirects : 0,
    ...(input.resent === true ? { resent: true as const } : {}),
    bytesUp: facts?.bytesUp ?? 0,
    bytesDown: facts?.bytesDown ?? 0,
    ms: Math.round((performance.now() - input.started) * 10) / 10,
    ...(upstreamMs !== undefined ? { upstreamMs } : {}),
    ...(input.upgrade === true ? { upgrade: true as const } : {}),
    ...(input.error !== undefined ? { error: text(input.error) } : {}),
    ...(input.detail !== undefined ? { detail: text(input.detail) } : {}),
  };
}

/**
 * A crafted 60 KB path must not make every record that long; cut after redaction, which a cut
 * could defeat. The proxy hands over the decision line's target, its path already cut at 512
 * (loggableUrl, loggableTarget): the README documents that cut. This one bounds a target given
 * some other way, past any origin plus that path.
 */
function cut(url: string, max = 1024): string {
  return url.length > max ? `${url.slice(0, max)}…` : url;
}

function sourceOf(entry: TraceEntry, redact: (text: string) => string): AuditSource {
  return {
    source: redact(entry.source),
    tier: entry.tier,
    phase: entry.phase,
    decision: entry.decision,
    ...(entry.reason !== undefined ? { reason: redact(entry.reason) } : {}),
    ...(entry.detail !== undefined ? { detail: redact(entry.detail) } : {}),
    ...(entry.status !== undefined ? { status: entry.status } : {}),
    ...(entry.failure !== undefined ? { failure: entry.failure } : {}),
    ...(entry.failOpen === true ? { failOpen: true as const } : {}),
    ...(entry.secret !== undefined ? { secret: entry.secret } : {}),
    ms: entry.ms,
  };
}
