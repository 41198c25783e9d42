import type { ServerHttp2Stream } from "node:http2";
import type { ServerResponse } from "node:http";
import { createServer } from "node:https";
import { describe, expect, it } from "vitest";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { flag, frame, frameType, ping, RawH2, requestBlock } from "../helpers/h2-frames.js";
import { startH2Upstream } from "../helpers/h2-upstream.js";
import { loggedRequest, startTestProxy } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { listenForTest, startUpstream } from "../helpers/upstream.js";

/**
 * A response whose last body bytes fill the HTTP/2 guest's stream window exactly, and whose end
 * comes after them (the upstream's end in a later read, or seen only once the pump's last write
 * has drained): nghttp2 holds the END_STREAM back until the guest opens its window again, and the
 * guest must then get it (or the trailers that carry it), not an RST_STREAM in its place. Node
 * closed such a stream with RST_STREAM(NO_ERROR) when its request side was never read
 * (docs/reliability.md, fifteenth session).
 */

/** The guest's SETTINGS_INITIAL_WINDOW_SIZE and the body's length: the body fills the window exactly. */
const windowBytes = 20_000;
const initialWindowSize = 0x4;

interface Shape {
  readonly upstream: "h1" | "h2";
  /** How the answer's body is delimited: a Content-Length, chunked (HTTP/1.1) or DATA frames alone (HTTP/2), or the connection's close (HTTP/1.1). */
  readonly framing: "length" | "chunked" | "close";
  readonly trailers: boolean;
}

/**
 * An upstream whose `/full` answers `windowBytes` of body at once and its end only on `finish()`,
 * which resolves once the proxy has read that end: over HTTP/1.1 the answer says
 * `Connection: close` and the proxy closes the connection once it has the whole answer; over
 * HTTP/2 a PING sent after the END_STREAM comes back acknowledged, which the proxy's session
 * does only after the frames before it.
 */
async function upstreamFor(shape: Shape): Promise<{ port: number; started: () => boolean; finish: () => Promise<void> }> {
  let finishing: (() => Promise<void>) | undefined;
  const head = (): Record<string, string> => ({
    "content-type": "application/octet-stream",
    ...(shape.framing === "length" ? { "content-length": String(windowBytes) } : {}),
  });
  if (shape.upstream === "h1") {
    const upstream = await startUpstream({
      routes: {
        "/full": (req, res: ServerResponse) => {
          // Neither a length nor chunked: the body ends at the connection's close (RFC 9112 §6.3).
          if (shape.framing === "close") res.useChunkedEncodingByDefault = false;
          res.writeHead(200, { ...head(), connection: "close", ...(shape.trailers ? { trailer: "x-sum" } : {}) });
          res.write(Buffer.alloc(windowBytes, 0x61));
          finishing = async () => {
            const closed = new Promise<void>((resolve) => req.socket.once("close", () => resolve()));
            if (shape.trailers) res.addTrailers({ "x-sum": "42" });
            res.end();
            await closed;
          };
        },
        "/again": (_req, res) => {
          res.writeHead(200, { "content-type": "text/plain" });
          res.end("again");
        },
      },
    });
    return { port: upstream.port, started: () => finishing !== undefined, finish: () => finishing!() };
  }
  const upstream = await startH2Upstream({
    "/full": (stream: ServerHttp2Stream) => {
      stream.respond({ ":status": 200, ...head() }, { waitForTrailers: shape.trailers });
      if (shape.trailers) stream.once("wantTrailers", () => stream.sendTrailers({ "x-sum": "42" }));
      stream.write(Buffer.alloc(windowBytes, 0x61));
      finishing = async () => {
        const session = stream.session!;
        // The PING goes after the stream's last frame once that has gone (its close).
        const closed = new Promise<void>((resolve) => stream.once("close", () => resolve()));
        stream.end();
        await closed;
        await new Promise<void>((resolve, reject) => session.ping((error) => (error ? reject(error) : resolve())));
      };
    },
    "/again": (stream: ServerHttp2Stream) => {
      stream.respond({ ":status": 200, "content-type": "text/plain" });
      stream.end("again");
    },
  });
  return { port: upstream.port, started: () => finishing !== undefined, finish: () => finishing!() };
}

const shapes: Shape[] = [
  { upstream: "h1", framing: "length", trailers: false },
  { upstream: "h1", framing: "close", trailers: false },
  { upstream: "h1", framing: "chunked", trailers: false },
  { upstream: "h1", framing: "chunked", trailers: true },
  { upstream: "h2", framing: "length", trailers: false },
  { upstream: "h2", framing: "chunked", trailers: false },
  { upstream: "h2", framing: "chunked", trailers: true },
  { upstream: "h2", framing: "length", trailers: true },
];

describe("an HTTP/2 guest whose window the body fills exactly, its end arriving after", () => {
  it.each(shapes)("$upstream upstream, framing $framing, trailers $trailers: the guest gets END_STREAM once it opens its window", async (shape) => {
    const upstream = await upstreamFor(shape);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const authority = `api.test:${upstream.port}`;
    const guest = await RawH2.open(proxy.port, authority, proxy.caCertPem, [[initialWindowSize, windowBytes]]);
    guest.write(frame(frameType.settings, flag.ack, 0));
    guest.write(frame(frameType.headers, flag.endHeaders | flag.endStream, 1, requestBlock(authority, "/full")));
    const received = (): number => guest.frames.filter((f) => f.type === frameType.data && f.streamId === 1).reduce((n, f) => n + f.payload.length, 0);
    // The whole body is out: the guest's window for the stream is 0.
    await guest.until(() => received() >= windowBytes);
    expect(upstream.started()).toBe(true);
    // The end reaches the proxy; then a round trip with the guest lets the proxy act on it.
    await upstream.finish();
    guest.write(ping(1));
    await guest.until((c) => c.frames.some((f) => f.type === frameType.ping && (f.flags & flag.ack) !== 0));
    const increment = Buffer.alloc(4);
    increment.writeUInt32BE(windowBytes);
    guest.write(frame(frameType.windowUpdate, 0, 1, increment));
    const ended = (): boolean => guest.frames.some((f) => (f.type === frameType.data || f.type === frameType.headers) && f.streamId === 1 && (f.flags & flag.endStream) !== 0);
    await guest.until((c) => ended() || c.resetCode(1) !== undefined);
    const frames = guest.frames.filter((f) => f.streamId === 1).map((f) => `${f.type}:${f.flags}`);
    expect({ ended: ended(), reset: guest.resetCode(1), bytes: received() }, frames.join(" ")).toEqual({ ended: true, reset: undefined, bytes: windowBytes });
    if (shape.trailers) expect(guest.frames.filter((f) => f.type === frameType.headers && f.streamId === 1).length).toBe(2);
    const line = await loggedRequest(proxy, "/full");
    expect(line).toMatchObject({ status: 200 });
    expect(line["error"]).toBeUndefined();
    // The proxy still serves, on a connection of the guest's own and on another.
    guest.write(frame(frameType.headers, flag.endHeaders | flag.endStream, 3, requestBlock(authority, "/again")));
    await guest.until((c) => c.frames.some((f) => f.streamId === 3 && (f.flags & flag.endStream) !== 0) || c.resetCode(3) !== undefined);
    expect(guest.resetCode(3)).toBeUndefined();
    const session = await h2Session(proxy.port, authority, proxy.caCertPem);
    const again = await h2Request(session, { ":path": "/again" });
    expect([again.status, again.body.toString()]).toEqual([200, "again"]);
  }, 20_000);
});

/**
 * An upload the upstream answers before its end (RFC 9113 §8.1): the proxy stops it with
 * RST_STREAM(NO_ERROR) once the response is out, and that reset must come after the END_STREAM
 * (or the trailers that carry it), never in its place, however long the guest's window holds it.
 */
describe("an HTTP/2 guest still sending its request, whose window the early answer's body fills exactly", () => {
  it.each([{ trailers: false }, { trailers: true }])("trailers $trailers: END_STREAM, then the reset that stops the upload", async ({ trailers }) => {
    const ca = await testCa();
    const credentials = (await ca.serverCredentials(["api.test"])).get("api.test")!;
    // Answers at once, whole, without waiting for the upload.
    const server = createServer({ key: credentials.key, cert: credentials.cert }, (req, res) => {
      req.resume();
      if (req.url === "/again") {
        res.end("again");
        return;
      }
      res.writeHead(200, { "content-type": "application/octet-stream", ...(trailers ? { trailer: "x-sum" } : { "content-length": String(windowBytes) }) });
      if (trailers) res.addTrailers({ "x-sum": "42" });
      res.end(Buffer.alloc(windowBytes, 0x61));
    });
    const port = await listenForTest(server);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const authority = `api.test:${port}`;
    const guest = await RawH2.open(proxy.port, authority, proxy.caCertPem, [[initialWindowSize, windowBytes]]);
    guest.write(frame(frameType.settings, flag.ack, 0));
    answerPings(guest);
    guest.write(frame(frameType.headers, flag.endHeaders, 1, requestBlock(authority, "/up", [], "POST")));
    guest.write(frame(frameType.data, 0, 1, Buffer.alloc(100, 0x62)));
    const received = (): number => guest.frames.filter((f) => f.type === frameType.data && f.streamId === 1).reduce((n, f) => n + f.payload.length, 0);
    await guest.until((c) => received() >= windowBytes || c.resetCode(1) !== undefined);
    // Two round trips with the guest: the proxy has acted on the body's end (and, without the
    // fix, reset the stream) before the window opens.
    for (const id of [1, 2]) {
      guest.write(ping(id));
      await guest.until((c) => c.frames.filter((f) => f.type === frameType.ping && (f.flags & flag.ack) !== 0).length >= id);
    }
    const increment = Buffer.alloc(4);
    increment.writeUInt32BE(windowBytes);
    guest.write(frame(frameType.windowUpdate, 0, 1, increment));
    await guest.until((c) => c.resetCode(1) !== undefined);
    const onStream = guest.frames.filter((f) => f.streamId === 1);
    const end = onStream.findIndex((f) => (f.type === frameType.data || f.type === frameType.headers) && (f.flags & flag.endStream) !== 0);
    const reset = onStream.findIndex((f) => f.type === frameType.rstStream);
    expect({ endBeforeReset: end >= 0 && end < reset, resetCode: guest.resetCode(1), bytes: received() }, onStream.map((f) => `${f.type}:${f.flags}`).join(" ")).toEqual({
      endBeforeReset: true,
      resetCode: 0,
      bytes: windowBytes,
    });
    if (trailers) expect(onStream[end]!.type).toBe(frameType.headers);
    const line = await loggedRequest(proxy, "/up");
    expect(line).toMatchObject({ status: 200 });
    expect(line["error"]).toBeUndefined();
    const session = await h2Session(proxy.port, authority, proxy.caCertPem);
    const again = await h2Request(session, { ":path": "/again" });
    expect([again.status, again.body.toString()]).toEqual([200, "again"]);
  }, 20_000);
});

/** Acknowledges each PING the proxy sends, as a live guest does (RawH2 answers nothing by itself). */
function answerPings(guest: RawH2): void {
  let seen = 0;
  // After RawH2's own listener: the frames of this read are parsed.
  guest.socket.on("data", () => {
    for (; seen < guest.frames.length; seen++) {
      const f = guest.frames[seen]!;
      if (f.type === frameType.ping && (f.flags & flag.ack) === 0) guest.write(frame(frameType.ping, flag.ack, 0, f.payload));
    }
  });
}

