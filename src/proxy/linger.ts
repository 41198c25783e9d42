import type { Socket } from "node:net";

/**
 * The bounds of a lingering close: how long a guest may go on sending after an answer that
 * closes its connection, and how much of it is read and dropped. The bytes cover what a client
 * has in flight before it can have seen the answer: its send buffer and the proxy's receive
 * buffer, about 10 MiB on Linux's defaults.
 */
export const lingerBounds = Object.freeze({ ms: 5_000, bytes: 16 * 1024 * 1024 });

/** Connections whose answer closes them, from the answer's head: nothing more on them is processed. */
const closing = new WeakSet<Socket>();
/** Connections whose close has begun (lingering, or once written). */
const begun = new WeakSet<Socket>();

/**
 * A connection answered `Connection: close`, its answer under way or in its lingering close: what
 * arrives on it is dropped, a request pipelined behind the answer included, and a parse error at
 * its end (the guest stopping mid-body) is no "bad request".
 */
export function isLingering(socket: Socket): boolean {
  return closing.has(socket);
}

/**
 * The connection's close has begun, its answer written: in its lingering close nothing reads it
 * but the linger, which must not be paused, and no other answer can follow.
 */
export function closeBegun(socket: Socket): boolean {
  return begun.has(socket);
}

/**
 * The connection's answer will close it, and the guest is still sending (an upload the answer came
 * before, a request pipelined after `Connection: close`). A request pipelined behind that answer
 * is dropped from now on, not processed (RFC 9112 §9.6), and the close Node's server makes once the
 * answer is written (`destroySoon`, which destroys the socket with the guest's bytes unread, so
 * the kernel resets it and drops what the answer had not yet delivered) becomes a lingering
 * close. One Node has begun already (the answer written, its socket ending) is taken over.
 */
export function lingerAtClose(socket: Socket): void {
  if (socket.destroyed || closing.has(socket)) return;
  closing.add(socket);
  if (socket.writableEnded) {
    // Node's destroySoon has run, and destroys the socket once the answer is flushed.
    socket.off("finish", socket.destroy);
    closeLingering(socket);
    return;
  }
  // Node's server calls destroySoon() once the answer is written; this socket's alone is replaced.
  (socket as Socket & { destroySoon: () => void }).destroySoon = function linger(this: Socket): void {
    closeLingering(this);
  };
}

/**
 * Closes a guest connection after what has been written to it, with a lingering close (RFC 9112
 * §9.6). Closed at once, a connection on which the guest is still sending (an upload, a request
 * pipelined behind, the rest of a head the parser refused) leaves bytes unread in the kernel, or
 * draws more, and the kernel answers them with a reset: a guest that stops at its failed send
 * (curl: "Send failure: Broken pipe"; any client that sends its whole request before it reads)
 * never reads the answer. Instead our side ends (a FIN after the answer), and what the guest
 * still sends is read and dropped, unparsed (Node's parser, or whoever read the socket, reads no
 * more of it), until the guest ends its side, the socket closes, {@link lingerBounds} bytes have
 * been dropped, or its time has passed, whichever is first; then the socket is destroyed, its
 * timer and listeners with it. A guest that never reads is held to the same time.
 */
export function closeLingering(socket: Socket): void {
  closing.add(socket);
  if (socket.destroyed || begun.has(socket)) return;
  // A guest that has ended its side sends nothing more, and its end will not come again.
  if (socket.readableEnded) return closeOnceWritten(socket);
  begun.add(socket);
  const release = (): void => void socket.destroy();
  // Also the bound for a guest that never reads what is written.
  const timer = setTimeout(release, lingerBounds.ms);
  timer.unref();
  // The requests after the answer are not processed, and a reader's backpressure (a hook's clone
  // of the body, the upstream upload) cannot pause the socket again: only the linger reads it.
  for (const listener of socket.listeners("data")) socket.off("data", listener as (...args: unknown[]) => void);
  let dropped = 0;
  const drop = (chunk: Buffer): void => {
    dropped += chunk.length;
    if (dropped > lingerBounds.bytes) release();
  };
  socket.on("data", drop);
  socket.once("end", release);
  socket.once("close", () => {
    clearTimeout(timer);
    socket.off("data", drop);
    socket.off("end", release);
  });
  if (!socket.writableEnded) socket.end();
  socket.resume();
  // A pause while Node's parser read the socket stopped its handle, and taking the socket from the parser does not restart it.
  const handle = (socket as unknown as { _handle?: { reading: boolean; readStart(): number } | null })._handle;
  if (handle && !handle.reading) {
    handle.reading = true;
    handle.readStart();
  }
}

/**
 * Closes a connection once what has been written to it is flushed, without lingering: for a
 * guest that has ended its side, and for the refusals past what the connection limit lets linger
 * (see ConnectionLimits). A guest that never reads is held to the linger's time.
 */
export function closeOnceWritten(socket: Socket): void {
  closing.add(socket);
  if (socket.destroyed || begun.has(socket)) return;
  begun.add(socket);
  const release = (): void => void socket.destroy();
  const timer = setTimeout(release, lingerBounds.ms);
  timer.unref();
  socket.once("close", () => {
    clearTimeout(timer);
    socket.off("finish", release);
  });
  if (socket.writableFinished) return release();
  socket.once("finish", release);
  if (!socket.writableEnded) socket.end();
}
