// Editor support for policies: the globals the tier-2 sandbox adds to the standard builtins.
// Request, Response, Headers, URL, URLSearchParams, TextEncoder, TextDecoder, atob, btoa and
// console come from the usual DOM/Node typings.
declare class HttpRequestBlockedError extends Error {
  constructor(message?: string, status?: number, statusText?: string);
  readonly status: number;
  readonly statusText: string;
}
/**
 * What `handle(request, next)` gets as `next`: sends a Request (the layer's own when called with
 * nothing) through the rest of the path (inner layers, secrets, every check, the upstream and its
 * redirects, onResponse) and resolves to the Response. It rejects with HttpRequestBlockedError for
 * a refusal (403, or a policy's own status), and with an Error carrying `status` and `code` for
 * any other failure (502, 504, …). A body goes once: pass `request.clone()` to send it again.
 */
type Next = (request?: Request) => Promise<Response>;
/**
 * Waits `ms` milliseconds, inside `handle` only (the sandbox has no timers). The wait does not
 * count towards the policy's time limit, but does towards the request's `timeouts.requestMs`:
 * a wait that would pass it rejects at once, and the request ends with 504.
 */
declare function sleep(ms: number): Promise<void>;
declare module "*.json" {
  const value: unknown;
  export default value;
}
