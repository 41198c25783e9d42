import { fork, type ChildProcess } from "node:child_process";
import { Duplex } from "node:stream";
import { checkServerIdentity, connect as tlsConnect, type TLSSocket } from "node:tls";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { startTestProxy, tempDir } from "../helpers/proxy.js";
import { curlVia } from "../helpers/curl.js";
import { openTlsTunnel, openTunnel } from "../helpers/raw.js";
import { startUpstream, type Upstream } from "../helpers/upstream.js";

interface Measure {
  readonly rss: number;
  readonly heapUsed: number;
  /** Guest connections still open when it was taken. */
  readonly open: number;
  readonly signed: number;
  readonly refusals: number;
  readonly gc: boolean;
}

const child = fileURLToPath(new URL("../helpers/sni-proxy-child.ts", import.meta.url));

function nextMessage<T>(proc: ChildProcess, kind: string): Promise<T> {
  return new Promise((resolve, reject) => {
    const onMessage = (message: { kind: string }): void => {
      if (message.kind !== kind) return;
      proc.off("message", onMessage);
      proc.off("exit", onExit);
      resolve(message as T);
    };
    const onExit = (code: number | null): void => reject(new Error(`the proxy process exited (${code}) before "${kind}"`));
    proc.on("message", onMessage);
    proc.once("exit", onExit);
  });
}

/** CONNECT api.test:443 through the proxy, then a handshake naming `servername`: the error it ends with, if any. */
async function handshake(port: number, ca: string, servername: string): Promise<string | undefined> {
  try {
    const tunnel = await openTlsTunnel(port, "api.test:443", { ca, servername });
    tunnel.socket.destroy();
    return undefined;
  } catch (error) {
    return String((error as NodeJS.ErrnoException).code);
  }
}

async function handshakes(port: number, ca: string, names: readonly string[]): Promise<string[]> {
  const results: string[] = [];
  for (let i = 0; i < names.length; i += 20) {
    results.push(...(await Promise.all(names.slice(i, i + 20).map(async (name) => String(await handshake(port, ca, name))))));
  }
  return results;
}

describe("the leaf certificate is signed only for the CONNECT target", () => {
  it("1,000 distinct SNI names through an allowed CONNECT sign no certificate, and the proxy's RSS grows by under 10 MiB", async () => {
    // A 1 MiB young generation: V8 grows it (up to 16 MiB a semi-space) as allocation speeds up,
    // which RSS would show as growth the proxy does not hold.
    const proc = fork(child, [tempDir()], {
      execArgv: ["--import", "tsx", "--expose-gc", "--max-semi-space-size=1"],
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    });
    onTestFinished(async () => {
      if (proc.exitCode === null && proc.signalCode === null) {
        const exited = new Promise((resolve) => proc.once("exit", resolve));
        proc.kill("SIGKILL");
        await exited;
      }
    });
    const { port, ca } = await nextMessage<{ port: number; ca: string }>(proc, "ready");
    const measure = (): Promise<Measure> => {
      const answer = nextMessage<Measure>(proc, "measure");
      proc.send("measure");
      return answer;
    };
    // Warm up: the first handshakes allocate what every later one reuses.
    const warm = await handshakes(port, ca, Array.from({ length: 200 }, (_, i) => `warm${i}.victim-bank.example`));
    expect(new Set(warm)).toEqual(new Set(["ERR_SSL_TLSV1_UNRECOGNIZED_NAME"]));
    const before = await measure();
    expect(before.gc).toBe(true);
    expect(before.open).toBe(0);

    const names = Array.from({ length: 1000 }, (_, i) => `n${i}.victim-bank.example`);
    const results = await handshakes(port, ca, names);
    // Every handshake ended with the alert, before any certificate was sent.
    expect(results.filter((code) => code === "ERR_SSL_TLSV1_UNRECOGNIZED_NAME")).toHaveLength(1000);
    const after = await measure();
    expect(after.open).toBe(0);
    expect(after.signed).toBe(0);
    expect(after.refusals).toBe(1200);
    const grewMiB = (after.rss - before.rss) / 1024 / 1024;
    if (process.env["EGRESSGATE_SNI_REPORT"]) console.log(`RSS before ${(before.rss / 1048576).toFixed(1)} MiB, after ${(after.rss / 1048576).toFixed(1)} MiB`);
    expect(grewMiB, `RSS grew by ${grewMiB.toFixed(1)} MiB`).toBeLessThan(10);

    // The count does count: the CONNECT target's own name is signed, once.
    expect(await handshake(port, ca, "api.test")).toBeUndefined();
    expect(await handshake(port, ca, "api.test")).toBeUndefined();
    expect((await measure()).signed).toBe(1);
    proc.send("close");
  }, 180_000);

  it("a ClientHello cut into 1-byte records is refused with a decode_error alert at its first record", async () => {
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const socket = (await openTunnel(proxy.port, "api.test:443")).detach();
    socket.on("error", () => undefined);
    onTestFinished(() => void socket.destroy());
    // A ClientHello header claiming 60,000 bytes, then the bytes, each in a record of its own.
    const message = Buffer.concat([Buffer.from([0x01, 0x00, 0xea, 0x60]), Buffer.alloc(60_000, 0x41)]);
    const alert = new Promise<Buffer>((resolve) => socket.once("data", resolve));
    socket.write(Buffer.concat([...message].map((byte) => Buffer.from([0x16, 0x03, 0x01, 0x00, 0x01, byte]))));
    expect([...(await alert)]).toEqual([0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 50]);
    const closed = proxy.logs.filter((line) => line["msg"] === "tunnel closed");
    expect(closed.map((line) => line["reason"])).toEqual(["ClientHello fragmented into records of under 64 bytes"]);
  });

  it("a handshake without SNI, as for an IP address, gets the CONNECT target's certificate", async () => {
    const proxy = await startTestProxy({ allowedInternalHosts: ["127.0.0.1"] });
    const plain = await openTunnel(proxy.port, "127.0.0.1:443");
    const socket: TLSSocket = tlsConnect({
      socket: plain.detach(),
      ca: proxy.caCertPem,
      checkServerIdentity: (_host, cert) => checkServerIdentity("127.0.0.1", cert),
    });
    await new Promise<void>((resolve, reject) => {
      socket.once("secureConnect", resolve);
      socket.once("error", reject);
    });
    expect(socket.getPeerCertificate().subjectaltname).toBe("IP Address:127.0.0.1");
    socket.destroy();
  });

  it("a TLS 1.2 guest's renegotiation is refused with an alert (each would cost the proxy a key exchange and a signature), and the proxy goes on serving", async () => {
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const raw = (await openTunnel(proxy.port, "api.test:443")).detach();
    // The TLS client runs over a relay that shows the record types the proxy sends (TLS 1.2
    // record headers stay in the clear): a handshake record answers a renegotiation it takes.
    const received: Buffer[] = [];
    let arrived: (() => void) | undefined;
    const relay = new Duplex({
      read() {},
      write(chunk: Buffer, _encoding, callback) {
        raw.write(chunk, callback);
      },
    });
    raw.on("data", (chunk: Buffer) => {
      received.push(chunk);
      arrived?.();
      relay.push(chunk);
    });
    raw.on("error", () => undefined);
    const socket: TLSSocket = tlsConnect({ socket: relay, servername: "api.test", ca: proxy.caCertPem, maxVersion: "TLSv1.2" });
    socket.on("error", () => undefined);
    await new Promise<void>((resolve, reject) => {
      socket.once("secureConnect", resolve);
      socket.once("error", reject);
    });
    const next = new Promise<void>((resolve) => (arrived = resolve));
    const before = received.length;
    expect(socket.renegotiate({ rejectUnauthorized: false }, () => undefined)).toBe(true);
    await next;
    const answer = received[before]!;
    expect(answer[0], "the first record after the renegotiation's ClientHello: 0x15 alert, 0x16 handshake").toBe(0x15);
    socket.destroy();
    raw.destroy();
    const again = await openTlsTunnel(proxy.port, "api.test:443", { ca: proxy.caCertPem });
    again.write("GET /x HTTP/1.1\r\nHost: api.test\r\n\r\n");
    // Refused by the allowlist's internal-address rule or answered: either way, an HTTP answer.
    expect((await again.readResponse()).status).toBeGreaterThanOrEqual(200);
  });
});


// Black-box finding: the termination offered `h2, http/1.1`, and a guest that offers only
// `http/1.0` (`curl --http1.0`) got a no_application_protocol alert, though the HTTP/1.1 server
// serves HTTP/1.0 requests. Each row: the guest's ALPN list, then what the proxy chose (false: no
// ALPN), or the alert for a list with nothing the proxy speaks.
describe("the protocol ALPN picks for a guest's TLS", () => {
  const setup = async (): Promise<{ proxy: Awaited<ReturnType<typeof startTestProxy>>; upstream: Upstream }> => {
    const upstream = await startUpstream({ names: ["api.test"] });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    return { proxy, upstream };
  };
  it.each([
    ["http/1.0 alone", "is served over http/1.0", ["http/1.0"], "http/1.0"],
    ["http/1.1 then http/1.0", "is served over http/1.1", ["http/1.1", "http/1.0"], "http/1.1"],
    ["http/1.0 then http/1.1", "is served over http/1.1, the proxy's preference", ["http/1.0", "http/1.1"], "http/1.1"],
    ["h2 then http/1.0", "gets h2", ["h2", "http/1.0"], "h2"],
    ["nothing", "is served over HTTP/1.1 with no ALPN", [], false],
    ["h2c alone", "gets a no_application_protocol alert (cleartext HTTP/2 has no place in TLS)", ["h2c"], "ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL"],
    ["200 unknown names", "gets a no_application_protocol alert", Array.from({ length: 200 }, (_, i) => `x-${i}`), "ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL"],
  ] as const)("a guest offering %s %s, and the next guest is served", async (_what, _outcome, offered, expected) => {
    const { proxy, upstream } = await setup();
    const target = `api.test:${upstream.port}`;
    const opening = openTlsTunnel(proxy.port, target, { ca: proxy.caCertPem, ALPNProtocols: offered });
    if (typeof expected === "string" && expected.startsWith("ERR_")) {
      await expect(opening).rejects.toMatchObject({ code: expected });
    } else {
      const tunnel = await opening;
      expect((tunnel.socket as TLSSocket).alpnProtocol).toBe(expected);
      if (expected !== "h2") {
        // An HTTP/1.0 guest's request, served by the HTTP/1.1 server.
        tunnel.write(`GET /echo HTTP/${expected === "http/1.0" ? "1.0" : "1.1"}\r\nHost: ${target}\r\n\r\n`);
        const res = await tunnel.readResponse();
        expect(res.status, res.body).toBe(200);
        expect(upstream.hits()).toBe(1);
      }
      tunnel.socket.destroy();
    }
    // Whatever the guest offered, the proxy serves the next guest.
    const after = await openTlsTunnel(proxy.port, target, { ca: proxy.caCertPem });
    after.write(`GET /echo HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
    expect((await after.readResponse()).status).toBe(200);
  });

  it("curl --http1.0 through the proxy gets its answer", async () => {
    const { proxy, upstream } = await setup();
    const res = await curlVia(proxy.url, join(proxy.caDir, "ca.crt"), `https://api.test:${upstream.port}/echo`, ["--http1.0"]);
    expect(res.exitCode, res.stderr).toBe(0);
    expect(res.status).toBe(200);
    expect(upstream.hits()).toBe(1);
  });
});

// Black-box finding: RFC 6066 allows no IP literal in SNI, but clients send one (Node does for
// `servername: "::1"`), and `127.0.0.1` already matched `CONNECT 127.0.0.1:443`; a bare IPv6
// one was read as `host:port` and refused as naming another host. Each row: CONNECT target, SNI,
// then the leaf's subjectAltName or the alert.
describe("an IP literal as the SNI", () => {
  it.each([
    ["[::1]:443", "::1", "IP Address:0:0:0:0:0:0:0:1"],
    ["[::1]:443", "0:0:0:0:0:0:0:1", "IP Address:0:0:0:0:0:0:0:1"],
    ["[::1]:443", "[::1]", "IP Address:0:0:0:0:0:0:0:1"],
    ["[::1]:443", "[::1]:443", "IP Address:0:0:0:0:0:0:0:1"],
    ["[::1]:443", "::1:443", "ERR_SSL_TLSV1_UNRECOGNIZED_NAME"],
    ["[::1]:443", "::2", "ERR_SSL_TLSV1_UNRECOGNIZED_NAME"],
    ["127.0.0.1:443", "127.0.0.1", "IP Address:127.0.0.1"],
    ["127.0.0.1:443", "::1", "ERR_SSL_TLSV1_UNRECOGNIZED_NAME"],
    ["127.0.0.1:443", "::ffff:127.0.0.2", "ERR_SSL_TLSV1_UNRECOGNIZED_NAME"],
    ["api.test:443", "::1", "ERR_SSL_TLSV1_UNRECOGNIZED_NAME"],
  ])("CONNECT %s, SNI %s: %s", async (target, servername, expected) => {
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test", "::1", "127.0.0.1"] });
    const verifyName = expected.startsWith("IP Address:") ? target.slice(0, target.lastIndexOf(":")).replace(/^\[|\]$/g, "") : servername;
    const opening = openTlsTunnel(proxy.port, target, { ca: proxy.caCertPem, servername, verifyName });
    if (expected.startsWith("ERR_")) {
      await expect(opening).rejects.toMatchObject({ code: expected });
      expect(proxy.logs.some((line) => line["msg"] === "tunnel closed" && String(line["reason"]).startsWith(`TLS SNI names ${JSON.stringify(servername)}`))).toBe(true);
      return;
    }
    const tunnel = await opening;
    expect((tunnel.socket as TLSSocket).getPeerCertificate().subjectaltname).toBe(expected);
    tunnel.socket.destroy();
  });
});
