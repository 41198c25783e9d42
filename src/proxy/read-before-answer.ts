import type { IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import { EgressError } from "../errors.js";
import type { GuestGone } from "../pipeline/exchange.js";
import type { LaneRequest } from "./lanes.js";
import { isLingering } from "./linger.js";

/** An upstream exchange failed (refused, broken, timed out): the request body may have been on its way there. */
export function upstreamFailure(error: unknown): boolean {
  return error instanceof EgressError && (error.code === "EG_UPSTREAM" || error.code === "EG_UPSTREAM_TIMEOUT");
}

/** {@link readBeforeAnswer}: the silence that ends it, and the most it reads, in time and bytes. */
const readBeforeAnswerQuietMs = 20;
const readBeforeAnswerMs = 1_000;
const readBeforeAnswerBytes = 8 * 1024 * 1024;

/**
 * Before the error answer to a request whose upstream failed under its unfinished upload: reads
 * what the guest has sent (dropping it, as the lingering close after such an answer does) until
 * nothing more comes for 20 ms, and says whether the guest has gone. While the upstream takes no
 * more of an upload (an HTTP/2 stream whose window stays shut, a full socket), the proxy stops
 * reading the guest's connection, and a guest that leaves then is not seen: its FIN waits unread
 * behind the rest of its body. The upstream's timer later answered 504 into the closed
 * connection, and the line said 504 where every other path says 499 (an HTTP/2 upstream's
 * 64 KiB window shuts after a small upload; an HTTP/1.1 upstream's socket takes megabytes
 * first). What a gone guest sent is in the kernel's buffers by then, so its end comes within
 * these reads; a guest still sending is answered after at most 1 s or 8 MiB.
 */
export async function readBeforeAnswer(req: IncomingMessage, socket: Socket, abort: GuestGone, inLane: LaneRequest): Promise<boolean> {
  if (socket.destroyed || isLingering(socket)) return socket.destroyed;
  // Nobody reads the body any more (the upstream's request failed): dropped as it comes.
  req.unpipe();
  (req as IncomingMessage & { _dump?: () => void })._dump?.();
  socket.resume();
  const start = socket.bytesRead;
  const until = performance.now() + readBeforeAnswerMs;
  let seen = -1;
  for (;;) {
    // The parser answered a body that broke: that answer is the request's (its caller logs it).
    if (inLane.answered !== undefined) return false;
    // The guest's end or its reset (the parser answers an end mid-body, and closes, on its own).
    if (abort.aborted || socket.destroyed || socket.readableEnded || socket.writableEnded) return true;
    if (req.complete) return false;
    const read = socket.bytesRead;
    if (read === seen || read - start >= readBeforeAnswerBytes || performance.now() >= until) return false;
    seen = read;
    await new Promise<void>((resolve) => setTimeout(resolve, readBeforeAnswerQuietMs));
  }
}
