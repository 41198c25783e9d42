import type { Socket } from "node:net";
import { EgressError } from "../errors.js";
import type { Logger } from "../log.js";
import type { ParseErrorPlace } from "./lanes.js";
import { isLingering, writeRawError } from "./respond.js";

/** The largest request head a guest may send (431 beyond). */
export const maxHeaderBytes = 64 * 1024;

/**
 * What Node's parser refused, answered as bytes on the socket (no ServerResponse exists yet):
 * 400 for malformed input, 431 for an oversized head, 408 for a slow one, 405 for TRACK.
 */
export function answerClientError(error: NodeJS.ErrnoException, socket: Socket, log: Logger, place?: (answer: EgressError) => ParseErrorPlace): void {
  if (isLingering(socket)) {
    // The answer has gone, and the guest stopped mid-body (curl does on an early answer).
    socket.destroy();
    return;
  }
  // Node's parser stays at its error and reports it again for every later chunk.
  if (answering.has(socket)) return;
  log.info("bad request", { error, client: socket.remoteAddress });
  const answer = answerFor(error);
  if (answer === undefined) {
    socket.destroy();
    return;
  }
  answering.add(socket);
  const where = place?.(answer) ?? { answer: "now" };
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

/** Connections whose parse error waits for the answers before it. */
const answering = new WeakSet<Socket>();

function answerFor(error: NodeJS.ErrnoException): EgressError | undefined {
  const code = error.code ?? "";
  const rawPacket = (error as { rawPacket?: Buffer }).rawPacket;
  // llhttp does not know TRACK, but it is refused for the same reason as TRACE, not as garbage.
  if (code === "HPE_INVALID_METHOD" && rawPacket?.subarray(0, 6).toString("latin1") === "TRACK ") return new EgressError("EG_METHOD_NOT_ALLOWED", 405, "method TRACK is not allowed: it would echo credentials back");
  if (code === "HPE_HEADER_OVERFLOW") return new EgressError("EG_HEADERS_TOO_LARGE", 431, `request head is larger than ${maxHeaderBytes} bytes`);
  if (code.startsWith("HPE_")) return new EgressError("EG_BAD_REQUEST", 400, `malformed request (${code.slice(4).toLowerCase().replaceAll("_", " ")})`);
  if (code === "ERR_HTTP_REQUEST_TIMEOUT") return new EgressError("EG_BAD_REQUEST", 408, "request head not received in time");
  return undefined;
}
