import type { Duplex } from "node:stream";

/** One end of a relay: a socket, or anything with a socket's idle timer. */
export type RelayEnd = Duplex & { setTimeout(ms: number, onIdle: () => void): unknown };

/**
 * Relays bytes both ways between two connections after an upgrade, until both are done.
 *
 * A side that ends (its peer sent FIN, and every byte it sent was passed on) ends the other once
 * what the other still holds has gone out: `pipe` does that. A side that closes after such an end
 * leaves the other to finish, so bytes still buffered for a slow peer are not dropped. A side
 * that fails, or closes without ending (reset, destroyed by the proxy's close), takes the other
 * down at once, as does `idleMs` without traffic on either, which also bounds a peer that stops
 * reading what is left for it.
 */
export function relay(a: RelayEnd, b: RelayEnd, idleMs: number): void {
  const closeBoth = (): void => {
    a.destroy();
    b.destroy();
  };
  for (const [self, other] of [
    [a, b],
    [b, a],
  ] as const) {
    self.setTimeout(idleMs, closeBoth);
    self.on("error", closeBoth);
    // A socket that is not half-open ends its own writing at its peer's FIN: what the other side
    // still sends has nowhere to go, and writing it would fail both (EPIPE), held bytes and all.
    // The other side's later bytes (a WebSocket client's Close frame) are read and let go, so
    // its own FIN is seen and it closes once its end is written, not at idleMs.
    self.once("end", () => {
      if (self.allowHalfOpen) return;
      other.unpipe(self);
      other.resume();
    });
    self.on("close", () => {
      if (self.readableEnded) other.end();
      else closeBoth();
    });
  }
  a.pipe(b);
  b.pipe(a);
}
