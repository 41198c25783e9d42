import type { Readable } from "node:stream";
import type { GuestGone } from "./exchange.js";

/**
 * Whether a request body of unknown length ends without a byte. A GET or HEAD framed with
 * `Transfer-Encoding: chunked` whose body is the last chunk straight away (`0\r\n\r\n`), or an
 * HTTP/2 GET whose HEADERS came without END_STREAM and whose one DATA frame is empty, has no body:
 * it is served as a GET without one, where a GET with a body is refused while a hook is shown the
 * request (a WHATWG Request cannot hold one).
 *
 * Waits for the body's first bytes or its end, whichever comes first, and reads nothing of a body
 * that has bytes: they stay in its buffer, unread (`readableLength` says they came). A guest that
 * leaves first (`signal`), or a body that breaks, rejects; a guest that sends nothing is cut by
 * `timeouts.idleMs` as any stalled upload is, which breaks the body.
 */
export function endsEmpty(body: Readable, signal: GuestGone): Promise<boolean> {
  if (body.readableEnded) return Promise.resolve(true);
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<boolean>((resolve, reject) => {
    const settle = (then: () => void): void => {
      body.off("readable", onReadable);
      body.off("end", onEnd);
      body.off("error", onError);
      body.off("close", onClose);
      signal.off("abort", onAbort);
      then();
    };
    const onReadable = (): void => {
      if (body.readableLength > 0) settle(() => resolve(false));
      // Nothing buffered: the body has ended, and this read (which returns null) emits its 'end'.
      else body.read(0);
    };
    const onEnd = (): void => settle(() => resolve(true));
    const onError = (error: Error): void => settle(() => reject(error));
    const onClose = (): void => settle(() => reject(body.errored ?? new Error("the guest closed the connection during its request body")));
    const onAbort = (): void => settle(() => reject(signal.reason));
    body.on("readable", onReadable);
    body.once("end", onEnd);
    body.once("error", onError);
    body.once("close", onClose);
    signal.once("abort", onAbort);
  });
}
