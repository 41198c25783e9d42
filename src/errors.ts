import { STATUS_CODES } from "node:http";
/**
 * Stable error codes. Every failure that reaches a guest carries one of these, so log
 * pipelines and tests can match on the code instead of on message text.
 */
export type EgressErrorCode =
  | "EG_BAD_REQUEST"
  | "EG_DENIED"
  | "EG_METHOD_NOT_ALLOWED"
  | "EG_MISDIRECTED"
  | "EG_HEADERS_TOO_LARGE"
  | "EG_UPSTREAM"
  | "EG_UPSTREAM_TIMEOUT"
  | "EG_REDIRECT_LOOP"
  | "EG_TOO_LARGE"
  | "EG_HOOK_BLOCKED"
  | "EG_HOOK_FAILED"
  | "EG_HOOK_TIMEOUT"
  | "EG_LIMIT"
  | "EG_AUTH"
  | "EG_CA"
  /** Replay (--replay FILE.har): no recorded entry matches the request; no socket was opened. */
  | "EG_REPLAY_MISS"
  /** Replay with --replay-exhausted error: every recorded answer to this request was used. */
  | "EG_REPLAY_EXHAUSTED"
  /** Replay: something a recording cannot answer (a WebSocket upgrade). */
  | "EG_REPLAY_UNSUPPORTED";

/**
 * How a hook call failed, for `egressgate_hook_failures_total{kind}` and the audit record: it ran
 * out of time (or never settled), memory or stack (tier 2's limits), threw, returned something
 * its phase cannot use, or found its policy busy (`limits.maxCalls`).
 */
export type HookFailureKind = "time" | "memory" | "stack" | "throw" | "invalid" | "busy";

const statusTexts: Record<number, string> = {
  400: "Bad Request",
  401: "Unauthorized",
  402: "Payment Required",
  404: "Not Found",
  408: "Request Timeout",
  409: "Conflict",
  410: "Gone",
  415: "Unsupported Media Type",
  422: "Unprocessable Content",
  423: "Locked",
  429: "Too Many Requests",
  403: "Forbidden",
  405: "Method Not Allowed",
  407: "Proxy Authentication Required",
  413: "Content Too Large",
  451: "Unavailable For Legal Reasons",
  417: "Expectation Failed",
  421: "Misdirected Request",
  431: "Request Header Fields Too Large",
  500: "Internal Server Error",
  501: "Not Implemented",
  503: "Service Unavailable",
  502: "Bad Gateway",
  504: "Gateway Timeout",
  508: "Loop Detected",
};

/** The reason phrase for a status the proxy itself answers with. */
export function statusText(status: number): string {
  return statusTexts[status] ?? STATUS_CODES[status] ?? "Error";
}

/**
 * One error class for everything egressgate reports: a stable `code`, the HTTP `status` the
 * guest receives, and a message that stands on its own (it becomes the response body).
 */
export class EgressError extends Error {
  readonly code: EgressErrorCode;
  readonly status: number;
  /**
   * What the operator's log gets beyond the message: resolved addresses, raw socket errors.
   * Kept out of the guest's answer so a guest cannot use the proxy to map internal DNS.
   */
  readonly detail: string | undefined;
  /** The reason phrase, when a hook chose one (HttpRequestBlockedError's statusText). */
  readonly statusText: string;
  /** Headers the answer needs besides the error's own (`Proxy-Authenticate` on 407, `Retry-After` on 429). */
  readonly headers: Readonly<Record<string, string>> | undefined;
  /** The hook source whose phase failed or refused (a policy's file, `hooks[N]`), for the log; set once by the pipeline. */
  source: string | undefined;
  /** For a hook's failure: how it failed, from what the runner or the sandbox knew (not from the message). */
  readonly failure: HookFailureKind | undefined;
  /** For a refusal by the secrets: the secret it is about, as configured (the metrics' label; never parsed from the message). */
  readonly secret: string | undefined;

  constructor(
    code: EgressErrorCode,
    status: number,
    message: string,
    options?: { cause?: unknown; detail?: string; statusText?: string; headers?: Readonly<Record<string, string>>; failure?: HookFailureKind; secret?: string },
  ) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.name = "EgressError";
    this.code = code;
    this.status = status;
    this.detail = options?.detail;
    this.statusText = options?.statusText ?? statusText(status);
    this.headers = options?.headers;
    this.source = undefined;
    this.failure = options?.failure;
    this.secret = options?.secret;
  }
}

export function denied(message: string, detail?: string): EgressError {
  return new EgressError("EG_DENIED", 403, message, detail === undefined ? undefined : { detail });
}

/** A 403 of the secrets' rules, about the secret named `secret`. */
export function secretDenied(secret: string, message: string, detail?: string): EgressError {
  return new EgressError("EG_DENIED", 403, message, detail === undefined ? { secret } : { detail, secret });
}

export function badRequest(message: string): EgressError {
  return new EgressError("EG_BAD_REQUEST", 400, message);
}

/** What the proxy's own code threw, as an error a guest may be answered with: 502, the message kept for the log. */
export function asEgressError(error: unknown): EgressError {
  if (error instanceof EgressError) return error;
  const detail = (error as Error)?.message ?? String(error);
  return new EgressError("EG_UPSTREAM", 502, "internal error (see the proxy log)", { cause: error, detail });
}

/** The longest reason phrase a guest is sent. */
const maxStatusText = 100;

/**
 * The error as a guest may see it: its message and reason phrase passed through `redact` (when
 * secrets are configured), and the reason phrase cut to length only then, so that no part of a
 * secret is left over from a cut through it.
 */
export function guestError(error: EgressError, redact: ((text: string) => string) | undefined): EgressError {
  if (redact === undefined && error.statusText.length <= maxStatusText) return error;
  const message = redact === undefined ? error.message : redact(error.message);
  const text = (redact === undefined ? error.statusText : redact(error.statusText)).slice(0, maxStatusText).trim();
  const copy = new EgressError(error.code, error.status, message, {
    statusText: text === "" ? statusText(error.status) : text,
    ...(error.detail === undefined ? {} : { detail: error.detail }),
    ...(error.cause === undefined ? {} : { cause: error.cause }),
    ...(error.headers === undefined ? {} : { headers: error.headers }),
    ...(error.failure === undefined ? {} : { failure: error.failure }),
    ...(error.secret === undefined ? {} : { secret: error.secret }),
  });
  copy.source = error.source;
  return copy;
}


/**
 * A string from a hook or an upstream, for an error message: quoted whole when short, otherwise
 * only counted. Redaction runs on the finished message; a cut copy could hold the first part of
 * a secret's value, which it no longer recognises.
 */
export function quoteShort(text: string, max = 64): string {
  return text.length <= max ? JSON.stringify(text) : `of ${text.length} characters (not shown)`;
}

/** A thrown value as text for the log, whatever it is (reading its fields may throw too). */
export function describeThrown(error: unknown): string {
  try {
    return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  } catch {
    return "a value that could not be read";
  }
}
