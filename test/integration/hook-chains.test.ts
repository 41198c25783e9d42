import { describe, expect, it } from "vitest";
import { createHttpHooks, HttpRequestBlockedError, type HttpHooksOptions } from "../../src/index.js";
import { json, startDecisionServer } from "../helpers/deciders.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { loadPolicy } from "../helpers/djs.js";
import { fetchVia, startTestProxy } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";

interface Echo {
  path: string;
  headers: Record<string, string | undefined>;
}

/** The decision lines of a proxy's log. */
function decisions(logs: Record<string, unknown>[]): Record<string, unknown>[] {
  return logs.filter((line) => line["msg"] === "request");
}

describe("hook chains: sources run in list order", () => {
  it("a rewrite by the first policy is what the second policy sees", async () => {
    const upstream = await startUpstream();
    const first = loadPolicy({ source: `export function onRequest(r) { r.headers.set("x-step", "1"); }`, filename: "first.mjs" });
    const second = loadPolicy({ source: `export function onRequest(r) { r.headers.set("x-seen", (r.headers.get("x-step") ?? "none") + "2"); }`, filename: "second.mjs" });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [first, { djsHooks: second }] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(200);
    expect((JSON.parse(res.text) as Echo).headers["x-seen"]).toBe("12");
  });

  it("tier 3 and tier 2 interleave as listed: a callback, a policy, a callback", async () => {
    const upstream = await startUpstream();
    const policy = loadPolicy({ source: `export function onRequest(r) { r.headers.set("x-trail", r.headers.get("x-trail") + ",policy"); }`, filename: "mid.mjs" });
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      hooks: [
        { onRequest: (r: Request) => void r.headers.set("x-trail", "a") },
        policy,
        { onRequest: (r: Request) => void r.headers.set("x-trail", `${r.headers.get("x-trail")},c`) },
      ],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect((JSON.parse(res.text) as Echo).headers["x-trail"]).toBe("a,policy,c");
  });

  it("a block in the first source ends the phase: the second never runs, nothing leaves, and the log names the first", async () => {
    const upstream = await startUpstream();
    const first = loadPolicy({ source: `export function onRequest() { throw new HttpRequestBlockedError("first says no", 451); }`, filename: "blocker.mjs" });
    let secondCalls = 0;
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [first, { onRequest: () => void secondCalls++ }] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(451);
    expect(res.text).toContain("first says no");
    expect(secondCalls).toBe(0);
    expect(upstream.hits()).toBe(0);
    expect(decisions(proxy.logs).at(-1)).toMatchObject({ status: 451, source: expect.stringMatching(/\/blocker\.mjs$/) });
  });

  it("a Response from a callback ends the phase, and the log names it by its index", async () => {
    const upstream = await startUpstream();
    let laterCalls = 0;
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      hooks: [{ onRequest: () => undefined }, { onRequest: () => new Response("from the chain", { status: 203 }) }, { onRequest: () => void laterCalls++ }],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(203);
    expect(res.text).toBe("from the chain");
    expect(laterCalls).toBe(0);
    expect(upstream.hits()).toBe(0);
    expect(decisions(proxy.logs).at(-1)).toMatchObject({ status: 203, source: "hooks[1]" });
  });

  it("a rewrite to a host off the allowlist gets 403: the allowlist judges the final request", async () => {
    const upstream = await startUpstream({ names: ["api.test", "other.test"] });
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      hooks: [{ onRequest: (r: Request) => new Request(r.url.replace("api.test", "other.test"), r) }, { onRequest: () => undefined }],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(403);
    expect(res.text).toMatch(/host "other\.test" is not in allowedHosts/);
    expect(upstream.hits()).toBe(0);
  });

  it("the checks are AND-ed in order: the first false refuses, and the log names that source", async () => {
    const upstream = await startUpstream();
    let thirdCalls = 0;
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      hooks: [
        { isRequestAllowed: () => true },
        { isRequestAllowed: (r: Request) => !new URL(r.url).pathname.startsWith("/no") },
        {
          isRequestAllowed: () => {
            thirdCalls++;
            return true;
          },
        },
      ],
    });
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
    expect(thirdCalls).toBe(1);
    const refused = await fetchVia(proxy, `https://api.test:${upstream.port}/no`);
    expect(refused.status).toBe(403);
    expect(thirdCalls).toBe(1);
    expect(decisions(proxy.logs).at(-1)).toMatchObject({ status: 403, source: "hooks[1]" });
  });

  it("isIpAllowed sources are AND-ed per address, and a policy's refusal is logged with its file", async () => {
    const upstream = await startUpstream();
    const policy = loadPolicy({ source: `export function isIpAllowed(info) { return info.port !== ${upstream.port}; }`, filename: "ports.mjs" });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [{ isIpAllowed: () => true }, policy] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(403);
    expect(res.text).toMatch(/refused by the isIpAllowed policy/);
    expect(decisions(proxy.logs).at(-1)).toMatchObject({ status: 403, source: expect.stringMatching(/\/ports\.mjs$/) });
    expect(upstream.hits()).toBe(0);
  });

  it("onResponse sources run in order, each on what the one before returned", async () => {
    const upstream = await startUpstream();
    const policy = loadPolicy({ source: `export async function onResponse(res) { return new Response((await res.text()) + "+policy", res); }`, filename: "append.mjs" });
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      hooks: [{ onResponse: async (res: Response) => new Response(`first:${(await res.text()).length}`, res) }, policy],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(200);
    expect(res.text).toMatch(/^first:\d+\+policy$/);
  });
});

// A body one entry built (a new Request, a layer's next(request.clone()), a decider's
// includeBody) became a one-shot stream when the next entry returned undefined: the entry after
// that saw no body, and the request went out empty with a 200 (an h2 upstream: a stale length and
// a reset); with one entry after it, a 307 could no longer send it again (black-box finding).
describe("hook chains: a body an entry built survives the entries after it", () => {
  const tag = (n: number) => ({ onRequest: (r: Request) => void r.headers.set(`x-tag-${n}`, "1") });
  const builders: Record<string, () => Promise<NonNullable<HttpHooksOptions["hooks"]>>> = {
    "onRequest returns a new Request": async () => [{ onRequest: (r: Request) => new Request(r.url, { method: "POST", body: "built-body", headers: r.headers }) }],
    "a layer calls next(request.clone())": async () => [{ handle: (r: Request, next: (r: Request) => Promise<Response>) => next(r.clone()) }],
    "a decider with includeBody": async () => [{ webhook: (await startDecisionServer((_doc, _req, res) => json(res, 200, { decision: "allow" }))).url, includeBody: true }],
  };
  const built = (name: string): string => (name.startsWith("onRequest") ? "built-body" : "guest-body");
  for (const [name, builder] of Object.entries(builders)) {
    for (const followers of [1, 2, 3]) {
      it(`${name}, then ${followers} entr${followers === 1 ? "y" : "ies"} editing headers: the upstream gets the body, and again after a 307, from either guest protocol`, async () => {
        const upstream = await startUpstream();
        const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [...(await builder()), ...Array.from({ length: followers }, (_, i) => tag(i))] });
        const target = `api.test:${upstream.port}`;
        const session = await h2Session(proxy.port, target, proxy.caCertPem);
        for (const path of ["/echo", `/redirect?status=307&to=${encodeURIComponent("/echo?hop=2")}`]) {
          const h1 = await fetchVia(proxy, `https://${target}${path}`, { method: "POST", body: "guest-body" });
          const h2 = await h2Request(session, { ":method": "POST", ":path": path }, "guest-body");
          for (const [protocol, status, text] of [["HTTP/1.1", h1.status, h1.text], ["HTTP/2", h2.status, h2.body.toString()]] as const) {
            const where = `${protocol} ${path}`;
            expect(status, where).toBe(200);
            const echo = JSON.parse(text) as Echo & { bodyBytes: number; method: string };
            expect(echo.method, where).toBe("POST");
            expect(echo.bodyBytes, where).toBe(built(name).length);
            expect(echo.headers[`x-tag-${followers - 1}`], where).toBe("1");
          }
        }
      });
    }
  }
});

describe("hook chains: options", () => {
  it("hooks cannot be combined with the single-object forms, and a bad entry names its index", () => {
    expect(() => createHttpHooks({ hooks: [], onRequest: () => undefined })).toThrow(expect.objectContaining({ code: "EG_INVALID_OPTION", path: "onRequest" }));
    expect(() => createHttpHooks({ hooks: [{ onRequst: () => undefined } as never] })).toThrow(/hooks\[0\]\.onRequst.*onRequest/);
    expect(() => createHttpHooks({ hooks: [{ onRequest: "x" } as never] })).toThrow(expect.objectContaining({ path: "hooks[0].onRequest" }));
    expect(() => createHttpHooks({ hooks: [42 as never] })).toThrow(expect.objectContaining({ path: "hooks[0]" }));
  });

  it("a spread copy keeps the chain: it rides on the generated check functions", async () => {
    const upstream = await startUpstream();
    const { httpHooks } = createHttpHooks({
      allowedInternalHosts: ["api.test"],
      hooks: [
        {
          onRequest: () => {
            throw new HttpRequestBlockedError("chain ran", 418);
          },
        },
      ],
    });
    const proxy = await startTestProxy({}, { httpHooks: { ...httpHooks } } as never);
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(418);
  });
});
