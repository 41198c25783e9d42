import type { Socket } from "node:net";

/**
 * Request heads Node's HTTP/1.1 parser has completed on each guest socket, counted from the
 * server's own events (`request`, `checkContinue`, `checkExpectation`, `connect`, `upgrade`),
 * which Node emits while it parses the bytes it read: a count that moved during a turn of the
 * event loop says a head was completed in that turn's reads. Counted here rather than read off
 * the socket's parser, which is Node's internal state.
 */
const heads = new WeakMap<Socket, number>();

/** Sockets a CONNECT or an upgrade took from the parser: Node's error handling of them is over. */
const takenOver = new WeakSet<Socket>();

/** Counts a head the server has emitted for `socket`; `takesOver` for a CONNECT or an upgrade. */
export function countHead(socket: Socket, takesOver = false): void {
  heads.set(socket, (heads.get(socket) ?? 0) + 1);
  if (takesOver) takenOver.add(socket);
}

/** The heads counted so far on `socket`. */
export function headsParsed(socket: Socket): number {
  return heads.get(socket) ?? 0;
}

/** Whether a CONNECT or an upgrade has taken `socket` from Node's HTTP server. */
export function isTakenOver(socket: Socket): boolean {
  return takenOver.has(socket);
}
