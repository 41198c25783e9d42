/**
 * What the number of guests costs each request, and each addGuest (black-box finding: with N
 * guests holding one secret each, a request cost CPU in proportion to N, an addGuest blocked the
 * event loop for 127 ms at 1000, and adding 1000 one by one took 97 s). The proxy runs in this
 * process, the upstream (plain HTTP, `GET /c`) in a child of its own, so the CPU measured is the
 * proxy's and its client's.
 *
 *   node --import tsx bench/many-guests.ts [N] [--level info|warn] [--one-by-one]
 *
 * Prints: the reload to N + 1 guests; wall time and CPU per request over 100 requests, on one
 * new connection each, from guest g0; one more addGuest (synchronous: the event loop is held for
 * that long); the request after it. With `--one-by-one`, also the time to add the N guests one
 * addGuest at a time to a proxy that has only `base`.
 */
import { spawn } from "node:child_process";
import net from "node:net";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createHttpHooks, startProxy, type GuestOptions, type RunningProxy } from "../src/index.js";

const n = Number(process.argv[2] ?? 1000);
const level = (process.argv.includes("--level") ? process.argv[process.argv.indexOf("--level") + 1] : "info") as "info" | "warn";
const oneByOne = process.argv.includes("--one-by-one");

const upstream = spawn(
  process.execPath,
  ["-e", `const s = require("node:http").createServer((q, r) => r.end("ok")).listen(0, "127.0.0.1", () => console.log(s.address().port)); process.stdin.on("end", () => process.exit(0)); process.stdin.resume();`],
  { stdio: ["pipe", "pipe", "inherit"] },
);
const port = await new Promise<number>((resolve) => upstream.stdout.once("data", (data: Buffer) => resolve(Number(data.toString().trim()))));
const caDir = mkdtempSync(join(tmpdir(), "egressgate-many-guests-"));

const resolveHosts = { "a.test": ["127.0.0.1"] };
const plain = (): GuestOptions => ({ httpHooks: createHttpHooks({ allowedInternalHosts: ["a.test"] }).httpHooks });
const withSecret = (i: number): GuestOptions => ({
  httpHooks: createHttpHooks({ allowedInternalHosts: ["a.test"], secrets: { S: { hosts: ["a.test"], value: `value-${i}-abcdefgh` } } }).httpHooks,
});
const start = (): Promise<RunningProxy> =>
  startProxy({ guests: { base: plain() }, resolve: resolveHosts, listen: { host: "127.0.0.1", port: 0 }, logLevel: level, logSink: () => {}, caDir, deploymentKey: "k".repeat(40) });

/** Wall and CPU milliseconds of `run` (CPU: this process's, upstream excluded; on a busy machine wall time is mostly waiting). */
const timed = async <T>(run: () => T | Promise<T>): Promise<{ wall: string; cpu: string }> => {
  const cpu = process.cpuUsage();
  const t = performance.now();
  await run();
  const used = process.cpuUsage(cpu);
  return { wall: (performance.now() - t).toFixed(2), cpu: ((used.user + used.system) / 1000).toFixed(2) };
};
const basicOf = (proxy: RunningProxy, name: string): string => {
  const url = new URL(proxy.guestEnv(name)["HTTPS_PROXY"]!);
  return `Basic ${Buffer.from(`${url.username}:${url.password}`).toString("base64")}`;
};
const get = (proxy: RunningProxy, auth: string): Promise<string> =>
  new Promise((resolve, reject) => {
    const socket = net.connect(proxy.port, "127.0.0.1", () =>
      socket.write(`GET http://a.test:${port}/c HTTP/1.1\r\nHost: a.test:${port}\r\nProxy-Authorization: ${auth}\r\nConnection: close\r\n\r\n`),
    );
    let text = "";
    socket.on("data", (data: Buffer) => (text += data.toString()));
    socket.on("error", reject);
    socket.on("close", () => resolve(text.split(" ")[1] ?? ""));
  });

try {
  const proxy = await start();
  const guests: Record<string, GuestOptions> = { base: plain() };
  for (let i = 0; i < n; i++) guests[`g${i}`] = withSecret(i);
  const reload = await timed(() => proxy.reload({ guests, resolve: resolveHosts }));
  console.log(`N=${n} level=${level}: reload to ${n + 1} guests: wall ${reload.wall} ms, cpu ${reload.cpu} ms`);
  const auth = basicOf(proxy, "g0");
  for (let i = 0; i < 5; i++) if ((await get(proxy, auth)) !== "200") throw new Error("the warm-up request was not answered 200");
  const cpu = process.cpuUsage();
  const t = performance.now();
  for (let i = 0; i < 100; i++) await get(proxy, auth);
  const used = process.cpuUsage(cpu);
  console.log(`  per request: wall ${((performance.now() - t) / 100).toFixed(2)} ms, cpu ${((used.user + used.system) / 100 / 1000).toFixed(2)} ms`);
  const add = await timed(() => proxy.addGuest("late", plain()));
  console.log(`  one addGuest: wall ${add.wall} ms, cpu ${add.cpu} ms (synchronous: the event loop is held)`);
  const after = await timed(() => get(proxy, auth));
  console.log(`  the request after it: wall ${after.wall} ms, cpu ${after.cpu} ms`);
  await proxy.close();

  if (oneByOne) {
    const fresh = await start();
    const options = Array.from({ length: n }, (_, i) => withSecret(i));
    const all = await timed(() => {
      for (let i = 0; i < n; i++) fresh.addGuest(`g${i}`, options[i]!);
    });
    const next = await timed(() => get(fresh, basicOf(fresh, "g0")));
    console.log(`  ${n} addGuest one by one: wall ${all.wall} ms, cpu ${all.cpu} ms; the request after them: wall ${next.wall} ms, cpu ${next.cpu} ms`);
    await fresh.close();
  }
} finally {
  upstream.stdin.end();
  rmSync(caDir, { recursive: true, force: true });
}
