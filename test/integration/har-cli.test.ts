import { execFileSync, spawn } from "node:child_process";
import { existsSync, lstatSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { gunzipSync } from "node:zlib";
import { ProxyAgent, request } from "undici";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import type { RecordedHar } from "../../src/record/har.js";
import { formatHarReport } from "../../src/record/har-check.js";
import { fetchVia, startTestProxy, tempDir } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { startUpstream } from "../helpers/upstream.js";

const root = fileURLToPath(new URL("../../", import.meta.url));
const fixtures = join(root, "test", "fixtures", "har");

/** Runs the built CLI (test/global-setup.ts builds dist when the sources are newer); resolves with its exit and output. */
function cli(args: readonly string[], onStdout?: (text: string, child: ReturnType<typeof spawn>) => void): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [join(root, "dist", "cli", "bin.js"), ...args], {
    cwd: root,
    env: { ...process.env, XDG_CONFIG_HOME: tempDir("egressgate-xdg-"), HTTPS_PROXY: "", HTTP_PROXY: "" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  onTestFinished(() => {
    clearTimeout(timer);
    child.kill("SIGKILL");
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (chunk: Buffer) => {
    stdout += chunk.toString();
    onStdout?.(stdout, child);
  });
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  return new Promise((resolve) => child.once("close", (code) => resolve({ code, stdout, stderr })));
}

describe("egressgate har check", () => {
  it("accepts a Chrome DevTools export and a mitmproxy export, listing their entries", async () => {
    const chrome = await cli(["har", "check", join(fixtures, "chrome-devtools.har")]);
    expect(chrome.stdout).toMatch(/valid HAR 1\.2/);
    expect(chrome.stdout).toMatch(/GET https:\/\/api\.test\/v1\/items\?page=2&sort=name -> 200/);
    expect(chrome.code).toBe(0);
    const mitm = await cli(["har", "check", join(fixtures, "mitmproxy.har")]);
    expect(mitm.stdout).toMatch(/HAR 1\.2 by mitmproxy 11\.0\.2, 3 entries/);
    expect(mitm.code).toBe(0);
  });

  it("accepts a file the proxy recorded, and lists secret-looking strings with exit 1", async () => {
    const dir = tempDir();
    const har = join(dir, "own.har");
    const upstream = await startUpstream();
    const proxy = await startTestProxy(
      { allowedInternalHosts: ["api.test"], secrets: { GH_TOKEN: { hosts: ["api.test"], value: "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB" } } },
      { upstream: { record: { path: har } } },
    );
    await fetchVia(proxy, `https://api.test:${upstream.port}/echo`, { headers: { authorization: `Bearer ${proxy.guestEnv()["GH_TOKEN"]!}` } });
    await fetchVia(proxy, `https://api.test:${upstream.port}/bytes?n=${2 * 1024 * 1024}`);
    await proxy.close();
    const own = await cli(["har", "check", har]);
    expect(own.stdout).toMatch(/valid HAR 1\.2/);
    expect(own.stdout).toMatch(/sidecar/);
    expect(own.stdout).toMatch(/secret-looking strings: none/);
    expect(own.code).toBe(0);
    const leaky = await cli(["har", "check", join(fixtures, "with-secret.har")]);
    expect(leaky.stdout).toMatch(/a GitHub token: ghp_012345…/);
    expect(leaky.stdout).not.toContain("ghp_0123456789abcdefghijklmnopqrstuvwxyzAB");
    expect(leaky.code).toBe(1);
  });

  it("refuses a file that is not HAR 1.2 with exit 2, naming each problem", async () => {
    const bad = await cli(["har", "check", join(fixtures, "invalid.har")]);
    expect(bad.code).toBe(2);
    expect(bad.stdout).toMatch(/log\.entries\[0\]\.startedDateTime: not an ISO 8601 date/);
    expect(bad.stdout).toMatch(/log\.entries\[0\]\.time: must be a number/);
    expect(bad.stdout).toMatch(/log\.entries\[0\]\.request\.url: not an absolute URL/);
    expect(bad.stdout).toMatch(/log\.entries\[0\]\.response\.content: missing/);
  });

  // The summary line said "HAR undefined" for a log without a version (a README run found it).
  it("a log without a version or a creator's name is summarised with ?, next to the problems naming them", async () => {
    const har = join(tempDir("egressgate-har-"), "bare.har");
    writeFileSync(har, JSON.stringify({ log: { creator: { version: "1" }, entries: [] } }));
    const bare = await cli(["har", "check", har]);
    expect(bare.code).toBe(2);
    expect(bare.stdout.split("\n")[0]).toBe(`${har}: HAR ? by ? 1, 0 entries`);
    expect(bare.stdout).toMatch(/log\.version: missing/);
    expect(bare.stdout).not.toContain("undefined");
  });
});

// Lists spread into push() as arguments overflowed the stack past about 120,000 items: `har
// check` of a long recording exited 2 with "Maximum call stack size exceeded" and nothing else,
// and so did `--replay` of an entry with that many problems.
describe("a HAR file with more items than a call takes arguments", () => {
  const many = 200_000;

  it("har check lists every problem of 200,000 entries, exit 2, with nothing on stderr", async () => {
    const har = join(tempDir("egressgate-har-"), "many.har");
    writeFileSync(har, JSON.stringify({ log: { version: "1.2", creator: { name: "t", version: "1" }, entries: Array.from({ length: many }, () => 1) } }));
    const result = await cli(["har", "check", har]);
    expect(result.stderr).toBe("");
    expect(result.code).toBe(2);
    expect(result.stdout).toContain(`not valid HAR 1.2 (${many} problems):\n  log.entries[0]: must be an object\n`);
    expect(result.stdout).toContain(`  log.entries[${many - 1}]: must be an object\nsecret-looking strings: none\n`);
  });

  it("the report of 200,000 valid entries lists them all, exit 0", () => {
    const entries = Array.from({ length: many }, (_, i) => `${i}  GET https://api.test/${i} -> 200`);
    const { text, status } = formatHarReport({ summary: "many.har: HAR 1.2 by t 1", problems: [], entries, suspicious: [], partial: [] });
    expect(status).toBe(0);
    expect(text.split("\n")).toHaveLength(many + 5);
    expect(text.endsWith(`${entries.at(-1)!}\nsecret-looking strings: none\n`)).toBe(true);
  });

  it("--replay of an entry with 200,000 bad headers exits 2 counting its problems", async () => {
    const har = join(tempDir("egressgate-har-"), "headers.har");
    const entry = {
      startedDateTime: "2026-01-01T00:00:00.000Z",
      time: 1,
      request: { method: "GET", url: "https://api.test/", httpVersion: "HTTP/1.1", cookies: [], headers: [], queryString: [], headersSize: -1, bodySize: 0 },
      response: {
        status: 200,
        statusText: "OK",
        httpVersion: "HTTP/1.1",
        cookies: [],
        headers: Array.from({ length: many }, () => ({ name: "bad name", value: "x" })),
        content: { size: 2, mimeType: "text/plain", text: "ok" },
        redirectURL: "",
        headersSize: -1,
        bodySize: 2,
      },
      cache: {},
      timings: { send: 0, wait: 1, receive: 0 },
    };
    writeFileSync(har, JSON.stringify({ log: { version: "1.2", creator: { name: "t", version: "1" }, entries: [entry] } }));
    const result = await cli(["--listen", "127.0.0.1:0", "--replay", har]);
    expect(result.code).toBe(2);
    expect(result.stdout).toBe("");
    expect(result.stderr).toContain(`--replay: ${har} cannot be replayed (${many} problems): log.entries[0].response.headers[0]: the name "bad name" is not a token`);
  });
});

describe("foreign HAR files replay", () => {
  it("a Chrome DevTools export replays, h2 pseudo-headers dropped and gzip applied again", async () => {
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: join(fixtures, "chrome-devtools.har") } } });
    const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caCertPem } });
    onTestFinished(() => agent.close());
    const res = await request("https://api.test/v1/items?sort=name&page=2", { dispatcher: agent });
    expect(res.statusCode).toBe(200);
    expect(res.headers["content-encoding"]).toBe("gzip");
    expect(gunzipSync(Buffer.from(await res.body.arrayBuffer())).toString()).toBe('{"items":[{"id":3},{"id":4}],"page":2}');
    const created = await fetchVia(proxy, "https://api.test/v1/items", { method: "POST", body: '{"qty":1,"name":"new"}', headers: { "content-type": "application/json" } });
    expect(created.status).toBe(201);
    expect(created.text).toBe('{"id":5}');
  });

  it("a mitmproxy export replays: a binary body, and a redirect followed hop by hop", async () => {
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: join(fixtures, "mitmproxy.har") } } });
    const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caCertPem } });
    onTestFinished(() => agent.close());
    const logo = await request("https://api.test/logo.png", { dispatcher: agent });
    expect(Buffer.from(await logo.body.arrayBuffer()).equals(Buffer.from("iVBORw0KGgoAAAANAQ==", "base64"))).toBe(true);
    const form = await fetchVia(proxy, "https://api.test/form", { method: "POST", body: "a=1&b=2", headers: { "content-type": "application/x-www-form-urlencoded" } });
    expect(form.status).toBe(200);
    expect(form.text).toBe("done");
  });

  it("a WebSocket upgrade in replay gets 502", async () => {
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: join(fixtures, "mitmproxy.har") } } });
    const { connect } = await import("node:net");
    const socket = connect(proxy.port, "127.0.0.1");
    onTestFinished(() => {
      socket.destroy();
    });
    socket.write("GET http://api.test/logo.png HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n");
    const head = await new Promise<string>((resolve) => socket.once("data", (chunk: Buffer) => resolve(chunk.toString("latin1"))));
    expect(head).toMatch(/^HTTP\/1\.1 502 /);
    expect(head).toMatch(/cannot be answered from a recording/);
  });
});

describe("record and replay flags", () => {
  it("conflicting flags exit 2, and so does --workers 2 with --record", async () => {
    const dir = tempDir();
    const both = await cli(["--record", join(dir, "a.har"), "--replay", join(dir, "b.har")]);
    expect(both.code).toBe(2);
    expect(both.stderr).toMatch(/upstream\.record cannot be combined with replay: .*recordMissing/);
    const workers = await cli(["--workers", "2", "--record", join(dir, "a.har")]);
    expect(workers.code).toBe(2);
    expect(workers.stderr).toMatch(/--workers 2: a recording has one writer/);
    const orphan = await cli(["--replay-latency", "recorded"]);
    expect(orphan.code).toBe(2);
  });

  // The recording's rename replaced a device node or a FIFO at the path with a regular file.
  it("--record onto a FIFO exits 2 naming it, and the FIFO stays", async () => {
    const dir = tempDir();
    const fifo = join(dir, "pipe.har");
    execFileSync("mkfifo", [fifo]);
    const run = await cli(["--listen", "127.0.0.1:0", "--ca-dir", join(dir, "ca"), "--record", fifo]);
    expect(run.code).toBe(2);
    expect(run.stderr).toMatch(/--record: cannot record to .*pipe\.har: it is a FIFO, not a regular file/);
    expect(lstatSync(fifo).isFIFO()).toBe(true);
  });

  it("SIGTERM writes the HAR file, with what was recorded, and removes the journal without an error", async () => {
    const dir = tempDir();
    const har = join(dir, "cli.har");
    const ca = await testCa();
    const caFile = join(dir, "upstream-ca.pem");
    writeFileSync(caFile, ca.certPem);
    const upstream = await startUpstream();
    let fetched: Promise<void> | undefined;
    const run = cli(
      ["--listen", "127.0.0.1:0", "--ca-dir", join(dir, "ca"), "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--upstream-ca", caFile, "--record", har, "--log-level", "error"],
      (stdout, child) => {
        const port = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(stdout)?.[1];
        if (port === undefined || fetched !== undefined) return;
        fetched = (async () => {
          const agent = new ProxyAgent({ uri: `http://127.0.0.1:${port}`, requestTls: { ca: readFileSync(join(dir, "ca", "ca.crt"), "utf8") } });
          const res = await request(`https://api.test:${upstream.port}/echo`, { dispatcher: agent });
          await res.body.text();
          await agent.close();
          child.kill("SIGTERM");
        })();
      },
    );
    const exit = await run;
    await fetched;
    expect(exit.code).toBe(0);
    const file = JSON.parse(readFileSync(har, "utf8")) as RecordedHar;
    expect(file.log.entries).toHaveLength(1);
    expect(file.log.entries[0]!.response.status).toBe(200);
    // The flush SIGTERM starts and the one the close makes once the drain ends write the same file.
    expect(exit.stderr).not.toContain("EG_RECORD_FAILED");
    expect(existsSync(`${har}.journal`)).toBe(false);
    expect(readdirSync(dir).filter((name) => name.endsWith(".tmp"))).toEqual([]);
  });
});

// A body over 1 MiB streams to FILE.har.d/.<hex>.part before it is searched for secrets. A
// recording killed outright (SIGKILL, out of memory) left it there with the raw bytes, here an
// upstream echoing the real token into an 8 MiB body, in the folder the README's workflow
// commits; neither the next --record nor `har check` said a word (black-box finding).
describe("a recording killed while a large body streams", () => {
  it("leaves its partial body encrypted, har check lists it (exit 1), and the next --record on the path removes it", async () => {
    const dir = tempDir();
    const har = join(dir, "killed.har");
    const envFile = join(dir, "guest.env");
    const value = "ghp_KilledRecordingValue0123456789abcdefgh";
    const caFile = join(dir, "upstream-ca.pem");
    writeFileSync(caFile, (await testCa()).certPem);
    // A HAR already at the path (a recording from before), valid and clean on its own.
    writeFileSync(har, JSON.stringify({ log: { version: "1.2", creator: { name: "egressgate", version: "1" }, pages: [], entries: [] } }));
    const upstream = await startUpstream({
      routes: {
        // 2 MiB of the token the proxy put in, then silence: the body never ends.
        "/echo-token": (req, res) => {
          res.writeHead(200, { "content-type": "text/plain" });
          const line = Buffer.from(`token seen: ${String(req.headers.authorization)}\n`);
          res.write(Buffer.concat(Array.from({ length: Math.ceil((2 * 1024 * 1024) / line.length) }, () => line)));
        },
      },
    });
    const flags = ["--listen", "127.0.0.1:0", "--ca-dir", join(dir, "ca"), "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--upstream-ca", caFile];
    flags.push("--host-secret", `GH_TOKEN@api.test=${value}`, "--guest-env-file", envFile, "--record", har, "--log-level", "warn");
    const partial = (): string[] => (existsSync(`${har}.d`) ? readdirSync(`${har}.d`).filter((name) => name.endsWith(".part")) : []);
    let streaming: Promise<void> | undefined;
    const killed = cli(flags, (stdout, child) => {
      const port = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(stdout)?.[1];
      if (port === undefined || streaming !== undefined) return;
      streaming = (async () => {
        const placeholder = /^GH_TOKEN=(.+)$/m.exec(readFileSync(envFile, "utf8"))![1]!;
        const agent = new ProxyAgent({ uri: `http://127.0.0.1:${port}`, requestTls: { ca: readFileSync(join(dir, "ca", "ca.crt"), "utf8") } });
        onTestFinished(() => agent.destroy());
        const res = await request(`https://api.test:${upstream.port}/echo-token`, { dispatcher: agent, headers: { authorization: `Bearer ${placeholder}` } });
        res.body.on("data", () => undefined).on("error", () => undefined);
        // Past the 1 MiB kept in memory, the body is in its partial file: killed there.
        await vi.waitFor(() => expect(partial().map((name) => statSync(join(`${har}.d`, name)).size)).toEqual([expect.any(Number)]), { timeout: 20_000, interval: 50 });
        await vi.waitFor(() => expect(statSync(join(`${har}.d`, partial()[0]!)).size).toBeGreaterThan(1024 * 1024), { timeout: 20_000, interval: 50 });
        child.kill("SIGKILL");
      })();
    });
    await killed;
    await streaming;
    const left = partial();
    expect(left).toHaveLength(1);
    // Encrypted with a key that died with the process: neither the value nor its base64 is there.
    const bytes = readFileSync(join(`${har}.d`, left[0]!), "latin1");
    expect(bytes).not.toContain(value);
    expect(bytes).not.toContain("token seen");
    const checked = await cli(["har", "check", har]);
    expect(checked.stdout).toMatch(/secret-looking strings: none/);
    expect(checked.stdout).toContain(`partial bodies an interrupted recording left (1)`);
    expect(checked.stdout).toContain(join(`${har}.d`, left[0]!));
    expect(checked.code).toBe(1);
    // The next recording on the path removes it as it opens, and says so.
    const next = cli(flags, (stdout, child) => {
      if (/listening on/.test(stdout)) child.kill("SIGTERM");
    });
    const exit = await next;
    expect(exit.code).toBe(0);
    expect(partial()).toEqual([]);
    expect(exit.stderr).toContain("EG_RECORD_PARTIAL_REMOVED");
    expect(exit.stderr).toContain(left[0]!);
    const after = await cli(["har", "check", har]);
    expect(after.stdout).not.toMatch(/partial bodies/);
    expect(after.code).toBe(0);
  });
});
