import { describe, expect, it, vi } from "vitest";
import { loadPolicy } from "../helpers/djs.js";
import { fetchVia, startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";

/**
 * A tier-2 policy whose phase returns what the phase cannot use gets 502, and the log's detail
 * shows what it returned after the policy's file: its type and a short view of it. The detail was
 * the file's name alone, so "onRequest policy returned object" left the operator to guess which
 * object (black-box finding). The view is the policy's text: it is redacted before it is cut.
 */

const VALUE = "tok_4f1c9a7e2b6d8035c1e9f7a2b4d6c8e0f1a3b5c7";

function decision(proxy: TestProxy): Record<string, unknown> | undefined {
  return proxy.logs.find((line) => line["msg"] === "request");
}

describe.each([
  { phase: "onRequest", returns: `Symbol("odd")`, message: /onRequest policy returned symbol$/, detail: /\/returns\.mjs: returned symbol Symbol\("odd"\)$/ },
  { phase: "onRequest", returns: `({ allow: true, reason: "fine" })`, message: /onRequest policy returned object$/, detail: /\/returns\.mjs: returned object Object \{ allow, reason \}$/ },
  { phase: "onRequest", returns: `"yes"`, message: /onRequest policy returned string$/, detail: /\/returns\.mjs: returned string "yes"$/ },
  { phase: "onRequest", returns: `[1, 2, 3]`, message: /onRequest policy returned object$/, detail: /\/returns\.mjs: returned object an array of 3$/ },
  { phase: "onRequest", returns: `42`, message: /onRequest policy returned number$/, detail: /\/returns\.mjs: returned number 42$/ },
  { phase: "onResponse", returns: `"line\\r\\nforged " + "x".repeat(500)`, message: /onResponse policy returned string$/, detail: /\/returns\.mjs: returned string "line\\r\\nforged x{87}…"$/ },
  { phase: "isRequestAllowed", returns: `"allow"`, message: /isRequestAllowed policy returned string, not a boolean$/, detail: /\/returns\.mjs: returned string "allow"$/ },
  { phase: "handle", returns: `new Map([["a", 1]])`, message: /handle policy returned object, not a Response/, detail: /\/returns\.mjs: returned object Map$/ },
])("a $phase policy returning $returns", ({ phase, returns, message, detail }) => {
  it("gets 502, and the log's detail shows what it returned", async () => {
    const upstream = await startUpstream();
    const args = { onRequest: "r", onResponse: "res, r", isRequestAllowed: "r", handle: "r, next" }[phase];
    const policy = loadPolicy({ source: `export function ${phase}(${args}) { return ${returns}; }`, filename: "returns.mjs", workers: 1 });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [policy] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(502);
    await vi.waitFor(() => expect(decision(proxy)).toMatchObject({ status: 502, code: "EG_HOOK_FAILED", source: policy.engine.filename }));
    expect(String(decision(proxy)!["reason"])).toMatch(message);
    expect(String(decision(proxy)!["detail"])).toMatch(detail);
    // What the guest is told is unchanged: the detail is the operator's.
    expect(res.text).not.toContain("returns.mjs");
  });
});

describe("what a policy returned, shown in the log", () => {
  it("is redacted before it is cut: a secret's value the cut goes through is not left in part", async () => {
    const upstream = await startUpstream();
    // isRequestAllowed sees the request with its secrets substituted: the value starts at character 90 of 100.
    const policy = loadPolicy({ source: `export function isRequestAllowed(r) { return "a".repeat(90) + r.headers.get("x-token"); }`, filename: "returns.mjs", workers: 1 });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], secrets: { TOKEN: { hosts: ["api.test"], value: VALUE } }, hooks: [policy] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`, { headers: { "x-token": proxy.guestEnv()["TOKEN"]! } });
    expect(res.status).toBe(502);
    await vi.waitFor(() => expect(decision(proxy)).toMatchObject({ status: 502, code: "EG_HOOK_FAILED" }));
    const shown = String(decision(proxy)!["detail"]);
    expect(shown).toMatch(/\/returns\.mjs: returned string "a{90}\[REDACTED:TOKEN\]…"$/);
    expect(shown).not.toContain(VALUE.slice(0, 8));
    expect(JSON.stringify(proxy.logs)).not.toContain(VALUE.slice(0, 8));
  });
});

/**
 * What an async phase settles to is read after the phase's own code has run: a getter that
 * throws there (a Response subclass, a Proxy of one) was an uncaught throw inside the sandbox's
 * handler, which left the call without an outcome; the guest was told "returned a promise that
 * never settles" and the failure counted as time, where the same Response returned at once was
 * the policy's throw (black-box finding). Sync rows are the reference.
 */
describe("an answer whose reading throws is the policy's throw, returned at once or awaited", () => {
  const shapes = {
    "a Response whose status getter throws": `(() => { const r = new Response("x"); Object.defineProperty(r, "status", { get() { throw new Error("status getter threw"); } }); return r; })()`,
    "a Proxy of a Response": `new Proxy(new Response("x"), {})`,
    "a Response subclass whose headers are a plain object": `new (class extends Response { get headers() { return { "x-a": "b" }; } })("x")`,
  };
  const phases = { onRequest: "r", onResponse: "res, r", handle: "r, next" };
  const rows = Object.entries(phases).flatMap(([phase, args]) =>
    Object.entries(shapes).flatMap(([shape, value]) => (["", "async "] as const).map((mode) => ({ name: `${mode}${phase}`, phase, args, shape, value, mode }))),
  );
  it.each(rows)("$name returning $shape: 502, a throw in the log, not a promise that never settles", async ({ phase, args, value, mode }) => {
    const upstream = await startUpstream();
    const policy = loadPolicy({ source: `export ${mode}function ${phase}(${args}) { return ${value}; }`, filename: "reading.mjs", workers: 1 });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [policy] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status, res.text).toBe(502);
    expect(res.headers["x-egressgate-error"]).toBe("EG_HOOK_FAILED");
    expect(res.text).toContain(`${phase} hook failed (see the proxy log)`);
    await vi.waitFor(() => expect(decision(proxy)).toMatchObject({ status: 502, code: "EG_HOOK_FAILED" }));
    expect(String(decision(proxy)!["reason"])).not.toMatch(/never settles/);
    expect(String(decision(proxy)!["detail"])).toMatch(/\/reading\.mjs\): /);
  });
});
