import { EventEmitter } from "node:events";
import type { Readable } from "node:stream";
import type { Decision } from "../policy/decision.js";
import type { HeaderList } from "../headers.js";

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

/** Per-request context the proxy layer hands to the pipeline. */
export interface ExchangeContext {
  readonly id: string;
  /** Called just before the body is first read: sends `100 Continue` when the guest asked. */
  readonly beforeBody?: () => void;
  /** Aborted when the guest goes away: the upstream request is cancelled instead of left hanging. */
  readonly signal: GuestGone;
}
