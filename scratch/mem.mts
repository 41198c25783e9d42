import { Sandbox } from "../src/djs/sandbox.ts";
const sb = await Sandbox.create("module", "/tmp/p.mjs", `(function (globalThis) { "use strict"; var __egressgatePolicy = { onRequest(r) { const a = []; for (;;) a.push("x".repeat(1 << 16) + a.length); } }; return __egressgatePolicy; })`, undefined, { timeoutMs: 5000, memoryBytes: 8 << 20, stackBytes: 256 << 10, returnBytes: 1 << 24 });
const t0 = performance.now();
console.log(JSON.stringify(sb.call({ id: 1, phase: "onRequest", now: 1, method: "GET", url: "https://a.test/", headers: "", hasBody: false }).reply), performance.now() - t0);
