import { statusText as reasonPhrase } from "../errors.js";

/**
 * Thrown from a hook to refuse a request with a chosen status. The message becomes the body of
 * the guest's response and appears in the decision log.
 *
 * @example
 * ```ts
 * onRequest(request) {
 *   if (request.method === "DELETE") throw new HttpRequestBlockedError("deletes are not allowed");
 * }
 * ```
 */
export class HttpRequestBlockedError extends Error {
  /** Stable, as every egressgate error's: the code the guest's answer and the log line carry. */
  readonly code = "EG_HOOK_BLOCKED";
  readonly status: number;
  readonly statusText: string;

  /** Without `statusText`, the status's own reason phrase (`451 Unavailable For Legal Reasons`). */
  constructor(message: string, status = 403, statusText: string = reasonPhrase(status)) {
    super(message);
    this.name = "HttpRequestBlockedError";
    if (!Number.isInteger(status) || status < 400 || status > 599) {
      throw new RangeError(`HttpRequestBlockedError: status must be an integer from 400 to 599, got ${status}`);
    }
    this.status = status;
    this.statusText = statusText;
  }
}
