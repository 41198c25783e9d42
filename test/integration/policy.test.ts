import { describe, expect, it, onTestFinished } from "vitest";
import { createHttpHooks, startProxy } from "../../src/index.js";
import { leafSignedChannel } from "../../src/tls/leaf-cert-cache.js";
import { cleanEnv, runClient } from "../helpers/clients.js";
import { curlVia } from "../helpers/curl.js";
import { openRaw } from "../helpers/raw.js";
import { fetchVia, startTestProxy, tempDir } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { startUpstream } from "../helpers/upstream.js";

describe("the allowlist", () => {
  it("a host that is not allowed gets 403 through CONNECT and the upstream sees nothing", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["other.test"] });
    const res = await curlVia(proxy.url, `${proxy.caDir}/ca.crt`, `https://api.test:${upstream.port}/echo`);
    expect(res.exitCode).toBe(56);
    expect(res.stderr).toMatch(/CONNECT tunnel failed, response 403/);
    expect(upstream.hits()).toBe(0);
  });

  it("a refused CONNECT names the reason in its status line, which clients that never read the body show", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["other.test"] });
    const raw = await openRaw(proxy.port);
    raw.write(`CONNECT api.test:${upstream.port} HTTP/1.1\r\nHost: api.test:${upstream.port}\r\n\r\n`);
    const res = await raw.readResponse({ forConnect: true });
    expect(`${res.status} ${res.statusText}`).toBe('403 Forbidden: host "api.test" is not in allowedHosts');
    expect(res.body).toMatch(/^403 Forbidden: host "api\.test" is not in allowedHosts; allow it with --allow-host api\.test/);
    // Python's http.client reports a refused tunnel by its status line alone.
    const code = "import sys, urllib.request\ntry:\n    urllib.request.urlopen(sys.argv[1], timeout=15)\nexcept Exception as e:\n    print(e)";
    const python = await runClient("python3", ["-c", code, `https://api.test:${upstream.port}/echo`], cleanEnv({ https_proxy: proxy.url }));
    expect(python.stdout).toContain('Tunnel connection failed: 403 Forbidden: host "api.test" is not in allowedHosts');
    expect(upstream.hits()).toBe(0);
  });

  it("with refuseInTunnel, the CONNECT to a refused host opens and the request inside it gets the 403 with the reason, never reaching the upstream", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { refuseInTunnel: true });
    const res = await curlVia(proxy.url, `${proxy.caDir}/ca.crt`, `https://other.test:${upstream.port}/echo`, ["--http1.1"]);
    expect(res.status).toBe(403);
    expect(res.body).toMatch(/^403 Forbidden: host "other\.test" is not in allowedHosts; allow it with --allow-host other\.test/);
    expect(upstream.hits()).toBe(0);
    // The tunnel itself was answered 200: the refusal is the request's, inside it.
    const raw = await openRaw(proxy.port);
    raw.write(`CONNECT other.test:${upstream.port} HTTP/1.1\r\nHost: other.test:${upstream.port}\r\n\r\n`);
    expect((await raw.readResponse({ forConnect: true })).status).toBe(200);
    // And the proxy still serves an allowed host.
    expect((await curlVia(proxy.url, `${proxy.caDir}/ca.crt`, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
  });

  it("with refuseInTunnel, a guest cycling through refused names never pushes an allowed host's leaf out of the cache", async () => {
    const signed: string[] = [];
    const onSigned = (message: unknown): void => void signed.push((message as { name: string }).name);
    leafSignedChannel.subscribe(onSigned);
    onTestFinished(() => leafSignedChannel.unsubscribe(onSigned));
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { refuseInTunnel: true, leafCacheSize: 2 });
    const ca = `${proxy.caDir}/ca.crt`;
    expect((await curlVia(proxy.url, ca, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
    const refused = ["r1.test", "r2.test", "r3.test", "r4.test"];
    for (const name of refused) {
      const res = await curlVia(proxy.url, ca, `https://${name}:${upstream.port}/echo`, ["--http1.1"]);
      expect(res.status, name).toBe(403);
    }
    // Four refused names against a cache of two: api.test's leaf is still there, not signed again.
    expect((await curlVia(proxy.url, ca, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
    expect(signed).toEqual(["api.test", ...refused]);
    expect(upstream.hits()).toBe(2);
  });

  it("a host that is not allowed gets 403 with a reason naming the host for plain HTTP", async () => {
    const upstream = await startUpstream({ tls: false });
    const proxy = await startTestProxy({ allowedInternalHosts: ["other.test"] });
    const res = await curlVia(proxy.url, `${proxy.caDir}/ca.crt`, `http://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(403);
    expect(res.body).toMatch(/^403 Forbidden: host "api\.test" is not in allowedHosts; allow it with --allow-host api\.test/);
    expect(upstream.hits()).toBe(0);
  });

  it("with no allowed hosts everything is refused and the reason says how to allow hosts", async () => {
    const upstream = await startUpstream({ tls: false });
    const proxy = await startTestProxy({});
    const res = await curlVia(proxy.url, `${proxy.caDir}/ca.crt`, `http://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(403);
    expect(res.body).toMatch(/deny-all.*--allow-host api\.test.*createHttpHooks\(\{ allowedHosts/);
    expect(upstream.hits()).toBe(0);
  });

  it("a wildcard pattern matches across dots and a trailing dot in the request does not bypass it", async () => {
    const upstream = await startUpstream({ tls: false });
    const proxy = await startTestProxy(
      { allowedInternalHosts: ["*.deep.test"] },
      { resolve: { "a.b.deep.test": ["127.0.0.1"], "deep.test": ["127.0.0.1"] } },
    );
    const ok = await curlVia(proxy.url, "/dev/null", `http://a.b.deep.test:${upstream.port}/echo`);
    expect(ok.status).toBe(200);
    const bare = await curlVia(proxy.url, "/dev/null", `http://deep.test:${upstream.port}/echo`);
    expect(bare.status).toBe(403);
    const dotted = await curlVia(proxy.url, "/dev/null", `http://A.B.DEEP.TEST.:${upstream.port}/echo`);
    expect(dotted.status).toBe(200);
    expect(upstream.hits()).toBe(2);
  });

  it("hooks without createHttpHooks configuration are deny-all", async () => {
    const upstream = await startUpstream({ tls: false });
    const ca = await testCa();
    const proxy = await startProxy({
      httpHooks: {},
      listen: { port: 0 },
      caDir: tempDir(),
      upstreamCa: [ca.certPem],
      logLevel: "silent",
      resolve: { "api.test": ["127.0.0.1"] },
    });
    try {
      const res = await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`);
      expect(res.status).toBe(403);
      expect(upstream.hits()).toBe(0);
    } finally {
      await proxy.close();
    }
  });

  it("a spread copy of the hooks gives the same answers by calling the generated functions", async () => {
    const upstream = await startUpstream({ tls: false });
    const ca = await testCa();
    const { httpHooks } = createHttpHooks({ allowedInternalHosts: ["api.test"] });
    const proxy = await startProxy({
      httpHooks: { ...httpHooks },
      listen: { port: 0 },
      caDir: tempDir(),
      upstreamCa: [ca.certPem],
      logLevel: "silent",
      resolve: { "api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"], "public.test": ["8.8.8.8"] },
    });
    try {
      expect((await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`)).status).toBe(200);
      expect((await curlVia(proxy.url, "/dev/null", `http://other.test:${upstream.port}/echo`)).status).toBe(403);
      // The CONNECT itself is refused, as the native path does.
      const tunnel = await curlVia(proxy.url, "/dev/null", `https://other.test:${upstream.port}/echo`);
      expect(tunnel.stderr).toMatch(/CONNECT tunnel failed, response 403/);
      expect(upstream.hits()).toBe(1);
    } finally {
      await proxy.close();
    }
  });
});

describe("internal addresses", () => {
  // Every form stays on this machine: even a broken build could only dial loopback.
  it.each(["127.0.0.1", "127.1", "0x7f000001", "2130706433", "0", "[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]"])(
    "the internal literal %s is refused with 403, as an absolute-form URL and through CONNECT",
    async (literal) => {
      const upstream = await startUpstream({ tls: false });
      const proxy = await startTestProxy({ allowedHosts: ["*"] });
      const plain = await curlVia(proxy.url, "/dev/null", `http://${literal}:${upstream.port}/echo`);
      expect(plain.status).toBe(403);
      expect(plain.body).toMatch(/(loopback|unspecified) address/);
      const tunnel = await curlVia(proxy.url, "/dev/null", `https://${literal}:${upstream.port}/echo`, ["-k"]);
      expect(tunnel.exitCode).toBe(56);
      expect(tunnel.stderr).toMatch(/CONNECT tunnel failed, response 403/);
      expect(upstream.hits()).toBe(0);
      const denials = proxy.logs.filter((l) => l["msg"] === "request" && l["status"] === 403);
      expect(denials.length).toBeGreaterThanOrEqual(2);
    },
  );

  it("a name that resolves to loopback is refused unless it is in allowedInternalHosts", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedHosts: ["api.test"] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(403);
    expect(res.text).toMatch(/host "api\.test" resolves to a loopback address; allow it with --allow-internal-host api\.test/);
    // The resolved address is for the operator's log, not for the guest to map internal DNS with.
    expect(res.text).not.toContain("127.0.0.1");
    const denial = proxy.logs.find((l) => l["msg"] === "request" && l["status"] === 403);
    expect(denial?.["detail"]).toBe("api.test -> 127.0.0.1");
    expect(upstream.hits()).toBe(0);
  });

  // `::ffff:127.0.0.1` is 127.0.0.1 (RFC 4291 §2.5.5.2): the classifier already judged it by
  // the IPv4 inside, but the allowlist matched text, and allowing one spelling refused the other
  // (carried from an earlier session). Only the mapped form is the same address.
  it.each([
    ["127.0.0.1", "[::ffff:127.0.0.1]", "127.0.0.1"],
    ["::ffff:127.0.0.1", "127.0.0.1", "::ffff:7f00:1"],
    ["127.0.0.*", "[::ffff:7f00:1]", "127.0.0.*"],
  ])("allowedInternalHosts %s admits the same address written %s, as an absolute-form URL and through CONNECT; no other address opens", async (pattern, literal, named) => {
    const upstream = await startUpstream({ tls: false });
    const proxy = await startTestProxy({ allowedInternalHosts: [pattern] });
    for (const extra of [[], ["--proxytunnel"]]) {
      const res = await curlVia(proxy.url, "/dev/null", `http://${literal}:${upstream.port}/echo`, extra);
      expect(res.status, res.body + res.stderr).toBe(200);
    }
    expect(upstream.hits()).toBe(2);
    // The line names the pattern as it was written (the URL parser's spelling of it).
    expect(proxy.logs.filter((l) => l["msg"] === "request").map((l) => l["rule"])).toEqual([`allowedHosts:${named}`, `allowedHosts:${named}`]);
    // Another loopback address, the IPv4-compatible and NAT64 forms (other addresses, judged by
    // the IPv4 inside only to refuse them), and the proxy's own port stay refused.
    for (const other of ["127.0.0.2", "[::ffff:127.0.0.2]", "[::127.0.0.1]", "[64:ff9b::127.0.0.1]"].filter(() => !pattern.includes("*"))) {
      expect((await curlVia(proxy.url, "/dev/null", `http://${other}:${upstream.port}/echo`)).status, other).toBe(403);
    }
    const self = await curlVia(proxy.url, "/dev/null", `http://${literal}:${proxy.port}/echo`);
    expect(self.status).toBe(403);
    expect(self.body).toMatch(/egressgate's own listening address/);
    expect(upstream.hits()).toBe(2);
  });

  it("the proxy's own listening address is refused even for an allowed internal host", async () => {
    const proxy = await startTestProxy({ allowedInternalHosts: ["self.test"] }, { resolve: { "self.test": ["127.0.0.1"] } });
    const res = await curlVia(proxy.url, "/dev/null", `http://self.test:${proxy.port}/anything`);
    expect(res.status).toBe(403);
    expect(res.body).toMatch(/egressgate's own listening address/);
    // One request in the log: the proxy never re-entered itself.
    expect(proxy.logs.filter((l) => l["msg"] === "request")).toHaveLength(1);
  });

  it.each(["0.0.0.0", "127.0.0.2"])("%s on the proxy's own port is refused as the proxy itself", async (ip) => {
    const proxy = await startTestProxy({ allowedHosts: ["*"], blockInternalRanges: false }, { resolve: { "loop.test": [ip] } });
    const res = await curlVia(proxy.url, "/dev/null", `http://loop.test:${proxy.port}/`);
    expect(res.status).toBe(403);
    expect(res.body).toMatch(/egressgate's own listening address/);
    expect(proxy.logs.filter((l) => l["msg"] === "request")).toHaveLength(1);
  });

  it("blockInternalRanges: false lets an allowed host reach loopback", async () => {
    const upstream = await startUpstream({ tls: false });
    const proxy = await startTestProxy({ allowedHosts: ["api.test"], blockInternalRanges: false });
    const res = await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(200);
  });

  it("a static name pinned to several addresses uses an approved one", async () => {
    const upstream = await startUpstream({ tls: false });
    // 169.254.169.254 is refused (metadata) and never dialled; 127.0.0.1 is allowed internally.
    const proxy = await startTestProxy(
      { allowedInternalHosts: ["multi.test"] },
      { resolve: { "multi.test": ["169.254.169.254", "127.0.0.1"] } },
    );
    const res = await curlVia(proxy.url, "/dev/null", `http://multi.test:${upstream.port}/echo`);
    expect(res.status).toBe(200);
    expect(upstream.hits()).toBe(1);
  });

  it("a name pinned only to a metadata address is refused even as an allowed internal host", async () => {
    const proxy = await startTestProxy({ allowedInternalHosts: ["imds.test"] }, { resolve: { "imds.test": ["169.254.169.254"] } });
    const res = await curlVia(proxy.url, "/dev/null", "http://imds.test/latest/meta-data/");
    expect(res.status).toBe(403);
    expect(res.body).toMatch(/cloud metadata address/);
  });
});
