import type { EventEmitter } from "node:events";

/**
 * In a cluster worker: calls `onLost` once, the first time a connection the primary handed over
 * does not arrive.
 *
 * node:cluster's round robin accepts each connection in the primary and passes it to a worker as
 * a descriptor (SCM_RIGHTS), then waits for that worker's answer before it hands it another. A
 * worker out of file descriptors (EMFILE) receives the message without the descriptor (the
 * kernel drops it), Node's channel answers NODE_HANDLE_NACK, and the answer the round robin waits
 * for never comes: the primary hands that worker no connection again for as long as it lives,
 * and the guest whose connection it was gets no answer. When every worker had run out once, the
 * proxy accepted connections and answered none, with no log line, until it was restarted
 * (fd-exhaustion probe). Node reports the lost descriptor only to its own internal message event
 * on `process`, which is what this listens to; the worker can only be replaced.
 */
export function onHandoffLost(onLost: () => void): void {
  const channel = process as unknown as EventEmitter;
  const listener = (message: { cmd?: unknown } | null, handle: unknown): void => {
    if (message?.cmd !== "NODE_HANDLE" || (handle !== undefined && handle !== null)) return;
    channel.off("internalMessage", listener);
    onLost();
  };
  channel.on("internalMessage", listener);
}
