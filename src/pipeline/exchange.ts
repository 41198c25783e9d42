import { EventEmitter } from "node:events";
import { METHODS } from "node:http";
import type { Readable } from "node:stream";
import type { HookFailureKind } from "../errors.js";
import type { Decision } from "../policy/decision.js";
import type { HeaderList } from "../headers.js";
import type { ResolvedAddress } from "../upstream/resolve.js";

/** A request as the pipeline evaluates it: already validated, with end-to-end headers only. */
export interface OutboundRequest {
  readonly method: string;
  /** Absolute http: or https: URL of the destination. */
  readonly url: URL;
  /** End-to-end headers, without Host (it is derived from `url` on every hop). */
  readonly headers: HeaderList;
  /**
   * The guest's body, streamed through unread; bytes when a hook built a new body (those can be
   * re-sent on a 307/308); null when the request has none.
   */
  readonly body: Readable | Uint8Array | null;
  /**
   * Set on a redirect hop whose `Location` held a secret's value, and on every later hop of the
   * request: that secret's name. The URL parser may have rewritten the copy where redaction
   * cannot see it, so every output that names this URL (error texts, a decider's document, a
   * recording) names its origin and `/[REDACTED:NAME]` only (src/policy/hidden-url.ts). The
   * request itself goes out as the upstream asked.
   */
  readonly hiddenPath?: string;
}

export interface PipelineResponse {
  readonly status: number;
  /** End-to-end response headers. */
  readonly headers: HeaderList;
  /** null for responses without a body (HEAD, 204, 304). */
  readonly body: Readable | null;
  /** The decision that let the final hop out. */
  readonly decision: Decision;
  /** The URL the response came from, after redirects. */
  readonly url: URL;
  readonly redirects: number;
  /**
   * The upstream's trailer fields, once `body` has ended (an HTTP/2 upstream's trailing HEADERS,
   * an HTTP/1.1 chunked response's trailer section); absent when none can come. Dropped when an
   * onResponse hook replaces the response: a WHATWG Response has no trailers to set.
   */
  readonly trailers?: () => HeaderList | undefined;
  /** Called once the guest has the response: releases an upstream body a hook replaced. */
  readonly cleanup?: () => void;
}

/**
 * Aborted when the guest goes away. undici takes an EventEmitter with `aborted` and `reason` as
 * a request's signal; one of these costs far less than Node 20's AbortController, which took
 * about 3% of the proxy's CPU on small GETs (one per request, almost never aborted).
 */
export class GuestGone extends EventEmitter {
  aborted = false;
  reason: unknown = undefined;
  /** Work the request let go of when it ended that still runs: see {@link GuestGone.hold}. */
  private holding: Promise<unknown>[] | undefined;

  /**
   * Counts work that outlives its request, bounded by its own deadline: a hook's call still
   * pending when the guest left ends the request at once, but goes on in the hook's own code. An
   * HTTP/2 connection's running-work cap counts it until it settles, so that a guest cannot
   * reset streams to start calls without limit (CVE-2023-44487).
   */
  hold(work: Promise<unknown>): void {
    (this.holding ??= []).push(work);
  }

  /** Settles once all held work has; undefined when none was held (the usual case: nothing to wait for). */
  held(): Promise<void> | undefined {
    return this.holding === undefined ? undefined : Promise.allSettled(this.holding).then(() => undefined);
  }

  abort(reason: unknown = new Error("the guest closed the connection")): void {
    if (this.aborted) return;
    this.aborted = true;
    this.reason = reason;
    this.emit("abort");
  }
}

/**
 * Methods no request may leave with (fetch forbids them too): TRACE and TRACK echo the request
 * back, secrets included (DESIGN §4), and CONNECT is a tunnel, not a request to forward.
 */
export const forbiddenMethods: ReadonlySet<string> = new Set(["CONNECT", "TRACE", "TRACK"]);

/**
 * The methods a request may leave with, each in its one spelling: Node's HTTP/1.1 methods but
 * the forbidden ones. Methods are case-sensitive, and a `delete` passes a check for `DELETE`.
 */
export const forwardedMethods: ReadonlySet<string> = new Set(METHODS.filter((m) => !forbiddenMethods.has(m)));

/**
 * The end of a refusal of a method that is not forwarded: its one spelling, when it is a
 * forwarded method in the wrong case (` (spell it PATCH)` for `patch`), else nothing.
 */
export function spellingHint(method: string): string {
  const upper = method.toUpperCase();
  return forwardedMethods.has(upper) ? ` (spell it ${upper})` : "";
}

/** What one source said in one phase: allowed, refused, rewrote, answered itself, or failed. */
export type SourceVerdict = "allow" | "block" | "rewrite" | "answer" | "error";

/**
 * One source's say in one phase of a request (issue 17's audit log): the pipeline pushes one per
 * call when the context carries a trace, in the order the calls started. A layer's `ms` includes
 * the descents it made through `next()`. Reasons are raw here; the audit record redacts them.
 */
export interface TraceEntry {
  /** The source's label (a policy's file, `hooks[N]`, `hooks`), or `declarative` for the allowlist, the internal ranges and secrets. */
  readonly source: string;
  readonly tier: string;
  /** onRequest, isRequestAllowed, isIpAllowed, onResponse, handle; for the declarative tier allowlist, address or secrets. */
  readonly phase: string;
  decision: SourceVerdict;
  reason?: string;
  /** For the operator only (a refused address): never sent to the guest. */
  detail?: string;
  /** The status a refusal or failure answered with. */
  status?: number;
  /** How a failed call failed (time, memory, stack, throw, invalid, busy), from the error's own data. */
  failure?: HookFailureKind;
  /** A failOpen decider failed and allowed: decision `allow`, with its `failure` and reason. */
  failOpen?: true;
  /** For a refusal by the secrets: the secret it is about. */
  secret?: string;
  ms: number;
}

/** Per-request context the proxy layer hands to the pipeline. */
export interface ExchangeContext {
  /**
   * The decision line's id, which the request's other log lines carry too (a number, as there);
   * undefined where no decision line is written (`egressgate check`).
   */
  readonly id: number | undefined;
  /**
   * Present only when an audit log or onDecision wants records: each source's call is pushed
   * here. Absent, the pipeline measures nothing, so the hot path costs nothing extra.
   */
  readonly trace?: TraceEntry[];
  /** Called just before the body is first read: sends `100 Continue` when the guest asked. */
  readonly beforeBody?: () => void;
  /** Aborted when the guest goes away: the upstream request is cancelled instead of left hanging. */
  readonly signal: GuestGone;
  /**
   * Called when an exchange of this request is sent once more on a fresh connection, its pooled
   * one having turned out closed (resendOnceIfStale): its decision line says so (`resent`).
   */
  readonly onResend?: (() => void) | undefined;
}

/** One answer of the innermost executor: a single exchange (the pipeline follows redirects). */
export interface ExecutorResponse {
  readonly status: number;
  readonly headers: HeaderList;
  /** null when the response has no body; undici's `dump()` lets a redirect's body go without closing its connection. */
  readonly body: (Readable & { dump?: (options: { limit: number; signal: AbortSignal }) => Promise<void> }) | null;
  /** The Location header, when there is exactly one. */
  readonly location: string | undefined;
  /** The trailer fields, read once `body` has ended (see {@link PipelineResponse.trailers}). */
  readonly trailers?: () => HeaderList | undefined;
  /** Set when the upstream spoke HTTP/2; HTTP/1.1 otherwise (a recording's `httpVersion`). */
  readonly httpVersion?: "HTTP/2";
}

/** Where in its request one send is: the request's id and its redirect hop (0 first). */
export interface SendInfo {
  readonly id: number | undefined;
  readonly hop: number;
  /** The request's {@link ExchangeContext.onResend}. */
  readonly onResend?: (() => void) | undefined;
}

/**
 * The innermost executor (DESIGN §2): sends one request, whose checks have all passed, to one
 * approved address. The upstream is one; a recorded network (src/record/) is the other.
 */
export interface Executor {
  send(request: OutboundRequest, address: ResolvedAddress, signal: GuestGone, info: SendInfo): Promise<ExecutorResponse>;
}
