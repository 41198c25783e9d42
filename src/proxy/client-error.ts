import type { Socket } from "node:net";
import { EgressError } from "../errors.js";
import type { Logger } from "../log.js";
import { versionNotSupported } from "./guest-request.js";
import type { ParseErrorPlace } from "./lanes.js";
import { isLingering, lingerAtClose } from "./linger.js";
import { writeRawError } from "./respond.js";

/** The largest request head a guest may send (431 beyond). */
export const maxHeaderBytes = 64 * 1024;

/**
 * What Node's parser refused, answered as bytes on the socket (no ServerResponse exists yet):
 * 400 for malformed input, 431 for an oversized head, 408 for a slow one, 405 for TRACK.
 */
export function answerClientError(
  error: NodeJS.ErrnoException,
  socket: Socket,
  log: Logger,
  place?: (answer: EgressError, guestLeft: boolean) => ParseErrorPlace,
  brokeLingering?: (answer: EgressError) => void,
): void {
  // Node's parser stays at its error and reports it again for every later chunk, until the
  // answer's lingering close takes the socket from it: the answer, written or waiting its turn,
  // closes the connection.
  if (answering.has(socket)) return;
  if (error.code === afterClose) {
    // A request pipelined after one that said `Connection: close` is not processed (RFC 9112
    // §9.6), and is no bad request: the guest asked for the close, and the answer to the request
    // before it, under way or written, is all it gets. What it still sends is read and dropped
    // until that answer has closed the connection, never left unread for the close to reset.
    answering.add(socket);
    log.debug("guest sent more after a request with Connection: close; dropped", { client: socket.remoteAddress });
    lingerAtClose(socket);
    return;
  }
  if (isLingering(socket)) {
    // The answer has gone (or is going), and the guest stopped mid-body (curl does on an early
    // answer). A body the parser refused is no guest that stopped: the proxy closes the
    // connection for it, under a response that may still be under way (an upstream that
    // answered before the upload's end), whose line said "guest closed the connection".
    const answer = error.code === endedMidRequest ? undefined : answerFor(error);
    if (answer !== undefined) {
      answering.add(socket);
      brokeLingering?.(answer);
    }
    socket.destroy();
    return;
  }
  const answer = answerFor(error);
  if (answer === undefined) {
    // Not the parser's: the connection failed under it (a reset, or a write the proxy's own cut
    // cancelled, ECANCELED at the drain's end). Whatever request was on it has its own line.
    log.debug("guest connection failed", { error, client: socket.remoteAddress });
    socket.destroy();
    return;
  }
  logParseError(error, socket, log);
  answering.add(socket);
  const where = place?.(answer, error.code === endedMidRequest) ?? { answer: "now" };
  if (where.answer === "now") {
    writeRawError(socket, answer);
    return;
  }
  if (where.answer === "none") {
    socket.destroy();
    return;
  }
  // Read no more: the answer closes the connection.
  socket.pause();
  // Requests pipelined before the bad one are answered first, in order; the error follows them
  // and closes the connection (not at all if one of them closed it).
  if (where.answer === "after") void where.before.then(() => writeRawError(socket, answer));
}

/**
 * Only input the parser refused is the guest's "bad request". A guest that closed its connection
 * in the middle of a request (HPE_INVALID_EOF_STATE: an upload it gave up on) left, and that
 * request's own line says 499: 69 "bad request" lines in one CLI run were such guests.
 */
function logParseError(error: NodeJS.ErrnoException, socket: Socket, log: Logger): void {
  const fields = { error, client: socket.remoteAddress };
  if (error.code === endedMidRequest) log.debug("guest closed the connection mid-request", fields);
  else log.info("bad request", fields);
}

/** The parser's error for bytes after a request that said `Connection: close` ("Data after `Connection: close`"). */
const afterClose = "HPE_CLOSED_CONNECTION";

/** The parser's error for a guest that ended its side of the connection in the middle of a request. */
const endedMidRequest = "HPE_INVALID_EOF_STATE";

/** Connections whose parse error waits for the answers before it. */
const answering = new WeakSet<Socket>();

function answerFor(error: NodeJS.ErrnoException): EgressError | undefined {
  const code = error.code ?? "";
  const rawPacket = (error as { rawPacket?: Buffer }).rawPacket;
  // llhttp does not know TRACK, but it is refused for the same reason as TRACE, not as garbage.
  if (code === "HPE_INVALID_METHOD" && rawPacket?.subarray(0, 6).toString("latin1") === "TRACK ") return new EgressError("EG_METHOD_NOT_ALLOWED", 405, "method TRACK is not allowed: it would echo credentials back");
  if (code === "HPE_HEADER_OVERFLOW") return new EgressError("EG_HEADERS_TOO_LARGE", 431, `request head is larger than ${maxHeaderBytes} bytes`);
  // A well-formed version llhttp does not take (1.2, 1.9, 3.0: two single digits, its "Invalid
  // HTTP version") is a version the proxy does not speak (RFC 9110 §15.6.6), as 0.9 and 2.0 are
  // once llhttp hands them on, not garbage; one that is not two digits stays a malformed request.
  if (code === "HPE_INVALID_VERSION" && (error as { reason?: string }).reason === "Invalid HTTP version") return versionNotSupported(versionBefore(error));
  if (code.startsWith("HPE_")) return new EgressError("EG_BAD_REQUEST", 400, `malformed request (${code.slice(4).toLowerCase().replaceAll("_", " ")})`);
  if (code === "ERR_HTTP_REQUEST_TIMEOUT") return new EgressError("EG_BAD_REQUEST", 408, "request head not received in time");
  return undefined;
}

/**
 * The version llhttp refused, `HTTP/1.2`: its error stops just after the minor digit, in the
 * chunk it was parsing (`rawPacket`). A request line that came in pieces may have left only part
 * of it in that chunk, and then the version is not named.
 */
function versionBefore(error: NodeJS.ErrnoException): string {
  const { rawPacket, bytesParsed } = error as { rawPacket?: Buffer; bytesParsed?: number };
  if (rawPacket === undefined || bytesParsed === undefined || bytesParsed < 3) return "this HTTP version";
  const digits = rawPacket.subarray(bytesParsed - 3, bytesParsed).toString("latin1");
  return /^\d\.\d$/.test(digits) ? `HTTP/${digits}` : "this HTTP version";
}
