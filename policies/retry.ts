// Retries idempotent requests (GET, HEAD, OPTIONS, PUT, DELETE) that fail in a way worth another
// try: an answer of 429, 502, 503 or 504, or a failure on the way (an unreachable or timed-out
// upstream, 502/503/504). At most three attempts in all, with exponential backoff and jitter, and
// Retry-After honoured when the upstream sends one. A refusal (403) is never retried.
//
//   egressgate --allow-host api.example.com --hooks-script policies/retry.ts
//
// A request with a body is cloned for each attempt, so every attempt sends all of it (the proxy
// then holds the body, within maxHttpBodyBytes). The waits count towards timeouts.requestMs:
// a retry that would not fit gets 504.
const idempotent = new Set(["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]);
const retryAnswers = new Set([429, 502, 503, 504]);
const retryFailures = new Set([502, 503, 504]);
const maxAttempts = 3;
const firstDelayMs = 100;
/** The longest wait this policy accepts: a Retry-After beyond it gets the answer as it is. */
const maxDelayMs = 10_000;

export async function handle(request: Request, next: Next): Promise<Response> {
  if (!idempotent.has(request.method)) return next(request);
  for (let attempt = 1; ; attempt++) {
    const last = attempt === maxAttempts;
    let response: Response;
    try {
      response = await next(request.body === null ? request : request.clone());
    } catch (error) {
      if (last || !retryable(error)) throw error;
      await sleep(backoff(attempt));
      continue;
    }
    if (last || !retryAnswers.has(response.status)) return response;
    const wait = retryAfter(response.headers.get("retry-after")) ?? backoff(attempt);
    // The upstream asked for longer than this policy waits: its answer is the answer.
    if (wait > maxDelayMs) return response;
    await sleep(wait);
  }
}

/**
 * A failure on the way to the upstream that another attempt may not meet: 502, 503 or 504, but
 * not a refusal, and not a hook's own failure (EG_HOOK_*), which would only fail again.
 */
function retryable(error: unknown): boolean {
  if (error instanceof HttpRequestBlockedError) return false;
  const { status, code } = error as { status?: unknown; code?: unknown };
  return typeof status === "number" && retryFailures.has(status) && !String(code).startsWith("EG_HOOK");
}

/** 100 ms, then 200 ms, …, each with up to half of it taken off at random, so clients spread out. */
function backoff(attempt: number): number {
  const full = firstDelayMs * 2 ** (attempt - 1);
  return Math.round(full / 2 + (Math.random() * full) / 2);
}

/** Retry-After (RFC 9110 §10.2.3): seconds, or an HTTP date; undefined when absent or unreadable. */
function retryAfter(value: string | null): number | undefined {
  if (value === null) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const date = Date.parse(text);
  return Number.isNaN(date) ? undefined : Math.max(0, date - Date.now());
}
