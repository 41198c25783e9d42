/**
 * Runs `verdict` once the reads of this turn of the event loop are done. A timer that comes due
 * while the process was not running (SIGSTOP and SIGCONT, a paused VM, a starved host, a long
 * synchronous parse) fires before that turn's poll, so what a peer sent in time is still unread
 * in the kernel when the timer judges it silent or late. Go's `SetReadDeadline` and Envoy judge
 * the same way; a verdict that waits for the poll (an immediate runs after it) sees the head,
 * the PING answer or the data that came meanwhile, and the caller checks again there.
 */
export function afterReads(verdict: () => void): void {
  setImmediate(verdict);
}
