import { createServer as createHttpServer, type Server as HttpServer } from "node:http";
import { createServer, type AddressInfo, type Socket } from "node:net";
import { spawnSync } from "node:child_process";
import { subscribe, unsubscribe } from "node:diagnostics_channel";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { request } from "undici";
import { createHttpHooks, type AuditRecord, type HttpHooksOptions } from "../../src/index.js";
import { caseOf, gateDecider, json, loggedDocuments, processesWith, pythonDecider, shellDecider, startDecisionServer, text, until } from "../helpers/deciders.js";
import { loadPolicy } from "../helpers/djs.js";
import { openRaw } from "../helpers/raw.js";
import { fetchVia, proxyAgent, startTestProxy, tempDir, type TestProxy } from "../helpers/proxy.js";
import { gzipJsonRoute, listenForTest, startUpstream, type Echo, type Upstream } from "../helpers/upstream.js";

/** The decision lines of a proxy's log. */
function decisions(logs: Record<string, unknown>[]): Record<string, unknown>[] {
  return logs.filter((line) => line["msg"] === "request");
}

/** A proxy that lets api.test through, with `hooks` as its chain. */
async function proxyWith(
  hooks: NonNullable<HttpHooksOptions["hooks"]>,
  extra: HttpHooksOptions = {},
  options: Parameters<typeof startTestProxy>[1] = {},
): Promise<{ proxy: TestProxy; upstream: Upstream; base: string }> {
  const upstream = await startUpstream();
  const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks, ...extra }, options);
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
  // A program that does not exist is refused by createHttpHooks (deciders-contract.test.ts); one
  // removed after that fails closed.
  it("stdout that is not JSON fails closed; a program that no longer exists fails closed", async () => {
    const { proxy, base } = await proxyWith([{ command: [shellDecider] }]);
    expect((await fetchVia(proxy, `${base}/echo?case=garbage`)).status).toBe(502);
    const program = join(tempDir(), "decider.sh");
    writeFileSync(program, "#!/bin/sh\nexit 0\n", { mode: 0o755 });
    const missing = await proxyWith([{ command: [program] }]);
    rmSync(program);
    const res = await fetchVia(missing.proxy, `${missing.base}/echo`);
    expect(res.status).toBe(502);
    expect(JSON.stringify(decisions(missing.proxy.logs).at(-1))).toContain("ENOENT");
    // Still answering (every request is refused the same way).
    expect((await fetchVia(missing.proxy, `${missing.base}/echo`)).status).toBe(502);
  });

  // No shell stands between a program and createHttpHooks: `~/check.sh` was spawned as a file
  // under a folder named `~` in the working directory, and every request got 502, where the
  // config file has long expanded it.
  it("a program given as ~/… is under $HOME, as in the config file; ~user/… is refused naming the entry", async () => {
    const home = tempDir("egressgate-home-");
    writeFileSync(join(home, "says-no.sh"), '#!/bin/sh\ncat > /dev/null\necho "home says no" >&2\nexit 2\n', { mode: 0o755 });
    vi.stubEnv("HOME", home);
    onTestFinished(() => {
      vi.unstubAllEnvs();
    });
    const { proxy, upstream, base } = await proxyWith([{ command: ["~/says-no.sh"] }]);
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(403);
    expect(res.text).toContain("home says no");
    expect(upstream.hits()).toBe(0);
    expect(decisions(proxy.logs).at(-1)).toMatchObject({ source: "command:~/says-no.sh" });
    expect(() => createHttpHooks({ hooks: [{ command: "~bob/says-no.sh --strict" }] })).toThrow(
      expect.objectContaining({
        code: "EG_INVALID_OPTION",
        path: "hooks[0].command",
        message: 'createHttpHooks: hooks[0].command starts with "~bob", which is not expanded: only ~ and ~/ are (the home folder, $HOME); write the folder out',
      }),
    );
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

  // A decider runs per request: a process it leaves behind would pile up, one per request.
  it.each([
    ["with its output sent elsewhere", ">/dev/null 2>&1"],
    ["holding the answer's pipe open", ""],
  ])("a process the command leaves running (%s) is killed when the command exits, and the answer is read at once", async (_name, redirect) => {
    const marker = `41.${process.pid}${Math.floor(Math.random() * 1e6)}`;
    const leftovers = (): number => processesWith(["sleep", marker]);
    onTestFinished(() => void spawnSync("pkill", ["-KILL", "-f", marker]));
    const { proxy, base } = await proxyWith([{ command: `sleep ${marker} ${redirect} & cat > /dev/null; echo '{"decision":"allow"}'`, shell: true, timeoutMs: 20_000 }]);
    for (let i = 0; i < 3; i++) expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    await expect.poll(leftovers, { timeout: 5_000 }).toBe(0);
  });

  // The 503 was audited with decision "error" and no `failure`, and the metric read the kind
  // from its message: "throw" (black-box finding).
  it("a flood beyond concurrency queues, a full queue answers 503 at once (audited and counted as kind busy), and the queued ones are served once processes free up", async () => {
    const sockets: Socket[] = [];
    const gate = createServer((socket) => {
      socket.on("error", () => undefined);
      sockets.push(socket);
    });
    const gatePort = await listenForTest(gate as unknown as HttpServer);
    const audit = join(tempDir(), "audit.jsonl");
    const { proxy, upstream, base } = await proxyWith([{ command: [gateDecider, String(gatePort)], concurrency: 2, queue: 1 }], {}, { auditLog: audit, metricsListen: "127.0.0.1:0" });
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
    const records = (): Record<string, unknown>[] => readFileSync(audit, "utf8").split("\n").filter((line) => line !== "").map((line) => JSON.parse(line) as Record<string, unknown>);
    await until(() => records().length === 4, "four audit records");
    const busy = records().find((record) => record["status"] === 503)!;
    expect(busy["sources"]).toEqual([expect.objectContaining({ source: `command:${gateDecider}`, decision: "error", status: 503, failure: "busy" })]);
    const metrics = await (await request(`${proxy.metricsUrl!}/metrics`)).body.text();
    expect(metrics).toContain(`egressgate_hook_failures_total{source="command:${gateDecider}",kind="busy"} 1`);
    expect(metrics).not.toMatch(/egressgate_hook_failures_total\{[^}]*kind="throw"/);
    // The proxy still serves, with the gate open.
    const last = fetchVia(proxy, `${base}/echo?case=allow`);
    await until(() => sockets.length === 4, "the next process reaches the gate");
    sockets[3]!.end("go");
    expect((await last).status).toBe(200);
  });
});

/** A webhook that answers by the request's `case`; "hang" is never answered. */
async function webhookServer() {
  return startDecisionServer(
    (doc, _req, res) => {
      switch (caseOf(doc)) {
        case "empty":
          res.writeHead(204);
          res.end();
          return;
        case "text":
          return text(res, 200, "ok");
        case "block422":
          return text(res, 422, "webhook says no");
        case "json-block":
          return json(res, 200, { decision: "block", reason: "webhook json says no", status: 451 });
        case "rewrite":
          return json(res, 200, { decision: "allow", set_headers: { "x-decided": "webhook" }, remove_headers: ["x-drop"] });
        case "error500":
          return text(res, 500, "internal trouble");
        case "malformed":
          res.writeHead(200, { "content-type": "application/json" });
          res.end("{not json");
          return;
        case "bad-status":
          return json(res, 200, { decision: "block", status: 200 });
        case "null-decision":
          return json(res, 200, { decision: null, reason: "must not pass" });
        default:
          return json(res, 200, { decision: "allow" });
      }
    },
    (doc) => caseOf(doc) === "hang",
  );
}

describe("webhook deciders", () => {
  it("a 2xx with an allow, an empty 204 and a 2xx without JSON all allow; the webhook got the document", async () => {
    const hook = await webhookServer();
    const { proxy, upstream, base } = await proxyWith([{ webhook: `${hook.url}/decide` }]);
    for (const c of ["allow", "empty", "text"]) expect([c, (await fetchVia(proxy, `${base}/echo?case=${c}`)).status]).toEqual([c, 200]);
    expect(upstream.hits()).toBe(3);
    expect(hook.received[0]).toMatchObject({ phase: "request", guest: "default", request: { method: "GET", url_parsed: { host: "api.test", path: "/echo", query: "case=allow" } } });
  });

  it("422 blocks with the body as the reason; a JSON block answers with its own status; the log names the webhook", async () => {
    const hook = await webhookServer();
    const { proxy, upstream, base } = await proxyWith([{ webhook: `${hook.url}/decide` }]);
    const res = await fetchVia(proxy, `${base}/echo?case=block422`);
    expect(res.status).toBe(403);
    expect(res.text).toContain("webhook says no");
    expect(decisions(proxy.logs).at(-1)).toMatchObject({ status: 403, source: `webhook:${hook.url}/decide` });
    const json451 = await fetchVia(proxy, `${base}/echo?case=json-block`);
    expect(json451.status).toBe(451);
    expect(json451.text).toContain("webhook json says no");
    expect(upstream.hits()).toBe(0);
  });

  it("a rewrite from the webhook sets and removes headers", async () => {
    const hook = await webhookServer();
    const { proxy, base } = await proxyWith([{ webhook: `${hook.url}/decide` }]);
    const res = await fetchVia(proxy, `${base}/echo?case=rewrite`, { headers: { "x-drop": "1" } });
    const echo = JSON.parse(res.text) as Echo;
    expect(echo.headers["x-decided"]).toBe("webhook");
    expect(echo.headers["x-drop"]).toBeUndefined();
  });

  it("500, a malformed answer, a block with a bad status and a null decision fail closed with 502, and the proxy still serves", async () => {
    const hook = await webhookServer();
    const { proxy, upstream, base } = await proxyWith([{ webhook: `${hook.url}/decide` }]);
    for (const c of ["error500", "malformed", "bad-status", "null-decision"]) expect([c, (await fetchVia(proxy, `${base}/echo?case=${c}`)).status]).toEqual([c, 502]);
    expect(upstream.hits()).toBe(0);
    expect(JSON.stringify(decisions(proxy.logs)[0])).toContain("answered status 500");
    await stillServes(proxy, base);
  });

  it("a webhook that does not answer within timeoutMs fails closed with 502", async () => {
    const hook = await webhookServer();
    const { proxy, upstream, base } = await proxyWith([{ webhook: `${hook.url}/decide`, timeoutMs: 300 }]);
    const res = await fetchVia(proxy, `${base}/echo?case=hang`);
    expect(res.status).toBe(502);
    expect(hook.held()).toBe(1);
    expect(upstream.hits()).toBe(0);
    expect(JSON.stringify(decisions(proxy.logs).at(-1))).toContain("did not answer within 300 ms");
    await stillServes(proxy, base);
  });

  it("no server at all fails closed with 502; with failOpen the request goes through", async () => {
    const probe = createServer();
    await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
    const port = (probe.address() as { port: number }).port;
    await new Promise<void>((resolve) => probe.close(() => resolve()));
    const closed = await proxyWith([{ webhook: `http://127.0.0.1:${port}/decide` }]);
    const res = await fetchVia(closed.proxy, `${closed.base}/echo`);
    expect(res.status).toBe(502);
    expect(JSON.stringify(decisions(closed.proxy.logs).at(-1))).toContain("ECONNREFUSED");
    const open = await proxyWith([{ webhook: `http://127.0.0.1:${port}/decide`, failOpen: true }]);
    expect((await fetchVia(open.proxy, `${open.base}/echo`)).status).toBe(200);
    expect(open.upstream.hits()).toBe(1);
  });

  // A failOpen decider that failed left no trace but a warning (which --log-level can hide): the
  // audit record said a plain allow with no failure, and egressgate_hook_failures_total counted
  // nothing, so requests let through while the decider was down could not be found (black-box
  // finding). The warning's id was "1", where the decision lines say 1.
  it("with failOpen, a failure is audited as an allow with its failure kind and failOpen, counted by kind, and warned under the decision line's id", async () => {
    const hook = await webhookServer();
    const records: AuditRecord[] = [];
    const { proxy, upstream, base } = await proxyWith(
      [{ webhook: `${hook.url}/decide`, failOpen: true, timeoutMs: 300, phases: ["request", "response"] }],
      {},
      { onDecision: (record) => void records.push(record), metrics: true },
    );
    const label = `webhook:${hook.url}/decide`;
    const kinds = { malformed: "invalid", hang: "time", error500: "throw" } as const;
    for (const c of Object.keys(kinds)) expect([c, (await fetchVia(proxy, `${base}/echo?case=${c}`)).status]).toEqual([c, 200]);
    expect(upstream.hits()).toBe(3);
    await vi.waitFor(() => expect(records).toHaveLength(3));
    for (const [i, kind] of Object.values(kinds).entries()) {
      const deciders = records[i]!.sources.filter((source) => source.tier === "decider");
      expect(deciders).toEqual(
        ["onRequest", "onResponse"].map((phase) =>
          expect.objectContaining({ source: label, phase, decision: "allow", failure: kind, failOpen: true, reason: expect.stringMatching(/^failed open: /) }),
        ),
      );
    }
    // An answer that allows is still a plain allow.
    expect((await fetchVia(proxy, `${base}/echo?case=allow`)).status).toBe(200);
    await vi.waitFor(() => expect(records).toHaveLength(4));
    for (const source of records[3]!.sources.filter((s) => s.tier === "decider")) {
      expect(source).not.toHaveProperty("failure");
      expect(source).not.toHaveProperty("failOpen");
    }
    const metrics = await proxy.metrics();
    for (const kind of Object.values(kinds)) expect(metrics).toContain(`egressgate_hook_failures_total{source="${label}",kind="${kind}"} 2`);
    const warnings = proxy.logs.filter((line) => line["msg"] === "decider failed open");
    expect(warnings).toHaveLength(6);
    const ids = decisions(proxy.logs).map((line) => line["id"]);
    for (const warning of warnings) {
      expect(typeof warning["id"]).toBe("number");
      expect(ids).toContain(warning["id"]);
    }
  });

  // undici's text(), which reads an answer of declared length, drops a UTF-8 byte order mark;
  // the bounded read of a chunked one kept it, so the same block answer was a block with
  // Content-Length and "not JSON" without, and a failOpen decider let the request through
  // (black-box finding).
  it("a JSON block after a UTF-8 byte order mark blocks, from a webhook whether its length is declared or chunked and from a command, failOpen or not", async () => {
    const answer = Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(JSON.stringify({ decision: "block", reason: "marked no", status: 451 }))]);
    const hook = await startDecisionServer((doc, _req, res) => {
      if (caseOf(doc) === "allow") return json(res, 200, { decision: "allow" });
      if (caseOf(doc) === "declared") res.writeHead(200, { "content-type": "application/json", "content-length": answer.length });
      else res.writeHead(200, { "content-type": "application/json" });
      res.end(answer);
    });
    for (const failOpen of [false, true]) {
      const { proxy, upstream, base } = await proxyWith([{ webhook: `${hook.url}/decide`, failOpen }]);
      for (const c of ["declared", "chunked"]) {
        const res = await fetchVia(proxy, `${base}/echo?case=${c}`);
        expect([failOpen, c, res.status, res.text]).toEqual([failOpen, c, 451, expect.stringContaining("marked no")]);
      }
      expect(proxy.logs.filter((line) => line["msg"] === "decider failed open")).toEqual([]);
      await stillServes(proxy, base);
      expect(upstream.hits()).toBe(1);
    }
    // A command's stdout is the same contract, read the same way.
    const marked = `cat >/dev/null; printf '\\357\\273\\277{"decision":"block","reason":"marked no","status":451}'`;
    for (const failOpen of [false, true]) {
      const { proxy, upstream, base } = await proxyWith([{ command: [marked], shell: true, failOpen }]);
      const res = await fetchVia(proxy, `${base}/echo`);
      expect([failOpen, res.status, res.text]).toEqual([failOpen, 451, expect.stringContaining("marked no")]);
      expect(upstream.hits()).toBe(0);
    }
  });

  it("headers may name listed environment variables, which the webhook receives filled in", async () => {
    process.env["DECIDER_TEST_TOKEN"] = "tok-123";
    try {
      const seen: (string | undefined)[] = [];
      const hook = await startDecisionServer((_doc, req, res) => {
        seen.push(req.headers["authorization"]);
        json(res, 200, { decision: "allow" });
      });
      const { proxy, base } = await proxyWith([{ webhook: hook.url, headers: { authorization: "Bearer ${DECIDER_TEST_TOKEN}" }, allowEnv: ["DECIDER_TEST_TOKEN"] }]);
      expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
      expect(seen).toEqual(["Bearer tok-123"]);
    } finally {
      delete process.env["DECIDER_TEST_TOKEN"];
    }
  });

  it("phases: [\"response\"] asks about responses only: a block there replaces the response, and the upstream was reached", async () => {
    const hook = await startDecisionServer((doc, _req, res) => {
      const response = doc["response"] as { status: number } | undefined;
      if (response?.status === 404) return json(res, 200, { decision: "block", reason: "no 404s here", status: 409 });
      json(res, 200, { decision: "allow" });
    });
    const { proxy, upstream, base } = await proxyWith([{ webhook: hook.url, phases: ["response"] }]);
    const ok = await fetchVia(proxy, `${base}/echo`);
    expect(ok.status).toBe(200);
    expect(JSON.parse(ok.text)).toMatchObject({ path: "/echo" });
    const blocked = await fetchVia(proxy, `${base}/missing`);
    expect(blocked.status).toBe(409);
    expect(blocked.text).toContain("no 404s here");
    expect(blocked.text).not.toContain("no such route");
    expect(upstream.hits()).toBe(2);
    expect(hook.received.map((d) => d["phase"])).toEqual(["response", "response"]);
    expect(hook.received[1]).toMatchObject({ response: { status: 404, headers: { "content-type": "text/plain" } } });
    expect(decisions(proxy.logs).at(-1)).toMatchObject({ status: 409, source: `webhook:${hook.url}/` });
  });

  it("cacheMs keeps allows and blocks per (phase, guest, method, scheme, host, port, path); rewrites are asked every time", async () => {
    const hook = await webhookServer();
    const { proxy, upstream, base } = await proxyWith([{ webhook: hook.url, cacheMs: 60_000 }]);
    expect((await fetchVia(proxy, `${base}/echo?case=allow`)).status).toBe(200);
    // Same tuple (the query is not part of it): answered from the cache.
    expect((await fetchVia(proxy, `${base}/echo?case=block422`)).status).toBe(200);
    expect(hook.received).toHaveLength(1);
    // Another path is another tuple.
    expect((await fetchVia(proxy, `${base}/other?case=block422`)).status).toBe(403);
    expect((await fetchVia(proxy, `${base}/other?case=allow`)).status).toBe(403);
    expect(hook.received).toHaveLength(2);
    expect((await fetchVia(proxy, `${base}/echo`, { method: "POST", body: "x" })).status).toBe(200);
    expect(hook.received).toHaveLength(3);
    const rewrites = await proxyWith([{ webhook: hook.url, cacheMs: 60_000 }]);
    await fetchVia(rewrites.proxy, `${rewrites.base}/echo?case=rewrite`);
    await fetchVia(rewrites.proxy, `${rewrites.base}/echo?case=rewrite`);
    expect(hook.received).toHaveLength(5);
    expect(upstream.hits()).toBe(3);
  });

  it("includeBody sends the body (text, cut at maxBodyBytes and marked), and the upstream still gets all of it", async () => {
    const hook = await webhookServer();
    const { proxy, upstream, base } = await proxyWith([{ webhook: hook.url, includeBody: true, maxBodyBytes: 8 }]);
    const res = await fetchVia(proxy, `${base}/echo`, { method: "POST", body: "hello, decider body" });
    expect(res.status).toBe(200);
    expect(hook.received[0]).toMatchObject({ request: { body: { encoding: "utf8", data: "hello, d", size: 19, truncated: true } } });
    const echo = JSON.parse(res.text) as Echo;
    expect(echo.bodyBytes).toBe(19);
    expect(upstream.seen[0]!.headers["content-length"]).toBe("19");
    const binary = Buffer.from([0xff, 0xfe, 0x00, 0x80, 0x41]);
    expect((await fetchVia(proxy, `${base}/echo`, { method: "POST", body: binary })).status).toBe(200);
    expect(hook.received[1]).toMatchObject({ request: { body: { encoding: "base64", data: binary.toString("base64"), size: 5, truncated: false } } });
  });
});

// A decider that read the body (includeBody) and allowed was traced as "rewrite" whenever the
// request had a body: the body read whole went on as bytes, which the trace took for new ones.
describe("the trace of an includeBody decider", () => {
  it("says allow for an allow, with or without a body, and rewrite for a header change", async () => {
    const hook = await webhookServer();
    const records: AuditRecord[] = [];
    const { proxy, base } = await proxyWith([{ webhook: hook.url, includeBody: true }], {}, { onDecision: (record) => void records.push(record) });
    expect((await fetchVia(proxy, `${base}/echo?case=allow`, { method: "POST", body: "hello" })).status).toBe(200);
    expect((await fetchVia(proxy, `${base}/echo?case=allow`)).status).toBe(200);
    expect((await fetchVia(proxy, `${base}/echo?case=rewrite`, { method: "POST", body: "hello" })).status).toBe(200);
    await vi.waitFor(() => expect(records).toHaveLength(3));
    const deciderVerdicts = records.map((record) => record.sources?.find((source) => source.tier === "decider")?.decision);
    expect(deciderVerdicts).toEqual(["allow", "allow", "rewrite"]);
  });
});

/**
 * A webhook that answers the first request on each connection and closes the connection, without
 * answering, when another request arrives on it: a server whose idle keep-alive timer fired as the
 * proxy's next call went out on that connection, made deterministic. `unanswered(call, onConnection)`
 * (both counted from 1) overrides that: undefined answers the call, a string is written before the
 * connection closes ("" for nothing).
 */
async function crossingCloseWebhook(
  unanswered: (call: number, onConnection: number) => string | undefined = (_call, onConnection) => (onConnection === 1 ? undefined : ""),
): Promise<{ url: string; connections: () => number; answered: () => number; calls: () => number }> {
  let connections = 0;
  let answered = 0;
  let calls = 0;
  const server = createServer((socket) => {
    connections += 1;
    socket.on("error", () => undefined);
    let onConnection = 0;
    let buffered = "";
    socket.on("data", (chunk: Buffer) => {
      buffered += chunk.toString("latin1");
      const end = buffered.indexOf("\r\n\r\n");
      if (end < 0) return;
      const length = Number(/content-length:\s*(\d+)/i.exec(buffered.slice(0, end))?.[1] ?? 0);
      if (buffered.length < end + 4 + length) return;
      buffered = buffered.slice(end + 4 + length);
      const before = unanswered(++calls, ++onConnection);
      if (before !== undefined) return void socket.end(before);
      answered += 1;
      socket.write('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 20\r\n\r\n{"decision":"allow"}');
    });
  });
  const port = await listenForTest(server as unknown as HttpServer);
  return { url: `http://127.0.0.1:${port}/decide`, connections: () => connections, answered: () => answered, calls: () => calls };
}

// A decider's keep-alive close that crossed the proxy's next call on that connection gave the
// guest 502 (UND_ERR_SOCKET: other side closed): 1 in 40 requests a second apart, with a decider
// that closed idle connections after 1 s (black-box finding). The upstream side resends such a
// request; a decider's call, a POST of a document that can be asked twice, is resent too. Only
// that: a decider that sent anything back, or closed a new connection, may have acted on the
// call (a webhook that logs or counts), and is asked once (black-box finding: every socket error
// was taken for a crossed close).
describe("a decider's keep-alive close that crosses the next call", () => {
  it("is asked again on a new connection, once: every request is decided", async () => {
    const hook = await crossingCloseWebhook();
    const { proxy, upstream, base } = await proxyWith([{ webhook: hook.url }]);
    for (let i = 0; i < 3; i++) expect([i, (await fetchVia(proxy, `${base}/echo?n=${i}`)).status]).toEqual([i, 200]);
    expect(upstream.hits()).toBe(3);
    // The second and third calls each found their connection closed and went out on a new one.
    expect(hook.connections()).toBe(3);
    expect(hook.answered()).toBe(3);
    expect(proxy.logs.filter((line) => line["code"] === "EG_HOOK_FAILED")).toEqual([]);
  });

  it("a decider that answers once, then closes every connection unanswered, is asked twice for the next request (the second time on a new connection), then fails closed with 502", async () => {
    const hook = await crossingCloseWebhook((call) => (call === 1 ? undefined : ""));
    const { proxy, upstream, base } = await proxyWith([{ webhook: hook.url }]);
    expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(502);
    expect(upstream.hits()).toBe(1);
    expect([hook.calls(), hook.connections()]).toEqual([3, 2]);
    expect(JSON.stringify(decisions(proxy.logs).at(-1))).toMatch(/UND_ERR_SOCKET|ECONNRESET|EPIPE/);
  });

  it.each([
    ["closes a new connection without answering", (call: number) => (call === 1 ? "" : undefined), 1],
    ["sends a 103 on a new connection, then closes", (call: number) => (call === 1 ? "HTTP/1.1 103 Early Hints\r\n\r\n" : undefined), 1],
    ["sends a 103 on a reused connection, then closes", (call: number) => (call === 2 ? "HTTP/1.1 103 Early Hints\r\n\r\n" : undefined), 2],
    ["sends half a head on a reused connection, then closes", (call: number) => (call === 2 ? "HTTP/1.1 200 OK\r\ncontent-le" : undefined), 2],
  ] as const)("a decider that %s is asked once: 502, and the next request is decided", async (_name, unanswered, failingRequest) => {
    const hook = await crossingCloseWebhook(unanswered);
    const { proxy, upstream, base } = await proxyWith([{ webhook: hook.url }]);
    for (let i = 1; i < failingRequest; i++) expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(502);
    expect([hook.calls(), hook.connections()]).toEqual([failingRequest, 1]);
    expect(upstream.hits()).toBe(failingRequest - 1);
    expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    expect(hook.calls()).toBe(failingRequest + 1);
  });
});

describe("decider bodies", () => {
  it("a gzip response is decoded for the document, and the guest gets the original compressed bytes", async () => {
    const { gzipSync } = await import("node:zlib");
    const gzipped = gzipSync(Buffer.from(JSON.stringify({ hello: "compressed world" })));
    const upstream = await startUpstream({ routes: { "/gz": gzipJsonRoute(gzipped) } });
    const hook = await webhookServer();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [{ webhook: hook.url, phases: ["response"], includeBody: true }] });
    const res = await request(`https://api.test:${upstream.port}/gz`, { dispatcher: proxyAgent(proxy) });
    expect(res.statusCode).toBe(200);
    expect(res.headers["content-encoding"]).toBe("gzip");
    expect(Buffer.from(await res.body.arrayBuffer()).equals(gzipped)).toBe(true);
    expect(hook.received[0]).toMatchObject({ response: { body: { encoding: "utf8", data: '{"hello":"compressed world"}', truncated: false } } });
    expect((hook.received[0] as { response: { headers: Record<string, string> } }).response.headers["content-encoding"]).toBeUndefined();
  });

  it("with includeBody, a request body over maxHttpBodyBytes gets 413 and nothing leaves", async () => {
    const upstream = await startUpstream();
    const hook = await webhookServer();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [{ webhook: hook.url, includeBody: true }] }, { maxHttpBodyBytes: 1024 });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`, { method: "POST", body: Buffer.alloc(4096, 0x62) });
    expect(res.status).toBe(413);
    expect(hook.received).toHaveLength(0);
    expect(upstream.hits()).toBe(0);
  });

  it("called on its own, httpHooks.onRequest of a chain with a request-phase decider refuses with 502", async () => {
    const { httpHooks } = createHttpHooks({ allowedHosts: ["api.test"], hooks: [{ webhook: "http://127.0.0.1:9/decide" }] });
    await expect(httpHooks.onRequest!(new Request("https://api.test/"))).rejects.toMatchObject({ name: "HttpRequestBlockedError", status: 502 });
  });
});

// The document's headers were a plain object: a field named "__proto__" set its prototype and
// was not in the JSON, so a decider checking header values never saw it while the upstream (or
// the guest) got it, and "constructor" came out as "function Object() { [native code] }, c".
describe("header names that Object.prototype has", () => {
  /** A decider that blocks (451) whatever carries "exfil" in a request or response header value. */
  async function headerCheckingDecider(): Promise<Awaited<ReturnType<typeof startDecisionServer>>> {
    return startDecisionServer((doc, _req, res) => {
      const part = (doc["response"] ?? doc["request"]) as { headers: Record<string, string> };
      if (Object.values(part.headers).some((value) => value.includes("exfil"))) return json(res, 200, { decision: "block", reason: "a header carries exfil", status: 451 });
      json(res, 200, { decision: "allow" });
    });
  }

  /** The headers of the `index`th document a decider got, parsed from its raw JSON (own keys only). */
  function documentHeaders(hook: Awaited<ReturnType<typeof startDecisionServer>>, index: number, phase: "request" | "response"): Record<string, string> {
    return (JSON.parse(hook.raw[index]!) as Record<typeof phase, { headers: Record<string, string> }>)[phase].headers;
  }

  async function plainGet(port: number, target: string, field: string): Promise<number> {
    const client = await openRaw(port);
    client.write(`GET ${target} HTTP/1.1\r\nHost: ${new URL(target).host}\r\n${field}x-normal: n\r\nConnection: close\r\n\r\n`);
    return (await client.readResponse()).status;
  }

  const names = ["__proto__", "constructor", "toString", "hasOwnProperty", "valueOf"];

  it.each(names)("a request header %s is in the request document as sent, so a decider can refuse on it", async (name) => {
    const upstream = await startUpstream({ tls: false });
    const hook = await headerCheckingDecider();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [{ webhook: hook.url }] });
    const target = `http://api.test:${upstream.port}/echo`;
    expect(await plainGet(proxy.port, target, `${name}: harmless\r\n`)).toBe(200);
    expect(upstream.seen[0]!.rawHeaders).toEqual(expect.arrayContaining([name, "harmless"]));
    const headers = documentHeaders(hook, 0, "request");
    expect(Object.hasOwn(headers, name.toLowerCase())).toBe(true);
    expect(headers[name.toLowerCase()]).toBe("harmless");
    expect(headers["x-normal"]).toBe("n");
    expect(await plainGet(proxy.port, target, `${name}: exfiltrated-data-here\r\n`)).toBe(451);
    expect(upstream.hits()).toBe(1);
  });

  it.each(names)("a response header %s is in the response document as the upstream sent it, so a decider can refuse on it", async (name) => {
    const upstream = await startUpstream({
      tls: false,
      routes: {
        "/named": (_req, res, _body, url) => {
          res.writeHead(200, [name, url.searchParams.get("value") ?? "", "x-normal", "n", "content-length", "2"]);
          res.end("ok");
        },
      },
    });
    const hook = await headerCheckingDecider();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [{ webhook: hook.url, phases: ["response"] }] });
    expect(await plainGet(proxy.port, `http://api.test:${upstream.port}/named?value=harmless`, "")).toBe(200);
    const headers = documentHeaders(hook, 0, "response");
    expect(Object.hasOwn(headers, name.toLowerCase())).toBe(true);
    expect(headers[name.toLowerCase()]).toBe("harmless");
    expect(headers["x-normal"]).toBe("n");
    expect(await plainGet(proxy.port, `http://api.test:${upstream.port}/named?value=exfiltrated-data-here`, "")).toBe(451);
    expect(upstream.hits()).toBe(2);
  });
});

describe("OPA deciders", () => {
  /**
   * Not the real OPA (its binary is not installable here): a server written from OPA's documented
   * Data API (POST /v1/data/<path> with {"input": …}, answering 200 with {"result": …}, or {}
   * when the document is undefined; 404 for an unknown API path, 400 without input).
   */
  async function opaServer() {
    return startDecisionServer((body, req, res) => {
      if (req.method !== "POST" || req.url !== "/v1/data/egress") return json(res, 404, { code: "resource_not_found" });
      const input = body["input"] as Record<string, unknown> | undefined;
      if (input === undefined) return json(res, 400, { code: "invalid_parameter", message: "missing input" });
      switch (caseOf(input)) {
        case "false":
          return json(res, 200, { result: false });
        case "undefined":
          return json(res, 200, {});
        case "block":
          return json(res, 200, { result: { allow: false, reason: "opa says no", status: 451 } });
        case "rewrite":
          return json(res, 200, { result: { allow: true, set_headers: { "x-decided": "opa" }, remove_headers: ["x-drop"] } });
        case "object":
          return json(res, 200, { result: { allow: true } });
        case "error":
          return json(res, 500, { code: "internal_error" });
        default:
          return json(res, 200, { result: true, decision_id: "d-1" });
      }
    });
  }

  it("result true or {allow: true} allows, and the input document arrives under input", async () => {
    const opa = await opaServer();
    const { proxy, upstream, base } = await proxyWith([{ opa: `${opa.url}/v1/data/egress` }]);
    expect((await fetchVia(proxy, `${base}/echo?case=true`)).status).toBe(200);
    expect((await fetchVia(proxy, `${base}/echo?case=object`)).status).toBe(200);
    expect(upstream.hits()).toBe(2);
    expect(opa.received[0]).toMatchObject({ input: { phase: "request", request: { url_parsed: { host: "api.test" } } } });
  });

  it("result false, an undefined result and {allow: false} deny; the object's status and reason are the answer", async () => {
    const opa = await opaServer();
    const { proxy, upstream, base } = await proxyWith([{ opa: `${opa.url}/v1/data/egress` }]);
    expect((await fetchVia(proxy, `${base}/echo?case=false`)).status).toBe(403);
    const undef = await fetchVia(proxy, `${base}/echo?case=undefined`);
    expect(undef.status).toBe(403);
    expect(undef.text).toContain("OPA returned no result");
    const block = await fetchVia(proxy, `${base}/echo?case=block`);
    expect(block.status).toBe(451);
    expect(block.text).toContain("opa says no");
    expect(decisions(proxy.logs).at(-1)).toMatchObject({ status: 451, source: `opa:${opa.url}/v1/data/egress` });
    expect(upstream.hits()).toBe(0);
  });

  it("a rewrite from OPA sets headers; an error status fails closed, and the proxy still serves", async () => {
    const opa = await opaServer();
    const { proxy, base } = await proxyWith([{ opa: `${opa.url}/v1/data/egress` }]);
    const res = await fetchVia(proxy, `${base}/echo?case=rewrite`, { headers: { "x-drop": "1" } });
    expect((JSON.parse(res.text) as Echo).headers["x-decided"]).toBe("opa");
    expect((await fetchVia(proxy, `${base}/echo?case=error`)).status).toBe(502);
    const wrongPath = await proxyWith([{ opa: `${opa.url}/v1/data/nothing` }]);
    expect((await fetchVia(wrongPath.proxy, `${wrongPath.base}/echo`)).status).toBe(502);
    await stillServes(proxy, base);
  });
});

describe("policies/egress.rego", () => {
  /**
   * The shipped policy's rules, mirrored in JavaScript behind OPA's Data API (the real OPA is not
   * installable here): what it reads of the document is what egressgate sends.
   */
  function egressRego(input: { phase: string; guest: string; request: { method: string; url_parsed: { scheme: string; host: string; path: string } }; response?: { headers: Record<string, string> } }) {
    const { request } = input;
    const readOnly = ["api.github.com", "registry.npmjs.org", "pypi.org", "files.pythonhosted.org"].includes(request.url_parsed.host) && ["GET", "HEAD", "OPTIONS"].includes(request.method);
    const writer = input.guest === "ci" && request.url_parsed.host === "api.github.com" && !request.url_parsed.path.startsWith("/admin");
    const executable = ["application/x-msdownload", "application/x-executable", "application/x-sh", "application/x-elf"].some((t) => (input.response?.headers["content-type"] ?? "").toLowerCase().startsWith(t));
    const allow = input.phase === "request" ? request.url_parsed.scheme === "https" && (readOnly || writer) : !executable;
    if (allow) return { allow, ...(input.phase === "request" ? { set_headers: { "x-egress-guest": input.guest } } : {}) };
    const reason =
      input.phase === "request"
        ? `${request.method} ${request.url_parsed.scheme}://${request.url_parsed.host}${request.url_parsed.path} is not allowed by policies/egress.rego for guest ${input.guest}`
        : "executable downloads are refused by policies/egress.rego";
    return { allow, reason, status: 403, request };
  }

  it("lets a read-only GET to a listed host through, tagged with the guest, and refuses a write with the policy's reason", async () => {
    const shipped = readFileSync(new URL("../../policies/egress.rego", import.meta.url), "utf8");
    expect(shipped).toContain("package egress");
    const opa = await startDecisionServer((body, _req, res) => json(res, 200, { result: egressRego(body["input"] as Parameters<typeof egressRego>[0]) }));
    const upstream = await startUpstream({ names: ["api.github.com"] });
    const proxy = await startTestProxy(
      { allowedInternalHosts: ["api.github.com"], hooks: [{ opa: `${opa.url}/v1/data/egress`, phases: ["request", "response"] }] },
      { resolve: { "api.github.com": ["127.0.0.1"] } },
    );
    const base = `https://api.github.com:${upstream.port}`;
    const read = await fetchVia(proxy, `${base}/echo`);
    expect(read.status).toBe(200);
    expect((JSON.parse(read.text) as Echo).headers["x-egress-guest"]).toBe("default");
    const write = await fetchVia(proxy, `${base}/echo`, { method: "POST", body: "{}" });
    expect(write.status).toBe(403);
    expect(write.text).toContain(`POST https://api.github.com/echo is not allowed by policies/egress.rego for guest default`);
    expect(upstream.hits()).toBe(1);
  });
});

describe("deciders in a chain", () => {
  it("a command's rewrite is what a later QuickJS policy checks; in the other order the policy refuses", async () => {
    const policy = () =>
      loadPolicy({
        source: `export function onRequest(r) { if (r.headers.get("x-decided") !== "shell") throw new HttpRequestBlockedError("not decided yet", 409); }`,
        filename: "needs-decided.mjs",
      });
    const before = await proxyWith([{ command: [shellDecider] }, policy()]);
    const res = await fetchVia(before.proxy, `${before.base}/echo?case=rewrite`);
    expect(res.status).toBe(200);
    expect((JSON.parse(res.text) as Echo).headers["x-decided"]).toBe("shell");
    const after = await proxyWith([policy(), { command: [shellDecider] }]);
    const refused = await fetchVia(after.proxy, `${after.base}/echo?case=rewrite`);
    expect(refused.status).toBe(409);
    expect(after.upstream.hits()).toBe(0);
  });

  it("a webhook's deny ends the chain before a tier-3 hook, which is never called", async () => {
    const hook = await webhookServer();
    let tier3Calls = 0;
    const { proxy, upstream, base } = await proxyWith([{ webhook: hook.url }, { onRequest: () => void tier3Calls++ }]);
    expect((await fetchVia(proxy, `${base}/echo?case=block422`)).status).toBe(403);
    expect(tier3Calls).toBe(0);
    expect(upstream.hits()).toBe(0);
    expect((await fetchVia(proxy, `${base}/echo?case=allow`)).status).toBe(200);
    expect(tier3Calls).toBe(1);
  });

  it("a rewrite is checked again: a placeholder it sets for a host outside the secret's hosts is refused with 403", async () => {
    const file = join(tempDir(), "placeholder");
    const { proxy, upstream, base } = await proxyWith(
      [{ command: ["/bin/sh", "-c", `cat > /dev/null; printf '{"set_headers":{"authorization":"Bearer %s"}}' "$(cat "$1")"`, "sh", file] }],
      { secrets: { OTHER: { hosts: ["other.test"], value: "other-secret-value" } } },
    );
    writeFileSync(file, proxy.guestEnv()["OTHER"]!);
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(403);
    expect(res.text).toContain("placeholder of secret OTHER");
    expect(upstream.hits()).toBe(0);
  });
});

// Guests that hung up kept their decider calls: queued ones held the queue (each later ran a
// process to its timeoutMs) and a live request got 503; running ones kept their process, and a
// webhook's call its pooled connection (black-box finding).
describe("a guest that leaves ends what a decider has queued or running for it", () => {
  it("its running process is killed and its queued calls give up their places: a live request is decided, not refused busy", async () => {
    const marker = `700.${process.pid}${Math.floor(Math.random() * 1e6)}`;
    onTestFinished(() => void spawnSync("pkill", ["-KILL", "-f", marker]));
    const sleeping = (): number => processesWith(["/bin/sh", "-c", `sleep ${marker}; echo '{"decision":"allow"}'`]);
    const { proxy, base, upstream } = await proxyWith([{ command: `sleep ${marker}; echo '{"decision":"allow"}'`, shell: true, concurrency: 1, queue: 2, timeoutMs: 600_000 }]);
    // Three guests: one call runs (its process sleeps), two wait in the queue of 2; then all leave.
    let started = 0;
    const onStart = (): void => void (started += 1);
    subscribe("egressgate:request:start", onStart);
    onTestFinished(() => void unsubscribe("egressgate:request:start", onStart));
    const leaving = Array.from({ length: 3 }, () => {
      const controller = new AbortController();
      const answer = request(`${base}/echo`, { dispatcher: proxyAgent(proxy), signal: controller.signal }).then(
        () => "answered",
        () => "left",
      );
      return { controller, answer };
    });
    await vi.waitFor(() => expect(sleeping()).toBe(1), { timeout: 10_000, interval: 20 });
    // All three are in; from a request's start to its place in the decider's queue is promises only.
    await vi.waitFor(() => expect(started).toBe(3), { timeout: 10_000, interval: 20 });
    await new Promise((resolve) => setImmediate(resolve));
    for (const { controller } of leaving) controller.abort();
    expect(await Promise.all(leaving.map(({ answer }) => answer))).toEqual(["left", "left", "left"]);
    // The running process is killed, and no queued call starts one of its own.
    await vi.waitFor(() => expect(sleeping()).toBe(0), { timeout: 5_000, interval: 20 });
    await vi.waitFor(() => expect(decisions(proxy.logs).map((line) => line["status"])).toEqual([499, 499, 499]));
    expect(sleeping()).toBe(0);
    expect(upstream.hits()).toBe(0);
    // The queue is free: a live request waits its turn (its own process sleeps), it is not refused with 503.
    const live = fetchVia(proxy, `${base}/echo`).then((res) => res.status, () => "cut");
    await vi.waitFor(() => expect(sleeping()).toBe(1), { timeout: 10_000, interval: 20 });
    expect(decisions(proxy.logs).filter((line) => line["status"] === 503)).toEqual([]);
    void spawnSync("pkill", ["-KILL", "-f", marker]);
    expect(await live).toBe(502);
  }, 30_000);

  it("its webhook call is ended, and the connection it held closes", async () => {
    let calls = 0;
    let closed = 0;
    // A webhook that never answers: only the proxy can end the call.
    const hook = createHttpServer((req) => {
      calls += 1;
      req.socket.once("close", () => (closed += 1));
    });
    await new Promise<void>((resolve) => hook.listen(0, "127.0.0.1", resolve));
    onTestFinished(() => {
      hook.closeAllConnections();
      hook.close();
    });
    // failOpen: a guest that leaves is no failure of the decider's, to wave through or to count.
    const records: AuditRecord[] = [];
    const { proxy, base } = await proxyWith([{ webhook: `http://127.0.0.1:${(hook.address() as AddressInfo).port}/decide`, timeoutMs: 600_000, failOpen: true }], {}, { onDecision: (record) => void records.push(record) });
    const controller = new AbortController();
    const answer = request(`${base}/echo`, { dispatcher: proxyAgent(proxy), signal: controller.signal }).then(
      () => "answered",
      () => "left",
    );
    await vi.waitFor(() => expect(calls).toBe(1), { timeout: 10_000, interval: 20 });
    controller.abort();
    expect(await answer).toBe("left");
    await vi.waitFor(() => expect(closed).toBe(1), { timeout: 5_000, interval: 20 });
    await vi.waitFor(() => expect(decisions(proxy.logs).map((line) => line["status"])).toEqual([499]));
    expect(proxy.logs.filter((line) => line["msg"] === "decider failed open")).toEqual([]);
    await vi.waitFor(() => expect(records).toHaveLength(1));
    expect(records[0]!.sources?.filter((source) => source.decision === "error")).toEqual([]);
  });
});

// proxy.close() left a command decider's process running, and waited out a webhook's call, for
// the decider's timeoutMs (up to 10 minutes): nothing closed the deciders a guest's chain held.
describe("proxy.close() ends what the guests' deciders have under way", () => {
  // (A webhook's call left open does not hold close(); the CLI's exit, which it did hold, is
  // tested in deciders-cli.test.ts.)
  it("a command decider still deciding: its process is killed by close(), not left for its timeoutMs", async () => {
    const marker = `600.${process.pid}1`;
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [{ command: ["sleep", marker], timeoutMs: 600_000 }] }, { timeouts: { drainMs: 300 } });
    const answer = fetchVia(proxy, `https://api.test:${upstream.port}/echo`).then(
      (res) => res.status,
      () => "cut",
    );
    const sleeping = (): number => processesWith(["sleep", marker]);
    await vi.waitFor(() => expect(sleeping()).toBe(1), { timeout: 10_000, interval: 20 });
    await proxy.close();
    expect([502, "cut"]).toContain(await answer);
    expect(upstream.hits()).toBe(0);
    await vi.waitFor(() => expect(sleeping()).toBe(0), { timeout: 5_000, interval: 20 });
  }, 30_000);
});
