import { AsyncLocalStorage, AsyncResource, createHook, executionAsyncId } from "node:async_hooks";
import type { ClientHttp2Session } from "node:http2";
import { afterAll, beforeAll, describe, expect, it, onTestFinished, vi } from "vitest";
import { requestStream } from "../../src/upstream/h2-request-call.js";
import { startH2cPathServer, type H2cPathServer } from "../helpers/h2c-server.js";

// A cleartext h2 server on loopback: requestStream() is about the client's request() call only.
let server: H2cPathServer;
beforeAll(async () => void (server = await startH2cPathServer()));
afterAll(() => server.close());

/** A session to the test server (still connecting), destroyed when the test ends. */
const session = (): ClientHttp2Session => server.session();

/** The AsyncResource#bind in place while request() makes its PendingRequest resource. */
function bindSeenByRequest(): { readonly seen: () => unknown } {
  let seen: unknown;
  const hook = createHook({
    init(_id, type) {
      if (type === "PendingRequest") seen = AsyncResource.prototype.bind;
    },
  }).enable();
  onTestFinished(() => void hook.disable());
  return { seen: () => seen };
}

async function bodyOf(stream: ReturnType<typeof requestStream>): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    let status = 0;
    let body = "";
    stream.on("response", (head) => (status = Number(head[":status"])));
    stream.setEncoding("utf8");
    stream.on("data", (chunk: string) => (body += chunk));
    stream.on("end", () => resolve({ status, body }));
    stream.on("error", reject);
  });
}

describe("requestStream (session.request without Node 20's per-request deprecate wrappers)", () => {
  const nodeBind = AsyncResource.prototype.bind;

  it("swaps bind for the call only: request() binds with another, and the bound function runs fn in the resource's scope", async () => {
    const watch = bindSeenByRequest();
    const stream = requestStream(session(), { ":path": "/swapped" }, { endStream: true });
    expect(AsyncResource.prototype.bind).toBe(nodeBind);
    const used = watch.seen() as (this: AsyncResource, fn: unknown, thisArg?: unknown) => unknown;
    expect(typeof used).toBe("function");
    expect(used).not.toBe(nodeBind);
    expect(await bodyOf(stream)).toEqual({ status: 200, body: "path /swapped" });
    // What that bind gives, called as request() calls it: this, arguments, result, async scope.
    const resource = new AsyncResource("check");
    const target = { name: "target" };
    const bound = used.call(resource, function (this: unknown, a: number, b: number) {
      return { self: this, sum: a + b, scope: executionAsyncId() };
    }) as (this: unknown, a: number, b: number) => { self: unknown; sum: number; scope: number };
    expect(bound.call(target, 2, 3)).toEqual({ self: target, sum: 5, scope: resource.asyncId() });
    const withThis = used.call(resource, function (this: unknown) {
      return this;
    }, target) as () => unknown;
    expect(withThis.call({ other: true })).toBe(target);
    expect(() => used.call(resource, "not a function" as never)).toThrow(TypeError);
    expect(Object.getOwnPropertyDescriptor(bound, "asyncResource")).toBeUndefined();
  });

  it("sends the request, on a session still connecting and on a connected one, and puts bind back", async () => {
    const connecting = session();
    expect(connecting.connecting).toBe(true);
    const early = requestStream(connecting, { ":path": "/early" }, { endStream: true });
    expect(AsyncResource.prototype.bind).toBe(nodeBind);
    expect(await bodyOf(early)).toEqual({ status: 200, body: "path /early" });
    const late = requestStream(connecting, { ":path": "/late" }, { endStream: true });
    expect(await bodyOf(late)).toEqual({ status: 200, body: "path /late" });
    expect(AsyncResource.prototype.bind).toBe(nodeBind);
  });

  it("starts a stream deferred until the session connects in the async context of the call", async () => {
    const storage = new AsyncLocalStorage<string>();
    const connecting = session();
    expect(connecting.connecting).toBe(true);
    // 'ready' is emitted from the bound start function: at once when connected, else on 'connect'.
    const seen = await storage.run("the caller's context", () => {
      const stream = requestStream(connecting, { ":path": "/context" }, { endStream: true });
      return new Promise<string | undefined>((resolve) => stream.once("ready", () => resolve(storage.getStore())));
    });
    expect(seen).toBe("the caller's context");
  });

  it("puts Node's bind back when request() throws", () => {
    const closed = session();
    closed.destroy();
    expect(() => requestStream(closed, { ":path": "/" }, { endStream: true })).toThrow(/ERR_HTTP2_INVALID_SESSION|destroyed/i);
    expect(AsyncResource.prototype.bind).toBe(nodeBind);
  });

  it("leaves a bind that someone else installed in place, after this module loaded or before it", async () => {
    let calls = 0;
    const installed = function (this: AsyncResource, ...args: Parameters<typeof nodeBind>) {
      calls += 1;
      return nodeBind.apply(this, args);
    } as typeof nodeBind;
    AsyncResource.prototype.bind = installed;
    onTestFinished(() => void (AsyncResource.prototype.bind = nodeBind));
    const watch = bindSeenByRequest();
    const stream = requestStream(session(), { ":path": "/theirs" }, { endStream: true });
    expect(watch.seen()).toBe(installed);
    expect(AsyncResource.prototype.bind).toBe(installed);
    expect(await bodyOf(stream)).toEqual({ status: 200, body: "path /theirs" });
    expect(calls).toBe(1);
    // Installed before the module loads (an agent from --import): it looks like the module's
    // starting point, and is still not swapped out.
    vi.resetModules();
    const fresh = await import("../../src/upstream/h2-request-call.js");
    const again = fresh.requestStream(session(), { ":path": "/theirs-again" }, { endStream: true });
    expect(watch.seen()).toBe(installed);
    expect(await bodyOf(again)).toEqual({ status: 200, body: "path /theirs-again" });
    expect(calls).toBe(2);
  });

  it("keeps a bind installed during the call instead of putting Node's back over it", async () => {
    const installed = function (this: AsyncResource, ...args: Parameters<typeof nodeBind>) {
      return nodeBind.apply(this, args);
    } as typeof nodeBind;
    onTestFinished(() => void (AsyncResource.prototype.bind = nodeBind));
    // An async_hooks init callback is the only code that runs inside request().
    const hook = createHook({
      init(_id, type) {
        if (type === "PendingRequest") AsyncResource.prototype.bind = installed;
      },
    }).enable();
    onTestFinished(() => void hook.disable());
    const stream = requestStream(session(), { ":path": "/during" }, { endStream: true });
    hook.disable();
    expect(AsyncResource.prototype.bind).toBe(installed);
    expect(await bodyOf(stream)).toEqual({ status: 200, body: "path /during" });
  });
});
