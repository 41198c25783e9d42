// How an upstream's failure reads to the guest, and which failures a request is sent again after.
import { errors as undiciErrors } from "undici";
import { EgressError } from "../errors.js";
import { isStaleConnection } from "../upstream/stale-connection.js";
import type { GuestGone, OutboundRequest } from "./exchange.js";

const connectErrorCodes = new Set(["ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "EADDRNOTAVAIL", "UND_ERR_CONNECT_TIMEOUT"]);

export function isConnectFailure(error: unknown): boolean {
  const cause = error instanceof EgressError ? error.cause : error;
  return cause instanceof undiciErrors.ConnectTimeoutError || connectErrorCodes.has((cause as NodeJS.ErrnoException)?.code ?? "");
}

/** RFC 9110 §9.2.2: a request that may be sent twice with the effect of once (TRACE never leaves: forbiddenMethods). */
const idempotentMethods = new Set(["GET", "HEAD", "OPTIONS", "PUT", "DELETE"]);

/**
 * Sends, and once more when a pooled connection turned out closed before any answer came: an
 * upstream's keep-alive close that crosses the next request on the wire, which undici reports
 * as "other side closed" (or a reset), the same close (a FIN or a reset, no GOAWAY) of an HTTP/2
 * session under a stream that was not its first, or an HTTP/2 session that stopped answering
 * PINGs, each before any of the response came. Only an idempotent request whose body can be sent again
 * (none, or bytes) is resent, as Go's Transport and nginx do; 0.9% of GETs got 502 when an
 * upstream closed idle connections 50 ms after each answer (black-box finding). Only when the
 * HTTP/1.1 connection had carried an earlier request and not one byte of an answer came back on
 * it (`isStaleConnection`): an upstream that answered anything (a 1xx, half a head) or closed a
 * new connection may have acted on the request, and gets it once.
 */
export async function resendOnceIfStale<T>(request: OutboundRequest, signal: GuestGone, send: () => Promise<T>, onResend?: () => void): Promise<T> {
  try {
    return await send();
  } catch (error) {
    const replayable = request.body === null || request.body instanceof Uint8Array;
    if (!replayable || !idempotentMethods.has(request.method) || signal.aborted || !isStaleConnection(error)) throw error;
    // The upstream gets the request twice on the wire (once unanswered): the decision line says so.
    onResend?.();
    return await send();
  }
}

/** The 502 of a response whose upstream body failed before any of it was sent. */
export function bodyFailedUnsent(host: string, cause: Error | null): EgressError {
  return new EgressError("EG_UPSTREAM", 502, `the upstream response body from ${host} failed before it could be sent`, {
    ...(cause !== null ? { cause, detail: cause.message } : {}),
  });
}

/** What an HTTP/1.1 head refused after its Content-Length field held, as far as undici tells. */
const contentLengthHeadReason =
  'its parser stopped after the Content-Length field (two Content-Length fields, a list such as "2, 3", one beside Transfer-Encoding, or a malformed field after it)';

/**
 * Turns an undici or socket failure into the status the guest receives. Only failures before the
 * response's head come here (undici's `request()` has settled once the head is in: a later
 * failure is the body's).
 */
export function upstreamError(error: unknown, url: URL): EgressError {
  if (error instanceof EgressError) return error;
  const target = `${url.hostname}:${url.port || (url.protocol === "https:" ? 443 : 80)}`;
  if (
    error instanceof undiciErrors.ConnectTimeoutError ||
    error instanceof undiciErrors.HeadersTimeoutError ||
    error instanceof undiciErrors.BodyTimeoutError
  ) {
    // The limit by name: a 504 a busy upstream earns reads as that option, not as a fault.
    const option =
      error instanceof undiciErrors.ConnectTimeoutError ? "upstreamConnectMs" : error instanceof undiciErrors.HeadersTimeoutError ? "upstreamHeadersMs" : "upstreamBodyMs";
    return new EgressError("EG_UPSTREAM_TIMEOUT", 504, `upstream ${target} timed out (timeouts.${option}): ${(error as Error).message}`, {
      cause: error,
    });
  }
  const err = error as NodeJS.ErrnoException;
  const code = err.code ?? "";
  const tlsProblem = code.startsWith("ERR_TLS") || code.includes("CERT") || code.startsWith("ERR_SSL") || /certificate/i.test(err.message);
  const detail = `${code ? `${code}: ` : ""}${err.message.trimEnd()}`;
  if (tlsProblem) {
    // OpenSSL's own errors read "<addr>:error:0A000460:SSL routines:<function>:<reason>:<source
    // path>:<line>:SSL alert number 120\n": the guest gets the reason (the alert's name), the log the whole text.
    const reason = (err as { reason?: unknown }).reason;
    const shown = code.startsWith("ERR_SSL") && typeof reason === "string" && reason !== "" ? `${code}: ${reason}` : detail;
    return new EgressError("EG_UPSTREAM", 502, `upstream TLS failed for ${target}: ${shown}`, { cause: error, detail });
  }
  // When llhttp refuses a head after a Content-Length field (a second one, a list such as `2, 3`,
  // one beside Transfer-Encoding, or any malformed field after it), undici reports its own
  // "Response body length does not match content-length header" in place of llhttp's reason: no
  // body was read, and the guest was told of one (helper finding). Before the head, that is
  // all the error can mean; which of those it was, undici does not say.
  if (code === "UND_ERR_RES_CONTENT_LENGTH_MISMATCH") {
    return new EgressError("EG_UPSTREAM", 502, `upstream ${target} sent a response head that does not match the HTTP/1.1 protocol: ${contentLengthHeadReason}`, { cause: error, detail });
  }
  // undici's parser asserts what it cannot take (a status under 100): its assertion's text is for
  // the log, not the guest.
  if (code === "ERR_ASSERTION") return new EgressError("EG_UPSTREAM", 502, `upstream ${target} sent a response the proxy could not read (see the proxy log)`, { cause: error, detail });
  // Socket errors (ECONNREFUSED 10.0.0.5:443) name the pinned address: the guest gets the code only.
  const shown = /^E[A-Z]+$/.test(code) ? code : detail;
  return new EgressError("EG_UPSTREAM", 502, `upstream request failed for ${target}: ${shown}`, { cause: error, detail });
}
