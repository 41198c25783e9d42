import { readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import path from "node:path";
import { Readable } from "node:stream";
import { request } from "undici";
import { describe, expect, it } from "vitest";
import { djsHooksOptionsFromFile, type DjsHooksOptions } from "../../src/index.js";
import { callPhase, loadPolicy } from "../helpers/djs.js";
import { fetchVia, proxyAgent, startTestProxy } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";

const policiesDir = fileURLToPath(new URL("../../policies/", import.meta.url));
const policyFile = (name: string): string => path.join(policiesDir, name);

/** A shipped policy behind a proxy, with the test names it needs mapped to loopback. */
async function behindProxy(policy: DjsHooksOptions, names: string[]) {
  const upstream = await startUpstream({ names });
  const djsHooks = loadPolicy(policy);
  const resolve = Object.fromEntries(names.map((n) => [n, ["127.0.0.1"]]));
  const proxy = await startTestProxy({ allowedInternalHosts: names, djsHooks }, { resolve });
  return { upstream, proxy };
}

describe("policies/", () => {
  it("every policy in the folder loads and defines at least one phase", () => {
    const files = readdirSync(policiesDir).filter((f) => /\.(js|mjs|ts)$/.test(f) && !f.endsWith(".d.ts"));
    expect(files.sort()).toEqual(["allowlist.ts", "audit-log.mjs", "block-large-uploads.mjs", "github-readonly.ts", "retry.ts", "strip-tracking.js"]);
    for (const file of files) expect(loadPolicy(djsHooksOptionsFromFile(policyFile(file))).phases.length, file).toBeGreaterThan(0);
  });

  it("allowlist.ts allows the hosts in its hosts.json, exact and by wildcard, and refuses the rest", async () => {
    const shipped = loadPolicy(djsHooksOptionsFromFile(policyFile("allowlist.ts")));
    const decide = (url: string) => callPhase(shipped, "isRequestAllowed", { url });
    expect(await decide("https://api.github.com/repos")).toMatchObject({ t: "code", v: 1 });
    expect(await decide("https://files.pythonhosted.org/x")).toMatchObject({ t: "code", v: 1 });
    expect(await decide("https://pythonhosted.org.evil.test/")).toMatchObject({ t: "blocked", status: 403 });

    const { upstream, proxy } = await behindProxy(
      { ...djsHooksOptionsFromFile(policyFile("allowlist.ts")), modules: { "hosts.json": JSON.stringify(["api.test"]) } },
      ["api.test", "other.test"],
    );
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
    const refused = await fetchVia(proxy, `https://other.test:${upstream.port}/echo`);
    expect(refused.status).toBe(403);
    expect(refused.text).toContain("other.test is not in hosts.json");
    expect(upstream.hits()).toBe(1);
  });

  it("github-readonly.ts lets GET and HEAD reach api.github.com and refuses writes and other hosts", async () => {
    const { upstream, proxy } = await behindProxy(djsHooksOptionsFromFile(policyFile("github-readonly.ts")), ["api.github.com", "api.test"]);
    const base = `https://api.github.com:${upstream.port}`;
    expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(200);
    expect((await fetchVia(proxy, `${base}/echo`, { method: "HEAD" })).status).toBe(200);
    const write = await fetchVia(proxy, `${base}/echo`, { method: "POST", body: "{}" });
    expect(write.status).toBe(403);
    expect(write.text).toContain("POST is refused; this policy allows GET and HEAD only");
    const other = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(other.status).toBe(403);
    expect(other.text).toContain("only api.github.com may be reached, not api.test");
    expect(upstream.seen.map((s) => s.method)).toEqual(["GET", "HEAD"]);
  });

  it("strip-tracking.js removes tracking headers and keeps the rest", async () => {
    const { upstream, proxy } = await behindProxy(djsHooksOptionsFromFile(policyFile("strip-tracking.js")), ["api.test"]);
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`, {
      headers: {
        "x-forwarded-for": "10.0.0.1",
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "x-b3-traceid": "abc",
        referer: "https://intranet.example/",
        "x-request-id": "r1",
        accept: "application/json",
        "x-keep": "yes",
      },
    });
    const headers = (JSON.parse(res.text) as { headers: Record<string, string> }).headers;
    for (const gone of ["x-forwarded-for", "traceparent", "x-b3-traceid", "referer", "x-request-id"]) expect(headers[gone], gone).toBeUndefined();
    expect(headers).toMatchObject({ accept: "application/json", "x-keep": "yes" });
  });

  it("block-large-uploads.mjs refuses a declared upload over 1 MiB (413) and an undeclared one (411)", async () => {
    const { upstream, proxy } = await behindProxy(djsHooksOptionsFromFile(policyFile("block-large-uploads.mjs")), ["api.test"]);
    const base = `https://api.test:${upstream.port}`;
    expect((await fetchVia(proxy, `${base}/echo`, { method: "POST", body: Buffer.alloc(1024, 1) })).status).toBe(200);
    const big = await fetchVia(proxy, `${base}/echo`, { method: "POST", body: Buffer.alloc(2 * 1024 * 1024, 1) });
    expect(big.status).toBe(413);
    expect(big.text).toContain("over the 1048576-byte limit");
    const chunked = await request(`${base}/echo`, { dispatcher: proxyAgent(proxy), method: "POST", body: Readable.from([Buffer.from("a"), Buffer.from("b")]) });
    expect(chunked.statusCode).toBe(411);
    await chunked.body.dump();
    expect(upstream.hits()).toBe(1);
  });

  it("audit-log.mjs writes one line per answered request and changes nothing", async () => {
    const { upstream, proxy } = await behindProxy(djsHooksOptionsFromFile(policyFile("audit-log.mjs")), ["api.test"]);
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo?token=secret`);
    expect(res.status).toBe(200);
    const lines = proxy.logs.filter((l) => l["msg"] === "policy console").map((l) => l["text"]);
    expect(lines).toEqual([`audit GET api.test:${upstream.port}/echo -> 200`]);
  });
});
