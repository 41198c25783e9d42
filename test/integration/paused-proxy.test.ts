import { readFileSync } from "node:fs";
import type { ServerHttp2Stream } from "node:http2";
import { describe, expect, it, onTestFinished } from "vitest";
import { startChildProxy, type ChildProxy } from "../helpers/child-proxy.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { flag, frame, frameType, RawH2, requestBlock } from "../helpers/h2-frames.js";
import { startH2Upstream } from "../helpers/h2-upstream.js";
import { latch } from "../helpers/latch.js";
import { tempDir } from "../helpers/proxy.js";
import { openRaw, openTlsTunnel, type RawClient } from "../helpers/raw.js";
import { testCa } from "../helpers/test-ca.js";
import { startUpstream } from "../helpers/upstream.js";

// A proxy process paused and resumed (SIGSTOP then SIGCONT: a paused VM, a starved host) finds
// every deadline that passed meanwhile due at once, and Node runs due timers before the poll that
// reads the sockets. A deadline judged there judged a peer silent whose answer, sent in time, was
// still unread in the kernel. The proxy runs in a child process, since the test pauses it; each
// test waits until the kernel reports it stopped, then lets the peer act and the deadline pass.

const deadlineMs = 1_000;

/** The child stopped (state T in /proc): the returned function resumes it; the test's end does too. */
async function pause(child: ChildProxy): Promise<() => void> {
  const resume = (): void => {
    if (child.alive()) process.kill(child.pid, "SIGCONT");
  };
  onTestFinished(resume);
  process.kill(child.pid, "SIGSTOP");
  const state = (): string => {
    const stat = readFileSync(`/proc/${child.pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
  };
  await until(() => state() === "T");
  return resume;
}

/** Resolves once `check` holds, looking every few milliseconds. */
async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((resolve) => setTimeout(resolve, 5));
}

/**
 * The proxy has read everything `guest` sent: the guest's socket holds nothing unsent, and the
 * kernel holds nothing unread on the proxy's end of the connection (its receive queue in
 * /proc/net/tcp), so what the guest wrote is in the proxy before it is paused.
 */
function readByProxy(guest: RawClient, proxy: ChildProxy): boolean {
  if (guest.socket.writableLength > 0) return false;
  const hex = (port: number): string => port.toString(16).toUpperCase().padStart(4, "0");
  const local = `0100007F:${hex(proxy.port)}`;
  const remote = `0100007F:${hex(guest.socket.localPort!)}`;
  for (const line of readFileSync(`/proc/${proxy.pid}/net/tcp`, "utf8").split("\n").slice(1)) {
    const fields = line.trim().split(/\s+/);
    if (fields[1] === local && fields[2] === remote) return fields[4]!.split(":")[1] === "00000000";
  }
  throw new Error(`no connection ${remote} -> ${local} in /proc/${proxy.pid}/net/tcp`);
}

/** Lets every deadline of `deadlineMs` armed before the pause pass while the proxy is stopped. */
function pastTheDeadline(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, deadlineMs * 2));
}

async function childProxy(timeouts: Record<string, number>, logLevel = "warn"): Promise<ChildProxy> {
  const ca = await testCa();
  const child = await startChildProxy({
    allowedHosts: ["api.test"],
    proxy: { caDir: tempDir(), logLevel, resolve: { "api.test": ["127.0.0.1"] }, upstreamCa: [ca.certPem], timeouts },
  });
  onTestFinished(() => child.stop());
  return child;
}

describe("a proxy paused past a deadline", { timeout: 30_000 }, () => {
  it("a head and a body an HTTP/2 upstream sent while the proxy was paused past upstreamHeadersMs and upstreamBodyMs reach the guest whole", async () => {
    const [arrived, inUpstream] = latch();
    const [headSent, sendHead] = latch();
    const [bodySent, sendRest] = latch();
    let headWritten!: () => void;
    let restWritten!: () => void;
    const upstream = await startH2Upstream({
      "/slow": (stream) => {
        inUpstream();
        void headSent.then(() => {
          stream.respond({ ":status": 200, "content-type": "text/plain" });
          stream.write("first ", () => headWritten());
          void bodySent.then(() => stream.end("last", () => restWritten()));
        });
      },
    });
    const proxy = await childProxy({ upstreamHeadersMs: deadlineMs, upstreamBodyMs: deadlineMs });
    const guest = await openRaw(proxy.port);
    guest.write(`GET https://api.test:${upstream.port}/slow HTTP/1.1\r\nHost: api.test:${upstream.port}\r\n\r\n`);
    await arrived;

    // The head while the proxy is stopped, past upstreamHeadersMs.
    let resume = await pause(proxy);
    await new Promise<void>((resolve) => ((headWritten = resolve), sendHead()));
    await pastTheDeadline();
    resume();
    // The head and the first chunk through (or, as it was, a 504 in their place).
    await until(() => guest.pending().includes("first ") || (guest.pending().length >= 12 && !guest.pending().startsWith("HTTP/1.1 200")) || guest.isClosed);
    expect(guest.pending()).toMatch(/^HTTP\/1\.1 200/);
    // The rest of the body likewise, past upstreamBodyMs of the proxy's silence.
    resume = await pause(proxy);
    await new Promise<void>((resolve) => ((restWritten = resolve), sendRest()));
    await pastTheDeadline();
    resume();

    const answer = await guest.readResponse();
    expect(answer.status).toBe(200);
    expect(answer.body).toBe("first last");
    expect(proxy.stderr()).not.toMatch(/timed out/);
  });

  it("an upload whose end an HTTP/2 upstream made room for while the proxy was paused past upstreamHeadersMs is answered, not 504", async () => {
    // The upstream takes nothing (its stream paused) until the proxy is stopped: the proxy sends
    // the initial window, 65,535 bytes, and holds the rest.
    const upstream = await startH2Upstream();
    let held: ServerHttp2Stream | undefined;
    upstream.server.prependListener("stream", (stream: ServerHttp2Stream) => {
      stream.pause();
      held = stream;
    });
    const proxy = await childProxy({ upstreamHeadersMs: deadlineMs });
    const guest = await openRaw(proxy.port);
    const size = 65_535 + 2_000;
    guest.write(`POST https://api.test:${upstream.port}/echo HTTP/1.1\r\nHost: api.test:${upstream.port}\r\nContent-Length: ${size}\r\n\r\n`);
    guest.write(Buffer.alloc(size, 0x61));
    await until(() => held !== undefined && held.readableLength === 65_535 && readByProxy(guest, proxy));

    // The upstream reads it all and opens its window while the proxy is stopped. At the resume
    // the deadline's timer fires first; the same turn's reads let the rest go out, and the upload
    // finishes: the head's time counts from there.
    const resume = await pause(proxy);
    held!.resume();
    await until(() => held!.readableLength === 0);
    await pastTheDeadline();
    resume();

    const answer = await guest.readResponse();
    expect(answer.status).toBe(200);
    expect((JSON.parse(answer.body) as { bodyBytes: number }).bodyBytes).toBe(size);
  });

  it("a request an HTTP/2 guest sent while the proxy was paused past its connection's idleMs is answered on that connection", async () => {
    const upstream = await startUpstream({ names: ["api.test"] });
    const proxy = await childProxy({ idleMs: deadlineMs });
    const authority = `api.test:${upstream.port}`;
    const session = await h2Session(proxy.port, authority, proxy.caCertPem);
    let goaway = false;
    session.on("goaway", () => (goaway = true));
    expect((await h2Request(session, { ":path": "/echo", ":authority": authority })).status).toBe(200);

    // No request running: the idle limit counts from the answer, and passes during the pause.
    const resume = await pause(proxy);
    const sent = h2Request(session, { ":path": "/echo", ":authority": authority });
    await pastTheDeadline();
    resume();

    expect((await sent).status).toBe(200);
    expect(goaway).toBe(false);
  });

  it("an HTTP/2 guest that answered the proxy's PING while the proxy was paused past h2PingMs keeps its connection", async () => {
    const upstream = await startUpstream({ names: ["api.test"] });
    const proxy = await childProxy({ h2PingMs: deadlineMs, idleMs: 600_000 });
    const authority = `api.test:${upstream.port}`;
    const guest = await RawH2.open(proxy.port, authority, proxy.caCertPem);
    // The SETTINGS acknowledged, or the SETTINGS_TIMEOUT (as long as h2PingMs) would end it first.
    await guest.until((c) => c.frames.some((f) => f.type === frameType.settings && (f.flags & flag.ack) === 0));
    guest.write(frame(frameType.settings, flag.ack, 0));

    // Silent for h2PingMs: the proxy asks. The guest answers while the proxy is stopped.
    const isPing = (f: { type: number; flags: number }): boolean => f.type === frameType.ping && (f.flags & flag.ack) === 0;
    await guest.until((c) => c.frames.some(isPing));
    const resume = await pause(proxy);
    guest.write(frame(frameType.ping, flag.ack, 0, guest.frames.find(isPing)!.payload));
    await pastTheDeadline();
    resume();

    guest.write(frame(frameType.headers, flag.endHeaders | flag.endStream, 1, requestBlock(authority, "/echo")));
    await guest.until((c) => c.answered(1));
    expect(guest.goaway()).toBeUndefined();
    expect(guest.closed).toBe(false);
  });

  it("a pipelined request behind one answered 504 in the turn its connection's idleMs passed is answered, not cut as a guest that read nothing", async () => {
    // Both deadlines pass in the pause, so both are judged in one turn after it, as two deadlines
    // due in the same millisecond are without one (the fuzzer's proxy has idleMs equal to
    // upstreamHeadersMs): the head deadline's verdict answers the first request 504, and the idle
    // verdict after it found that answer still in the TLS socket's queue, read it as a guest that
    // stopped reading, and cut the connection with the second request unanswered.
    const [arrived, inUpstream] = latch();
    const upstream = await startH2Upstream({ "/stall": () => inUpstream() });
    // idleMs after upstreamHeadersMs: once both have passed, the 504's verdict comes first.
    const proxy = await childProxy({ idleMs: deadlineMs * 1.5, upstreamHeadersMs: deadlineMs }, "debug");
    const authority = `api.test:${upstream.port}`;
    const guest = await openTlsTunnel(proxy.port, authority, { ca: proxy.caCertPem });
    guest.write(`GET /stall HTTP/1.1\r\nHost: ${authority}\r\n\r\nGET /echo HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
    await arrived;
    await until(() => readByProxy(guest, proxy));
    const resume = await pause(proxy);
    await pastTheDeadline();
    resume();

    expect((await guest.readResponse()).status).toBe(504);
    const second = await guest.readResponse();
    expect(second.status).toBe(200);
    expect(proxy.stderr()).not.toContain("the guest read nothing");
  });

  it("a request head an HTTP/1.1 guest finished while the proxy was paused past headersMs is answered, not 408, and the connection's reset is still the guest's failure", async () => {
    const upstream = await startUpstream({ tls: false });
    const proxy = await childProxy({ headersMs: deadlineMs }, "debug");
    const guest = await openRaw(proxy.port);
    // A first request on the connection shows the proxy reading it; the head's clock then runs
    // from the first byte of the second, which nothing answers until it is whole: the proxy has
    // read that first half before the pause (had it not, the test would not tell).
    guest.write(`GET http://api.test:${upstream.port}/echo HTTP/1.1\r\nHost: api.test:${upstream.port}\r\n\r\n`);
    expect((await guest.readResponse()).status).toBe(200);
    guest.write(`GET http://api.test:${upstream.port}/echo HTTP/1.1\r\nHost: api.test:${upstream.port}\r\n`);
    await until(() => readByProxy(guest, proxy));
    const resume = await pause(proxy);
    guest.write("Accept: */*\r\n\r\n");
    await pastTheDeadline();
    resume();

    expect((await guest.readResponse()).status).toBe(200);
    // Node took its own error listener off the socket before it reported the 408 the proxy then
    // did not give: the guest's reset goes through clientError all the same ("guest connection
    // failed", logged before the connection limits' own line for the error).
    guest.socket.resetAndDestroy();
    await until(() => proxy.stderr().includes('"guest socket error"'));
    expect(proxy.stderr()).toContain('"guest connection failed"');
  });
});
