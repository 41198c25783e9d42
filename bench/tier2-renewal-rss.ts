/**
 * RSS of a process whose tier-2 policy hits its memory limit again and again: each hit renews
 * the sandbox (a new WebAssembly heap), and the old heap must not stay behind.
 *
 *   node --expose-gc --import tsx bench/tier2-renewal-rss.ts [hits]
 *
 * Prints RSS in MiB at the start and after each memory-limit hit (followed by an ordinary call
 * and a main-thread GC). Recorded figures are in docs/reliability.md.
 */
import { createDjsHooks } from "../src/index.js";

const hits = Number(process.argv[2] ?? 16);
const { djsHooks } = createDjsHooks({
  source: `export function isRequestAllowed(r) { if (r.headers.get("x-bomb")) { const a = []; for (;;) a.push(new Array(1e5).fill(1)); } return true; }`,
  limits: { timeoutMs: 30_000 },
});
const rssMiB = (): number => Math.round(process.memoryUsage().rss / 1048576);
const call = (bomb: boolean): Promise<unknown> =>
  djsHooks.engine.call({ phase: "isRequestAllowed", now: Date.now(), seed: 1, method: "GET", url: "https://a.test/", headers: bomb ? "x-bomb\n1" : "", hasBody: false });
const readings = [rssMiB()];
for (let i = 0; i < hits; i++) {
  await call(true);
  await call(false);
  (globalThis as { gc?: () => void }).gc?.();
  await new Promise((resolve) => setTimeout(resolve, 50));
  readings.push(rssMiB());
}
console.log(`RSS MiB at the start, then after each of ${hits} memory-limit hits: ${readings.join(" ")}`);
await djsHooks.close();
