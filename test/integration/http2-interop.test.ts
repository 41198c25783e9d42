import { execFile, spawn, spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { cleanEnv } from "../helpers/clients.js";
import { curlVia } from "../helpers/curl.js";
import { guestConnections, startTestProxy, tempDir, type TestProxy } from "../helpers/proxy.js";
import { patternBody, patternSha256, startUpstream, type Upstream } from "../helpers/upstream.js";

// Real HTTP/2 clients through the proxy's HTTP/2 hardening (h2-guest.ts, h2-settings.ts): each
// runs as its users run it, and none may trip a limit meant for attacks. gRPC is in
// grpc-interop.test.ts.

const javaProgram = fileURLToPath(new URL("../fixtures/java/H2Interop.java", import.meta.url));

function hasCommand(name: string): boolean {
  return spawnSync("sh", ["-c", `command -v ${name}`], { stdio: "ignore" }).status === 0;
}

/** Another guest, on a connection of its own, still gets its answer. */
async function othersServed(proxy: TestProxy, upstream: Upstream): Promise<void> {
  const other = await curlVia(proxy.url, proxy.caCertPath, `https://api.test:${upstream.port}/echo?other`, ["--http2"]);
  expect(other.status, other.stderr).toBe(200);
}

/** A route that answers its head and one byte, then nothing: a client's own timeout ends it. */
function slowRoute(): Parameters<typeof startUpstream>[0] {
  return {
    routes: {
      "/slow": (_req, res) => {
        res.writeHead(200, { "content-type": "text/plain" });
        res.write("x");
      },
    },
  };
}

/**
 * timeouts.upstreamConnectMs for a client that starts 200 requests at once, each of which needs a
 * new connection to the HTTP/1.1 upstream. The upstream shares this process's event loop with the
 * proxy, and Node (libuv 1.45 on) accepts one connection per turn of it: on a loaded machine the
 * 200th was accepted 10 s after its dial, while the loop carried the traffic of the connections
 * already up, and the proxy's 10 s default answered 16–57 of them 504 "Connect Timeout Error"
 * (1 run in 4 to 3 in 3, load 10 and two busy loops). The limit works as documented; an upstream
 * of its own elsewhere accepts at once.
 */
const burstConnectMs = 45_000;

/**
 * timeouts.handshakeMs for a client that opens many connections at once: one address runs at
 * most 16 TLS handshakes at once and the rest wait in order within handshakeMs (README, "TLS
 * handshakes take turns"). With the JVM's TLS at the other end of 200 of them, a machine loaded
 * far past its cores (load 16 on 2) took longer than the 10 s default for the last ones, whose
 * tunnels were then closed (Java: "Broken pipe"). The limit works as documented; these tests
 * are about HTTP/2, not it.
 */
const burstHandshakeMs = 45_000;

/** Runs a client for at most 50 s (a JVM compiling its source, or h2load's 10,000 requests, take longer than runClient's 20 s); its exit code and all it printed. */
function runTool(file: string, args: readonly string[]): Promise<{ exitCode: number; stdout: string; out: string }> {
  return new Promise((resolve) => {
    execFile(file, args, { maxBuffer: 16 * 1024 * 1024, timeout: 50_000, env: cleanEnv() }, (error, stdout, stderr) => resolve({ exitCode: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, out: `${stdout}${stderr}` }));
  });
}

describe("Java's HttpClient (HTTP_2) through the proxy", () => {
  /** Runs test/fixtures/java/H2Interop.java against `proxy`; its JSON line. */
  async function java(proxy: TestProxy, upstream: Upstream, mode: "parallel" | "warm", idleMs = 0): Promise<Record<string, unknown>> {
    const address = new URL(proxy.url);
    const run = await runTool("java", [javaProgram, mode, `https://api.test:${upstream.port}`, `${address.hostname}:${address.port}`, proxy.caCertPath, String(idleMs)]);
    expect(run.exitCode, run.out).toBe(0);
    return JSON.parse(run.stdout.trim()) as Record<string, unknown>;
  }

  it("200 requests at once from a new client all get their 200 over HTTP/2 (it opens a connection for each while it has none)", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamConnectMs: burstConnectMs, handshakeMs: burstHandshakeMs } });
    expect(await java(proxy, upstream, "parallel")).toEqual({ parallel: 200, parallelH2: 200 });
    expect(guestConnections(proxy).closed).toEqual([]);
    await othersServed(proxy, upstream);
  }, 60_000);

  // Java 17's HttpClient fails a request past the connection's SETTINGS_MAX_CONCURRENT_STREAMS
  // ("too many concurrent streams") rather than wait or open another: 200 at once on a warm
  // connection need limits.h2Streams of 200 or more (README, "Guests").
  it("on one warm connection: 200 requests at once, a 64 MiB download and upload, and a request after the connection idled past h2PingMs", async () => {
    const upstream = await startUpstream();
    const h2PingMs = 300;
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { limits: { h2Streams: 256 }, timeouts: { idleMs: 600_000, h2PingMs, upstreamConnectMs: burstConnectMs } });
    const size = 64 * 1024 * 1024;
    // Five times h2PingMs: the proxy's PING goes out after one, and a connection that left it
    // unanswered would be closed after two, so the last request would need a second tunnel.
    const result = await java(proxy, upstream, "warm", 5 * h2PingMs);
    expect(result).toMatchObject({
      warm: 200,
      parallel: 200,
      parallelH2: 200,
      download: { status: 200, bytes: size, sha256: patternSha256(size) },
      upload: { status: 200, echo: { method: "POST", bodyBytes: size, bodySha256: patternSha256(size) } },
      after: 200,
      afterVersion: "HTTP_2",
    });
    expect(guestConnections(proxy)).toEqual({ tunnels: 1, closed: [] });
    await othersServed(proxy, upstream);
  }, 60_000);
});

/** The real curl through `proxy`, trusting its CA, with no ~/.curlrc; its exit code and what it printed. */
function curl(proxy: TestProxy, args: readonly string[]): Promise<{ exitCode: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(
      "curl",
      ["-sS", "--noproxy", "", "-x", proxy.url, "--cacert", proxy.caCertPath, ...args],
      { maxBuffer: 16 * 1024 * 1024, timeout: 50_000, env: cleanEnv() },
      (error, stdout, stderr) => resolve({ exitCode: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, stderr }),
    );
  });
}

describe("curl --http2 through the proxy", () => {
  it("--parallel --parallel-max 100 with 300 URLs, every third an upload (-T), all on one connection", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const dir = tempDir();
    const uploadSize = 256 * 1024;
    const upload = join(dir, "upload.bin");
    const chunks: Buffer[] = [];
    for await (const chunk of patternBody(uploadSize)) chunks.push(chunk as Buffer);
    writeFileSync(upload, Buffer.concat(chunks));
    const config: string[] = [];
    for (let i = 0; i < 300; i++) {
      config.push(`url = "https://api.test:${upstream.port}/echo?i=${i}"`, 'output = "/dev/null"');
      if (i % 3 === 0) config.push(`upload-file = "${upload}"`);
    }
    writeFileSync(join(dir, "urls"), `${config.join("\n")}\n`);
    const run = await curl(proxy, ["--http2", "--parallel", "--parallel-max", "100", "-K", join(dir, "urls"), "-w", "%{http_code} %{http_version} %{size_upload}\\n"]);
    expect(run.exitCode, run.stderr).toBe(0);
    const lines = run.stdout.trim().split("\n");
    expect(lines.length).toBe(300);
    expect(lines.filter((line) => line.startsWith("200 2 ")).length).toBe(300);
    expect(lines.filter((line) => line === `200 2 ${uploadSize}`).length).toBe(100);
    const uploads = upstream.seen.filter((seen) => seen.method === "PUT");
    expect(uploads.length).toBe(100);
    expect(new Set(uploads.map((seen) => `${seen.bodyBytes} ${seen.bodySha256}`))).toEqual(new Set([`${uploadSize} ${patternSha256(uploadSize)}`]));
    expect(guestConnections(proxy)).toEqual({ tunnels: 1, closed: [] });
    await othersServed(proxy, upstream);
  });

  it("--http2-prior-knowledge to an https URL speaks HTTP/2 in the tunnel (ALPN chooses it: prior knowledge is for cleartext)", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const run = await curl(proxy, ["--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code} %{http_version}", `https://api.test:${upstream.port}/echo`]);
    expect(run.exitCode, run.stderr).toBe(0);
    expect(run.stdout).toBe("200 2");
  });

  // curl resets each stream whose --max-time passes. 400 of them in four rounds of 100 were past
  // limits.h2ResetsPer10s: GOAWAY(ENHANCE_YOUR_CALM) at the third, and curl aborted the rest
  // ("Transfer aborted due to critical error in another transfer").
  it("--max-time on 400 slow transfers, 100 at a time on one connection: each ends in curl's own timeout, and the connection is never closed under it", async () => {
    const upstream = await startUpstream(slowRoute());
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const dir = tempDir();
    const config: string[] = [];
    for (let i = 0; i < 400; i++) config.push(`url = "https://api.test:${upstream.port}/slow?i=${i}"`, 'output = "/dev/null"');
    writeFileSync(join(dir, "urls"), `${config.join("\n")}\n`);
    // Past h2Limits.prematureResetMs (1 s) with room to spare: each transfer's stream is on the wire within milliseconds of its start.
    const run = await curl(proxy, ["--http2", "--parallel", "--parallel-max", "100", "--max-time", "2", "-K", join(dir, "urls"), "-w", "%{exitcode}\\n"]);
    expect(run.exitCode, run.stderr).toBe(28);
    const codes = run.stdout.trim().split("\n");
    expect(codes.length).toBe(400);
    expect(new Set(codes)).toEqual(new Set(["28"]));
    expect(guestConnections(proxy)).toEqual({ tunnels: 1, closed: [] });
    await othersServed(proxy, upstream);
  }, 60_000);
});

/** A free port on 127.0.0.1 (listened on and let go). */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/**
 * `socat TCP-LISTEN:P,fork PROXY:…`, which opens a CONNECT tunnel for each connection (nghttp and
 * h2load cannot use a proxy), `nodelay` on both sides: without it Nagle's algorithm held socat's
 * small writes for the peer's delayed ACK, 40 ms per window (README, "Guests"). Its port, once it listens.
 */
async function socatRelay(proxy: TestProxy, upstream: Upstream): Promise<number> {
  const address = new URL(proxy.url);
  const port = await freePort();
  // -d -d: socat says when it listens (a probe connection would open a tunnel of its own).
  const child = spawn("socat", ["-d", "-d", `TCP-LISTEN:${port},fork,reuseaddr,bind=127.0.0.1,nodelay`, `PROXY:${address.hostname}:api.test:${upstream.port},proxyport=${address.port},nodelay`], { stdio: ["ignore", "ignore", "pipe"], detached: true });
  // Its own process group: the children it forks for each connection go with it.
  onTestFinished(() => {
    try {
      process.kill(-child.pid!, "SIGTERM");
    } catch {
      // Already gone.
    }
  });
  await new Promise<void>((resolve, reject) => {
    let said = "";
    const listen = (chunk: Buffer): void => {
      said += chunk.toString("utf8");
      if (!said.includes(" listening on ")) return;
      child.stderr.off("data", listen);
      child.stderr.resume();
      resolve();
    };
    child.stderr.on("data", listen);
    child.once("exit", (code) => reject(new Error(`socat exited with ${code}: ${said}`)));
  });
  return port;
}

// Debian's nghttp2-client and socat: present on a developer's machine, maybe not in CI.
const nghttp2Tools = hasCommand("nghttp") && hasCommand("h2load") && hasCommand("socat");

describe.skipIf(!nghttp2Tools)("nghttp2's clients through socat (skipped without nghttp, h2load and socat: apt-get install nghttp2-client socat)", () => {
  it("nghttp -n -m 100 with its default windows (64 KiB) downloads 100 × 256 KiB, every stream 200", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const port = await socatRelay(proxy, upstream);
    // nghttp sends no SNI to an IP literal; the proxy's certificate follows the CONNECT's host.
    const run = await runTool("nghttp", ["-n", "-s", "-m", "100", "-H", `:authority: api.test:${upstream.port}`, `https://127.0.0.1:${port}/bytes?n=${256 * 1024}`]);
    expect(run.exitCode, run.out).toBe(0);
    expect(run.out).not.toMatch(/\[ERROR\]/);
    const rows = run.out.split("\n").filter((line) => /\/bytes\?n=/.test(line) && /^\s*\d+\s/.test(line));
    expect(rows.length, run.out).toBe(100);
    expect(rows.every((row) => /\s200\s+256K?\s|\s200\s+262144\s/.test(row)), rows.join("\n")).toBe(true);
    expect(guestConnections(proxy)).toEqual({ tunnels: 1, closed: [] });
    await othersServed(proxy, upstream);
  }, 60_000);

  it("h2load -n 10000 -c 4 -m 50: every request succeeds", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamConnectMs: burstConnectMs, handshakeMs: burstHandshakeMs } });
    const port = await socatRelay(proxy, upstream);
    const run = await runTool("h2load", ["-n", "10000", "-c", "4", "-m", "50", `--connect-to=127.0.0.1:${port}`, `https://api.test:${upstream.port}/echo`]);
    expect(run.exitCode, run.out).toBe(0);
    expect(run.out).toMatch(/requests: 10000 total, 10000 started, 10000 done, 10000 succeeded, 0 failed, 0 errored, 0 timeout/);
    expect(run.out).toMatch(/status codes: 10000 2xx, 0 3xx, 0 4xx, 0 5xx/);
    expect(guestConnections(proxy)).toEqual({ tunnels: 4, closed: [] });
    await othersServed(proxy, upstream);
  }, 60_000);
});
