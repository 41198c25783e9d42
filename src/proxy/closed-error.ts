/**
 * What `reload`, `addGuest` and `removeGuest` throw once `close()` has begun: the guests of a
 * closing proxy are the ones its drain serves, and none may join or change.
 */
export class ProxyClosedError extends Error {
  readonly code = "EG_CLOSED";

  constructor(method: string) {
    super(`${method}: the proxy is closing`);
    this.name = "ProxyClosedError";
  }
}
