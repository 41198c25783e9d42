import { Sandbox } from "../src/djs/sandbox.ts";
import { bundlePolicy } from "../src/djs/bundle.ts";
const code = await bundlePolicy({ kind: "module", filename: "/tmp/djs/p.mjs", source: `
const allowed = new Set(["application/json", "*/*"]);
export function isRequestAllowed(r) { const u = new URL(r.url); return u.hostname === "a.test" && allowed.has(r.headers.get("accept")); }
export function onRequest() {}
export function onResponse() {}
export async function isIpAllowed(i) { return i.port === 443; }`, modules: {}, fromDisk: false });
const sb = await Sandbox.create("module", "/tmp/djs/p.mjs", code, { timeoutMs: 100, memoryBytes: 32 << 20, stackBytes: 256 << 10, returnBytes: 1 << 24 });
const base = { id: 1, now: 1234, method: "GET", url: "https://a.test/x?y=1", headers: "accept\n*/*\nuser-agent\ncurl", hasBody: false };
const msgs = {
  onRequest: { ...base, phase: "onRequest" },
  isRequestAllowed: { ...base, phase: "isRequestAllowed" },
  onResponse: { ...base, phase: "onResponse", response: { status: 200, statusText: "", headers: "content-type\ntext/plain", url: base.url, hasBody: true } },
  isIpAllowed: { ...base, phase: "isIpAllowed", info: { hostname: "a.test", ip: "1.2.3.4", family: 4, port: 443, protocol: "https:" } },
};
for (const [name, m] of Object.entries(msgs)) {
  console.log(name, JSON.stringify(sb.call(m as never).reply.outcome));
  for (let r = 0; r < 3; r++) {
    const t0 = performance.now();
    for (let i = 0; i < 5000; i++) sb.call(m as never);
    console.log(name, "us/call", (((performance.now() - t0) * 1000) / 5000).toFixed(2));
  }
}
