import { AsyncResource } from "node:async_hooks";
import type { ClientHttp2Session, ClientHttp2Stream, ClientSessionRequestOptions, OutgoingHttpHeaders } from "node:http2";

type Bind = AsyncResource["bind"];

const prototype = AsyncResource.prototype;
/** Node's own bind, as this module found it: a bind someone else installed is left alone. */
const nodeBind: Bind = prototype.bind;

type Fn = (...args: unknown[]) => unknown;

function boundTo(resource: AsyncResource, fn: Fn, thisArg: unknown): Fn {
  return function bound(this: unknown, ...args: unknown[]): unknown {
    return resource.runInAsyncScope(fn, thisArg === undefined ? this : thisArg, ...args);
  };
}

/**
 * AsyncResource#bind without the deprecated `asyncResource` accessor (DEP0172): the bound
 * function runs `fn` in the resource's async scope, as Node's does.
 */
function scopedBind(this: AsyncResource, fn: Fn, thisArg?: unknown): Fn {
  return boundTo(this, fn, thisArg);
}

/**
 * `session.request()`, minus a cost of Node 20's: request() binds each new stream's start to an
 * AsyncResource, and AsyncResource#bind wraps the getter and setter of that deprecated accessor in
 * two fresh deprecate() functions whose prototypes it sets (nodejs/node#58218, fixed in 24). Each
 * request then makes hidden classes of its own, which only a full garbage collection frees; a
 * paired A/B (docs/performance.md) put it at about 40% of the proxy's CPU per request to an h2
 * upstream. The bound function stays inside request() (it starts the stream now, or once the
 * session connects), so nobody can read the accessor. For this one synchronous call the
 * prototype's bind is one without it, and is put back however the call ends.
 */
export function requestStream(session: ClientHttp2Session, headers: OutgoingHttpHeaders, options: ClientSessionRequestOptions): ClientHttp2Stream {
  if (prototype.bind !== nodeBind) return session.request(headers, options);
  prototype.bind = scopedBind as unknown as Bind;
  try {
    return session.request(headers, options);
  } finally {
    prototype.bind = nodeBind;
  }
}
