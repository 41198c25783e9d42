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

/** What the session pool destroys a session's unfinished streams with when it gives the session up. */
export class H2SessionLost extends Error {
  readonly code = "UND_ERR_SOCKET";
  /** @param unanswered the session stopped answering PINGs (rather than the upstream ending it). */
  constructor(
    message: string,
    readonly unanswered: boolean,
  ) {
    super(message);
  }
}

/**
 * A stream that got nothing of its response (not even a 1xx) before its session was given up
 * for not answering a PING that went out (a session whose own HTTP/2 client had stopped, on a
 * frame it could not take, may have refused the stream's response): an idempotent request may go once more on another
 * connection, as after a stale keep-alive connection (README, `timeouts.h2PingMs`).
 */
export class H2Unanswered extends Error {
  readonly code = "UND_ERR_SOCKET";
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
  11: "a response head over its limits (header fields or memory, an HPACK bomb)",
};

/**
 * What a stream that closed before its response head says in the log and to the guest, from the
 * error it was destroyed with (`failure`, if any) and its close code. The close code alone blamed
 * the upstream for the proxy's own resets: a PING left unanswered, the upstream's FIN, the
 * proxy's HTTP/2 client ending a connection whose frames it could not take, each logged
 * "upstream closed the HTTP/2 stream (code 2)" (black-box finding). `informational`: the 1xx
 * heads the stream got.
 */
export function closedBeforeResponse(host: string, rstCode: number, failure: (Error & { code?: unknown }) | undefined, informational: number): Error {
  let message: string;
  const code = typeof failure?.code === "string" ? failure.code : undefined;
  if (failure instanceof H2SessionLost) {
    // The session pool's reasons: no answer to a PING, the upstream's FIN.
    message = `no response from upstream ${host}: ${failure.message}`;
    if (failure.unanswered && informational === 0) return new H2Unanswered(message, { cause: failure });
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
  } else if (ownResets[rstCode] !== undefined) {
    message = `the HTTP/2 stream to upstream ${host} was reset (${h2CodeName(rstCode)}) before its response: by the proxy, for ${ownResets[rstCode]}, or by the upstream`;
  } else if (rstCode === 0) {
    message = `upstream ${host} closed the HTTP/2 stream (${h2CodeName(rstCode)}) before its response`;
  } else {
    message = `upstream ${host} reset the HTTP/2 stream (${h2CodeName(rstCode)}) before its response`;
  }
  return Object.assign(new Error(message, { cause: failure }), { code: "UND_ERR_SOCKET" });
}
