import { createServer, type Socket } from "node:net";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { createHttpHooks, type HttpHooksOptions } from "../../src/index.js";
import { caseOf, gateDecider, json, loggedDocuments, pythonDecider, shellDecider, startDecisionServer, text, until } from "../helpers/deciders.js";
import { loadPolicy } from "../helpers/djs.js";
import { fetchVia, startTestProxy, tempDir, type TestProxy } from "../helpers/proxy.js";
import { listenForTest, startUpstream, type Echo, type Upstream } from "../helpers/upstream.js";

/** The decision lines of a proxy's log. */
function decisions(logs: Record<string, unknown>[]): Record<string, unknown>[] {
  return logs.filter((line) => line["msg"] === "request");
}

/** A proxy that lets api.test through, with `hooks` as its chain. */
async function proxyWith(hooks: HttpHooksOptions["hooks"], extra: HttpHooksOptions = {}): Promise<{ proxy: TestProxy; upstream: Upstream; base: string }> {
  const upstream = await startUpstream();
  const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks, ...extra });
  return { proxy, upstream, base: `https://api.test:${upstream.port}` };
}

/** After an unusual row: a plain request through the same proxy still gets its answer. */
async function stillServes(proxy: TestProxy, base: string): Promise<void> {
  const plain = await fetchVia(proxy, `${base}/echo?case=allow`);
  expect(plain.status).toBe(200);
}

describe.each([
  // A timeout long enough for the interpreter to start on a loaded machine: the hanging case
  // never answers, so it times out whatever the figure.
  { kind: "a shell script", file: shellDecider, prefix: "", timeoutMs: 1_500 },
  { kind: "a Python script", file: pythonDecider, prefix: "python ", timeoutMs: 4_000 },
])("command deciders: $kind", ({ file, prefix, timeoutMs }) => {
  it("exit 0 with an allow lets the request through, and the command got the document on stdin", async () => {
    const log = join(tempDir(), "docs.jsonl");
    const { proxy, upstream, base } = await proxyWith([{ command: [file, log] }]);
    const res = await fetchVia(proxy, `${base}/echo?case=allow`, { headers: { "x-hello": "world" } });
    expect(res.status).toBe(200);
    expect(upstream.hits()).toBe(1);
    const [doc] = loggedDocuments(log);
    expect(doc).toMatchObject({
      phase: "request",
      guest: "default",
      request: {
        method: "GET",
        url: `${base}/echo?case=allow`,
        url_parsed: { scheme: "https", host: "api.test", port: upstream.port, path: "/echo", query: "case=allow" },
        headers: { "x-hello": "world" },
      },
    });
    expect(doc).not.toHaveProperty("response");
  });

  it("exit 2 blocks with stderr as the reason, and the log names the command", async () => {
    const { proxy, upstream, base } = await proxyWith([{ command: [file] }]);
    const res = await fetchVia(proxy, `${base}/echo?case=exit2`);
    expect(res.status).toBe(403);
    expect(res.text).toContain(`${prefix}exit two says no`);
    expect(upstream.hits()).toBe(0);
    expect(decisions(proxy.logs).at(-1)).toMatchObject({ status: 403, code: "EG_HOOK_BLOCKED", source: `command:${file}` });
  });

  it("a JSON block answers with its own status and reason", async () => {
    const { proxy, upstream, base } = await proxyWith([{ command: [file] }]);
    const res = await fetchVia(proxy, `${base}/echo?case=json-block`);
    expect(res.status).toBe(451);
    expect(res.text).toContain(`${prefix}json says no`);
    expect(upstream.hits()).toBe(0);
  });

  it("a rewrite sets and removes headers on the request that leaves", async () => {
    const { proxy, base } = await proxyWith([{ command: [file] }]);
    const res = await fetchVia(proxy, `${base}/echo?case=rewrite`, { headers: { "x-drop": "gone", "x-keep": "kept" } });
    expect(res.status).toBe(200);
    const echo = JSON.parse(res.text) as Echo;
    expect(echo.headers["x-decided"]).toBe(prefix === "" ? "shell" : "python");
    expect(echo.headers["x-drop"]).toBeUndefined();
    expect(echo.headers["x-keep"]).toBe("kept");
  });

  it("a crash fails closed with 502, and the proxy still serves", async () => {
    const { proxy, upstream, base } = await proxyWith([{ command: [file] }]);
    const res = await fetchVia(proxy, `${base}/echo?case=crash`);
    expect(res.status).toBe(502);
    expect(res.text).toContain(`command:${file} could not decide`);
    expect(upstream.hits()).toBe(0);
    expect(decisions(proxy.logs).at(-1)).toMatchObject({ status: 502, code: "EG_HOOK_FAILED", source: `command:${file}` });
    await stillServes(proxy, base);
  });

  it("a command that outlives timeoutMs is killed and the request fails closed with 502", async () => {
    const { proxy, upstream, base } = await proxyWith([{ command: [file], timeoutMs }]);
    const res = await fetchVia(proxy, `${base}/echo?case=hang`);
    expect(res.status).toBe(502);
    expect(upstream.hits()).toBe(0);
    expect(JSON.stringify(decisions(proxy.logs).at(-1))).toContain(`did not answer within ${timeoutMs} ms`);
    await stillServes(proxy, base);
  });

  it("another exit status fails closed with 502; with failOpen it allows", async () => {
    const closed = await proxyWith([{ command: [file] }]);
    expect((await fetchVia(closed.proxy, `${closed.base}/echo?case=exit3`)).status).toBe(502);
    const open = await proxyWith([{ command: [file], failOpen: true }]);
    expect((await fetchVia(open.proxy, `${open.base}/echo?case=exit3`)).status).toBe(200);
    expect((await fetchVia(open.proxy, `${open.base}/echo?case=crash`)).status).toBe(200);
    expect(open.upstream.hits()).toBe(2);
    expect(open.proxy.logs.some((line) => line["msg"] === "decider failed open")).toBe(true);
    // failOpen is about a broken decider, not about its answers: a block still blocks.
    expect((await fetchVia(open.proxy, `${open.base}/echo?case=exit2`)).status).toBe(403);
  });
});

describe("command deciders: processes", () => {
  it("stdout that is not JSON fails closed; a program that does not exist fails closed", async () => {
    const { proxy, base } = await proxyWith([{ command: [shellDecider] }]);
    expect((await fetchVia(proxy, `${base}/echo?case=garbage`)).status).toBe(502);
    const missing = await proxyWith([{ command: ["/nonexistent/decider"] }]);
    const res = await fetchVia(missing.proxy, `${missing.base}/echo`);
    expect(res.status).toBe(502);
    expect(JSON.stringify(decisions(missing.proxy.logs).at(-1))).toContain("ENOENT");
    // Still answering (every request is refused the same way).
    expect((await fetchVia(missing.proxy, `${missing.base}/echo`)).status).toBe(502);
  });

  it("a command that exits without reading stdin (EPIPE) is judged by its exit code, and the proxy lives", async () => {
    const { proxy, base } = await proxyWith([{ command: "/bin/sh -c 'exit 2'", includeBody: true }]);
    const big = Buffer.alloc(4 * 1024 * 1024, 0x61);
    const res = await fetchVia(proxy, `${base}/echo`, { method: "POST", body: big });
    expect(res.status).toBe(403);
    // Still answering.
    expect((await fetchVia(proxy, `${base}/echo`, { method: "POST", body: big })).status).toBe(403);
  });

  it("the environment is PATH plus the listed variables only, and no shell runs unless asked", async () => {
    process.env["DECIDER_TEST_LISTED"] = "listed-value";
    process.env["DECIDER_TEST_UNLISTED"] = "unlisted-value";
    try {
      const dir = tempDir();
      const out = join(dir, "env.txt");
      const { proxy, base } = await proxyWith([
        // The argument with a space and a $ would be split or expanded by a shell.
        { command: ["/bin/sh", "-c", 'env > "$1"; printf "%s" "$2" >> "$1"', "sh", out, "not $HOME expanded"], env: ["DECIDER_TEST_LISTED"] },
      ]);
      expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
      const { readFileSync } = await import("node:fs");
      const env = readFileSync(out, "utf8");
      expect(env).toContain("DECIDER_TEST_LISTED=listed-value");
      expect(env).toContain(`PATH=${process.env["PATH"]}`);
      expect(env).not.toContain("DECIDER_TEST_UNLISTED");
      expect(env).not.toContain("HOME=");
      expect(env.endsWith("not $HOME expanded")).toBe(true);
    } finally {
      delete process.env["DECIDER_TEST_LISTED"];
      delete process.env["DECIDER_TEST_UNLISTED"];
    }
  });

  it("shell: true runs the command through /bin/sh -c", async () => {
    const { proxy, base } = await proxyWith([{ command: `cat > /dev/null; echo '{"decision":"block","reason":"piped '"$((6*7))"'"}'`, shell: true }]);
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(403);
    expect(res.text).toContain("piped 42");
  });

  it("a flood beyond concurrency queues, a full queue answers 503 at once, and the queued ones are served once processes free up", async () => {
    const sockets: Socket[] = [];
    const gate = createServer((socket) => {
      socket.on("error", () => undefined);
      sockets.push(socket);
    });
    const gatePort = await listenForTest(gate as unknown as import("node:http").Server);
    const { proxy, upstream, base } = await proxyWith([{ command: [gateDecider, String(gatePort)], concurrency: 2, queue: 1 }]);
    const first = [fetchVia(proxy, `${base}/echo?n=1`), fetchVia(proxy, `${base}/echo?n=2`)];
    // Both processes are running (each holds a connection to the gate).
    await until(() => sockets.length === 2, "two processes reach the gate");
    const more = [fetchVia(proxy, `${base}/echo?n=3`), fetchVia(proxy, `${base}/echo?n=4`)];
    // One of the two waits in the queue (of 1); the other finds it full and is refused at once.
    const refused = await Promise.race(more);
    expect(refused.status).toBe(503);
    expect(refused.text).toMatch(/busy: 2 processes are running and 1 calls are queued/);
    expect(upstream.hits()).toBe(0);
    for (const socket of sockets) socket.end("go");
    await until(() => sockets.length === 3, "the queued call's process reaches the gate");
    sockets[2]!.end("go");
    const statuses = (await Promise.all([...first, ...more])).map((r) => r.status).sort();
    expect(statuses).toEqual([200, 200, 200, 503]);
    expect(upstream.hits()).toBe(3);
    // The proxy still serves, with the gate open.
    const last = fetchVia(proxy, `${base}/echo?case=allow`);
    await until(() => sockets.length === 4, "the next process reaches the gate");
    sockets[3]!.end("go");
    expect((await last).status).toBe(200);
  });
});
