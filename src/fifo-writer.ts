import { stat } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

/**
 * Writing to a path the operator named that may be a FIFO (a log shipper's, a guest's
 * environment reader): opened `O_NONBLOCK`, since a blocking open of a FIFO for writing waits in
 * open() until it has a reader, holding one of the four threadpool threads DNS lookups share, for
 * good when none comes. Non-blocking, that open fails with ENXIO instead, and a full pipe answers
 * EAGAIN; on a regular file the flag changes nothing.
 */

/** How often a start looks again for a FIFO's reader. */
export const readerPollMs = 100;
/** Waits between writes a full pipe refused (EAGAIN): short while it drains, longer while it stays full. */
export const firstFullWaitMs = 1;
export const longestFullWaitMs = 64;

/**
 * Runs `open` (a non-blocking open for writing) until it succeeds. A FIFO with no reader yet
 * (ENXIO) is waited for, looking again every {@link readerPollMs}, with `waiting` called once:
 * a start whose reader is not up yet waits for it, as any writer of a FIFO does, without holding
 * a thread meanwhile. ENXIO is also what a socket or a device without its driver answers: only a
 * FIFO waits; every other failure is `open`'s.
 */
export async function openWaitingForReader<T>(path: string, open: () => Promise<T>, waiting: () => void): Promise<T> {
  for (let warned = false; ; warned = true) {
    try {
      return await open();
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENXIO" || !(await isFifo(path))) throw error;
      if (!warned) waiting();
      await sleep(readerPollMs);
    }
  }
}

function isFifo(path: string): Promise<boolean> {
  return new Promise((resolve) => stat(path, (error, stats) => resolve(error === null && stats.isFIFO())));
}
