import { channel } from "node:diagnostics_channel";

/**
 * Per-request events for embedders, as undici publishes `undici:request:create`:
 * - `egressgate:request:start` gets `{ id, guest, method, url, time }` when a request's head
 *   has arrived (before any decision);
 * - `egressgate:request:end` gets the decision's {@link AuditRecord}, the audit log's line.
 *
 * Publishing costs nothing without a subscriber, and only a subscriber makes the proxy trace
 * the sources of each request. A subscriber that throws ends the process: Node's `publish()`
 * raises the throw again as an uncaught exception on the next tick, out of the proxy's reach
 * (`onDecision`'s throws are logged and ignored instead).
 *
 * @example
 * ```ts
 * import diagnostics_channel from "node:diagnostics_channel";
 * diagnostics_channel.subscribe("egressgate:request:end", (record) => console.log(record.status));
 * ```
 */
export const requestStart = channel("egressgate:request:start");
export const requestEnd = channel("egressgate:request:end");

/** The message of `egressgate:request:start`. */
export interface RequestStartMessage {
  readonly id: number;
  readonly guest: string | undefined;
  readonly method: string;
  /** The request target as the guest sent it, without the query. */
  readonly url: string;
  readonly time: string;
}
