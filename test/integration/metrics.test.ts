import { spawn } from "node:child_process";
import { subscribe, unsubscribe } from "node:diagnostics_channel";
import { createServer as createHttpServer, request as httpRequest, Agent } from "node:http";
import type { ServerHttp2Session } from "node:http2";
import { connect } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { HttpRequestBlockedError, OptionError, type AuditRecord } from "../../src/index.js";
import { loadPolicy } from "../helpers/djs.js";
import { fetchVia, startTestProxy, tempDir, type TestProxy } from "../helpers/proxy.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { startH2Upstream } from "../helpers/h2-upstream.js";
import { heldHttpUpstream, listenForTest, plainGet as get, startUpstream } from "../helpers/upstream.js";
import { basic, credentialsOf, startGuestsProxy } from "../helpers/guests.js";
import { createHttpHooks } from "../../src/index.js";

const root = fileURLToPath(new URL("../../", import.meta.url));

/** Every record published on egressgate:request:end, with a wait for the nth. */
function ends(): { records: AuditRecord[]; count: (n: number) => Promise<void> } {
  const records: AuditRecord[] = [];
  const waiters: Array<{ n: number; resolve: () => void }> = [];
  const listener = (message: unknown): void => {
    records.push(message as AuditRecord);
    for (const waiter of waiters.filter((w) => records.length >= w.n)) waiter.resolve();
  };
  subscribe("egressgate:request:end", listener);
  onTestFinished(() => void unsubscribe("egressgate:request:end", listener));
  return { records, count: (n) => (records.length >= n ? Promise.resolve() : new Promise((resolve) => waiters.push({ n, resolve }))) };
}


/** A plain forward-proxy request (absolute form). */
function plainVia(proxy: TestProxy, url: string, agent?: Agent): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: "127.0.0.1", port: proxy.port, path: url, headers: { host: new URL(url).host }, ...(agent !== undefined ? { agent } : {}) });
    req.on("response", (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("error", reject);
    req.end();
  });
}

/** The value of one series line, `name{labels} value`; labels given in any order must all match. */
function sample(text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const wanted = Object.entries(labels).every(([key, value]) => line.includes(`${key}="${value}"`));
    if (wanted) return Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return undefined;
}

function seriesOf(text: string, name: string): string[] {
  return text.split("\n").filter((line) => line.startsWith(`${name}{`) || line.startsWith(`${name} `));
}

describe("metrics", () => {
  // It rejected with a plain TypeError, without the code every other error of the embedding API has.
  it("proxy.metrics() on a proxy started without metrics rejects with EG_INVALID_OPTION at path metrics, and the proxy goes on serving", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const thrown = await proxy.metrics().then(
      () => undefined,
      (error: unknown) => error,
    );
    expect(thrown).toBeInstanceOf(TypeError);
    expect(thrown).toBeInstanceOf(OptionError);
    expect(thrown).toMatchObject({ code: "EG_INVALID_OPTION", path: "metrics", message: "metrics: start the proxy with metrics: true or metricsListen" });
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
  });

  it("a secret's refusal at a redirect hop, or under a header named like a secret, counts as the secrets' rule and under the secret's configured name", async () => {
    const upstream = await startUpstream({ names: ["api.test", "other.test"] });
    const seen = ends();
    const proxy = await startTestProxy(
      { allowedInternalHosts: ["api.test", "other.test"], secrets: { TOKEN: { hosts: ["api.test"], value: "s3cret-value" } } },
      { metricsListen: "127.0.0.1:0", logLevel: "warn" },
    );
    const placeholder = proxy.guestEnv()["TOKEN"]!;
    const hop = encodeURIComponent(`https://other.test:${upstream.port}/echo`);
    // Substituted for api.test, then carried by the redirect to other.test in the same header.
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/redirect?to=${hop}`, { headers: { "x-k": placeholder } })).status).toBe(403);
    // The reason names the header ("x-secret carries …"): the label is the secret's own name.
    expect((await fetchVia(proxy, `https://other.test:${upstream.port}/echo`, { headers: { "x-secret": placeholder } })).status).toBe(403);
    await seen.count(2);
    for (const record of seen.records) expect(record.sources.find((s) => s.phase === "secrets")).toMatchObject({ decision: "block", secret: "TOKEN" });
    const { text } = await get(`${proxy.metricsUrl}/metrics`);
    expect(sample(text, "egressgate_requests_total", { decision: "deny", rule: "declarative:secrets" })).toBe(2);
    expect(seriesOf(text, "egressgate_secret_refusals_total")).toEqual(['egressgate_secret_refusals_total{secret="TOKEN"} 2']);
  });

  it("counts allowed, denied and failing requests by guest, decision, status class and rule, with hook and secret series", async () => {
    const upstream = await startUpstream();
    const seen = ends();
    const proxy = await startTestProxy(
      {
        allowedInternalHosts: ["api.test"],
        secrets: { TOKEN: { hosts: ["other.test"], value: "s3cret-value" } },
        onRequest: (request) => {
          if (request.url.endsWith("/blocked")) throw new HttpRequestBlockedError("no");
          if (request.url.endsWith("/boom")) throw new Error("the hook broke");
          return undefined;
        },
      },
      { metricsListen: "127.0.0.1:0", logLevel: "warn" },
    );
    expect(proxy.metricsUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const base = `https://api.test:${upstream.port}`;
    expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    expect((await fetchVia(proxy, `${base}/echo`, { method: "POST", body: "12345" })).status).toBe(200);
    expect((await fetchVia(proxy, `${base}/blocked`)).status).toBe(403);
    expect((await fetchVia(proxy, `${base}/boom`)).status).toBe(502);
    const env = proxy.guestEnv();
    expect((await fetchVia(proxy, `${base}/echo`, { headers: { authorization: `Bearer ${env["TOKEN"]}` } })).status).toBe(403);
    expect(await plainVia(proxy, "http://nowhere.test/x")).toBe(403);
    await seen.count(6);

    const { status, text } = await get(`${proxy.metricsUrl}/metrics`);
    expect(status).toBe(200);
    expect(sample(text, "egressgate_requests_total", { guest: "default", decision: "allow", status_class: "2xx", rule: "allowedHosts:api.test" })).toBe(2);
    expect(sample(text, "egressgate_requests_total", { decision: "deny", status_class: "4xx", rule: "hooks:onRequest" })).toBe(1);
    expect(sample(text, "egressgate_requests_total", { decision: "error", status_class: "5xx", rule: "hooks:onRequest" })).toBe(1);
    expect(sample(text, "egressgate_requests_total", { decision: "deny", rule: "declarative:secrets" })).toBe(1);
    expect(sample(text, "egressgate_requests_total", { decision: "deny", rule: "declarative:allowlist" })).toBe(1);
    expect(sample(text, "egressgate_secret_refusals_total", { secret: "TOKEN" })).toBe(1);
    expect(sample(text, "egressgate_hook_failures_total", { source: "hooks", kind: "throw" })).toBe(1);
    expect(sample(text, "egressgate_hook_duration_seconds_count", { source: "hooks", phase: "onRequest" })).toBeGreaterThanOrEqual(4);
    expect(sample(text, "egressgate_request_duration_seconds_count", { decision: "allow" })).toBe(2);
    expect(sample(text, "egressgate_upstream_duration_seconds_count")).toBe(2);
    expect(sample(text, "egressgate_bytes_total", { direction: "up" })).toBe(5);
    expect(sample(text, "egressgate_bytes_total", { direction: "down" })).toBeGreaterThan(0);
    // Five CONNECTs to api.test: one leaf signed, then served from the cache.
    expect(sample(text, "egressgate_certificate_cache_misses_total")).toBe(1);
    expect(sample(text, "egressgate_certificate_cache_hits_total")).toBeGreaterThanOrEqual(1);
    expect(sample(text, "egressgate_open_tunnels")).toBeGreaterThanOrEqual(0);
    expect(sample(text, "egressgate_process_resident_memory_bytes")).toBeGreaterThan(0);
    expect(sample(text, "egressgate_nodejs_eventloop_lag_seconds")).toBeGreaterThanOrEqual(0);
    // No reason text or hostname in any label.
    expect(text).not.toContain("nowhere.test");
    expect(text).not.toContain("s3cret-value");
    // proxy.metrics() is the same registry.
    expect(sample(await proxy.metrics(), "egressgate_requests_total", { decision: "allow", rule: "allowedHosts:api.test" })).toBe(2);
  });

  it("counts open upstream connections by guest and protocol: up while the pools hold one, down once the upstream closes it", async () => {
    // A plain HTTP/1.1 upstream that can close its idle keep-alive connections on demand.
    const h1 = createHttpServer((req, res) => {
      req.resume();
      res.end("ok");
    });
    const h1Port = await listenForTest(h1);
    const h2 = await startH2Upstream();
    const h2Sessions = new Set<ServerHttp2Session>();
    h2.server.on("session", (session: ServerHttp2Session) => {
      h2Sessions.add(session);
      session.once("close", () => h2Sessions.delete(session));
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { metrics: true, logLevel: "warn" });
    const open = async (protocol: string): Promise<number> => sample(await proxy.metrics(), "egressgate_upstream_connections", { guest: "default", protocol }) ?? 0;
    /** Polls the gauge until it reads `value` (a bound for a loaded machine, not a timing claim). */
    const reaches = async (protocol: string, value: number): Promise<number> => {
      let now = await open(protocol);
      for (let tries = 0; now !== value && tries < 400; tries++) {
        await new Promise((resolve) => setTimeout(resolve, 25));
        now = await open(protocol);
      }
      return now;
    };
    expect(await open("h1")).toBe(0);
    expect(await plainVia(proxy, `http://api.test:${h1Port}/`)).toBe(200);
    // The response is done; the pool keeps its connection for the next request.
    expect(await open("h1")).toBe(1);
    h1.closeIdleConnections();
    expect(await reaches("h1", 0)).toBe(0);

    expect((await fetchVia(proxy, `https://api.test:${h2.port}/echo`)).status).toBe(200);
    expect(await open("h2")).toBe(1);
    expect((await fetchVia(proxy, `https://api.test:${h2.port}/echo`)).status).toBe(200);
    // Streams share the session: still one connection.
    expect(await open("h2")).toBe(1);
    for (const session of h2Sessions) session.close();
    expect(await reaches("h2", 0)).toBe(0);
  });

  it("drops a removed guest's upstream-connections series once its connections close, and keeps the kept guest's", async () => {
    const h1 = createHttpServer((req, res) => {
      req.resume();
      res.end("ok");
    });
    const h1Port = await listenForTest(h1);
    const proxy = await startGuestsProxy({ keep: { allowedInternalHosts: ["api.test"] }, drop: { allowedInternalHosts: ["api.test"] } }, { logLevel: "warn", metrics: true });
    /** A plain forward-proxy GET as `guest`: its pool keeps the upstream connection afterwards. */
    const getAs = (guest: string): Promise<number> => {
      const { user, token } = credentialsOf(proxy, guest);
      return new Promise((resolve, reject) => {
        const url = `http://api.test:${h1Port}/`;
        const req = httpRequest({ host: "127.0.0.1", port: proxy.port, path: url, agent: false, headers: { host: `api.test:${h1Port}`, "proxy-authorization": basic(user, token) } });
        req.on("response", (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode ?? 0));
        });
        req.on("error", reject);
        req.end();
      });
    };
    const open = async (guest: string): Promise<number | undefined> => sample(await proxy.metrics(), "egressgate_upstream_connections", { guest, protocol: "h1" });
    expect(await getAs("keep")).toBe(200);
    expect(await getAs("drop")).toBe(200);
    expect(await open("keep")).toBe(1);
    expect(await open("drop")).toBe(1);
    const hooks = createHttpHooks({ allowedInternalHosts: ["api.test"] });
    await proxy.reload({ guests: { keep: { httpHooks: hooks.httpHooks, env: hooks.env } }, resolve: { "api.test": ["127.0.0.1"] } });
    // The removed guest's pool is destroyed; its series goes once the close is counted (polled: a
    // bound for a loaded machine, not a timing claim).
    let dropped = await open("drop");
    for (let tries = 0; dropped !== undefined && tries < 400; tries++) {
      await new Promise((resolve) => setTimeout(resolve, 25));
      dropped = await open("drop");
    }
    expect(dropped).toBeUndefined();
    // The kept guest's pool was retired by the reload (its connection closes once idle), and its
    // series stays, at whatever it holds now (undefined would fail the comparison), and counts its
    // next connection.
    expect(await open("keep")).toBeGreaterThanOrEqual(0);
    expect(await getAs("keep")).toBe(200);
    expect(await open("keep")).toBeGreaterThanOrEqual(1);
  });

  // Every guest ever added kept its egressgate_requests_total series: rounds of adding a guest,
  // five requests and removing it grew the exposition from 11 to 120 KB (black-box finding).
  describe.each([
    { how: "removeGuest, with a scrape after each", by: "remove", scrapeEach: true },
    { how: "removeGuest, with no scrape until the end", by: "remove", scrapeEach: false },
    { how: "a reload that drops it, with a scrape after each", by: "reload", scrapeEach: true },
  ] as const)("a removed guest's request series ($how)", ({ by, scrapeEach }) => {
    it("are counted until its last request, then dropped: the series follow the guests served, not every guest ever added", async () => {
      const upstream = await startUpstream({ tls: false });
      const proxy = await startGuestsProxy({ base: { allowedInternalHosts: ["api.test"] } }, { logLevel: "warn", metrics: true });
      const base = createHttpHooks({ allowedInternalHosts: ["api.test"] });
      const resolve = { "api.test": ["127.0.0.1"], "b.test": ["127.0.0.1"] };
      /** Absolute-form GETs as `guest`: one allowed (200), one refused by the allowlist (403). */
      const ask = async (guest: string): Promise<number[]> => {
        const { user, token } = credentialsOf(proxy, guest);
        const one = (host: string): Promise<number> =>
          new Promise((done, reject) => {
            const req = httpRequest({ host: "127.0.0.1", port: proxy.port, path: `http://${host}:${upstream.port}/echo`, agent: false, headers: { host: `${host}:${upstream.port}`, "proxy-authorization": basic(user, token) } });
            req.on("response", (res) => {
              res.resume();
              res.on("end", () => done(res.statusCode ?? 0));
            });
            req.on("error", reject);
            req.end();
          });
        return [await one("api.test"), await one("b.test"), await one("api.test")];
      };
      const guestsIn = (text: string): Map<string, number> => {
        const counts = new Map<string, number>();
        for (const line of seriesOf(text, "egressgate_requests_total")) {
          const guest = /guest="([^"]*)"/.exec(line)![1]!;
          counts.set(guest, (counts.get(guest) ?? 0) + Number(line.slice(line.lastIndexOf(" ") + 1)));
        }
        return counts;
      };
      expect(await ask("base")).toEqual([200, 403, 200]);
      let most = 0;
      for (let i = 0; i < 40; i++) {
        const name = `job-${i}`;
        const hooks = createHttpHooks({ allowedInternalHosts: ["api.test"] });
        if (by === "remove") proxy.addGuest(name, { httpHooks: hooks.httpHooks, env: hooks.env });
        else await proxy.reload({ guests: { base: { httpHooks: base.httpHooks, env: base.env }, [name]: { httpHooks: hooks.httpHooks, env: hooks.env } }, resolve });
        expect(await ask(name)).toEqual([200, 403, 200]);
        if (by === "remove") await proxy.removeGuest(name);
        else await proxy.reload({ guests: { base: { httpHooks: base.httpHooks, env: base.env } }, resolve });
        if (!scrapeEach) continue;
        const seen = guestsIn(await proxy.metrics());
        // Its requests are all counted in the scrape after its removal, and its predecessors are gone.
        expect(seen.get(name)).toBe(3);
        most = Math.max(most, seen.size);
      }
      // At most the guest served and the one just removed: 41 guests were added.
      if (scrapeEach) expect(most).toBe(2);
      await proxy.metrics();
      const after = guestsIn(await proxy.metrics());
      expect([...after.keys()]).toEqual(["base"]);
      expect(after.get("base")).toBe(3);
      // A name served again starts from nothing.
      const again = createHttpHooks({ allowedInternalHosts: ["api.test"] });
      if (by === "remove") proxy.addGuest("job-0", { httpHooks: again.httpHooks, env: again.env });
      else await proxy.reload({ guests: { base: { httpHooks: base.httpHooks, env: base.env }, "job-0": { httpHooks: again.httpHooks, env: again.env } }, resolve });
      expect(await ask("job-0")).toEqual([200, 403, 200]);
      expect(guestsIn(await proxy.metrics()).get("job-0")).toBe(3);
    });
  });

  it("counts hook failures by the kind the sandbox and the hook runner report: time, memory, stack, throw and invalid, in both tiers", async () => {
    const upstream = await startUpstream();
    // The time limit only where the test is about it: on a loaded machine a short limit could
    // end any other call as "time" too.
    const timed = loadPolicy({ filename: "timed.js", source: 'function onRequest(request) { if (new URL(request.url).pathname === "/t2/time") { for (;;) {} } }', limits: { timeoutMs: 50 } });
    const kinds = loadPolicy({
      filename: "kinds.js",
      limits: { memoryBytes: 4 * 1024 * 1024 },
      source: `
        function deep(n) { return deep(n + 1) + 1; }
        function onRequest(request) {
          const path = new URL(request.url).pathname;
          if (path === "/t2/memory") { const hold = []; for (;;) hold.push("x".repeat(1 << 16) + hold.length); }
          if (path === "/t2/stack") return deep(0);
          if (path === "/t2/throw") throw new TypeError("the policy broke");
          if (path === "/t2/invalid") return 42;
        }`,
    });
    const tier3 = {
      onRequest: (request: Request): unknown => {
        const path = new URL(request.url).pathname;
        if (path === "/t3/time") return new Promise(() => undefined);
        if (path === "/t3/stack") {
          const deep = (n: number): number => deep(n + 1) + 1;
          return deep(0);
        }
        if (path === "/t3/throw") throw new Error("the hook broke");
        if (path === "/t3/invalid") return 42;
        return undefined;
      },
    };
    // The 50 ms policy alone on a proxy of its own, so that no other request meets its limit.
    const timedProxy = await startTestProxy({ allowedInternalHosts: ["api.test"], djsHooks: timed }, { metrics: true, logLevel: "warn" });
    // The default hook deadline here: timeouts.hookMs also bounds a tier-2 call's wait for a
    // worker, and the worker that met the memory limit builds a fresh runtime before it takes the
    // next call, which on a loaded machine took past a short deadline (504 for /t2/stack).
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [kinds, tier3 as never] }, { metrics: true, logLevel: "warn" });
    // The tier-3 deadline row on a proxy of its own with a short deadline, the same chain (so the
    // same `hooks[1]` label), and no tier-2 failure before it.
    const deadlineProxy = await startTestProxy(
      { allowedInternalHosts: ["api.test"], hooks: [kinds, tier3 as never] },
      { metrics: true, logLevel: "warn", timeouts: { hookMs: 200 } },
    );
    const base = `https://api.test:${upstream.port}`;
    expect((await fetchVia(timedProxy, `${base}/t2/time`)).status).toBe(502);
    for (const path of ["/t2/memory", "/t2/stack", "/t2/throw", "/t2/invalid", "/t3/stack", "/t3/throw", "/t3/invalid"]) {
      expect([path, (await fetchVia(proxy, `${base}${path}`)).status]).toEqual([path, 502]);
    }
    // A tier-3 hook that never settles is answered 504 at its deadline.
    expect((await fetchVia(deadlineProxy, `${base}/t3/time`)).status).toBe(504);
    const text = await proxy.metrics();
    const failures = (source: string, kind: string): number | undefined => sample(text, "egressgate_hook_failures_total", { source, kind });
    // A policy's source label is its file, resolved.
    const kindsJs = join(root, "kinds.js");
    expect(sample(await timedProxy.metrics(), "egressgate_hook_failures_total", { source: join(root, "timed.js"), kind: "time" })).toBe(1);
    expect(failures(kindsJs, "memory")).toBe(1);
    expect(failures(kindsJs, "stack")).toBe(1);
    expect(failures(kindsJs, "throw")).toBe(1);
    expect(failures(kindsJs, "invalid")).toBe(1);
    expect(sample(await deadlineProxy.metrics(), "egressgate_hook_failures_total", { source: "hooks[1]", kind: "time" })).toBe(1);
    expect(failures("hooks[1]", "time")).toBeUndefined();
    expect(failures("hooks[1]", "stack")).toBe(1);
    expect(failures("hooks[1]", "throw")).toBe(1);
    expect(failures("hooks[1]", "invalid")).toBe(1);
    // Seven failures here, seven counts: none counted twice or under another kind.
    const total = seriesOf(text, "egressgate_hook_failures_total").reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(" ") + 1)), 0);
    expect(total).toBe(7);
  });

  it("times the upstream alone: a request a hook answered adds no upstream time, one sent upstream adds each hop's exchange, within its total", async () => {
    const upstream = await startUpstream();
    const seen = ends();
    const proxy = await startTestProxy(
      {
        allowedInternalHosts: ["api.test"],
        onRequest: (request) => (new URL(request.url).pathname === "/answered" ? new Response("from the hook") : undefined),
      },
      { metrics: true, logLevel: "warn" },
    );
    const base = `https://api.test:${upstream.port}`;
    expect((await fetchVia(proxy, `${base}/answered`)).status).toBe(200);
    expect((await fetchVia(proxy, `${base}/redirect?to=/echo`)).status).toBe(200);
    await seen.count(2);
    const [answered, redirected] = seen.records;
    expect(answered!.rule?.tier).toBe("tier3");
    expect(answered!.upstreamMs).toBeUndefined();
    expect(redirected!.redirects).toBe(1);
    expect(redirected!.upstreamMs).toBeGreaterThan(0);
    expect(redirected!.upstreamMs!).toBeLessThanOrEqual(redirected!.ms + 0.1);
    const text = await proxy.metrics();
    // Both were allowed; only the one that went upstream has an upstream time.
    expect(sample(text, "egressgate_request_duration_seconds_count", { decision: "allow" })).toBe(2);
    expect(sample(text, "egressgate_upstream_duration_seconds_count")).toBe(1);
    expect(sample(text, "egressgate_upstream_duration_seconds_sum")).toBeCloseTo(redirected!.upstreamMs! / 1000, 4);
  });

  it("serves /healthz and /readyz, 404 elsewhere, and the listener closes with the proxy", async () => {
    const proxy = await startTestProxy({ allowedHosts: ["x.test"] }, { metricsListen: "127.0.0.1:0", logLevel: "warn" });
    expect(await get(`${proxy.metricsUrl}/healthz`)).toEqual({ status: 200, text: "ok\n" });
    expect(await get(`${proxy.metricsUrl}/readyz`)).toEqual({ status: 200, text: "ready\n" });
    expect((await get(`${proxy.metricsUrl}/nope`)).status).toBe(404);
    await proxy.close();
    await expect(get(`${proxy.metricsUrl}/healthz`)).rejects.toThrow();
  });

  it("its own thread refuses other methods (405 with Allow), answers HEAD without a body, ignores a query, and keeps serving after garbage on a raw socket", async () => {
    const proxy = await startTestProxy({ allowedHosts: ["x.test"] }, { metricsListen: "127.0.0.1:0", logLevel: "warn" });
    try {
      const url = new URL(proxy.metricsUrl!);
      const ask = (method: string, path: string): Promise<{ status: number; allow: string | undefined; length: string | undefined; text: string }> =>
        new Promise((resolve, reject) => {
          httpRequest({ host: url.hostname, port: url.port, method, path }, (res) => {
            let text = "";
            res.setEncoding("utf8");
            res.on("data", (chunk: string) => (text += chunk));
            res.on("end", () => resolve({ status: res.statusCode ?? 0, allow: res.headers["allow"], length: res.headers["content-length"], text }));
          })
            .on("error", reject)
            .end();
        });
      expect(await ask("POST", "/metrics")).toMatchObject({ status: 405, allow: "GET, HEAD" });
      expect(await ask("HEAD", "/healthz")).toEqual({ status: 200, allow: undefined, length: "3", text: "" });
      expect(await ask("GET", "/readyz?probe=1")).toMatchObject({ status: 200, text: "ready\n" });
      const scraped = await ask("GET", "/metrics?x=y");
      expect(scraped.status).toBe(200);
      expect(scraped.text).toContain("egressgate_requests_total");
      // Not HTTP at all: the listener drops that connection and serves the next one.
      await new Promise<void>((resolve) => {
        const socket = connect(Number(url.port), url.hostname, () => socket.end("\u0000\u0001 garbage\r\n\r\n"));
        socket.on("error", () => undefined);
        socket.on("close", () => resolve());
        socket.resume();
      });
      expect(await get(`${proxy.metricsUrl}/healthz`)).toEqual({ status: 200, text: "ok\n" });
    } finally {
      await proxy.close();
    }
  });

  it("while close() drains a request in flight, /readyz answers 503 and /metrics still serves; the listener closes after the drain", async () => {
    const held = await heldHttpUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { metricsListen: "127.0.0.1:0", logLevel: "warn" });
    const inFlight = plainVia(proxy, `http://api.test:${held.port}/held`);
    await held.arrived;
    const closed = proxy.close();
    expect(await get(`${proxy.metricsUrl}/readyz`)).toEqual({ status: 503, text: "not ready\n" });
    expect(await get(`${proxy.metricsUrl}/healthz`)).toEqual({ status: 200, text: "ok\n" });
    expect((await get(`${proxy.metricsUrl}/metrics`)).status).toBe(200);
    held.release();
    expect(await inFlight).toBe(200);
    await closed;
    await expect(get(`${proxy.metricsUrl}/readyz`)).rejects.toThrow();
  });

  it("keeps the series count fixed across 1,000 distinct hostnames under one wildcard rule", async () => {
    const upstream = await startUpstream({ tls: false });
    const names = Array.from({ length: 1000 }, (_, i) => `h${i}.wild.test`);
    const seen = ends();
    const proxy = await startTestProxy(
      { allowedInternalHosts: ["*.wild.test"] },
      { metrics: true, logLevel: "warn", resolve: Object.fromEntries(names.map((name) => [name, ["127.0.0.1"]])) },
    );
    const agent = new Agent({ keepAlive: true, maxSockets: 8 });
    onTestFinished(() => agent.destroy());
    for (const name of names.slice(0, 10)) expect(await plainVia(proxy, `http://${name}:${upstream.port}/echo`, agent)).toBe(200);
    await seen.count(10);
    const before = (await proxy.metrics()).split("\n").filter((line) => line.startsWith("egressgate_requests_total{") || line.startsWith("egressgate_request_duration")).length;
    for (let i = 10; i < names.length; i += 20) {
      await Promise.all(names.slice(i, i + 20).map(async (name) => expect(await plainVia(proxy, `http://${name}:${upstream.port}/echo`, agent)).toBe(200)));
    }
    await seen.count(1000);
    const text = await proxy.metrics();
    const after = text.split("\n").filter((line) => line.startsWith("egressgate_requests_total{") || line.startsWith("egressgate_request_duration")).length;
    expect(after).toBe(before);
    expect(seriesOf(text, "egressgate_requests_total")).toHaveLength(1);
    expect(sample(text, "egressgate_requests_total", { rule: "allowedHosts:*.wild.test" })).toBe(1000);
    expect(text).not.toContain("h999.wild.test");
  });

  it("refuses the metrics listener as a proxy target even when the allowlist allows loopback", async () => {
    const proxy = await startTestProxy({ allowedInternalHosts: ["metrics.test"] }, { metricsListen: "127.0.0.1:0", logLevel: "warn", resolve: { "metrics.test": ["127.0.0.1"] } });
    const port = new URL(proxy.metricsUrl!).port;
    expect(await plainVia(proxy, `http://metrics.test:${port}/metrics`)).toBe(403);
    // The same name on another loopback port is allowed: the refusal is the listener's alone.
    const upstream = await startUpstream({ tls: false });
    expect(await plainVia(proxy, `http://metrics.test:${upstream.port}/echo`)).toBe(200);
  });

  it("publishes egressgate:request:start and :end on diagnostics_channel without metrics", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { logLevel: "warn" });
    const starts: unknown[] = [];
    const onStart = (message: unknown): void => void starts.push(message);
    subscribe("egressgate:request:start", onStart);
    onTestFinished(() => void unsubscribe("egressgate:request:start", onStart));
    const seen = ends();
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/echo?secret=1`)).status).toBe(200);
    await seen.count(1);
    expect(starts).toEqual([expect.objectContaining({ guest: "default", method: "GET", url: `https://api.test:${upstream.port}/echo` })]);
    expect(seen.records[0]).toMatchObject({ guest: "default", status: 200, rule: { rule: "allowedHosts:api.test" }, sources: [expect.objectContaining({ phase: "allowlist" })] });
    await expect(proxy.metrics()).rejects.toThrow(TypeError);
    // An HTTP/2 guest's streams are published the same way, each with its own id.
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    expect((await h2Request(session, { ":path": "/echo?h2=1", ":authority": `api.test:${upstream.port}` })).status).toBe(200);
    await seen.count(2);
    expect(starts).toHaveLength(2);
    expect(starts[1]).toMatchObject({ guest: "default", method: "GET", url: `https://api.test:${upstream.port}/echo` });
    expect((starts[1] as { id: unknown }).id).not.toEqual((starts[0] as { id: unknown }).id);
  });

  it("refuses a metrics address it cannot listen on, naming the option", async () => {
    const first = await startTestProxy({ allowedHosts: ["x.test"] }, { metricsListen: "127.0.0.1:0", logLevel: "warn" });
    const taken = new URL(first.metricsUrl!).port;
    await expect(startTestProxy({ allowedHosts: ["x.test"] }, { metricsListen: `127.0.0.1:${taken}`, logLevel: "warn" })).rejects.toThrow(/metricsListen.*EADDRINUSE/);
  });

  it("with --workers 2, the primary serves the sum over its workers", async () => {
    const upstream = await startUpstream({ tls: false });
    const child = spawn(
      process.execPath,
      ["--import", "tsx", "src/cli/bin.ts", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--workers", "2", "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--log-level", "info", "--ca-dir", tempDir()],
      { cwd: root, stdio: ["ignore", "pipe", "pipe"] },
    );
    onTestFinished(() => {
      child.kill("SIGKILL");
    });
    let stderr = "";
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const url = await new Promise<string>((resolve, reject) => {
      let out = "";
      child.stdout.on("data", (chunk: Buffer) => {
        out += chunk.toString();
        const match = /listening on (\S+)/.exec(out);
        if (match !== null) resolve(match[1]!);
      });
      child.once("exit", (code) => reject(new Error(`exited ${code}: ${stderr}`)));
    });
    const proxyPort = Number(new URL(url).port);
    const agentless = (): Promise<number> =>
      new Promise((resolve, reject) => {
        // A new connection each time: the cluster spreads connections over the workers.
        const req = httpRequest({ host: "127.0.0.1", port: proxyPort, path: `http://api.test:${upstream.port}/echo`, headers: { host: `api.test:${upstream.port}`, connection: "close" }, agent: false });
        req.on("response", (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode ?? 0));
        });
        req.on("error", reject);
        req.end();
      });
    for (let i = 0; i < 6; i++) expect(await agentless()).toBe(200);
    const metricsPort = await primaryMetricsPort(stderr, () => stderr);
    // The workers count a request when the guest has the whole answer; poll the sum until all six are in.
    let total = 0;
    for (let i = 0; i < 200 && total < 6; i++) {
      total = sample((await get(`http://127.0.0.1:${metricsPort}/metrics`)).text, "egressgate_requests_total", { decision: "allow" }) ?? 0;
      if (total < 6) await new Promise((resolve) => setTimeout(resolve, 50));
    }
    expect(total).toBe(6);
    expect(await get(`http://127.0.0.1:${metricsPort}/readyz`)).toEqual({ status: 200, text: "ready\n" });
    // A request held upstream keeps its worker draining after the SIGTERM: meanwhile the
    // primary's /readyz answers 503, so a balancer's probe sees the instance leave.
    const held = await heldHttpUpstream();
    const holdPort = held.port;
    const inFlight = new Promise<number>((resolve, reject) => {
      const req = httpRequest({ host: "127.0.0.1", port: proxyPort, path: `http://api.test:${holdPort}/held`, headers: { host: `api.test:${holdPort}` }, agent: false });
      req.on("response", (res) => {
        res.resume();
        res.on("end", () => resolve(res.statusCode ?? 0));
      });
      req.on("error", reject);
      req.end();
    });
    await held.arrived;
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGTERM");
    let ready = 200;
    for (let i = 0; i < 200 && ready !== 503; i++) {
      ready = (await get(`http://127.0.0.1:${metricsPort}/readyz`)).status;
      if (ready !== 503) await new Promise((resolve) => setTimeout(resolve, 25));
    }
    expect(ready).toBe(503);
    held.release();
    expect(await inFlight).toBe(200);
    await exited;
    // Two workers each start a whole proxy: slow on a loaded machine, not a timing assertion.
  }, 120_000);
});

async function primaryMetricsPort(_initial: string, read: () => string): Promise<number> {
  for (let i = 0; i < 400; i++) {
    const match = /"msg":"metrics listening","url":"http:\/\/[^:]+:(\d+)"/.exec(read());
    if (match !== null) return Number(match[1]);
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
  throw new Error(`no metrics line: ${read()}`);
}
