import { errors as undiciErrors } from "undici";
import { H2Unanswered } from "./h2-close-reason.js";

/**
 * Whether a send through an undici pool failed because its connection turned out closed before
 * any answer came: the peer's keep-alive close crossing the request on the wire, which undici
 * reports as "other side closed" (`UND_ERR_SOCKET`) or a reset. A request that can be sent twice
 * with the effect of once may go again, on a new connection: the upstream's idempotent requests
 * (src/pipeline/upstream-errors.ts) and a decider's call (src/deciders/http.ts). So is an HTTP/2
 * session given up for not answering a PING before any of the response came, as the README has
 * long said (timeouts.h2PingMs), though nothing did it (black-box finding).
 */
export function isStaleConnection(error: unknown): boolean {
  if (error instanceof undiciErrors.SocketError || error instanceof H2Unanswered) return true;
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  return code === "ECONNRESET" || code === "EPIPE";
}
