/** RFC 9113 §7: the error codes, by value. */
export const h2CodeNames = [
  "NO_ERROR",
  "PROTOCOL_ERROR",
  "INTERNAL_ERROR",
  "FLOW_CONTROL_ERROR",
  "SETTINGS_TIMEOUT",
  "STREAM_CLOSED",
  "FRAME_SIZE_ERROR",
  "REFUSED_STREAM",
  "CANCEL",
  "COMPRESSION_ERROR",
  "CONNECT_ERROR",
  "ENHANCE_YOUR_CALM",
  "INADEQUATE_SECURITY",
  "HTTP_1_1_REQUIRED",
] as const;

/**
 * Why the session pool gave a session up: it stopped answering a PING that went out
 * (`unanswered`), the proxy's own HTTP/2 client had stopped on a frame it could not take and
 * held the PING (`stopped`: what the upstream sent may have been the stream's response, which
 * it refused), or the upstream ended the connection, a FIN with no GOAWAY (`ended`).
 */
export type H2LossKind = "unanswered" | "stopped" | "ended";

/** What the session pool destroys a session's unfinished streams with when it gives the session up. */
export class H2SessionLost extends Error {
  readonly code = "UND_ERR_SOCKET";
  constructor(
    message: string,
    readonly kind: H2LossKind,
  ) {
    super(message);
  }
}

/**
 * A stream that got nothing of its response (not even a 1xx) when its connection went in a way
 * that says nothing of the stream itself: an idempotent request whose body can be sent again
 * goes once more on another connection, as after a stale HTTP/1.1 keep-alive
 * connection (src/pipeline/upstream-errors.ts; README, "A request that crossed an upstream's
 * keep-alive close is sent once more" and `timeouts.h2PingMs`). Either the session was given up
 * for not answering a PING that went out, or the upstream closed or reset a connection that had
 * carried an earlier stream, with no GOAWAY ({@link crossedClose}).
 */
export class H2Unanswered extends Error {
  readonly code = "UND_ERR_SOCKET";
}

/** Socket errors of a connection the upstream reset or closed under a write (Node destroys the session with them). */
const connectionLostCodes: ReadonlySet<unknown> = new Set(["ECONNRESET", "EPIPE"]);

/**
 * Whether a stream's close was its connection's end (the upstream's FIN, or a reset of its
 * socket) rather than anything said about the stream: the idle close of a server or load balancer
 * that crossed the stream's HEADERS on the wire. The same test as an HTTP/1.1 connection's
 * (stale-connection.ts): a connection that had carried an earlier request (`reused`: the stream
 * is not the session's first), and closed with no GOAWAY (which says which streams the upstream
 * may have processed, RFC 9113 §6.8). A timeout, a reset of the stream, a PING the proxy's own
 * client held, a protocol error: none of them.
 */
function crossedClose(failure: (Error & { code?: unknown }) | undefined, reused: boolean): boolean {
  if (!reused || failure === undefined) return false;
  if (failure instanceof H2SessionLost) return failure.kind === "ended";
  return connectionLostCodes.has(failure.code);
}

/** `PROTOCOL_ERROR, code 1`, or just the number for a code RFC 9113 does not name. */
export function h2CodeName(code: number): string {
  const name = h2CodeNames[code];
  return name === undefined ? `code ${code}` : `${name}, code ${code}`;
}

/**
 * Codes the proxy's own HTTP/2 client (nghttp2, Node) resets a stream with when the response
 * breaks its rules, as an upstream may too: Node reports either reset the same way.
 */
const ownResets: Readonly<Record<number, string>> = {
  1: "a response head that breaks HTTP/2's rules",
  3: "a response past its flow-control window",
  6: "a frame over the size allowed",
};

/**
 * The two codes a response head past the proxy's HTTP/2 client's limits (128 fields, or 10 MB of
 * them in its session memory: an HPACK bomb) closes its stream with, as timing has it. Node
 * refuses the field and submits RST_STREAM(ENHANCE_YOUR_CALM); nghttp2, told by the same
 * refusal, submits RST_STREAM(INTERNAL_ERROR); the first submitted is the one sent, and the code
 * the stream closes with. Node puts its own off while a write of the session is in flight (the
 * acknowledgement of a PING or SETTINGS in an earlier TLS record of the same read), and then
 * nghttp2's goes first: the same bytes read "reset (ENHANCE_YOUR_CALM) … by the proxy" or
 * "upstream … reset the HTTP/2 stream (INTERNAL_ERROR)" as the proxy's load had it. Nothing Node
 * reports tells the proxy's reset from an upstream's RST_STREAM of either code, so both are said alike.
 */
const headOverLimitsCodes: ReadonlySet<number> = new Set([2, 11]);

/**
 * What a stream that closed before its response head says in the log and to the guest, from the
 * error it was destroyed with (`failure`, if any) and its close code. The close code alone blamed
 * the upstream for the proxy's own resets: a PING left unanswered, the upstream's FIN, the
 * proxy's HTTP/2 client ending a connection whose frames it could not take, each logged
 * "upstream closed the HTTP/2 stream (code 2)" (black-box finding). `informational`: the 1xx
 * heads the stream got. `reused`: the stream was not its session's first, and the session got no
 * GOAWAY; an {@link H2Unanswered} then marks a close that may have crossed the request.
 */
export function closedBeforeResponse(host: string, rstCode: number, failure: (Error & { code?: unknown }) | undefined, informational: number, reused: boolean): Error {
  const error = closeReason(host, rstCode, failure);
  if (informational === 0 && ((failure instanceof H2SessionLost && failure.kind === "unanswered") || crossedClose(failure, reused))) {
    return new H2Unanswered(error.message, { cause: failure });
  }
  return error;
}

function closeReason(host: string, rstCode: number, failure: (Error & { code?: unknown }) | undefined): Error {
  let message: string;
  const code = typeof failure?.code === "string" ? failure.code : undefined;
  if (failure instanceof H2SessionLost) {
    // The session pool's reasons: no answer to a PING, the upstream's FIN.
    message = `no response from upstream ${host}: ${failure.message}`;
  } else if (failure !== undefined && code === "ERR_HTTP2_ERROR") {
    // nghttp2 found a connection error in what the upstream sent (a frame it cannot take, bytes
    // that are not HTTP/2 at all, a SETTINGS value out of range) and ended the session.
    message = `upstream ${host} broke the HTTP/2 protocol before its response (${failure.message}): the proxy closed the connection`;
  } else if (failure !== undefined && code === "ERR_HTTP2_SESSION_ERROR") {
    message = `upstream ${host} ended the HTTP/2 connection before its response (${failure.message})`;
  } else if (failure !== undefined && code === undefined) {
    // resetH2Stream's reasons: the proxy reset the stream itself.
    message = `the proxy reset the HTTP/2 stream to upstream ${host} before its response: ${failure.message}`;
  } else if (failure !== undefined && code !== "ERR_HTTP2_STREAM_ERROR") {
    message = `the connection to upstream ${host} failed before its response: ${String(code)}: ${failure.message}`;
  } else if (headOverLimitsCodes.has(rstCode)) {
    message = `the HTTP/2 stream to upstream ${host} was reset before its response: by the proxy, for a response head over its limits (header fields or memory, an HPACK bomb), or by the upstream (the proxy's own reset goes out as ENHANCE_YOUR_CALM or as INTERNAL_ERROR, so neither code tells which)`;
  } else if (ownResets[rstCode] !== undefined) {
    message = `the HTTP/2 stream to upstream ${host} was reset (${h2CodeName(rstCode)}) before its response: by the proxy, for ${ownResets[rstCode]}, or by the upstream`;
  } else if (rstCode === 0) {
    message = `upstream ${host} closed the HTTP/2 stream (${h2CodeName(rstCode)}) before its response`;
  } else {
    message = `upstream ${host} reset the HTTP/2 stream (${h2CodeName(rstCode)}) before its response`;
  }
  return Object.assign(new Error(message, { cause: failure }), { code: "UND_ERR_SOCKET" });
}
