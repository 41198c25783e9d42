import { execFileSync } from "node:child_process";
import { closeSync, constants, openSync, readSync } from "node:fs";
import { join } from "node:path";
import { onTestFinished } from "vitest";
import { tempDir } from "./proxy.js";

/** A FIFO (`mkfifo`) in a folder of its own, removed when the test finishes. */
export function makeFifo(name = "audit.fifo"): string {
  const fifo = join(tempDir(), name);
  execFileSync("mkfifo", [fifo]);
  // A writer a test left waiting in a blocking open() (the bug some tests are for) is let go
  // once the FIFO has had a reader, rather than holding a threadpool thread of this process.
  onTestFinished(() => closeSync(openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK)));
  return fifo;
}

/**
 * The read end of a FIFO, held by this process and read only when asked: the log shipper of a
 * test. Opened non-blocking (no wait for a writer) and read on the main thread, so it takes no
 * threadpool thread either. `close()` is the shipper going away; closed when the test finishes.
 */
export class FifoReader {
  private fd: number | undefined;
  private received = "";

  constructor(fifo: string) {
    this.fd = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
    onTestFinished(() => this.close());
  }

  /** Everything that arrived so far. */
  read(): string {
    if (this.fd === undefined) return this.received;
    const chunk = Buffer.alloc(64 * 1024);
    for (;;) {
      let read: number;
      try {
        read = readSync(this.fd, chunk, 0, chunk.length, null);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code === "EAGAIN") break;
        throw error;
      }
      // 0: no writer has it open (now); EAGAIN: a writer has, with nothing written yet.
      if (read === 0) break;
      this.received += chunk.toString("utf8", 0, read);
    }
    return this.received;
  }

  /** Whole lines so far, parsed as JSON. */
  records<T = Record<string, unknown>>(): T[] {
    const lines = this.read().split("\n");
    return lines.slice(0, -1).map((line) => JSON.parse(line) as T);
  }

  close(): void {
    if (this.fd === undefined) return;
    closeSync(this.fd);
    this.fd = undefined;
  }
}

/** Waits, polling every 10 ms, until `check` holds; fails naming `what` after `timeoutMs`. */
export async function eventually(check: () => boolean, what: string, timeoutMs = 5_000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!check()) {
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** `work`, or a failure naming `what` once `timeoutMs` has passed without it. */
export function within<T>(work: Promise<T>, what: string, timeoutMs = 5_000): Promise<T> {
  return Promise.race([work, new Promise<never>((_resolve, reject) => setTimeout(() => reject(new Error(`${what} took over ${timeoutMs} ms`)), timeoutMs).unref())]);
}
