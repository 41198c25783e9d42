import { AsyncLocalStorage, AsyncResource } from "node:async_hooks";
import { connect, createServer, type ClientHttp2Session, type Http2Server } from "node:http2";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { requestStream } from "../../src/upstream/h2-request-call.js";

// A cleartext h2 server on loopback: requestStream() is about the client's request() call only.
let server: Http2Server;
let origin: string;
const sessions: ClientHttp2Session[] = [];

beforeAll(async () => {
  server = createServer();
  server.on("stream", (stream, headers) => {
    stream.on("error", () => undefined);
    stream.respond({ ":status": 200 });
    stream.end(`path ${String(headers[":path"])}`);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  for (const session of sessions) session.destroy();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

function session(): ClientHttp2Session {
  const made = connect(origin);
  made.on("error", () => undefined);
  sessions.push(made);
  return made;
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

  it("leaves a bind that someone else installed in place during the call", async () => {
    let calls = 0;
    const installed = function (this: AsyncResource, ...args: Parameters<typeof nodeBind>) {
      calls += 1;
      return nodeBind.apply(this, args);
    } as typeof nodeBind;
    AsyncResource.prototype.bind = installed;
    try {
      const stream = requestStream(session(), { ":path": "/theirs" }, { endStream: true });
      expect(AsyncResource.prototype.bind).toBe(installed);
      expect(await bodyOf(stream)).toEqual({ status: 200, body: "path /theirs" });
      expect(calls).toBe(1);
    } finally {
      AsyncResource.prototype.bind = nodeBind;
    }
  });
});
