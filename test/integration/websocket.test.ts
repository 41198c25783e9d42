import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createServer as createHttpsServer } from "node:https";
import { connect, createServer as createNetServer, type AddressInfo, type Socket } from "node:net";
import { ProxyAgent, WebSocket } from "undici";
import { describe, expect, it, onTestFinished } from "vitest";
import { HttpRequestBlockedError, type AuditRecord } from "../../src/index.js";
import { curlVia } from "../helpers/curl.js";
import { startTestProxy, tempDir } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";
import { openTlsTunnel } from "../helpers/raw.js";
import { testCa } from "../helpers/test-ca.js";

/** A minimal WebSocket echo server (RFC 6455): enough for short text frames. */
async function startEchoServer(): Promise<{ port: number; upgrades: () => number }> {
  const ca = await testCa();
  const context = (await ca.serverContexts(["api.test"])).get("api.test")!;
  let upgrades = 0;
  const server = createHttpsServer({ secureContext: context, SNICallback: (_n: string, cb: (e: null, c: typeof context) => void) => cb(null, context) } as never);
  const sockets = new Set<Socket>();
  server.on("upgrade", (req, socket: Socket) => {
    upgrades += 1;
    sockets.add(socket);
    const accept = createHash("sha1").update(`${req.headers["sec-websocket-key"]}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest("base64");
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
    socket.on("data", (frame: Buffer) => {
      const opcode = frame[0]! & 0x0f;
      if (opcode === 0x8) {
        socket.end(Buffer.from([0x88, 0]));
        return;
      }
      const length = frame[1]! & 0x7f; // short frames only
      const mask = frame.subarray(2, 6);
      const payload = Buffer.from(frame.subarray(6, 6 + length).map((b, i) => b ^ mask[i % 4]!));
      socket.write(Buffer.concat([Buffer.from([0x81, payload.length]), payload]));
    });
    socket.on("error", () => undefined);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { port: (server.address() as AddressInfo).port, upgrades: () => upgrades };
}

function openSocket(url: string, agent: ProxyAgent): Promise<{ ws: WebSocket; opened: boolean; reason: string }> {
  return new Promise((resolve) => {
    const ws = new WebSocket(url, { dispatcher: agent } as never);
    onTestFinished(() => ws.close());
    ws.addEventListener("open", () => resolve({ ws, opened: true, reason: "" }));
    ws.addEventListener("error", (event) => resolve({ ws, opened: false, reason: String((event as { message?: string }).message ?? "error") }));
  });
}

describe("WebSocket upgrades", () => {
  it("a wss:// upgrade to an allowed host is checked, relayed and pinned: messages echo both ways", async () => {
    const server = await startEchoServer();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caCertPem } });
    onTestFinished(() => agent.close());
    const { ws, opened } = await openSocket(`wss://api.test:${server.port}/socket`, agent);
    expect(opened).toBe(true);
    const echoed = new Promise<string>((resolve) => ws.addEventListener("message", (e) => resolve(String(e.data))));
    ws.send("hello through egressgate");
    expect(await echoed).toBe("hello through egressgate");
    // Logged with the URL, as other requests in a tunnel are, not with the path alone.
    expect(proxy.logs.find((l) => l["msg"] === "request" && l["status"] === 101)).toMatchObject({ target: `https://api.test:${server.port}/socket` });
  });

  it("an upgrade refused by isRequestAllowed never reaches the upstream", async () => {
    const server = await startEchoServer();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], isRequestAllowed: (req) => !req.url.includes("/forbidden") });
    const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caCertPem } });
    onTestFinished(() => agent.close());
    const { opened } = await openSocket(`wss://api.test:${server.port}/forbidden`, agent);
    expect(opened).toBe(false);
    expect(server.upgrades()).toBe(0);
    const denial = proxy.logs.find((l) => l["msg"] === "request" && l["status"] === 403);
    expect(denial?.["upgrade"]).toBe(true);
  });

  it("an upgrade refused with a reason that quotes a secret shows the guest the placeholder's redaction, never the value", async () => {
    const server = await startEchoServer();
    const secret = "s3cr3t-upgrade-value";
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      secrets: { KEY: { hosts: ["api.test"], value: secret } },
      // isRequestAllowed sees the real value: a careless reason quotes it, past the 100-character cut too.
      isRequestAllowed: (req) => {
        const key = req.headers.get("x-key") ?? "";
        throw new HttpRequestBlockedError(`refused ${key}`, 403, `${"x".repeat(90)} ${key}`);
      },
    });
    const placeholder = proxy.guestEnv()["KEY"]!;
    const tunnel = await openTlsTunnel(proxy.port, `api.test:${server.port}`, { ca: proxy.caCertPem });
    tunnel.write(`GET /socket HTTP/1.1\r\nHost: api.test:${server.port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nx-key: ${placeholder}\r\n\r\n`);
    const res = await tunnel.readResponse();
    expect(res.status).toBe(403);
    expect(res.body).toContain("refused");
    for (const part of [res.statusText, res.body]) {
      expect(part).not.toContain(secret);
      expect(part).not.toContain(secret.slice(0, 8));
    }
    expect(server.upgrades()).toBe(0);
  });

  it("an upgrade whose host resolves to an internal address without allowedInternalHosts is refused", async () => {
    const server = await startEchoServer();
    const proxy = await startTestProxy({ allowedHosts: ["api.test"] });
    const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caCertPem } });
    onTestFinished(() => agent.close());
    const { opened } = await openSocket(`wss://api.test:${server.port}/socket`, agent);
    expect(opened).toBe(false);
    expect(server.upgrades()).toBe(0);
  });
});

/** A plain TCP upstream on 127.0.0.1 that hands each connection to `onConnection`; closed, with its sockets, when the test ends. */
async function startRawUpstream(onConnection: (s: Socket) => void): Promise<{ port: number; sockets: ReadonlySet<Socket> }> {
  const sockets = new Set<Socket>();
  const server = createNetServer((s) => {
    sockets.add(s);
    s.on("error", () => undefined);
    onConnection(s);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { port: (server.address() as AddressInfo).port, sockets };
}

/** A guest that sends a plain-HTTP upgrade (WebSocket unless told) to api.test (then `extra`) and collects the answer. */
function sendUpgrade(proxyPort: number, upstreamPort: number, extra = "", upgrade = "websocket"): { guest: Socket; answer: () => string; guestClosed: Promise<unknown> } {
  const guest = connect(proxyPort, "127.0.0.1");
  onTestFinished(() => void guest.destroy());
  let answer = "";
  guest.on("data", (c: Buffer) => (answer += c.toString("latin1")));
  guest.on("error", () => undefined);
  const guestClosed = new Promise((resolve) => guest.on("close", resolve));
  guest.write(`GET http://api.test:${upstreamPort}/ws HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: ${upgrade}\r\n\r\n${extra}`);
  return { guest, answer: () => answer, guestClosed };
}

describe("upgrades an upstream does not accept", () => {
  it("an upstream that ignores Upgrade and stays open never receives the guest's following bytes", async () => {
    let received = "";
    const { port } = await startRawUpstream((s) =>
      s.on("data", (c: Buffer) => {
        received += c.toString("latin1");
        s.write("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok");
      }),
    );
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const { answer, guestClosed } = sendUpgrade(proxy.port, port, `DELETE /admin HTTP/1.1\r\nHost: evil.example\r\n\r\n`);
    await guestClosed;
    expect(answer()).toMatch(/^HTTP\/1\.1 502 /);
    expect(answer()).toMatch(/did not switch protocols \(answered 200\)/);
    expect(received).toMatch(/^GET \/ws HTTP\/1\.1\r\n/);
    expect(received).not.toMatch(/DELETE/);
  });
});

describe("a 101 that does not switch to WebSocket", () => {
  // Only WebSocket is relayed: a 101 to another protocol (or none named) would open a tunnel
  // whose traffic no tier sees, as an h2c request would. Relayed before.
  it.each([
    ["Upgrade: h2c", "Upgrade: h2c\r\nConnection: Upgrade\r\n"],
    ["no Upgrade header", "Connection: Upgrade\r\n"],
    ["Upgrade: websocket, h2c", "Upgrade: websocket, h2c\r\nConnection: Upgrade\r\n"],
  ])("a 101 with %s is answered 502, and the guest's following bytes never reach the upstream", async (_what, headers) => {
    let received = "";
    const { port } = await startRawUpstream((s) =>
      s.on("data", (c: Buffer) => {
        if (received === "") s.write(`HTTP/1.1 101 Switching Protocols\r\n${headers}\r\n`);
        received += c.toString("latin1");
      }),
    );
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const { answer, guestClosed } = sendUpgrade(proxy.port, port, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    await guestClosed;
    expect(answer()).toMatch(/^HTTP\/1\.1 502 /);
    expect(answer()).toMatch(/switched to .* not to WebSocket/);
    expect(received).toMatch(/^GET \/ws HTTP\/1\.1\r\n/);
    expect(received).not.toContain("PRI *");
    const upstream = await startUpstream({ tls: false });
    expect((await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`)).status).toBe(200);
  });
});

describe("upgrades to anything but WebSocket", () => {
  // After a 101 to h2c, HTTP/2 requests would cross the proxy that no tier sees.
  it.each(["h2c", "websocket, h2c", "TLS/1.2", "echo"])("Upgrade: %s gets 400 and never reaches the upstream; the proxy keeps serving", async (value) => {
    let received = "";
    const { port } = await startRawUpstream((s) =>
      s.on("data", (c: Buffer) => {
        received += c.toString("latin1");
        s.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n");
      }),
    );
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const { answer, guestClosed } = sendUpgrade(proxy.port, port, "", value);
    await guestClosed;
    expect(answer()).toMatch(/^HTTP\/1\.1 400 /);
    expect(answer()).toContain("only WebSocket upgrades are relayed");
    expect(received).toBe("");
    const upstream = await startUpstream({ tls: false });
    expect((await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`)).status).toBe(200);
  });
});

describe("bytes a guest sends before the 101", () => {
  it("reach the upstream after it switches, in order", async () => {
    let received = "";
    let headSeen!: () => void;
    const headReceived = new Promise<void>((resolve) => (headSeen = resolve));
    let switchNow!: () => void;
    const gotEarly = new Promise<void>((resolve) => (switchNow = resolve));
    const { port, sockets } = await startRawUpstream((s) =>
      s.on("data", (c: Buffer) => {
        received += c.toString("latin1");
        if (received.includes("\r\n\r\n")) headSeen();
        if (received.includes("second")) switchNow();
      }),
    );
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const { guest, answer } = sendUpgrade(proxy.port, port);
    await headReceived;
    guest.write("first,");
    await new Promise((resolve) => setTimeout(resolve, 50));
    guest.write("second");
    // Nothing reaches the upstream before it switches: the early bytes wait in the proxy.
    const early = await Promise.race([gotEarly.then(() => "forwarded early"), new Promise<string>((resolve) => setTimeout(() => resolve("held"), 500))]);
    expect(early).toBe("held");
    for (const s of sockets) s.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
    await gotEarly;
    expect(received.slice(received.indexOf("\r\n\r\n") + 4)).toBe("first,second");
    expect(answer()).toMatch(/^HTTP\/1\.1 101 /);
  });
});

describe("upgrades an upstream never answers", () => {
  /** An upstream that accepts connections, reads the head and never answers; reports each connection's close. */
  async function startTarpit(): Promise<{ port: number; headReceived: Promise<void>; upstreamClosed: Promise<void> }> {
    let headSeen!: () => void;
    let closed!: () => void;
    const headReceived = new Promise<void>((resolve) => (headSeen = resolve));
    const upstreamClosed = new Promise<void>((resolve) => (closed = resolve));
    const { port } = await startRawUpstream((s) => {
      s.on("data", () => headSeen());
      s.on("close", () => closed());
    });
    return { port, headReceived, upstreamClosed };
  }

  /** Resolves to "closed" when `closed` settles first, else to "still open" after `ms`. */
  function closedWithin(closed: Promise<void>, ms: number): Promise<string> {
    return Promise.race([closed.then(() => "closed"), new Promise<string>((resolve) => setTimeout(() => resolve("still open"), ms))]);
  }

  it("gets 504 after timeouts.upstreamHeadersMs, and the upstream connection is closed", async () => {
    const tarpit = await startTarpit();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamHeadersMs: 300 } });
    const { answer, guestClosed } = sendUpgrade(proxy.port, tarpit.port);
    expect(await closedWithin(guestClosed.then(() => undefined), 5_000)).toBe("closed");
    expect(answer()).toMatch(/^HTTP\/1\.1 504 /);
    expect(answer()).toMatch(/did not answer the upgrade within 300 ms/);
    expect(await closedWithin(tarpit.upstreamClosed, 2_000)).toBe("closed");
    expect(proxy.logs.some((l) => l["msg"] === "request" && l["status"] === 504 && l["upgrade"] === true)).toBe(true);
  });

  it("a guest that leaves while its upgrade is pending takes the upstream connection with it", async () => {
    const tarpit = await startTarpit();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const { guest } = sendUpgrade(proxy.port, tarpit.port);
    await tarpit.headReceived;
    guest.destroy();
    expect(await closedWithin(tarpit.upstreamClosed, 3_000)).toBe("closed");
  });

  it("a guest that sends bytes after its upgrade request and then leaves still takes the upstream connection with it", async () => {
    const tarpit = await startTarpit();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const { guest } = sendUpgrade(proxy.port, tarpit.port);
    await tarpit.headReceived;
    guest.end("early frame bytes");
    expect(await closedWithin(tarpit.upstreamClosed, 3_000)).toBe("closed");
  });

  it("a guest that sends more than 64 KiB before the 101 is cut, the upstream connection with it, and the log says why", async () => {
    const tarpit = await startTarpit();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const { guest, guestClosed } = sendUpgrade(proxy.port, tarpit.port);
    await tarpit.headReceived;
    guest.write(Buffer.alloc(70 * 1024, 0x61));
    await guestClosed;
    expect(await closedWithin(tarpit.upstreamClosed, 3_000)).toBe("closed");
    await expect.poll(() => proxy.logs.find((l) => l["msg"] === "request" && l["upgrade"] === true)).toMatchObject({
      status: 400,
      reason: expect.stringMatching(/sent more than 64 KiB before the upgrade completed; the proxy closed the connection/),
      target: `http://api.test:${tarpit.port}/ws`,
    });
  });

  // With a hook still deciding, the call let go when the proxy cut the guest rejected first, and
  // the line said 499 "the guest closed the connection" for the proxy's own cut (review finding).
  it("a guest cut for more than 64 KiB while an onRequest hook is still deciding gets the same 400 line, not a 499", async () => {
    const tarpit = await startTarpit();
    let called!: () => void;
    const hookCalled = new Promise<void>((resolve) => (called = resolve));
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      onRequest: () => {
        called();
        return new Promise<undefined>(() => undefined);
      },
    });
    const { guest, guestClosed } = sendUpgrade(proxy.port, tarpit.port);
    await hookCalled;
    guest.write(Buffer.alloc(70 * 1024, 0x61));
    await guestClosed;
    await expect.poll(() => proxy.logs.find((l) => l["msg"] === "request" && l["upgrade"] === true)).toMatchObject({
      status: 400,
      reason: expect.stringMatching(/sent more than 64 KiB before the upgrade completed; the proxy closed the connection/),
      target: `http://api.test:${tarpit.port}/ws`,
    });
  });

  it("closing the proxy closes the upstream connection of a pending upgrade", async () => {
    const tarpit = await startTarpit();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    sendUpgrade(proxy.port, tarpit.port);
    await tarpit.headReceived;
    await proxy.close();
    expect(await closedWithin(tarpit.upstreamClosed, 3_000)).toBe("closed");
  });
});

describe("upgrades a hook fails", () => {
  // The guest is told "see the proxy log": the upgrade's line must carry what a plain request's does.
  it("an upgrade whose onRequest throws gets 502, and its log line names the hook and carries its error, as a plain request's does", async () => {
    const { port } = await startRawUpstream(() => undefined);
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      onRequest: (request) => {
        if (new URL(request.url).pathname !== "/echo") throw new Error("boom from the hook");
      },
    });
    const { answer, guestClosed } = sendUpgrade(proxy.port, port);
    await guestClosed;
    expect(answer()).toMatch(/^HTTP\/1\.1 502 /);
    expect(answer()).toContain("see the proxy log");
    const upstream = await startUpstream({ tls: false });
    expect((await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/plain`)).status).toBe(502);
    const lines = proxy.logs.filter((l) => l["msg"] === "request" && l["status"] === 502);
    const upgradeLine = lines.find((l) => l["upgrade"] === true);
    const plainLine = lines.find((l) => l["upgrade"] === undefined);
    expect(plainLine).toMatchObject({ source: expect.any(String), detail: expect.stringContaining("boom from the hook") });
    expect(upgradeLine).toMatchObject({ source: plainLine!["source"], detail: plainLine!["detail"] });
    // The proxy keeps serving.
    expect((await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`)).status).toBe(200);
  });
});

describe("an upstream's status line that is not a 101", () => {
  // RFC 9112 §4: status-code is exactly three digits, then SP (the reason phrase may be empty,
  // and some servers leave the SP out too). "1010" read as "101" opened the relay.
  it.each([
    ["HTTP/1.1 1010 Nonsense", 502],
    ["HTTP/1.1 10 Short", 502],
    ["HTTP/1.1 101x Switching Protocols", 502],
    ["HTTP/1.1 099 Early", 502],
    ["HTTP/1.1 1011", 502],
    ["HTTP/1.1 101", 101],
    ["HTTP/1.1 101 ", 101],
  ])("%j is answered %i; the proxy keeps serving", async (statusLine, expected) => {
    let received = "";
    const { port } = await startRawUpstream((s) =>
      s.on("data", (c: Buffer) => {
        if (received === "") s.write(`${statusLine}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n`);
        received += c.toString("latin1");
      }),
    );
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const { guest, answer, guestClosed } = sendUpgrade(proxy.port, port);
    await expect.poll(() => answer()).toContain("\r\n\r\n");
    guest.write("after-switch");
    if (expected === 502) {
      expect(answer()).toMatch(/^HTTP\/1\.1 502 /);
      expect(answer()).toMatch(/did not switch protocols/);
      await guestClosed;
      expect(received).not.toContain("after-switch");
    } else {
      expect(answer()).toMatch(/^HTTP\/1\.1 101/);
      await expect.poll(() => received).toContain("after-switch");
    }
    await expect.poll(() => proxy.logs.find((l) => l["msg"] === "request" && l["upgrade"] === true)?.["status"]).toBe(expected);
    const upstream = await startUpstream({ tls: false });
    expect((await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`)).status).toBe(200);
  });
});

describe("upgrades abandoned before their 101", () => {
  /**
   * An upgrade sent to a proxy and held where `phase` says: in its onRequest hook for `holdMs`,
   * or at an upstream that never answers. Resolves once it is held there.
   */
  async function heldUpgrade(phase: string, holdMs: number, options: Parameters<typeof startTestProxy>[1]): Promise<{ proxy: Awaited<ReturnType<typeof startTestProxy>>; guest: ReturnType<typeof sendUpgrade>["guest"] }> {
    let headSeen!: () => void;
    const headReceived = new Promise<void>((resolve) => (headSeen = resolve));
    const { port } = await startRawUpstream((s) => s.on("data", () => headSeen()));
    let hookCalled!: () => void;
    const inHook = new Promise<void>((resolve) => (hookCalled = resolve));
    const inHookPhase = phase.startsWith("an onRequest");
    const proxy = await startTestProxy(
      {
        allowedInternalHosts: ["api.test"],
        onRequest: async (request) => {
          if (!inHookPhase || new URL(request.url).pathname !== "/ws") return;
          hookCalled();
          await new Promise((resolve) => setTimeout(resolve, holdMs));
        },
      },
      options,
    );
    const { guest } = sendUpgrade(proxy.port, port);
    await (inHookPhase ? inHook : headReceived);
    return { proxy, guest };
  }

  /** The decision lines of upgrades, as the log has them. */
  const upgradeLines = (logs: Record<string, unknown>[]): Record<string, unknown>[] => logs.filter((l) => l["msg"] === "request" && l["upgrade"] === true);

  // As a plain request whose guest leaves: the upstream did not fail, and nobody is left to answer.
  it.each(["an onRequest hook is deciding", "the upstream has not answered"])(
    "a guest that leaves while %s is logged and audited 499, as a plain request is, with no error body counted",
    async (phase) => {
      const records: AuditRecord[] = [];
      const { proxy, guest } = await heldUpgrade(phase, 300, { onDecision: (record) => void records.push(record) });
      guest.destroy();
      await expect.poll(() => upgradeLines(proxy.logs).length).toBe(1);
      expect(upgradeLines(proxy.logs)[0]).toMatchObject({ status: 499, reason: "guest closed the connection" });
      expect(upgradeLines(proxy.logs)[0]).not.toHaveProperty("code");
      expect(records).toHaveLength(1);
      expect(records[0]).toMatchObject({ status: 499, reason: "guest closed the connection", bytesDown: 0 });
      expect(records[0]).not.toHaveProperty("code");
      const upstream = await startUpstream({ tls: false });
      expect((await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`)).status).toBe(200);
    },
  );

  // An upgrade still in a hook at the drain's end was decided only once the hook settled (up to
  // hookMs), after close() had closed the audit log: its record was lost (last session's "left
  // alone"). It is decided when its connection goes now.
  it.each(["the upstream has not answered", "an onRequest hook is deciding"])(
    "an upgrade the end of the drain cuts while %s is logged as the proxy's doing, and audited like every decision line",
    async (phase) => {
      const hookMs = 10_000;
      const auditLog = join(tempDir(), "audit.jsonl");
      const { proxy } = await heldUpgrade(phase, hookMs - 1_000, { auditLog, timeouts: { drainMs: 300, hookMs } });
      await proxy.close();
      const lines = proxy.logs.filter((l) => l["msg"] === "request");
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatchObject({ upgrade: true, status: 499, reason: expect.stringMatching(/^the proxy closed the connection at the end of its drain/) });
      const records = readFileSync(auditLog, "utf8").trim().split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as AuditRecord);
      expect(records).toHaveLength(1);
      expect(records[0]).toMatchObject({ status: 499, reason: lines[0]!["reason"], bytesDown: 0 });
    },
  );
});

describe("an upgrade or a CONNECT pipelined behind a request", () => {
  // Kept up to 64 KiB while it waits its turn; past that the proxy cuts the connection, and the
  // lines say so: the request in front did not lose its guest, and the one waiting was not dropped unseen.
  it.each([
    {
      what: "an upgrade",
      head: (host: string) => `GET http://${host}/ws HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n`,
      line: (host: string) => ({ upgrade: true, method: "GET", target: `http://${host}/ws`, reason: expect.stringMatching(/sent more than 64 KiB before the upgrade completed; the proxy closed the connection/) }),
    },
    {
      what: "a CONNECT",
      head: (host: string) => `CONNECT ${host} HTTP/1.1\r\nHost: ${host}\r\n\r\n`,
      line: (host: string) => ({ method: "CONNECT", target: host, reason: expect.stringMatching(/sent more than 64 KiB before the tunnel opened; the proxy closed the connection/) }),
    },
  ])("$what followed by more than 64 KiB before its turn is cut and logged as the proxy's cut, and the request in front is not blamed on the guest", async ({ what, head, line }) => {
    // Never answers: the GET in front stays in flight.
    const { port } = await startRawUpstream((s) => s.resume());
    const records: AuditRecord[] = [];
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { onDecision: (record) => void records.push(record) });
    const guest = connect(proxy.port, "127.0.0.1");
    onTestFinished(() => void guest.destroy());
    guest.on("error", () => undefined);
    let answer = "";
    guest.on("data", (c: Buffer) => (answer += c.toString("latin1")));
    const guestClosed = new Promise((resolve) => guest.on("close", resolve));
    const host = `api.test:${port}`;
    guest.write(Buffer.concat([Buffer.from(`GET http://${host}/slow HTTP/1.1\r\nHost: ${host}\r\n\r\n${head(host)}`), Buffer.alloc(100_000, 0x61)]));
    await guestClosed;
    expect(answer).toBe("");
    await expect.poll(() => proxy.logs.filter((l) => l["msg"] === "request").length).toBe(2);
    const lines = proxy.logs.filter((l) => l["msg"] === "request");
    expect(lines.find((l) => l["target"] === `http://${host}/slow`)).toMatchObject({
      status: 499,
      reason: `the proxy closed the connection: the guest sent more than 64 KiB behind ${what} waiting its turn`,
    });
    expect(lines.find((l) => l["target"] !== `http://${host}/slow`)).toMatchObject({ status: 400, code: "EG_BAD_REQUEST", ...line(host) });
    expect(records.map((r) => r.status).sort()).toEqual([400, 499]);
    expect(records.find((r) => r.status === 400)).toMatchObject({ bytesDown: 0 });
    const upstream = await startUpstream({ tls: false });
    expect((await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`)).status).toBe(200);
  });
});

describe("the end of a relayed upgrade", () => {
  // The upstream sends its last bytes and closes before the guest has read them: the guest still
  // gets them all, then its end (test/unit/relay.test.ts holds the relay to this when the bytes
  // are still in the proxy's own buffers, which loopback's socket buffers make rare here).
  it("an upstream that sends 2 MiB and closes before the guest reads any: the guest receives every byte, then the end", async () => {
    const tail = 2 * 1024 * 1024;
    let upstreamClosed!: () => void;
    const closedUp = new Promise<void>((resolve) => (upstreamClosed = resolve));
    const { port } = await startRawUpstream((s) =>
      s.once("data", () => {
        s.on("close", () => upstreamClosed());
        s.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n");
        s.end(Buffer.alloc(tail, 0x61));
      }),
    );
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const guest = connect(proxy.port, "127.0.0.1");
    onTestFinished(() => void guest.destroy());
    guest.on("error", () => undefined);
    let received = 0;
    let head = "";
    guest.on("data", (chunk: Buffer) => {
      if (head.includes("\r\n\r\n")) return void (received += chunk.length);
      head += chunk.toString("latin1");
      const at = head.indexOf("\r\n\r\n");
      if (at < 0) return;
      received += Buffer.byteLength(head.slice(at + 4), "latin1");
      guest.pause();
    });
    const ended = new Promise<void>((resolve) => guest.on("end", () => resolve()));
    guest.write(`GET http://api.test:${port}/ws HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n`);
    await closedUp;
    guest.resume();
    await ended;
    expect(head).toMatch(/^HTTP\/1\.1 101 /);
    expect(received).toBe(tail);
    const upstream = await startUpstream({ tls: false });
    expect((await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`)).status).toBe(200);
  });
});
