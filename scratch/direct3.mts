import { Sandbox } from "../src/djs/sandbox.ts";
const lim = { timeoutMs: 100, memoryBytes: 32 << 20, stackBytes: 256 << 10, returnBytes: 1 << 24 };
const base = { id: 1, now: 1234, method: "GET", url: "https://a.test/x?y=1", headers: "accept\n*/*\nuser-agent\ncurl", hasBody: false };
const variants: [string, string, object][] = [
  ["ip empty", "function isIpAllowed(i) { return true }", { ...base, phase: "isIpAllowed", info: { hostname: "a.test", ip: "1.2.3.4", family: 4, port: 443, protocol: "https:" } }],
  ["onRequest empty", "function onRequest() {}", { ...base, phase: "onRequest" }],
  ["onRequest headers.get", "function onRequest(r) { r.headers.get('accept') }", { ...base, phase: "onRequest" }],
  ["isRequestAllowed url", "function isRequestAllowed(r) { return new URL(r.url).hostname === 'a.test' }", { ...base, phase: "isRequestAllowed" }],
];
for (const [label, src, m] of variants) {
  const sb = await Sandbox.create("script", "/tmp/p.js", src, lim);
  for (let i = 0; i < 3000; i++) sb.call(m as never);
  const t0 = performance.now();
  for (let i = 0; i < 10000; i++) sb.call(m as never);
  console.log(label, (((performance.now() - t0) * 1000) / 10000).toFixed(2), JSON.stringify(sb.call(m as never).reply.outcome));
}
