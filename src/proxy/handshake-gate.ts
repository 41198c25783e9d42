/**
 * TLS handshakes one guest address may run at once; the next wait their turn. A handshake costs
 * the proxy a key exchange and a signature, on the event loop every guest shares: one address
 * keeping 200 in flight held another address's plain requests for 0.7 s each (issue 13's
 * fairness rule, which the signing queue keeps for signings, held for handshakes too).
 */
export const handshakesPerSource = 16;

interface Waiter {
  readonly start: () => void;
  /** Its guest left after the turn was handed to it, before it started: the turn goes on. */
  gone: boolean;
}

interface Source {
  running: number;
  readonly waiting: Waiter[];
}

/**
 * Turns for TLS handshakes, per guest address: at most `perSource` run at once, the rest wait in
 * order. A turn is taken with `enter()` and given back with the function it resolves to; a wait
 * is dropped with the promise it was given (the guest left, or its deadline came).
 */
export class HandshakeGate {
  private readonly sources = new Map<string, Source>();

  constructor(private readonly perSource = handshakesPerSource) {}

  /** Resolves to the function that ends the turn (it may be called more than once), or to undefined if `gone` came first. */
  enter(source: string, gone: Promise<void>): Promise<(() => void) | undefined> {
    let entry = this.sources.get(source);
    if (entry === undefined) {
      entry = { running: 0, waiting: [] };
      this.sources.set(source, entry);
    }
    if (entry.running < this.perSource) {
      entry.running++;
      return Promise.resolve(this.turn(source, entry));
    }
    const queued = entry;
    return new Promise((resolve) => {
      const waiter: Waiter = { start: () => resolve(this.turn(source, queued)), gone: false };
      queued.waiting.push(waiter);
      void gone.then(() => {
        const at = queued.waiting.indexOf(waiter);
        if (at >= 0) queued.waiting.splice(at, 1);
        else waiter.gone = true;
        resolve(undefined);
      });
    });
  }

  private turn(source: string, entry: Source): () => void {
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      this.pass(source, entry);
    };
  }

  /**
   * An ended turn goes straight to the next waiter (`running` stays as it is, so nobody arriving
   * meanwhile takes it out of order), on the event loop's next round: handshakes run
   * synchronously where they start, and a burst of ends (a flood that resets after each
   * ServerHello) would otherwise run as many back to back as there are waiting.
   */
  private pass(source: string, entry: Source): void {
    const next = entry.waiting.shift();
    if (next === undefined) {
      entry.running--;
      if (entry.running === 0) this.sources.delete(source);
      return;
    }
    setImmediate(() => {
      if (next.gone) this.pass(source, entry);
      else next.start();
    });
  }
}
