import type { Readable } from "node:stream";

const ignore = (): void => undefined;

/**
 * Destroys a body nobody will read, without ever raising an unlistened `error` event. undici's
 * BodyReadable turns a plain `destroy()` into `RequestAbortedError` whenever its end was not yet
 * emitted, and when the response had already arrived in full nobody else listens for it: the
 * `error` event then ends the whole process, every guest with it.
 */
export function discardBody(body: Readable | null | undefined, reason?: Error): void {
  if (body === null || body === undefined) return;
  body.on("error", ignore);
  if (!body.destroyed) body.destroy(reason);
}
