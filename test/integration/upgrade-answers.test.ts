import { createHash } from "node:crypto";
import { maxHeaderSize } from "node:http";
import { connect, createServer, type AddressInfo, type Socket } from "node:net";
import { ProxyAgent, WebSocket } from "undici";
import { describe, expect, it, onTestFinished } from "vitest";
import { curlVia } from "../helpers/curl.js";
import { startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";

// What an upstream answers to a WebSocket upgrade, as bytes on the wire, and what the guest gets:
// informational responses before the 101 are skipped (they were answered 502), the 101 is rebuilt
// without hop-by-hop and framing fields (it went byte for byte), and a malformed head is refused
// at once (a bare-LF 101 was never recognised, and the guest waited upstreamHeadersMs for a 504).

const key = "dGhlIHNhbXBsZSBub25jZQ==";
const acceptFor = (k: string): string => createHash("sha1").update(`${k}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest("base64");
const switching = (accept: string, extra = ""): string =>
  `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n${extra}\r\n`;
const interim = (status = "103 Early Hints", fields = "Link: </style.css>; rel=preload\r\n"): string => `HTTP/1.1 ${status}\r\n${fields}\r\n`;
/** Long enough for a guest to be told at once, and far shorter than a guest left to wait would take. */
const headersMs = 8_000;

interface RawUpstream {
  readonly port: number;
  /** Everything the upstream received, over all its connections. */
  received(): string;
}

/**
 * A plain TCP upstream on 127.0.0.1: once a request head has arrived it writes what `answer`
 * makes of the request's Sec-WebSocket-Accept (a byte at a time with `dribble`), then echoes each
 * short masked text frame back unmasked. Closed, with its sockets, when the test ends.
 */
async function startRawUpstream(answer: (accept: string) => string | Buffer, dribble = false): Promise<RawUpstream> {
  const sockets = new Set<Socket>();
  let received = "";
  const server = createServer((s) => {
    sockets.add(s);
    s.on("error", () => undefined);
    let head = "";
    let switched = false;
    s.on("data", (chunk: Buffer) => {
      received += chunk.toString("latin1");
      if (switched) return void echoFrames(s, chunk);
      head += chunk.toString("latin1");
      if (!head.includes("\r\n\r\n")) return;
      switched = true;
      const made = answer(acceptFor(/sec-websocket-key: *(\S+)/i.exec(head)?.[1] ?? ""));
      const bytes = typeof made === "string" ? Buffer.from(made, "latin1") : made;
      if (!dribble) return void s.write(bytes);
      let at = 0;
      const next = (): void => {
        if (at < bytes.length && !s.destroyed) s.write(bytes.subarray(at, (at += 1)), () => setTimeout(next, 1));
      };
      next();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { port: (server.address() as AddressInfo).port, received: () => received };
}

/** Echoes a guest's short masked text frames (RFC 6455 §5.2), unmasked. */
function echoFrames(s: Socket, frame: Buffer): void {
  if ((frame[0]! & 0x0f) !== 0x1) return;
  const length = frame[1]! & 0x7f;
  const mask = frame.subarray(2, 6);
  const payload = Buffer.from(frame.subarray(6, 6 + length).map((b, i) => b ^ mask[i % 4]!));
  s.write(Buffer.concat([Buffer.from([0x81, payload.length]), payload]));
}

/** A guest that sends a plain-HTTP WebSocket upgrade to api.test, then `extra`; collects the answer. */
function sendUpgrade(proxy: TestProxy, port: number, extra = ""): { answer: () => string; closed: Promise<void>; guest: Socket } {
  const guest = connect(proxy.port, "127.0.0.1");
  onTestFinished(() => void guest.destroy());
  let answer = "";
  guest.on("data", (c: Buffer) => (answer += c.toString("latin1")));
  guest.on("error", () => undefined);
  const closed = new Promise<void>((resolve) => guest.on("close", () => resolve()));
  guest.write(
    `GET http://api.test:${port}/ws HTTP/1.1\r\nHost: api.test:${port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n` +
      `Sec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\n\r\n${extra}`,
  );
  return { answer: () => answer, closed, guest };
}

/** The head of an answer, its field names lowercased, in order. */
function headOf(answer: string): { statusLine: string; fields: [string, string][] } {
  const [statusLine, ...lines] = answer.slice(0, answer.indexOf("\r\n\r\n")).split("\r\n");
  return { statusLine: statusLine!, fields: lines.map((l) => [l.slice(0, l.indexOf(":")).toLowerCase(), l.slice(l.indexOf(":") + 1).trim()]) };
}

/** Opens a WebSocket through the proxy with undici's client, as a guest would, and echoes one message. */
async function echoThrough(proxy: TestProxy, port: number): Promise<string> {
  const agent = new ProxyAgent({ uri: proxy.url });
  onTestFinished(() => agent.close());
  const ws = new WebSocket(`ws://api.test:${port}/ws`, { dispatcher: agent } as never);
  onTestFinished(() => ws.close());
  await new Promise<void>((resolve, reject) => {
    ws.addEventListener("open", () => resolve());
    ws.addEventListener("error", (event) => reject(new Error(String((event as { message?: string }).message ?? "error"))));
  });
  const echoed = new Promise<string>((resolve) => ws.addEventListener("message", (e) => resolve(String(e.data))));
  ws.send("hello through egressgate");
  return echoed;
}

async function expectStillServing(proxy: TestProxy): Promise<void> {
  const upstream = await startUpstream({ tls: false });
  expect((await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`)).status).toBe(200);
}

const upgradeLine = (proxy: TestProxy): Record<string, unknown> | undefined => proxy.logs.find((l) => l["msg"] === "request" && l["upgrade"] === true);

describe("an upstream that switches after informational responses, or with a head the guest must not get as sent", () => {
  it.each([
    { what: "a 103 Early Hints first", answer: (a: string) => interim() + switching(a) },
    { what: "a 100 Continue first", answer: (a: string) => interim("100 Continue", "") + switching(a) },
    { what: "16 informational responses first (the most taken)", answer: (a: string) => interim().repeat(16) + switching(a) },
    { what: "a 103 and then its 101 a byte at a time", answer: (a: string) => interim() + switching(a), dribble: true },
    {
      what: "hop-by-hop and framing fields in the 101",
      answer: (a: string) =>
        switching(a, "Transfer-Encoding: chunked\r\nContent-Length: 5\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: X-T\r\n"),
    },
    {
      what: "a field its Connection names",
      answer: (a: string) => `HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\nConnection: Upgrade, X-Hop\r\nX-Hop: 1\r\nSec-WebSocket-Accept: ${a}\r\n\r\n`,
    },
  ])("$what: the guest's WebSocket opens and echoes, and its 101 has no hop-by-hop or framing field", async ({ answer, dribble }) => {
    const upstream = await startRawUpstream(answer, dribble);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamHeadersMs: headersMs } });
    const { answer: got } = sendUpgrade(proxy, upstream.port);
    await expect.poll(() => got(), { timeout: 5_000 }).toContain("\r\n\r\n");
    const { statusLine, fields } = headOf(got());
    expect(statusLine).toBe("HTTP/1.1 101 Switching Protocols");
    const names = fields.map(([name]) => name);
    for (const hop of ["transfer-encoding", "content-length", "keep-alive", "proxy-connection", "te", "trailer", "x-hop"]) expect(names).not.toContain(hop);
    expect(fields.filter(([name]) => name === "upgrade")).toEqual([["upgrade", "websocket"]]);
    expect(fields.filter(([name]) => name === "connection")).toEqual([["connection", "Upgrade"]]);
    expect(fields).toContainEqual(["sec-websocket-accept", acceptFor(key)]);
    expect(got()).not.toContain("HTTP/1.1 103");
    expect(got()).not.toContain("HTTP/1.1 100");
    expect(upgradeLine(proxy)).toMatchObject({ status: 101 });
    // A real WebSocket client (undici's, which checks the 101 as RFC 6455 §4.1 says) opens and echoes.
    expect(await echoThrough(proxy, upstream.port)).toBe("hello through egressgate");
    await expectStillServing(proxy);
  });

  it("end-to-end fields of the 101 (Set-Cookie, Sec-WebSocket-*, others) reach the guest as sent, in order", async () => {
    const upstream = await startRawUpstream((a) => switching(a, "Set-Cookie: a=b\r\nSet-Cookie: c=d\r\nSec-WebSocket-Protocol: chat\r\nX-Upstream:\t1 \r\n"));
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const { answer } = sendUpgrade(proxy, upstream.port);
    await expect.poll(() => answer(), { timeout: 5_000 }).toContain("\r\n\r\n");
    expect(headOf(answer()).fields).toEqual([
      ["upgrade", "websocket"],
      ["connection", "Upgrade"],
      ["sec-websocket-accept", acceptFor(key)],
      ["set-cookie", "a=b"],
      ["set-cookie", "c=d"],
      ["sec-websocket-protocol", "chat"],
      ["x-upstream", "1"],
    ]);
  });

  it("frames the upstream sends in the same packet as its 101 reach the guest after the head", async () => {
    const upstream = await startRawUpstream((a) => Buffer.concat([Buffer.from(interim() + switching(a), "latin1"), Buffer.from([0x81, 5]), Buffer.from("first")]));
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const { answer } = sendUpgrade(proxy, upstream.port);
    await expect.poll(() => answer(), { timeout: 5_000 }).toContain("first");
    expect(answer().slice(answer().indexOf("\r\n\r\n") + 4)).toBe("\x81\x05first");
  });
});

describe("an upstream whose answer to an upgrade is malformed, or too much", () => {
  const big = "a".repeat(maxHeaderSize);
  it.each([
    { what: "a 101 with bare-LF line ends", answer: (a: string) => switching(a).replace(/\r\n/g, "\n"), reason: /malformed head: a line that ends in a bare LF/ },
    { what: "a 101 with one bare-LF field line", answer: (a: string) => switching(a, "X-A: 1\n"), reason: /malformed head: a line that ends in a bare LF/ },
    { what: "a bare CR in the 101", answer: (a: string) => switching(a, "X-A: 1\rX-B: 2\r\n"), reason: /malformed head: a CR not followed by LF/ },
    { what: "an obs-fold line", answer: (a: string) => switching(a, "X-F: a\r\n b\r\n"), reason: /malformed head: a folded header line \(obs-fold/ },
    { what: "a field name with a space", answer: (a: string) => switching(a, "X F: 1\r\n"), reason: /malformed head: a header name that is not an HTTP token: "X F"/ },
    { what: "a space before the colon", answer: (a: string) => switching(a, "X-F : 1\r\n"), reason: /malformed head: a header name that is not an HTTP token: "X-F "/ },
    { what: "a field line without a colon", answer: (a: string) => switching(a, "X-F\r\n"), reason: /malformed head: a header line without a colon/ },
    { what: "a NUL in a value", answer: (a: string) => switching(a, "X-F: a\0b\r\n"), reason: /malformed head: a control character in the value of "X-F"/ },
    { what: "an HTTP/1.0 101", answer: (a: string) => switching(a).replace("HTTP/1.1", "HTTP/1.0"), reason: /did not switch protocols \(answered 101 with HTTP\/1\.0; a switch needs HTTP\/1\.1\)/ },
    { what: "an HTTP/1.0 103 before the 101", answer: (a: string) => interim().replace("HTTP/1.1", "HTTP/1.0") + switching(a), reason: /answered 103 with HTTP\/1\.0/ },
    { what: "a 200 after a 103", answer: () => `${interim()}HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok`, reason: /did not switch protocols \(answered 200\)/ },
    { what: "17 informational responses", answer: (a: string) => interim().repeat(17) + switching(a), reason: /sent more than 16 informational \(1xx\) responses/ },
    { what: "informational responses of more than 64 KiB in all", answer: (a: string) => interim("103 Early Hints", `Link: ${"x".repeat(10_000)}\r\n`).repeat(7) + switching(a), reason: /sent more than 64 KiB of response heads before switching protocols/ },
    { what: "a 101 head over http.maxHeaderSize", answer: (a: string) => switching(a, `X-Big: ${big}\r\n`), reason: new RegExp(`sent a response head over ${maxHeaderSize} bytes`) },
    { what: "a 101 head over http.maxHeaderSize that never ends", answer: () => `HTTP/1.1 101 Switching Protocols\r\nX-Big: ${big}`, reason: new RegExp(`sent a response head over ${maxHeaderSize} bytes`) },
    { what: "an SSH banner, no line end", answer: () => "SSH-2.0-OpenSSH_9.6", reason: /did not switch protocols \(answered a malformed status line\)/ },
    { what: "a 101 to h2c after a 103", answer: () => `${interim()}HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n`, reason: /switched to "h2c", not to WebSocket/ },
  ])("$what gets 502 at once, saying why; the upstream never gets the guest's next bytes, and the proxy keeps serving", async ({ answer, reason }) => {
    const upstream = await startRawUpstream(answer);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamHeadersMs: headersMs } });
    const started = performance.now();
    const { answer: got, closed } = sendUpgrade(proxy, upstream.port, "PRI * HTTP/2.0\r\n\r\n");
    await closed;
    expect(performance.now() - started).toBeLessThan(headersMs / 2);
    expect(got()).toMatch(/^HTTP\/1\.1 502 /);
    expect(got()).toMatch(reason);
    expect(upstream.received()).toMatch(/^GET \/ws HTTP\/1\.1\r\n/);
    expect(upstream.received()).not.toContain("PRI *");
    await expect.poll(() => upgradeLine(proxy)).toMatchObject({ status: 502, code: "EG_UPSTREAM", reason: expect.stringMatching(reason) });
    await expectStillServing(proxy);
  });

  it("an upstream that keeps sending informational responses slowly gets the guest a 504 after upstreamHeadersMs, as one that sends nothing does", async () => {
    const sockets = new Set<Socket>();
    const server = createServer((s) => {
      sockets.add(s);
      s.on("error", () => undefined);
      s.once("data", () => {
        const timer = setInterval(() => s.write(interim()), 50);
        s.on("close", () => clearInterval(timer));
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    onTestFinished(async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamHeadersMs: 300 } });
    const { answer, closed } = sendUpgrade(proxy, (server.address() as AddressInfo).port);
    await closed;
    expect(answer()).toMatch(/^HTTP\/1\.1 504 /);
    expect(answer()).toMatch(/did not answer the upgrade within 300 ms/);
    await expectStillServing(proxy);
  });
});
