/** Thrown when one source already has `perSource` signings waiting. */
export class SigningLimitError extends Error {
  override readonly name = "SigningLimitError";
}

/**
 * Signing work, one piece at a time, taking turns between sources (guest addresses). Issue 14:
 * each new name costs a signature and a `createSecureContext` on the event loop, about 3 ms, so
 * a source (guest address) that opens tunnels to many new names waits on its own queue. Guests
 * behind one address (a NAT, one VM host) are one source and share that queue. Every source has its
 * own queue of at most `perSource` waiting pieces (one more is refused), the queues are served
 * round-robin, and the event loop gets a turn between two pieces: another source's signing
 * waits for at most one piece per source, and nobody's traffic waits for a flood to drain.
 */
export class SigningQueue {
  private readonly waiting = new Map<string, (() => Promise<void>)[]>();
  private busy = false;

  constructor(private readonly perSource: number) {}

  run<T>(source: string, task: () => Promise<T>): Promise<T> {
    const queue = this.waiting.get(source) ?? [];
    if (queue.length >= this.perSource) {
      return Promise.reject(new SigningLimitError(`${source} already has ${this.perSource} certificates waiting to be signed`));
    }
    return new Promise<T>((resolve, reject) => {
      // Async, so a task that throws before its first await rejects its caller instead of the pump.
      queue.push(async () => {
        try {
          resolve(await task());
        } catch (error) {
          reject(error);
        }
      });
      if (queue.length === 1) this.waiting.set(source, queue);
      // An idle queue runs at once: a guest's first new name pays no extra turn of the loop.
      if (!this.busy) void this.pump();
    });
  }

  private async pump(): Promise<void> {
    this.busy = true;
    try {
      for (;;) {
        const next = this.waiting.entries().next();
        if (next.done === true) break;
        const [source, queue] = next.value;
        const piece = queue.shift()!;
        // Deleting and setting again moves the source to the back: round-robin.
        this.waiting.delete(source);
        if (queue.length > 0) this.waiting.set(source, queue);
        await piece();
        if (this.waiting.size > 0) await new Promise((resolve) => setImmediate(resolve));
      }
    } finally {
      // Whatever happened above, the next run() must find the queue idle, or signing stops for good.
      this.busy = false;
    }
  }
}
