import { closeSync, openSync } from "node:fs";

/** A process out of file descriptors (EMFILE), or a whole system (ENFILE). */
export type DescriptorShortage = "EMFILE" | "ENFILE";

/** Whether `error` is a failure to get a file descriptor: EMFILE or ENFILE. */
export function isDescriptorShortage(error: unknown): boolean {
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  return code === "EMFILE" || code === "ENFILE";
}

/**
 * Whether the process can open a file descriptor now, found by opening /dev/null once: for
 * failures that hide the cause. glibc's getaddrinfo answers a lookup it could not make (no
 * descriptor for /etc/hosts, nor a socket for DNS) as "name not known", ENOTFOUND, and a worker
 * thread that cannot get its event loop's descriptors stops before it runs a line.
 */
export function descriptorShortage(): DescriptorShortage | undefined {
  try {
    closeSync(openSync("/dev/null", "r"));
    return undefined;
  } catch (error) {
    return isDescriptorShortage(error) ? ((error as NodeJS.ErrnoException).code as DescriptorShortage) : undefined;
  }
}

/**
 * Whether the process can open `count` descriptors at once now (opened on /dev/null and closed
 * again): for a start that cannot be watched while it waits, as a worker thread's load, which
 * holds the event loop, and never ends if the thread could not get its own.
 */
export function descriptorsShort(count: number): DescriptorShortage | undefined {
  const opened: number[] = [];
  try {
    while (opened.length < count) opened.push(openSync("/dev/null", "r"));
    return undefined;
  } catch (error) {
    return isDescriptorShortage(error) ? ((error as NodeJS.ErrnoException).code as DescriptorShortage) : undefined;
  } finally {
    for (const fd of opened) closeSync(fd);
  }
}
