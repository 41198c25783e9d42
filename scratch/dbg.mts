import { Sandbox } from "../src/djs/sandbox.ts";
import { bundlePolicy } from "../src/djs/bundle.ts";
const code = await bundlePolicy({ kind: "module", filename: "/tmp/djs/p.mjs", source: `
const allowed = new Set(["application/json", "*/*"]);
export function isRequestAllowed(r) { const u = new URL(r.url); console.log(typeof URL, r.url, String(u), u.href, Object.keys(Object.getPrototypeOf(u)), [...r.headers].join("|")); return u.hostname === "a.test" && allowed.has(r.headers.get("accept")); }`, modules: {}, fromDisk: false });
const sb = await Sandbox.create("module", "/tmp/djs/p.mjs", code, { timeoutMs: 100, memoryBytes: 32 << 20, stackBytes: 256 << 10, returnBytes: 1 << 24 });
console.log(JSON.stringify(sb.call({ id: 1, now: 1234, method: "GET", url: "https://a.test/x?y=1", headers: "accept\n*/*\nuser-agent\ncurl", hasBody: false, phase: "isRequestAllowed" }).reply));
