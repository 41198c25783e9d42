import { subscribe } from "node:diagnostics_channel";
import type { Socket } from "node:net";
import { H2Unanswered } from "./h2-close-reason.js";

/** What was true of one undici request's connection when its head went out. */
interface Attempt {
  readonly socket: Socket;
  /** The connection had carried an earlier request: it came from the pool, not a new connect. */
  readonly reused: boolean;
  /** The connection's bytes read by then: every one after is this request's answer. */
  readonly bytesRead: number;
}

const requestsSent = new WeakMap<Socket, number>();
const attempts = new WeakMap<object, Attempt>();
const staleFailures = new WeakSet<object>();

// undici tells which socket a request goes out on only through these channels (its errors carry
// a copy of the socket's counters, not the socket). Published for every undici in the process,
// the embedder's too: the entries are keyed weakly by undici's own objects and only ever read
// for an error this module marked.
// A subscriber that throws is reported as an uncaught exception, which would end the process:
// so a message of another shape (another undici's, or anyone's publish) is passed over.
subscribe("undici:client:sendHeaders", (message) => {
  const { request, socket } = (message ?? {}) as { request?: unknown; socket?: Partial<Socket> };
  if (typeof request !== "object" || request === null || typeof socket !== "object" || socket === null || typeof socket.bytesRead !== "number") return;
  const sock = socket as Socket;
  const sent = requestsSent.get(sock) ?? 0;
  requestsSent.set(sock, sent + 1);
  attempts.set(request, { socket: sock, reused: sent > 0, bytesRead: sock.bytesRead });
});
subscribe("undici:request:error", (message) => {
  const { request, error } = (message ?? {}) as { request?: unknown; error?: unknown };
  if (typeof request !== "object" || request === null) return;
  const attempt = attempts.get(request);
  if (attempt === undefined || typeof error !== "object" || error === null) return;
  if (attempt.reused && attempt.socket.bytesRead === attempt.bytesRead && closedUnder(error)) staleFailures.add(error);
});

/**
 * The ways undici reports a connection that went under a request: the peer's FIN ("other side
 * closed", `SocketError`), its reset, a write into a closed socket. Anything else on a reused
 * connection that had read nothing is no crossed close: undici's headers timeout
 * (upstreamHeadersMs), above all, fails a request an upstream took and is still working on, and
 * was resent, a DELETE reaching the upstream twice and the guest waiting twice the timeout for
 * the second's answer where it was owed a 504 (review finding).
 */
const closedCodes: ReadonlySet<unknown> = new Set(["UND_ERR_SOCKET", "ECONNRESET", "EPIPE"]);

function closedUnder(error: object): boolean {
  return closedCodes.has((error as { code?: unknown }).code);
}

/**
 * Whether a send failed because its connection turned out closed before any answer came: the
 * peer's keep-alive close crossing the request on the wire, which undici reports as "other side
 * closed" or a reset. A request that can be sent twice with the effect of once may go again, on
 * a new connection: the upstream's idempotent requests (src/pipeline/upstream-errors.ts) and a
 * decider's call (src/deciders/http.ts).
 *
 * Only an HTTP/1.1 connection that had carried an earlier request (taken from the pool), on
 * which not one byte came back after this request went out, and which closed or was reset under
 * it (not a timeout: the upstream is there, and may be acting on it). Every undici SocketError counted
 * before, so a DELETE went to the upstream twice after it had answered (an unasked 100 or 101,
 * a 103 or half a head then a close) and after a brand-new connection closed unanswered: the
 * upstream may have acted on it, and a close on a new connection is no crossed idle close
 * (black-box finding). The bytes are the socket's as read (TLS: cleartext; a close_notify adds
 * none).
 *
 * So is an HTTP/2 stream that got nothing of its response (not a 1xx either) before its session
 * was given up for not answering a PING, as the README says (timeouts.h2PingMs), or before the
 * upstream closed or reset the session's connection with no GOAWAY when the stream was not the
 * session's first (H2Unanswered, h2-close-reason.ts): the HTTP/1.1 rule, stream for request.
 */
export function isStaleConnection(error: unknown): boolean {
  return error instanceof H2Unanswered || (typeof error === "object" && error !== null && staleFailures.has(error));
}
