/**
 * How long a SIGHUP with a large config file holds the proxy's event loop, as guests see it.
 * Starts the built CLI of a checkout (`--root`, default this one: run `npm run build` first) on
 * a config file with N `resolve` entries (or N `allowHosts`), a plain HTTP upstream in this
 * process, and sends SIGHUP `--rounds` times, each with a changed file.
 *
 *   node --import tsx bench/reload-hold.ts [--root DIR] [--entries N] [--kind resolve|allowHosts] [--rounds R]
 *
 * Prints per reload: the longest gap of a 10 ms interval timer inside the proxy (how long its
 * event loop was held), and the slowest of the GETs a client sends through the proxy, one every
 * 10 ms on a keep-alive connection, during that reload; then how many of those GETs failed.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "undici";

const flag = (name: string, fallback: string): string => (process.argv.includes(name) ? process.argv[process.argv.indexOf(name) + 1]! : fallback);
const root = resolve(flag("--root", fileURLToPath(new URL("..", import.meta.url))));
const entries = Number(flag("--entries", "40000"));
const kind = flag("--kind", "resolve");
const rounds = Number(flag("--rounds", "3"));

// Inside the proxy: a 10 ms timer that reports each gap over 100 ms on stderr.
const monitor = `data:text/javascript,${encodeURIComponent(
  "let last = performance.now(); setInterval(() => { const now = performance.now(); if (now - last > 100) process.stderr.write(`HELD ${Math.round(now - last)} ms\\n`); last = now; }, 10).unref();",
)}`;

const upstream = createServer((req, res) => {
  req.resume();
  res.end("ok");
});
await new Promise<void>((done) => upstream.listen(0, "127.0.0.1", done));
const upstreamPort = (upstream.address() as AddressInfo).port;
const dir = mkdtempSync(join(tmpdir(), "reload-hold-"));
const config = join(dir, "egressgate.yaml");
const body =
  kind === "resolve"
    ? `resolve:\n  api.test: [127.0.0.1]\n${Array.from({ length: entries }, (_, i) => `  h${i}.test: [127.0.0.5]\n`).join("")}`
    : `resolve:\n  api.test: [127.0.0.1]\nallowHosts:\n${Array.from({ length: entries }, (_, i) => `  - h${i}.example-${i % 97}.com\n`).join("")}`;
// Each round allows one more name, so every reload applies a changed file.
const write = (round: number): void => writeFileSync(config, `listen: 127.0.0.1:0\nallowInternalHosts: [api.test, r${round}.test]\n${body}`);
write(0);

const child = spawn(process.execPath, ["--import", monitor, join(root, "dist/cli/bin.js"), "--config", config, "--ca-dir", dir, "--log-format", "json"], { stdio: ["ignore", "pipe", "pipe"] });
let out = "";
child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
child.stderr.on("data", (chunk: Buffer) => (out += chunk.toString()));
const until = async (pattern: RegExp, from = 0): Promise<void> => {
  while (!pattern.test(out.slice(from))) {
    if (child.exitCode !== null) throw new Error(`egressgate exited:\n${out}`);
    await new Promise((done) => setTimeout(done, 10));
  }
};
await until(/listening on http:\/\/\S+/);
const proxyUrl = /listening on (http:\/\/\S+)/.exec(out)![1]!;

const client = new Client(proxyUrl, { keepAliveTimeout: 60_000 });
let slowest = 0;
let failures = 0;
let probing = true;
const probe = (async () => {
  while (probing) {
    const started = performance.now();
    try {
      const res = await client.request({ method: "GET", path: `http://api.test:${upstreamPort}/`, headers: { host: `api.test:${upstreamPort}` } });
      await res.body.text();
    } catch {
      failures += 1;
    }
    slowest = Math.max(slowest, performance.now() - started);
    await new Promise((done) => setTimeout(done, 10));
  }
})();

console.log(`${root}: ${entries} ${kind} entries, ${body.length} bytes`);
try {
  await new Promise((done) => setTimeout(done, 1_000));
  for (let round = 1; round <= rounds; round++) {
    write(round);
    const mark = out.length;
    slowest = 0;
    child.kill("SIGHUP");
    await until(/"msg":"(configuration reloaded|reload failed[^"]*)"/, mark);
    await new Promise((done) => setTimeout(done, 300));
    const held = Math.max(0, ...[...out.slice(mark).matchAll(/HELD (\d+) ms/g)].map((match) => Number(match[1])));
    const outcome = out.slice(mark).includes("reload failed") ? "failed" : "applied";
    console.log(`reload ${round}: ${outcome}; event loop held up to ${held} ms; slowest GET ${slowest.toFixed(0)} ms`);
  }
} finally {
  probing = false;
  await probe;
  console.log(`GETs that failed: ${failures}`);
  child.kill("SIGKILL");
  upstream.close();
  await client.close();
  rmSync(dir, { recursive: true, force: true });
}
