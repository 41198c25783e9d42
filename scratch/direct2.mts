import { Sandbox } from "../src/djs/sandbox.ts";
const sb = await Sandbox.create("script", "/tmp/djs/p.js", `function onRequest() {}\nfunction isRequestAllowed(r) { return new URL(r.url).hostname === "a.test" }`, { timeoutMs: 100, memoryBytes: 32 << 20, stackBytes: 256 << 10, returnBytes: 1 << 24 });
const base = { id: 1, now: 1234, method: "GET", url: "https://a.test/x?y=1", headers: "accept\0*/*\0user-agent\0curl", hasBody: false };
for (const phase of ["onRequest", "isRequestAllowed"]) {
  const m = { ...base, phase };
  console.log(JSON.stringify(sb.call(m as never).reply.outcome));
  for (let r = 0; r < 3; r++) {
    const t0 = performance.now();
    for (let i = 0; i < 5000; i++) sb.call(m as never);
    console.log(phase, "us/call", (((performance.now() - t0) * 1000) / 5000).toFixed(2));
  }
}
