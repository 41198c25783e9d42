import { AsyncResource } from "node:async_hooks";
import type { ClientHttp2Session, ClientHttp2Stream, ClientSessionRequestOptions, OutgoingHttpHeaders } from "node:http2";

type Bind = AsyncResource["bind"];
type Fn = (...args: unknown[]) => unknown;

const prototype = AsyncResource.prototype;
const nodeBind: Bind = prototype.bind;

/**
 * Whether the bind in place is Node's own with the deprecated accessor (Node 20, and 22 and 24
 * before the accessor's end), on a prototype that can take another for a moment. A bind that
 * an APM agent or an embedder installed, whenever it was installed, is never swapped out.
 */
const swappable = Object.getOwnPropertyDescriptor(prototype, "bind")?.writable === true && Function.prototype.toString.call(nodeBind).includes("DEP0172");

function boundTo(resource: AsyncResource, fn: Fn, thisArg: unknown): Fn {
  return function bound(this: unknown, ...args: unknown[]): unknown {
    return resource.runInAsyncScope(fn, thisArg === undefined ? this : thisArg, ...args);
  };
}

/**
 * AsyncResource#bind without the deprecated `asyncResource` accessor (DEP0172): the bound
 * function runs `fn` in the resource's async scope, with the call's `this` unless one was given,
 * as Node's does. Its `length` is 0.
 */
function scopedBind(this: AsyncResource, fn: Fn, thisArg?: unknown): Fn {
  if (typeof fn !== "function") throw new TypeError("The \"fn\" argument must be of type function");
  return boundTo(this, fn, thisArg);
}

/**
 * `session.request()`, minus a cost of Node 20's: request() binds each new stream's start to an
 * AsyncResource, and AsyncResource#bind wraps the getter and setter of that deprecated accessor in
 * two fresh deprecate() functions whose prototypes it sets (nodejs/node#58218, changed in 24).
 * Each request then makes hidden classes of its own, which only a full garbage collection frees;
 * a paired A/B (docs/performance.md) put it at about half of the proxy's CPU per request to an
 * h2 upstream. The bound function never reaches user code: request() calls it at once, or keeps
 * it on the session until the session connects. So for this one synchronous call the prototype's
 * bind is one without the accessor, and Node's is put back however the call ends. Only async_hooks
 * `init` callbacks run inside the call; one that binds there gets the same behaviour.
 */
export function requestStream(session: ClientHttp2Session, headers: OutgoingHttpHeaders, options: ClientSessionRequestOptions): ClientHttp2Stream {
  if (!swappable || prototype.bind !== nodeBind) return session.request(headers, options);
  prototype.bind = scopedBind as unknown as Bind;
  try {
    return session.request(headers, options);
  } finally {
    // Put back only what was swapped in: a bind installed during the call stays.
    if (prototype.bind === (scopedBind as unknown as Bind)) prototype.bind = nodeBind;
  }
}
