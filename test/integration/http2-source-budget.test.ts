import { createSecureServer, type ClientHttp2Session, type ClientHttp2Stream, type IncomingHttpHeaders, type ServerHttp2Session, type ServerHttp2Stream } from "node:http2";
import type { AddressInfo } from "node:net";
import type { SecureContext } from "node:tls";
import { describe, expect, it } from "vitest";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { startH2Upstream } from "../helpers/h2-upstream.js";
import { startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { onTestFinished } from "vitest";

/** What a stream is charged at the default windows (h2StreamCharge): its response's window, and the guest's window for a body. */
const bodiless = 1_048_575;
const upload = bodiless + 131_071;

/** A PING and its answer: every frame the proxy sent before it has been read. */
function roundTrip(session: ClientHttp2Session): Promise<void> {
  return new Promise((resolve, reject) => session.ping((error) => (error === null ? resolve() : reject(error))));
}

/**
 * An h2-only upstream whose `/hold` streams are left unread and unanswered until `release()`:
 * then each is read whole and answered with the bytes it got. `/big` answers 4 MiB, which a
 * guest that stopped reading leaves in the proxy; `/echo` answers at once.
 */
async function startHoldingUpstream(): Promise<{ port: number; held: () => number; big: () => number; release: () => void }> {
  const ca = await testCa();
  const context = (await ca.serverContexts(["api.test"])).get("api.test")!;
  const server = createSecureServer({ allowHTTP1: false, SNICallback: (_name: string, cb: (err: Error | null, ctx?: SecureContext) => void) => cb(null, context) } as Parameters<typeof createSecureServer>[0]);
  const sessions = new Set<ServerHttp2Session>();
  server.on("session", (session: ServerHttp2Session) => {
    sessions.add(session);
    session.on("error", () => undefined);
    session.once("close", () => sessions.delete(session));
  });
  const held: ServerHttp2Stream[] = [];
  let released = false;
  let big = 0;
  const answer = (stream: ServerHttp2Stream): void => {
    let bytes = 0;
    stream.on("data", (chunk: Buffer) => (bytes += chunk.length));
    stream.on("end", () => {
      stream.respond({ ":status": 200, "content-type": "text/plain" });
      stream.end(String(bytes));
    });
  };
  server.on("stream", (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => {
    stream.on("error", () => undefined);
    const path = String(headers[":path"]);
    if (path === "/hold") {
      held.push(stream);
      if (released) answer(stream);
    } else if (path === "/big") {
      big += 1;
      stream.respond({ ":status": 200, "content-type": "application/octet-stream" });
      // Written as its window takes it: 4 MiB queued at once on each of five streams is past
      // Node's own session memory (10 MiB), and the upstream would refuse streams itself.
      let left = 64;
      const pump = (): void => {
        while (left-- > 0) {
          if (left === 0) stream.end(Buffer.alloc(65_536));
          else if (!stream.write(Buffer.alloc(65_536))) {
            stream.once("drain", pump);
            return;
          }
        }
      };
      pump();
    } else answer(stream);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(async () => {
    for (const session of sessions) session.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return {
    port: (server.address() as AddressInfo).port,
    held: () => held.length,
    big: () => big,
    release: () => {
      released = true;
      for (const stream of held) answer(stream);
    },
  };
}

/** A stream's end as the guest saw it: its status (or none), the body, and the reset code. */
interface Outcome {
  readonly status: number | undefined;
  readonly error: string | undefined;
  readonly body: string;
  readonly rstCode: number | undefined;
}

/** An upload of `bytes` on `session`, streamed in 16 KiB writes as a client sends one, its outcome when it closes. */
function startUpload(session: ClientHttp2Session, bytes: number): { stream: ClientHttp2Stream; outcome: Promise<Outcome> } {
  const stream = session.request({ ":method": "POST", ":path": "/hold" }, { endStream: false });
  stream.on("error", () => undefined);
  const chunk = Buffer.alloc(16_384, 0x61);
  let left = bytes;
  const pump = (): void => {
    while (left > 0) {
      const piece = left >= chunk.length ? chunk : chunk.subarray(0, left);
      left -= piece.length;
      const more = stream.write(piece);
      if (left <= 0) stream.end();
      if (!more) {
        stream.once("drain", pump);
        return;
      }
    }
  };
  pump();
  return { stream, outcome: outcomeOf(stream) };
}

function outcomeOf(stream: ClientHttp2Stream): Promise<Outcome> {
  return new Promise((resolve) => {
    let head: IncomingHttpHeaders | undefined;
    const chunks: Buffer[] = [];
    stream.on("response", (h) => (head = h));
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.once("close", () =>
      resolve({ status: head === undefined ? undefined : Number(head[":status"]), error: head?.["x-egressgate-error"] as string | undefined, body: Buffer.concat(chunks).toString(), rstCode: stream.rstCode }),
    );
  });
}

/** Until `check()` holds, polled on the proxy's own answers (a round trip on each session), never on a clock. */
async function until(check: () => boolean, sessions: readonly ClientHttp2Session[]): Promise<void> {
  while (!check()) await Promise.all(sessions.map(roundTrip));
}

/** A request from another source address (127.0.0.2), with and without a body: both served. */
async function otherSourceServed(proxy: TestProxy, port: number): Promise<void> {
  const other = await h2Session(proxy.port, `api.test:${port}`, proxy.caCertPem, {}, { localAddress: "127.0.0.2" });
  const get = await h2Request(other, { ":path": "/echo" });
  expect(get.status).toBe(200);
  const post = await h2Request(other, { ":method": "POST", ":path": "/echo" }, Buffer.alloc(300_000));
  expect([post.status, post.body.toString()]).toEqual([200, "300000"]);
}

// One source may open limits.connectionsPerSource (256) connections of limits.h2Streams (100)
// streams each, every one holding what its windows let in: 64 connections of stopped uploads held
// 1.1 GiB (docs/performance.md, "What one source holds"). limits.sourceBufferBytes bounds them
// together, by what each stream's windows allow.
describe("limits.sourceBufferBytes: what one source's HTTP/2 streams hold together", () => {
  it("uploads over three connections to an upstream that reads none: those past the budget get 503 and reach no upstream, those within it are never reset and finish whole once it reads, and another source is served throughout", async () => {
    const upstream = await startHoldingUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { limits: { sourceBufferBytes: 10 * upload } });
    const sessions = await Promise.all([0, 1, 2].map(() => h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem)));
    await Promise.all(sessions.map(roundTrip));
    const size = 2 * 2 ** 20;
    const uploads = sessions.flatMap((session) => Array.from({ length: 6 }, () => startUpload(session, size)));
    const ends: (Outcome | undefined)[] = new Array(uploads.length).fill(undefined);
    uploads.forEach(({ outcome }, i) => void outcome.then((o) => (ends[i] = o)));
    // Every stream reached the upstream or was answered: ten fit, the other eight were refused.
    await until(() => upstream.held() + ends.filter((o) => o !== undefined).length === uploads.length, sessions);
    expect(upstream.held()).toBe(10);
    const refused = ends.filter((o): o is Outcome => o !== undefined);
    expect(refused.map((o) => `${o.status} ${o.error}`)).toEqual(new Array(8).fill("503 EG_LIMIT"));
    expect(refused[0]!.body).toContain("limits.sourceBufferBytes");
    // The ten under way: open, nothing reset.
    const admitted = uploads.filter((_, i) => ends[i] === undefined);
    expect(admitted.map(({ stream }) => `${stream.closed} ${stream.rstCode ?? 0}`)).toEqual(new Array(10).fill("false 0"));
    // A new one from the same source is refused too, while another source is served.
    const late = startUpload(sessions[0]!, 100_000);
    expect(await late.outcome).toMatchObject({ status: 503, error: "EG_LIMIT" });
    await otherSourceServed(proxy, upstream.port);
    expect(upstream.held()).toBe(10);
    // The upstream reads: every admitted upload arrives whole, and the budget is free again.
    upstream.release();
    const finished = await Promise.all(admitted.map(({ outcome }) => outcome));
    expect(finished.map((o) => `${o.status} ${o.body} ${o.rstCode}`)).toEqual(new Array(10).fill(`200 ${size} 0`));
    const again = await Promise.all(Array.from({ length: 10 }, () => startUpload(sessions[1]!, 1_000).outcome));
    expect(again.map((o) => `${o.status} ${o.body}`)).toEqual(new Array(10).fill("200 1000"));
    expect(proxy.logs.filter((line) => line["status"] === 503).length).toBe(9);
  });

  it("uploads refused before their end give their charge back: a GET from the same source is served after them, on the same connection and on a new one", async () => {
    const upstream = await startHoldingUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], isRequestAllowed: (request) => request.method !== "POST" }, { limits: { sourceBufferBytes: 3 * upload } });
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    // Three 400 KB uploads, more than the guest's window: answered 403 while their bodies still
    // come, then RST_STREAM(NO_ERROR), with what arrived unread in the stream.
    const refused = await Promise.all(Array.from({ length: 3 }, () => startUpload(session, 400_000).outcome));
    // Each answer whole before the reset: its head, its text to the end, and NO_ERROR.
    expect(refused.map((o) => `${o.status} ${o.error} ${o.rstCode} ${o.body}`)).toEqual(new Array(3).fill(`403 EG_DENIED 0 403 Forbidden: request to https://api.test:${upstream.port} refused by isRequestAllowed\n`));
    // Held for the connection's life before the fix: every later stream of the source was 503.
    const get = async (on: ClientHttp2Session): Promise<number | undefined> => {
      for (let tries = 0; tries < 50; tries += 1) {
        const status = (await outcomeOf(on.request({ ":path": "/echo" }).on("error", () => undefined))).status;
        if (status !== 503) return status;
        await roundTrip(on);
      }
      return 503;
    };
    expect(await get(session)).toBe(200);
    const fresh = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    expect(await get(fresh)).toBe(200);
    // Three more refused uploads and three GETs at once: the budget is whole again.
    const again = await Promise.all(Array.from({ length: 3 }, () => startUpload(fresh, 400_000).outcome));
    expect(again.map((o) => `${o.status} ${o.rstCode}`)).toEqual(new Array(3).fill("403 0"));
    expect(await Promise.all([get(fresh), get(fresh), get(session)])).toEqual([200, 200, 200]);
    expect(upstream.held()).toBe(0);
  });

  it("downloads a guest stopped reading, over three connections: those past the budget get 503 and reach no upstream, another source is served, and a stream that closes makes room", async () => {
    const upstream = await startHoldingUpstream();
    const echo = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { limits: { sourceBufferBytes: 5 * bodiless } });
    const sessions = await Promise.all([0, 1, 2].map(() => h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem)));
    await Promise.all(sessions.map(roundTrip));
    const heads: (number | undefined)[] = [];
    const streams = sessions.flatMap((session) =>
      Array.from({ length: 3 }, () => {
        const stream = session.request({ ":path": "/big" });
        stream.on("error", () => undefined);
        stream.on("response", (head) => heads.push(Number(head[":status"])));
        stream.pause();
        return stream;
      }),
    );
    await until(() => heads.length === 9, sessions);
    expect(heads.filter((status) => status === 200)).toHaveLength(5);
    expect(heads.filter((status) => status === 503)).toHaveLength(4);
    expect(upstream.big()).toBe(5);
    const stopped = streams.filter((stream) => !stream.closed);
    expect(stopped).toHaveLength(5);
    for (const stream of stopped) expect(stream.rstCode ?? 0).toBe(0);
    const other = await h2Session(proxy.port, `api.test:${echo.port}`, proxy.caCertPem, {}, { localAddress: "127.0.0.2" });
    expect((await h2Request(other, { ":path": "/echo" })).status).toBe(200);
    // One stopped download read to its end: room for one more, not two.
    const read = stopped[0]!;
    const whole = new Promise<number>((resolve) => {
      let bytes = 0;
      read.on("data", (chunk: Buffer) => (bytes += chunk.length));
      read.once("end", () => resolve(bytes));
    });
    read.resume();
    expect(await whole).toBe(4 * 2 ** 20);
    if (!read.closed) await new Promise((resolve) => read.once("close", resolve));
    const more = Array.from({ length: 2 }, () => {
      const stream = sessions[2]!.request({ ":path": "/big" });
      stream.on("error", () => undefined);
      stream.pause();
      return new Promise<number>((resolve) => stream.once("response", (head) => resolve(Number(head[":status"]))));
    });
    expect((await Promise.all(more)).sort()).toEqual([200, 503]);
    expect(upstream.big()).toBe(6);
    // The proxy's close would wait for the stopped downloads.
    for (const session of sessions) session.destroy();
  });
});
