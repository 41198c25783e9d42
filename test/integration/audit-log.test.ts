import { spawn, type ChildProcess } from "node:child_process";
import { subscribe, unsubscribe } from "node:diagnostics_channel";
import { request as httpRequest } from "node:http";
import { mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { HttpRequestBlockedError, type AuditRecord, type HttpHooksOptions, type ProxyOptions } from "../../src/index.js";
import { loadPolicy } from "../helpers/djs.js";
import { latch } from "../helpers/latch.js";
import { request } from "undici";
import { fetchVia, proxyAgent, startTestProxy, tempDir, type TestProxy } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { openRaw, openTlsTunnel } from "../helpers/raw.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { startUpstream, type Route } from "../helpers/upstream.js";
import { eventually, FifoReader, makeFifo, within } from "../helpers/fifo.js";

const root = fileURLToPath(new URL("../../", import.meta.url));

/** Records as onDecision hands them over, with a wait for the nth: a record is made once the guest has the whole answer. */
function recorder(): { records: AuditRecord[]; onDecision: (record: AuditRecord) => void; count: (n: number) => Promise<AuditRecord[]> } {
  const records: AuditRecord[] = [];
  const waiters: Array<{ n: number; resolve: () => void }> = [];
  return {
    records,
    onDecision(record) {
      records.push(record);
      for (const waiter of waiters.filter((w) => records.length >= w.n)) waiter.resolve();
    },
    count: (n) => (records.length >= n ? Promise.resolve(records) : new Promise((resolve) => waiters.push({ n, resolve: () => resolve(records) }))),
  };
}

async function audited(
  hooks: HttpHooksOptions,
  options: Omit<ProxyOptions, "httpHooks"> = {},
): Promise<{ proxy: TestProxy; file: string; seen: ReturnType<typeof recorder> }> {
  const file = join(tempDir(), "audit.jsonl");
  const seen = recorder();
  const proxy = await startTestProxy(hooks, { auditLog: file, onDecision: seen.onDecision, logLevel: "warn", ...options });
  return { proxy, file, seen };
}

function lines(file: string): AuditRecord[] {
  return readFileSync(file, "utf8")
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as AuditRecord);
}

/** A plain forward-proxy request (absolute-form, no CONNECT), as curl sends for http:// URLs. */
function plainVia(proxy: TestProxy, url: string, headers: Record<string, string> = {}): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: "127.0.0.1", port: proxy.port, path: url, headers: { host: new URL(url).host, ...headers } });
    req.on("response", (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("upgrade", (res, socket) => {
      socket.destroy();
      resolve(res.statusCode ?? 0);
    });
    req.on("error", reject);
    req.end();
  });
}

function expectSaneLatencies(record: AuditRecord): void {
  expect(record.ms).toBeGreaterThanOrEqual(0);
  for (const source of record.sources) {
    expect(typeof source.ms).toBe("number");
    expect(source.ms).toBeGreaterThanOrEqual(0);
  }
}

describe("the audit log", () => {
  it("records an allowed upload and download with the allowlist's rule and the exact body bytes both ways, the same in the file as for onDecision", async () => {
    const upstream = await startUpstream();
    const { proxy, file, seen } = await audited({ allowedInternalHosts: ["api.test"] });
    const base = `https://api.test:${upstream.port}`;
    const upload = await fetchVia(proxy, `${base}/echo?q=1`, { method: "POST", body: Buffer.alloc(100_000, 7), headers: { "content-type": "application/octet-stream" } });
    expect(upload.status).toBe(200);
    expect(JSON.parse(upload.text)).toMatchObject({ bodyBytes: 100_000 });
    await seen.count(1);
    const download = await fetchVia(proxy, `${base}/bytes?n=300000`);
    expect(download.text.length).toBeGreaterThan(0);
    const [up, down] = await seen.count(2);
    expect(up).toMatchObject({
      guest: "default",
      method: "POST",
      url: `${base}/echo`,
      status: 200,
      redirects: 0,
      bytesUp: 100_000,
      bytesDown: Buffer.byteLength(upload.text),
      rule: { tier: "declarative", rule: "allowedHosts:api.test" },
      sources: [{ source: "declarative", tier: "declarative", phase: "allowlist", decision: "allow" }],
    });
    expect(Date.parse(up!.time)).toBeGreaterThan(Date.now() - 60_000);
    expect(down).toMatchObject({ method: "GET", url: `${base}/bytes`, status: 200, bytesUp: 0, bytesDown: 300_000 });
    expectSaneLatencies(up!);
    await proxy.close();
    expect(lines(file)).toEqual(JSON.parse(JSON.stringify(seen.records)));
  });

  it("counts a response's body bytes and not its head or chunk framing, chunked or with Content-Length, for requests in turn on one connection", async () => {
    const upstream = await startUpstream({
      routes: {
        "/chunked": (_req, res) => {
          res.writeHead(200, { "content-type": "text/plain" });
          res.write("first chunk,");
          res.end(" then the last");
        },
      },
    });
    const { proxy, seen } = await audited({ allowedInternalHosts: ["api.test"] });
    const base = `https://api.test:${upstream.port}`;
    // One agent: the three requests go in turn over one tunnel, so each count starts where the last response ended.
    const agent = proxyAgent(proxy);
    const get = async (path: string, method: "GET" | "HEAD" = "GET"): Promise<string> => (await request(`${base}${path}`, { dispatcher: agent, method })).body.text();
    expect(await get("/chunked")).toBe("first chunk, then the last");
    expect((await get("/bytes?n=1234")).length).toBe(1234);
    expect(await get("/chunked", "HEAD")).toBe("");
    const [first, second, head] = await seen.count(3);
    expect(first).toMatchObject({ url: `${base}/chunked`, status: 200, bytesDown: "first chunk, then the last".length });
    expect(second).toMatchObject({ url: `${base}/bytes`, status: 200, bytesDown: 1234 });
    expect(head).toMatchObject({ method: "HEAD", status: 200, bytesDown: 0 });
    for (const record of [first!, second!]) {
      expect(record.upstreamMs).toBeGreaterThan(0);
      expect(record.upstreamMs!).toBeLessThanOrEqual(record.ms + 0.1);
    }
  });

  it("records a host outside the allowlist as a 403 from the declarative tier, for a plain request and for a CONNECT", async () => {
    const plain = await startUpstream({ tls: false });
    const { proxy, seen } = await audited({ allowedInternalHosts: ["api.test"] });
    expect(await plainVia(proxy, `http://other.test:${plain.port}/echo`)).toBe(403);
    const [refused] = await seen.count(1);
    expect(refused).toMatchObject({
      method: "GET",
      url: `http://other.test:${plain.port}/echo`,
      status: 403,
      code: "EG_DENIED",
      sources: [{ source: "declarative", phase: "allowlist", decision: "block", status: 403 }],
    });
    expect(refused!.rule).toBeUndefined();
    expect(refused!.bytesDown).toBeGreaterThan(0);
    expect(plain.hits()).toBe(0);

    const client = await openRaw(proxy.port);
    client.write("CONNECT other.test:9 HTTP/1.1\r\nHost: other.test:9\r\n\r\n");
    expect((await client.readResponse({ forConnect: true })).status).toBe(403);
    const [, connect] = await seen.count(2);
    expect(connect).toMatchObject({ method: "CONNECT", url: "other.test:9", status: 403, sources: [{ source: "declarative", phase: "allowlist", decision: "block" }] });
  });

  // The README said "cut at 1024 characters", yet the record's url is the decision line's
  // target, whose path was already cut at 512 (black-box finding): one cut, documented once.
  it("cuts a 3000-character URL's path at 512 characters, as the decision line does, for a request that passed and one refused", async () => {
    const upstream = await startUpstream();
    const plain = await startUpstream({ tls: false });
    const { proxy, seen } = await audited({ allowedInternalHosts: ["api.test"] }, { logLevel: "info" });
    const path = `/${"a".repeat(2999)}`;
    const passed = `https://api.test:${upstream.port}`;
    expect((await fetchVia(proxy, `${passed}${path}?q=1`)).status).toBe(404);
    const refused = `http://other.test:${plain.port}`;
    expect(await plainVia(proxy, `${refused}${path}?q=1`)).toBe(403);
    const records = await seen.count(2);
    const cutPath = `${path.slice(0, 512)}…`;
    expect(records.map((record) => record.url)).toEqual([`${passed}${cutPath}`, `${refused}${cutPath}`]);
    const targets = proxy.logs.filter((line) => line["msg"] === "request").map((line) => line["target"]);
    expect(targets).toEqual(records.map((record) => record.url));
    // The README's audit record table says the same.
    const row = readFileSync(join(root, "README.md"), "utf8").split("\n").find((line) => line.startsWith("| `method`, `url` |"));
    expect(row?.match(/cut at (\d+) characters/)?.[1]).toBe("512");
  });

  it("names every tier-3 source that spoke, with its verdict: a rewrite, a pass, a replaced response and a block with its own status", async () => {
    const upstream = await startUpstream();
    const { proxy, seen } = await audited({
      allowedInternalHosts: ["api.test"],
      hooks: [
        {
          onRequest: (request) => {
            if (request.method === "DELETE") throw new HttpRequestBlockedError("deletes are not allowed", 451, "Unavailable");
            const headers = new Headers(request.headers);
            headers.set("x-tagged", "1");
            return new Request(request, { headers });
          },
        },
        { onRequest: () => undefined, isRequestAllowed: () => true, onResponse: () => new Response("replaced") },
      ],
    });
    const base = `https://api.test:${upstream.port}`;
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.text).toBe("replaced");
    const [allowed] = await seen.count(1);
    expect(allowed!.sources.map(({ source, phase, decision }) => `${source} ${phase} ${decision}`)).toEqual([
      "hooks[0] onRequest rewrite",
      "hooks[1] onRequest allow",
      "hooks[1] isRequestAllowed allow",
      "declarative allowlist allow",
      "hooks[1] onResponse rewrite",
    ]);
    expect(allowed).toMatchObject({ status: 200, bytesDown: "replaced".length });
    expectSaneLatencies(allowed!);

    expect((await fetchVia(proxy, `${base}/echo`, { method: "DELETE" })).status).toBe(451);
    const [, blocked] = await seen.count(2);
    expect(blocked).toMatchObject({
      status: 451,
      code: "EG_HOOK_BLOCKED",
      source: "hooks[0]",
      reason: "deletes are not allowed",
      sources: [{ source: "hooks[0]", tier: "tier3", phase: "onRequest", decision: "block", reason: "deletes are not allowed", status: 451 }],
    });
    expect(upstream.hits()).toBe(1);
  });

  it("names a tier-2 policy's decisions: its check allows a GET and refuses a DELETE", async () => {
    const upstream = await startUpstream();
    const djsHooks = loadPolicy({ source: `export function isRequestAllowed(r) { return r.method !== "DELETE"; }`, filename: "policy.mjs" });
    const { proxy, seen } = await audited({ allowedInternalHosts: ["api.test"], djsHooks });
    const base = `https://api.test:${upstream.port}`;
    expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    expect((await fetchVia(proxy, `${base}/echo`, { method: "DELETE" })).status).toBe(403);
    const [allowed, refused] = await seen.count(2);
    expect(allowed!.sources).toMatchObject([
      { tier: "tier2", phase: "isRequestAllowed", decision: "allow" },
      { source: "declarative", phase: "allowlist", decision: "allow" },
    ]);
    expect(allowed!.sources[0]!.source).toContain("policy.mjs");
    expect(refused).toMatchObject({ status: 403, sources: [{ tier: "tier2", phase: "isRequestAllowed", decision: "block", status: 403 }] });
    expect(refused!.sources[0]!.reason).toContain("refused by the isRequestAllowed policy");
    expectSaneLatencies(refused!);
  });

  it("names layers: one that passes the descent's response on, and one that answers itself", async () => {
    const upstream = await startUpstream();
    const { proxy, seen } = await audited({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => next(request),
        async (request, next) => (new URL(request.url).pathname === "/cached" ? new Response("from the cache") : next(request)),
      ],
    });
    const base = `https://api.test:${upstream.port}`;
    expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    expect((await fetchVia(proxy, `${base}/cached`)).text).toBe("from the cache");
    const [passed, answered] = await seen.count(2);
    // createHttpHooks' layers are one source: its handle runs them outermost first.
    expect(passed!.sources.map(({ source, phase, decision }) => `${source} ${phase} ${decision}`)).toEqual(["hooks handle allow", "declarative allowlist allow"]);
    expect(passed!.sources[0]!.ms).toBeGreaterThanOrEqual(passed!.sources[1]!.ms);
    expect(answered!.sources.map(({ source, phase, decision }) => `${source} ${phase} ${decision}`)).toEqual(["hooks handle answer"]);
    expect(answered).toMatchObject({ status: 200, rule: { rule: "handle" }, bytesDown: "from the cache".length });
    expect(upstream.hits()).toBe(1);
  });

  it("never holds a secret's value, even when the guest sends placeholders, a hook quotes the value and the request is redirected", async () => {
    const value = "s3cr3t-audit-value-0123456789";
    const upstream = await startUpstream();
    const { proxy, file, seen } = await audited({
      allowedInternalHosts: ["api.test"],
      secrets: { TOKEN: { hosts: ["api.test"], value } },
      replaceSecretsInQuery: true,
      isRequestAllowed: (request) => {
        if (new URL(request.url).pathname.startsWith("/deny")) throw new HttpRequestBlockedError(`refused with ${request.headers.get("authorization")}`);
        return true;
      },
    });
    const placeholder = proxy.guestEnv()["TOKEN"]!;
    const base = `https://api.test:${upstream.port}`;
    const headers = { authorization: `Bearer ${placeholder}` };
    const redirected = await fetchVia(proxy, `${base}/redirect?to=/echo&t=${placeholder}`, { headers });
    expect(redirected.status).toBe(200);
    expect(redirected.text).toContain(value);
    expect((await fetchVia(proxy, `${base}/deny/${value}`, { headers })).status).toBe(403);
    const [hop, denied] = await seen.count(2);
    expect(hop).toMatchObject({ status: 200, redirects: 1, url: `${base}/redirect` });
    expect(denied!.url).not.toContain(value);
    expect(denied!.reason).toMatch(/^refused with Bearer /);
    await proxy.close();
    const text = readFileSync(file, "utf8");
    expect(text).toContain("refused with Bearer");
    expect(text).not.toContain(value);
    expect(text).not.toContain(Buffer.from(value).toString("base64"));
    expect(JSON.stringify(seen.records)).not.toContain(value);
  });

  it("records a WebSocket upgrade's decision with the sources that spoke", async () => {
    const upstream = await startUpstream({ tls: false });
    const { proxy, seen } = await audited({ allowedInternalHosts: ["api.test"] });
    // The plain upstream answers 404, not 101: the upgrade is refused with a 502 after every check passed.
    expect(await plainVia(proxy, `http://api.test:${upstream.port}/socket`, { connection: "Upgrade", upgrade: "websocket" })).toBe(502);
    const [record] = await seen.count(1);
    expect(record).toMatchObject({ upgrade: true, status: 502, url: `http://api.test:${upstream.port}/socket`, sources: [{ source: "declarative", phase: "allowlist", decision: "allow" }] });
  });

  it("keeps serving when onDecision throws or rejects, and says so in the log", async () => {
    const upstream = await startUpstream();
    let calls = 0;
    const proxy = await startTestProxy(
      { allowedInternalHosts: ["api.test"] },
      {
        onDecision: (record) => {
          calls += 1;
          if (record.method === "GET") throw new Error("onDecision broke");
          return Promise.reject(new Error("onDecision rejected"));
        },
      },
    );
    const base = `https://api.test:${upstream.port}`;
    for (let i = 0; i < 3; i++) expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    expect((await fetchVia(proxy, `${base}/echo`, { method: "POST", body: "x" })).status).toBe(200);
    await proxy.close();
    expect(calls).toBe(4);
    expect(proxy.logs.filter((line) => line["level"] === "warn" && String(line["msg"]).startsWith("onDecision threw")).length).toBeGreaterThan(0);
  });

  // An embedder's callback may throw anything. Describing a value with no toString threw in the
  // proxy's own handler (a rejection's: the process ended); a record the callback changed was
  // what the metrics then counted.
  const hostile: [string, (record: AuditRecord) => unknown][] = [
    ["throws an object with no prototype", () => {
      throw Object.create(null);
    }],
    ["rejects with an object with no prototype", () => Promise.reject(Object.create(null) as Error)],
    ["throws an object whose toString throws", () => {
      throw { toString: () => { throw new Error("no"); } };
    }],
    ["throws an Error whose message throws when read", () => {
      throw Object.defineProperty(new Error(), "message", { get: () => { throw new Error("no"); } });
    }],
    ["changes the record's status", (record) => {
      (record as { status: number }).status = 999;
    }],
    ["makes the record's status a getter that throws", (record) => {
      Object.defineProperty(record, "status", { get: () => { throw new Error("no"); } });
    }],
  ];
  it.each(hostile)("an onDecision that %s: the guest is answered, the file and the metrics hold the real decision, and the proxy keeps serving", async (_name, onDecision) => {
    const upstream = await startUpstream();
    const file = join(tempDir(), "audit.jsonl");
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { auditLog: file, onDecision, metrics: true });
    const base = `https://api.test:${upstream.port}`;
    for (let i = 0; i < 2; i++) expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    const text = await proxy.metrics();
    expect(text).toMatch(/egressgate_requests_total\{[^}]*status_class="2xx"[^}]*\} 2\n/);
    expect(text).not.toContain('status_class="9xx"');
    await proxy.close();
    expect(lines(file).map((record) => record.status)).toEqual([200, 200]);
  });

  it("close() resolves with every record in the file", async () => {
    const upstream = await startUpstream();
    const { proxy, file, seen } = await audited({ allowedInternalHosts: ["api.test"] });
    const base = `https://api.test:${upstream.port}`;
    await Promise.all(Array.from({ length: 40 }, (_, i) => fetchVia(proxy, `${base}/echo?i=${i}`)));
    await seen.count(40);
    await proxy.close();
    expect(lines(file)).toHaveLength(40);
  });

  it("a file that cannot be written (a full disk) loses records with a warning, and the proxy keeps serving", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { auditLog: "/dev/full" });
    const base = `https://api.test:${upstream.port}`;
    for (let i = 0; i < 3; i++) expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    await proxy.close();
    const warnings = proxy.logs.filter((line) => line["level"] === "warn" && String(line["msg"]).startsWith("audit log"));
    expect(warnings.some((line) => line["error"] === "ENOSPC")).toBe(true);
  });

  // The records were counted, but only a rate-limited warning and the count at close() said so:
  // nothing an operator's alerting reads while the proxy runs.
  it("the records a full disk loses are counted in egressgate_audit_records_dropped_total while the proxy serves", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { auditLog: "/dev/full", metrics: true });
    const base = `https://api.test:${upstream.port}`;
    for (let i = 0; i < 3; i++) expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    // A failed write is known a turn or two after the record was made.
    const droppedReaches = async (n: number): Promise<void> => {
      const deadline = performance.now() + 5_000;
      for (;;) {
        const text = await proxy.metrics();
        if (text.includes(`\negressgate_audit_records_dropped_total ${n}\n`)) return;
        if (performance.now() > deadline) throw new Error(`egressgate_audit_records_dropped_total never reached ${n}:\n${text}`);
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
    };
    await droppedReaches(3);
    expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    await droppedReaches(4);
    // Without an audit log there is no such series.
    const plain = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { metrics: true });
    expect(await plain.metrics()).not.toContain("egressgate_audit_records_dropped_total");
  });

  it("a path that cannot be opened fails the start with the option's name", async () => {
    const dir = tempDir();
    await expect(startTestProxy({ allowedInternalHosts: ["api.test"] }, { auditLog: dir })).rejects.toMatchObject({
      code: "EG_INVALID_OPTION",
      message: expect.stringContaining("auditLog"),
    });
  });

  it("SIGUSR1 makes each proxy reopen its own file, and close() removes its handler", async () => {
    const upstream = await startUpstream();
    const base = `https://api.test:${upstream.port}`;
    const before = process.listenerCount("SIGUSR1");
    const a = await audited({ allowedInternalHosts: ["api.test"] });
    const b = await audited({ allowedInternalHosts: ["api.test"] });
    expect(process.listenerCount("SIGUSR1")).toBe(before + 2);
    for (const { proxy, seen } of [a, b]) {
      await fetchVia(proxy, `${base}/echo?before`);
      await seen.count(1);
    }
    for (const { file } of [a, b]) renameSync(file, `${file}.1`);
    // The listeners, as the signal runs them (a real signal would reach the worker's whole process).
    process.emit("SIGUSR1", "SIGUSR1");
    for (const { proxy, seen } of [a, b]) {
      await fetchVia(proxy, `${base}/echo?after`);
      await seen.count(2);
      await proxy.close();
    }
    expect(process.listenerCount("SIGUSR1")).toBe(before);
    for (const { file } of [a, b]) {
      expect(lines(`${file}.1`).map((r) => r.status)).toEqual([200]);
      expect(lines(file)).toHaveLength(1);
    }
  });

  it("a reopen that fails (the path became a directory) is warned about, and the proxy keeps serving", async () => {
    const upstream = await startUpstream();
    const base = `https://api.test:${upstream.port}`;
    const { proxy, file, seen } = await audited({ allowedInternalHosts: ["api.test"] }, { logLevel: "info" });
    renameSync(file, `${file}.1`);
    mkdirSync(file);
    process.emit("SIGUSR1", "SIGUSR1");
    expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    await seen.count(1);
    await proxy.close();
    expect(proxy.logs.some((line) => line["level"] === "warn" && String(line["msg"]).startsWith("audit log: a write failed") && line["error"] === "EISDIR")).toBe(true);
    // It was logged "reopened" as well, at once, whatever came of it.
    expect(proxy.logs.filter((line) => line["msg"] === "audit log reopened")).toEqual([]);
  });

  // README: bytesDown is the body bytes as sent. An HTTP/2 guest's HEAD got no body, yet its
  // record counted the hook-made one, piped into a stream Node had already ended (black-box
  // finding: 0 for HTTP/1.1 guests, the body's length for HTTP/2 ones).
  for (const guest of ["HTTP/1.1", "HTTP/2"] as const) {
    it(`counts no body for a HEAD answered by a hook's Response with one, on an ${guest} guest, and the body's length for a GET`, async () => {
      const upstream = await startUpstream();
      const { proxy, seen } = await audited({
        allowedInternalHosts: ["api.test"],
        hooks: [
          {
            onRequest: (request) => (new URL(request.url).pathname === "/answered" ? new Response("fifteen bytes..") : undefined),
            onResponse: () => new Response("replaced by onResponse"),
          },
        ],
      });
      const base = `https://api.test:${upstream.port}`;
      // One connection each: the four requests go in turn over it.
      const agent = proxyAgent(proxy);
      const session = guest === "HTTP/2" ? await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem) : undefined;
      const send = async (method: "GET" | "HEAD", path: string): Promise<{ status: number; body: string }> => {
        if (session === undefined) {
          const res = await request(`${base}${path}`, { dispatcher: agent, method });
          return { status: res.statusCode, body: await res.body.text() };
        }
        const res = await h2Request(session, { ":method": method, ":path": path });
        return { status: res.status, body: res.body.toString() };
      };
      expect(await send("HEAD", "/answered")).toEqual({ status: 200, body: "" });
      expect(await send("HEAD", "/echo")).toEqual({ status: 200, body: "" });
      expect(await send("GET", "/answered")).toEqual({ status: 200, body: "fifteen bytes.." });
      expect(await send("GET", "/echo")).toEqual({ status: 200, body: "replaced by onResponse" });
      const records = await seen.count(4);
      expect(records.map(({ method, url, status, bytesDown }) => ({ method, path: new URL(url).pathname, status, bytesDown }))).toEqual([
        { method: "HEAD", path: "/answered", status: 200, bytesDown: 0 },
        { method: "HEAD", path: "/echo", status: 200, bytesDown: 0 },
        { method: "GET", path: "/answered", status: 200, bytesDown: "fifteen bytes..".length },
        { method: "GET", path: "/echo", status: 200, bytesDown: "replaced by onResponse".length },
      ]);
      expect(records.every((record) => record.code === undefined)).toBe(true);
    });
  }
});

describe("close() and the requests its drain's end cuts", () => {
  // README: close() closes the audit log "last, so the records of the requests that drained are
  // in it". A response still streaming at the drain's end was decided only once its connection
  // and upstream had gone, after the file was closed ("audit log: records were lost"); a request
  // still in a hook or a policy call was decided when that call settled (up to hookMs or the
  // policy's timeoutMs), long after close() had resolved, and its record was lost without a word.
  const drainMs = 100;
  const drainCut = `the proxy closed the connection at the end of its drain (timeouts.drainMs, ${drainMs} ms)`;

  /** Where one request is when close() starts, and how the test knows it is there. */
  interface InFlight {
    readonly hooks: HttpHooksOptions;
    readonly path: string;
    /** The upstream's answer to `path`, when the default routes' is not the one. */
    readonly route?: Route;
    /** Settles once the request is there; `received` settles once the guest has the first bytes of its response's body. */
    reached(received: Promise<void>): Promise<void>;
    readonly expected: Record<string, unknown>;
  }
  const cut = { status: 499, reason: drainCut };
  const states: Record<string, () => InFlight> = {
    "its response still streaming": () => ({
      hooks: {},
      path: "/part",
      route: (_req, res) => void res.writeHead(200, { "content-length": "100" }).write("part of it"),
      reached: (received) => received,
      expected: { status: 200, error: expect.stringContaining(`${drainCut} before the response was complete`) },
    }),
    "a tier-3 hook still running": () => {
      const [inHook, hookHas] = latch();
      const [never, release] = latch();
      onTestFinished(() => release());
      const onRequest = async (): Promise<void> => {
        hookHas();
        await never;
      };
      return { hooks: { onRequest }, path: "/echo", reached: () => inHook, expected: cut };
    },
    "a tier-2 policy call still running": () => {
      // The call runs until its time limit (unhurriedMs): the request is in it from its start on,
      // which the start channel tells.
      const djsHooks = loadPolicy({ source: "export function onRequest() { for (;;) {} }", filename: "spin.mjs" });
      const [started, start] = latch();
      const onStart = (): void => start();
      subscribe("egressgate:request:start", onStart);
      onTestFinished(() => void unsubscribe("egressgate:request:start", onStart));
      return { hooks: { djsHooks }, path: "/echo", reached: () => started, expected: cut };
    },
    "its upstream not answered yet": () => {
      const [arrived, arrive] = latch();
      return { hooks: {}, path: "/never", route: () => arrive(), reached: () => arrived, expected: cut };
    },
  };

  /** Sends GET `path` on a guest of its kind; `received` settles once it has the first bytes of the response's body. */
  const guests: Record<string, (proxy: TestProxy, authority: string, path: string) => Promise<{ received: Promise<void> }>> = {
    "HTTP/1.1": async (proxy, authority, path) => {
      const guest = await openTlsTunnel(proxy.port, authority, { ca: proxy.caCertPem });
      const [received, receive] = latch();
      guest.socket.on("data", () => {
        if (guest.pending().includes("part of it")) receive();
      });
      guest.write(`GET ${path} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
      return { received };
    },
    "HTTP/2": async (proxy, authority, path) => {
      const session = await h2Session(proxy.port, authority, proxy.caCertPem);
      const stream = session.request({ ":method": "GET", ":path": path });
      stream.on("error", () => undefined);
      const [received, receive] = latch();
      stream.on("data", () => receive());
      return { received };
    },
  };

  for (const [guest, send] of Object.entries(guests)) {
    for (const [state, make] of Object.entries(states)) {
      it(`an ${guest} request with ${state} has its record in the file and its onDecision call once close() resolves`, async () => {
        const inFlight = make();
        const upstream = await startUpstream(inFlight.route === undefined ? {} : { routes: { [inFlight.path]: inFlight.route } });
        const { proxy, file, seen } = await audited({ allowedInternalHosts: ["api.test"], ...inFlight.hooks }, { timeouts: { drainMs } });
        const { received } = await send(proxy, `api.test:${upstream.port}`, inFlight.path);
        await inFlight.reached(received);
        await proxy.close();
        const records = lines(file);
        expect(records).toHaveLength(1);
        expect(records[0]).toMatchObject({ url: `https://api.test:${upstream.port}${inFlight.path}`, ...inFlight.expected });
        expect(seen.records).toHaveLength(1);
        expect(seen.records[0]).toMatchObject(inFlight.expected);
        expect(proxy.logs.filter((line) => String(line["msg"]).startsWith("audit log:"))).toEqual([]);
      });
    }
  }
});

/** The CLI under tsx, with its output kept; killed when the test finishes if it still runs. */
function startCli(args: readonly string[]): {
  child: ChildProcess;
  out: () => string;
  err: () => string;
  until: (check: () => boolean, what: string) => Promise<void>;
  exited: Promise<number | null>;
} {
  const child = spawn(process.execPath, ["--import", "tsx", "src/cli/bin.ts", ...args], {
    cwd: root,
    env: { ...process.env, HTTPS_PROXY: "", HTTP_PROXY: "", https_proxy: "", http_proxy: "" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  const waiters: Array<() => void> = [];
  const wake = (): void => waiters.splice(0).forEach((w) => w());
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => ((out += chunk), wake()));
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => ((err += chunk), wake()));
  const exited = new Promise<number | null>((resolve) => child.once("close", (code) => (wake(), resolve(code))));
  onTestFinished(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
  });
  const until = async (check: () => boolean, what: string): Promise<void> => {
    while (!check()) {
      if (child.exitCode !== null) throw new Error(`egressgate exited while waiting for ${what}\n${err}`);
      await new Promise<void>((resolve) => waiters.push(resolve));
    }
  };
  return { child, out: () => out, err: () => err, until, exited };
}

const listeningLine = /listening on (http:\/\/127\.0\.0\.1:\d+)/;

describe("--audit-log", () => {
  it("the CLI appends records to the file, and SIGUSR1 after a rename sends new lines to a fresh file at the path", async () => {
    const upstream = await startUpstream();
    const dir = tempDir();
    const file = join(dir, "audit.jsonl");
    const caFile = join(dir, "upstream-ca.pem");
    writeFileSync(caFile, (await testCa()).certPem);
    const caDir = join(dir, "ca");
    const { child, out, err, until, exited } = startCli([
      "--listen", "127.0.0.1:0", "--ca-dir", caDir, "--upstream-ca", caFile, "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--audit-log", file, "--log-level", "info",
    ]);
    const count = (pattern: RegExp): number => err().split("\n").filter((line) => pattern.test(line)).length;
    await until(() => listeningLine.test(out()), "the listening line");
    const url = listeningLine.exec(out())![1]!;
    const via = { url, caCertPem: readFileSync(join(caDir, "ca.crt"), "utf8") } as TestProxy;
    const base = `https://api.test:${upstream.port}`;
    expect((await fetchVia(via, `${base}/echo?first`)).status).toBe(200);
    // The decision line follows the record's append, so the record is queued on the old file.
    await until(() => count(/"msg":"request"/) >= 1, "the first decision line");
    renameSync(file, `${file}.1`);
    child.kill("SIGUSR1");
    await until(() => count(/"msg":"audit log reopened"/) === 1, "the reopen line");
    expect((await fetchVia(via, `${base}/echo?second`)).status).toBe(200);
    await until(() => count(/"msg":"request"/) >= 2, "the second decision line");
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
    expect(lines(`${file}.1`)).toMatchObject([{ method: "GET", url: `${base}/echo`, status: 200 }]);
    expect(lines(file)).toMatchObject([{ method: "GET", url: `${base}/echo`, status: 200 }]);
  });
});

// The README calls a FIFO a valid target (a log shipper's). Opened with a blocking open(), the
// retry after the shipper went away, and each logrotate SIGUSR1 after it, held a libuv threadpool
// thread in open(); after four, every lookup through the system resolver (on those threads) got
// 504 "DNS lookup … took longer than 5000 ms", and SIGTERM never ended the process (black-box
// finding). A blocking write to a shipper that stopped reading held the exit the same way.
describe("--audit-log on a FIFO", { timeout: 60_000 }, () => {
  const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
  const drainMs = 2_000;
  const ok: Route = (_req, res) => void res.end("ok\n");

  /** The CLI writing its audit log to a FIFO that a FifoReader of this test reads. */
  async function auditedByFifo(): Promise<{
    fifo: string;
    reader: FifoReader;
    cli: ReturnType<typeof startCli>;
    via: TestProxy;
    base: string;
    upstreamPort: number;
  }> {
    const upstream = await startUpstream({ tls: false, routes: { "/one": ok, "/two": ok, "/three": ok, "/four": ok, "/five": ok, "/back": ok } });
    const dir = tempDir();
    const fifo = makeFifo();
    // The shipper first, as the README says: the start waits for a reader.
    const reader = new FifoReader(fifo);
    const config = join(dir, "egressgate.json");
    // localhost is left to the system resolver (its hosts file): the lookup runs on the threadpool.
    writeFileSync(config, JSON.stringify({ caDir: join(dir, "ca"), allowInternalHosts: ["api.test", "localhost"], resolve: { "api.test": ["127.0.0.1"] }, auditLog: fifo, timeouts: { drainMs } }));
    const cli = startCli(["--listen", "127.0.0.1:0", "--config", config, "--log-level", "info"]);
    await cli.until(() => listeningLine.test(cli.out()), "the listening line");
    const via = { port: Number(new URL(listeningLine.exec(cli.out())![1]!).port) } as TestProxy;
    return { fifo, reader, cli, via, base: `http://api.test:${upstream.port}`, upstreamPort: upstream.port };
  }

  /** The shipper goes away; the next record fails, one more after the retry delay reopens, and four SIGUSR1 reopen again. */
  async function shipperGone(setup: Awaited<ReturnType<typeof auditedByFifo>>): Promise<void> {
    const { reader, cli, via, base } = setup;
    expect(await plainVia(via, `${base}/one`)).toBe(200);
    await eventually(() => reader.records().length === 1, "the first record at the shipper");
    reader.close();
    expect(await plainVia(via, `${base}/two`)).toBe(200);
    // Past the retry delay (1 s): this record opens the FIFO again.
    await sleep(1_100);
    expect(await plainVia(via, `${base}/three`)).toBe(200);
    // Apart: signals sent together merge into one.
    for (let i = 0; i < 4; i++) {
      cli.child.kill("SIGUSR1");
      await sleep(200);
    }
  }

  it("whose reader went away: the proxy keeps answering through logrotate reopens, and a reader that comes back gets the records made after it came", async () => {
    const setup = await auditedByFifo();
    const { fifo, cli, via, base, upstreamPort } = setup;
    await shipperGone(setup);
    expect(await within(plainVia(via, `${base}/four`), "a request to a name from resolve")).toBe(200);
    // Through the system resolver: it waited for a threadpool thread, and got 504 after 5 s.
    expect(await within(plainVia(via, `http://localhost:${upstreamPort}/five`), "a request to localhost", 4_500)).toBe(200);
    expect(cli.err()).toContain('"msg":"audit log: the FIFO has no reader; records are dropped until one opens it"');
    expect(cli.err()).toContain('"error":"EPIPE"');
    // Every record so far is made (its decision line follows the append) and dropped before the reader comes back.
    await cli.until(() => cli.err().split("\n").filter((line) => line.includes('"msg":"request"')).length === 5, "the fifth decision line");
    await sleep(300);
    const back = new FifoReader(fifo);
    // The first record a second after the last failed open opens the FIFO again.
    for (let tries = 0; back.records().length === 0; tries++) {
      if (tries === 25) throw new Error("no record reached the reader that came back in 5 s");
      expect(await plainVia(via, `${base}/back`)).toBe(200);
      await sleep(200);
    }
    const urls = back.records<AuditRecord>().map((record) => record.url);
    expect(urls.length).toBeGreaterThan(0);
    expect(new Set(urls)).toEqual(new Set([`${base}/back`]));
    cli.child.kill("SIGTERM");
    expect(await within(cli.exited, "the exit after SIGTERM", drainMs + 3_000)).toBe(0);
  });

  it("whose reader went away: SIGTERM ends the process without waiting out drainMs, counting the records lost", async () => {
    const setup = await auditedByFifo();
    const { cli } = setup;
    await shipperGone(setup);
    cli.child.kill("SIGTERM");
    // It stayed up for good: each reopen's open() was still waiting for a reader.
    expect(await within(cli.exited, "the exit after SIGTERM", drainMs + 3_000)).toBe(0);
    // Nothing waited for drainMs: no record was left to hand over.
    expect(cli.err()).not.toContain("closing without them");
    const lost = cli.err().split("\n").filter((line) => line.includes('"msg":"audit log: records were lost while it ran"'));
    expect(lost).toHaveLength(1);
    expect((JSON.parse(lost[0]!) as { dropped: number }).dropped).toBe(2);
  });

  it("whose reader stopped reading: SIGTERM ends the process within drainMs, counting each record not handed over", async () => {
    const { reader, cli, via, base } = await auditedByFifo();
    // Over 1 KiB a record (the URL is cut at 1024 characters), 150 KiB in all: more than the
    // pipe's 64 KiB, which the reader never empties.
    const requests = 120;
    for (let i = 0; i < requests; i++) expect(await plainVia(via, `${base}/${"x".repeat(1_100)}${i}`)).toBe(404);
    await cli.until(() => cli.err().split("\n").filter((line) => line.includes('"msg":"request"')).length === requests, "every decision line");
    const started = performance.now();
    cli.child.kill("SIGTERM");
    // A write waiting for room in the pipe held the exit for good.
    expect(await within(cli.exited, "the exit after SIGTERM", drainMs + 3_000)).toBe(0);
    expect(performance.now() - started).toBeGreaterThan(drainMs - 500);
    expect(cli.err()).toContain('"msg":"audit log: the disk did not take the last records in time; closing without them"');
    const lost = cli.err().split("\n").find((line) => line.includes('"msg":"audit log: records were lost while it ran"'));
    const handedOver = reader.read().split("\n").length - 1;
    expect(handedOver).toBeGreaterThan(0);
    expect((JSON.parse(lost!) as { dropped: number }).dropped).toBe(requests - handedOver);
  });
});
