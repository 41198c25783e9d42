import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { once } from "node:events";
import { gzipSync } from "node:zlib";
import { describe, expect, it, onTestFinished } from "vitest";
import { startAllowlistProxy } from "../../examples/allowlist.js";
import { startMockProxy } from "../../examples/mock.js";
import { startCacheProxy } from "../../examples/cache-layer.js";
import { redacted, startResponseRewriterProxy } from "../../examples/response-rewriter.js";
import { startUploadFilterProxy } from "../../examples/upload-filter.js";
import type { RunningProxy } from "../../src/index.js";
import { curlVia } from "../helpers/curl.js";
import { fetchVia, tempDir } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { patternChunk, startUpstream, type Route } from "../helpers/upstream.js";

// The examples import "egressgate", which resolves to dist/: run `npm run build` before these tests.

/** What every example proxy gets here: its own CA dir, no log noise, the test upstream CA, loopback names. */
async function exampleOptions() {
  const ca = await testCa();
  return {
    caDir: tempDir(),
    logLevel: "silent" as const,
    upstreamCa: [ca.certPem],
    resolve: { "api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"], "local.test": ["127.0.0.1"] },
  };
}

/** The examples start bare proxies; the test closes them. */
function closedAfterTest<P extends RunningProxy>(proxy: P): P {
  onTestFinished(() => proxy.close());
  return proxy;
}

const privateKeyUpload = [
  "# deploy config",
  "-----BEGIN PRIVATE KEY-----",
  "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgexampleexampleexample",
  "-----END PRIVATE KEY-----",
  "",
].join("\n");

describe("examples/allowlist.ts", () => {
  it("lets its hosts through and refuses the rest", async () => {
    const upstream = await startUpstream({ tls: false });
    const options = await exampleOptions();
    const proxy = await startAllowlistProxy({ allowedHosts: ["api.test"], allowedInternalHosts: ["local.test"] }, options);
    try {
      const denied = await curlVia(proxy.url, "/dev/null", `http://other.test:${upstream.port}/echo`);
      expect(denied.status).toBe(403);
      // api.test is allowed, but it resolves to loopback, which only allowedInternalHosts opens.
      const internal = await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`);
      expect(internal.status).toBe(403);
      expect(internal.body).toMatch(/loopback address/);
      expect(upstream.hits()).toBe(0);
      const allowed = await curlVia(proxy.url, "/dev/null", `http://local.test:${upstream.port}/echo`);
      expect(allowed.status).toBe(200);
      expect(upstream.hits()).toBe(1);
    } finally {
      await proxy.close();
    }
  });
});

describe("examples/upload-filter.ts", () => {
  it("refuses an upload carrying a private key with 422, and the upstream sees nothing", async () => {
    const upstream = await startUpstream();
    const proxy = closedAfterTest(await startUploadFilterProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`, {
      method: "POST",
      headers: { "content-type": "text/plain" },
      body: privateKeyUpload,
    });
    expect(res.status).toBe(422);
    expect(res.text).toContain("upload contains a private key");
    expect(upstream.hits()).toBe(0);
  });

  it("lets a clean 1 MiB upload through byte-exact", async () => {
    const upstream = await startUpstream();
    const proxy = closedAfterTest(await startUploadFilterProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const body = patternChunk(1024 * 1024);
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`, {
      method: "POST",
      headers: { "content-type": "application/octet-stream" },
      body,
    });
    expect(res.status).toBe(200);
    const echoed = JSON.parse(res.text) as { bodyBytes: number; bodySha256: string };
    expect(echoed.bodyBytes).toBe(body.length);
    expect(echoed.bodySha256).toBe(createHash("sha256").update(body).digest("hex"));
    expect(upstream.hits()).toBe(1);
  });

  it("refuses a compressed upload it cannot inspect with 415", async () => {
    const upstream = await startUpstream();
    const proxy = closedAfterTest(await startUploadFilterProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`, {
      method: "POST",
      headers: { "content-type": "text/plain", "content-encoding": "gzip" },
      body: gzipSync(privateKeyUpload),
    });
    expect(res.status).toBe(415);
    expect(upstream.hits()).toBe(0);
  });

  it("still refuses hosts outside the allowlist, with or without a body", async () => {
    const upstream = await startUpstream();
    const proxy = closedAfterTest(await startUploadFilterProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const res = await fetchVia(proxy, `https://other.test:${upstream.port}/echo`, { method: "POST", body: "clean" });
    expect(res.status).toBe(403);
    expect(upstream.hits()).toBe(0);
  });

  it("answers the refusal with the status text HttpRequestBlockedError was given", async () => {
    const upstream = await startUpstream();
    const proxy = closedAfterTest(await startUploadFilterProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    // HTTP/1.1: an HTTP/2 status line has no reason phrase, and curl now negotiates h2 with the proxy.
    const res = await curlVia(proxy.url, proxy.caCertPath, `https://api.test:${upstream.port}/echo`, [
      "--http1.1",
      "-i",
      "--data-binary",
      privateKeyUpload,
    ]);
    expect(res.status).toBe(422);
    expect(res.body).toMatch(/^HTTP\/1\.1 422 Unprocessable Content\r$/m);
    expect(upstream.hits()).toBe(0);
  });
});

describe("examples/response-rewriter.ts", () => {
  const account = {
    user: "ada",
    token: "tok_live_123",
    profile: { password: "hunter2", city: "London" },
    keys: [{ apiKey: "k-1", label: "ci" }],
  };
  const routes: Record<string, Route> = {
    "/account": (_req, res) => {
      res.writeHead(200, { "content-type": "application/json", etag: '"v1"' });
      res.end(JSON.stringify(account));
    },
    "/account.gz": (_req, res) => {
      res.writeHead(200, { "content-type": "application/json", "content-encoding": "gzip" });
      res.end(gzipSync(JSON.stringify(account)));
    },
    "/plain": (_req, res) => {
      res.writeHead(200, { "content-type": "text/plain", "x-upstream": "kept" });
      res.end(`{"token":"looks like JSON, but is text"}`);
    },
    "/public": (_req, res) => {
      res.writeHead(201, { "content-type": "application/problem+json", etag: '"p1"' });
      res.end(`{ "title": "nothing secret" }`);
    },
  };

  it("redacts credential fields in a JSON response the upstream sent", async () => {
    const upstream = await startUpstream({ routes });
    const proxy = closedAfterTest(await startResponseRewriterProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/account`);
    expect(res.status).toBe(200);
    expect(res.headers["content-type"]).toBe("application/json; charset=utf-8");
    expect(res.headers["etag"]).toBeUndefined();
    expect(JSON.parse(res.text)).toEqual({
      user: "ada",
      token: redacted,
      profile: { password: redacted, city: "London" },
      keys: [{ apiKey: redacted, label: "ci" }],
    });
    expect(upstream.hits()).toBe(1);
  });

  it("redacts a gzip-compressed JSON response, which the hook sees decoded", async () => {
    const upstream = await startUpstream({ routes });
    const proxy = closedAfterTest(await startResponseRewriterProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/account.gz`);
    expect(res.status).toBe(200);
    expect(res.headers["content-encoding"]).toBeUndefined();
    expect(JSON.parse(res.text)).toMatchObject({ user: "ada", token: redacted });
  });

  it("passes a non-JSON response through unchanged", async () => {
    const upstream = await startUpstream({ routes });
    const proxy = closedAfterTest(await startResponseRewriterProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/plain`);
    expect(res.status).toBe(200);
    expect(res.headers["content-type"]).toBe("text/plain");
    expect(res.headers["x-upstream"]).toBe("kept");
    expect(res.text).toBe(`{"token":"looks like JSON, but is text"}`);
  });

  it("passes a JSON response with nothing to redact through unchanged", async () => {
    const upstream = await startUpstream({ routes });
    const proxy = closedAfterTest(await startResponseRewriterProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/public`);
    expect(res.status).toBe(201);
    expect(res.headers["content-type"]).toBe("application/problem+json");
    expect(res.headers["etag"]).toBe('"p1"');
    expect(res.text).toBe(`{ "title": "nothing secret" }`);
  });
});

describe("examples/mock.ts", () => {
  it("answers a mocked URL itself, with no DNS lookup and no upstream request", async () => {
    const upstream = await startUpstream();
    // api.mock.test is neither allowed nor resolvable: only the hook can answer it.
    const proxy = closedAfterTest(await startMockProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const res = await fetchVia(proxy, "https://api.mock.test/v1/status");
    expect(res.status).toBe(200);
    expect(res.headers["content-type"]).toBe("application/json");
    expect(JSON.parse(res.text)).toEqual({ ok: true });
    const echo = await curlVia(proxy.url, proxy.caCertPath, "https://api.mock.test/v1/echo?x=1", ["-X", "PUT"]);
    expect(echo.status).toBe(200);
    expect(JSON.parse(echo.body)).toEqual({ method: "PUT", url: "https://api.mock.test/v1/echo?x=1" });
    expect(upstream.hits()).toBe(0);
  });

  it("sends every other request through the allowlist", async () => {
    const upstream = await startUpstream();
    const proxy = closedAfterTest(await startMockProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const allowed = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(allowed.status).toBe(200);
    expect(upstream.hits()).toBe(1);
    const otherHost = await fetchVia(proxy, `https://other.test:${upstream.port}/echo`);
    expect(otherHost.status).toBe(403);
    expect(otherHost.text).toMatch(/not in allowedHosts/);
    // The mocked host is not on the allowlist, so its unmocked paths are refused too.
    const unmocked = await fetchVia(proxy, "https://api.mock.test/v1/unknown");
    expect(unmocked.status).toBe(403);
    expect(upstream.hits()).toBe(1);
  });
});

describe("examples run directly", () => {
  it.each([
    ["allowlist.ts", []],
    ["upload-filter.ts", []],
    ["response-rewriter.ts", []],
    ["mock.ts", ["api.github.com"]],
  ])("examples/%s prints the guest environment, serves, and exits on Ctrl-C", async (file, args) => {
    const child = spawn(process.execPath, ["--import", "tsx", `examples/${file}`, ...args], {
      // The default caDir is under XDG_CONFIG_HOME: keep it out of the real home directory.
      env: { ...process.env, XDG_CONFIG_HOME: tempDir() },
      stdio: ["ignore", "pipe", "pipe"],
    });
    onTestFinished(() => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    });
    let stdout = "";
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    const printed = new Promise<Record<string, string>>((resolve, reject) => {
      child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
        stdout += chunk;
        const env = Object.fromEntries(
          stdout
            .split("\n")
            .slice(0, -1)
            .map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]),
        ) as Record<string, string>;
        if (env["HTTPS_PROXY"] !== undefined && env["NODE_EXTRA_CA_CERTS"] !== undefined) resolve(env);
      });
      child.once("exit", (code) => reject(new Error(`examples/${file} exited with ${code} before printing: ${stderr}`)));
    });
    const env = await printed;
    expect(env["HTTPS_PROXY"]).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    // A name the allowlist refuses is answered before any DNS lookup.
    const refused = await curlVia(env["HTTPS_PROXY"]!, "/dev/null", "http://refused.invalid/");
    expect(refused.status).toBe(403);
    if (file === "mock.ts") {
      const mocked = await curlVia(env["HTTPS_PROXY"]!, env["NODE_EXTRA_CA_CERTS"]!, "https://api.mock.test/v1/status");
      expect(JSON.parse(mocked.body)).toEqual({ ok: true });
    }
    const exited = once(child, "exit");
    child.kill("SIGINT");
    expect(await exited).toEqual([0, null]);
  });
});

describe("examples/cache-layer.ts", () => {
  /** A route counting its calls, with the Cache-Control the query gives. */
  function counted(): { route: Route; calls: () => number } {
    let calls = 0;
    return {
      calls: () => calls,
      route: (_req, res, _body, url) => {
        calls++;
        const size = Number(url.searchParams.get("size") ?? 0);
        res.writeHead(200, { "content-type": "text/plain", "cache-control": url.searchParams.get("cc") ?? "max-age=60" });
        res.end(size > 0 ? patternChunk(size) : `answer ${calls}`);
      },
    };
  }

  it("answers a repeated GET from memory: one upstream request, the same body, and x-cache says which", async () => {
    const { route, calls } = counted();
    const upstream = await startUpstream({ routes: { "/c": route } });
    const proxy = closedAfterTest(await startCacheProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const first = await fetchVia(proxy, `https://api.test:${upstream.port}/c`);
    const second = await fetchVia(proxy, `https://api.test:${upstream.port}/c`);
    expect([first.text, second.text]).toEqual(["answer 1", "answer 1"]);
    expect([first.headers["x-cache"], second.headers["x-cache"]]).toEqual(["miss", "hit"]);
    expect(calls()).toBe(1);
  });

  it("keeps nothing the upstream forbids, nothing but GET, and partitions by the guest's Authorization", async () => {
    const { route, calls } = counted();
    const upstream = await startUpstream({ routes: { "/c": route } });
    const proxy = closedAfterTest(await startCacheProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    for (let i = 0; i < 2; i++) await fetchVia(proxy, `https://api.test:${upstream.port}/c?cc=no-store`);
    for (let i = 0; i < 2; i++) await fetchVia(proxy, `https://api.test:${upstream.port}/c`, { method: "POST", body: "x" });
    await fetchVia(proxy, `https://api.test:${upstream.port}/c`, { headers: { authorization: "Bearer a" } });
    const other = await fetchVia(proxy, `https://api.test:${upstream.port}/c`, { headers: { authorization: "Bearer b" } });
    expect(other.headers["x-cache"]).toBe("miss");
    expect(calls()).toBe(6);
  });

  it("lets a body larger than an entry through whole, uncached", async () => {
    const { route, calls } = counted();
    const upstream = await startUpstream({ routes: { "/c": route } });
    const proxy = closedAfterTest(await startCacheProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions(), { maxEntryBytes: 100_000 }));
    for (let i = 0; i < 2; i++) {
      const res = await fetchVia(proxy, `https://api.test:${upstream.port}/c?size=300000`);
      expect(res.text).toBe(patternChunk(300_000).toString());
      expect(res.headers["x-cache"]).toBe("miss");
    }
    expect(calls()).toBe(2);
  });

  it("still applies the allowlist on a miss: a host off it is refused and nothing is cached", async () => {
    const { route } = counted();
    const upstream = await startUpstream({ routes: { "/c": route }, names: ["api.test", "other.test"] });
    const proxy = closedAfterTest(await startCacheProxy({ allowedInternalHosts: ["api.test"] }, await exampleOptions()));
    const refused = await fetchVia(proxy, `https://other.test:${upstream.port}/c`);
    expect(refused.status).toBe(403);
    expect(upstream.hits()).toBe(0);
  });
});
