import type { Socket } from "node:net";
import { EgressError } from "../errors.js";
import type { Logger } from "../log.js";
import { isLingering, writeRawError } from "./respond.js";

/** The largest request head a guest may send (431 beyond). */
export const maxHeaderBytes = 64 * 1024;

/**
 * What Node's parser refused, answered as bytes on the socket (no ServerResponse exists yet):
 * 400 for malformed input, 431 for an oversized head, 408 for a slow one, 405 for TRACK.
 */
export function answerClientError(error: NodeJS.ErrnoException, socket: Socket, log: Logger): void {
  if (isLingering(socket)) {
    // The answer has gone, and the guest stopped mid-body (curl does on an early answer).
    socket.destroy();
    return;
  }
  const code = error.code ?? "";
  log.info("bad request", { error, client: socket.remoteAddress });
  const rawPacket = (error as { rawPacket?: Buffer }).rawPacket;
  if (code === "HPE_INVALID_METHOD" && rawPacket?.subarray(0, 6).toString("latin1") === "TRACK ") {
    // llhttp does not know TRACK, but it is refused for the same reason as TRACE, not as garbage.
    writeRawError(socket, new EgressError("EG_METHOD_NOT_ALLOWED", 405, "method TRACK is not allowed: it would echo credentials back"));
  } else if (code === "HPE_HEADER_OVERFLOW") {
    writeRawError(socket, new EgressError("EG_HEADERS_TOO_LARGE", 431, `request head is larger than ${maxHeaderBytes} bytes`));
  } else if (code.startsWith("HPE_")) {
    writeRawError(socket, new EgressError("EG_BAD_REQUEST", 400, `malformed request (${code.slice(4).toLowerCase().replaceAll("_", " ")})`));
  } else if (code === "ERR_HTTP_REQUEST_TIMEOUT") {
    writeRawError(socket, new EgressError("EG_BAD_REQUEST", 408, "request head not received in time"));
  } else {
    socket.destroy();
  }
}
