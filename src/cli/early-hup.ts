/**
 * A SIGHUP during start-up (a `systemctl reload` just after a start) ended the process with the
 * signal's default action, before bin.ts had its handler. This module is bin.ts's first import,
 * so the signal is taken from the moment the process runs its first module: a single process
 * reloads once it serves; a cluster's workers that start later read the file as it is then.
 */
let received = false;

export function onEarlyHup(): void {
  received = true;
}

/** Whether a SIGHUP came before the proxy's own handler. */
export function earlyHup(): boolean {
  return received;
}

process.on("SIGHUP", onEarlyHup);
