/**
 * `node --import tsx bench/h1-held.ts [options]`: what one source address can make the proxy hold
 * over HTTP/1.1 and WebSocket, the sibling of bench/h2-held.ts (docs/performance.md, "What one
 * source holds"). For each scenario, a fresh proxy (bench/h2-windows-proxy.ts: `startProxy` from
 * a built tree's `dist/`, with its own `limits.connectionsPerSource` unless `--trees` sets one) and
 * a fresh bench upstream, the proxy's RSS after two collections; then `--connections` HTTP/1.1
 * guest connections from 127.0.0.1, each in a CONNECT tunnel with TLS (ALPN `http/1.1`), doing
 * what the scenario says with nobody reading on one side; once nothing has moved for a second,
 * the RSS as it stands and after two collections, and V8's `arrayBuffers`.
 *
 * Scenarios (`--scenarios`):
 *   up-h1up     `POST /hold` with a `--mib` MiB body to the upstream's HTTP/1.1 port, which reads
 *               nothing and never answers; the guest writes as fast as its socket takes
 *   up-h2up     the same to its h2-only port (the upstream stream's window, 65,535 bytes, fills)
 *   down-h1up   `GET /download` of `--mib` MiB; the guest reads the first bytes and no more
 *   down-h2up   the same from the h2-only port (`--origins N`: connection i to `o<i mod N>`, each
 *               origin an upstream HTTP/2 connection of its own, its whole window for one stream)
 *   pipe-h1up   a stopped download, then pipelined `GET /small` requests behind it, each with a
 *               head of `--head-kib` KiB, written as fast as the socket takes (the proxy stops
 *               reading past `limits.pipelinedRequests` waiting)
 *   pipe-up-h1up  a stopped download, then pipelined `POST /upload` requests of `--mib` MiB each
 *   head        a head of `--head-kib` KiB that never ends (no blank line), waiting for
 *               `timeouts.headersMs`
 *   ws-up       a WebSocket upgrade to `/ws-hold` (101, then nothing read); the guest then writes
 *               as fast as its socket takes
 *   ws-down     an upgrade to `/ws-flood` (101, then zeros as fast as they go); the guest reads
 *               the 101 and no more
 *
 * Options: `--trees label=DIR[:limitsJSON],…` (each built), `--connections 256` (a list),
 * `--mib 8`, `--head-kib 60`, `--origins 1`, `--json FILE`.
 */
import { once } from "node:events";
import { mkdtempSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { parseArgs } from "node:util";
import { ask, cleanup, installCleanup, root, setWorkDir, statusKb, stopChild } from "./children.js";
import { connectThrough } from "./h2-load.js";
import { parseTrees, startHeldProxy, type HeldConfig } from "./held-proxy.js";
import type { WindowsProxyMemory } from "./h2-windows-proxy.js";
import { originHost } from "./targets.js";
import type { UpstreamStats } from "./upstream.js";
import { createUpstreamCa, startBenchUpstream } from "./upstream-ca.js";

const scenarios = ["up-h1up", "up-h2up", "down-h1up", "down-h2up", "pipe-h1up", "pipe-up-h1up", "head", "ws-up", "ws-down"] as const;
type Scenario = (typeof scenarios)[number];

const { values } = parseArgs({
  options: {
    trees: { type: "string", default: `new=${root}` },
    scenarios: { type: "string", default: scenarios.join(",") },
    connections: { type: "string", default: "256" },
    origins: { type: "string", default: "1" },
    mib: { type: "string", default: "8" },
    "head-kib": { type: "string", default: "60" },
    json: { type: "string" },
  },
});

const configs = parseTrees(values.trees);
const chosen = values.scenarios.split(",").map((s) => {
  if (!(scenarios as readonly string[]).includes(s)) throw new RangeError(`--scenarios: unknown ${s}`);
  return s as Scenario;
});
const connectionCounts = values.connections.split(",").map(Number);
const origins = Number(values.origins);
const bytes = Number(values.mib) * 2 ** 20;
const headBytes = Number(values["head-kib"]) * 1024;

installCleanup();
const dir = mkdtempSync(join(tmpdir(), "eg-h1held-"));
setWorkDir(dir);
const ca = await createUpstreamCa(dir);

interface Reading {
  readonly config: string;
  readonly scenario: Scenario;
  readonly connections: number;
  /** Guests whose connection was refused or answered with another status, by what they got. */
  readonly refused: Readonly<Record<string, number>>;
  readonly rssBeforeMiB: number;
  readonly rssHeldMiB: number;
  readonly rssHeldGcMiB: number;
  readonly arrayBuffersMiB: number;
  readonly heapGrowthMiB: number;
  readonly externalGrowthMiB: number;
  /** What the guests got onto the wire (uploads, pipelines, heads), or the upstream wrote (downloads). */
  readonly movedMiB: number;
  readonly loadavg: number;
}

const readings: Reading[] = [];
const log = (line: string): void => void process.stderr.write(`${line}\n`);

const startProxy = (config: HeldConfig): ReturnType<typeof startHeldProxy> => startHeldProxy(config, ca.caFile, origins);

/** A guest connection: a CONNECT tunnel to `authority`, TLS inside it offering only `http/1.1`. */
async function h1Guest(proxyUrl: string, caPem: string, host: string, port: number): Promise<TLSSocket> {
  const tunnel = await connectThrough(proxyUrl, `${host}:${port}`);
  const socket = tlsConnect({ socket: tunnel, servername: host, ca: caPem, ALPNProtocols: ["http/1.1"] });
  socket.on("error", () => undefined);
  await once(socket, "secureConnect");
  return socket;
}

const chunk = Buffer.alloc(64 * 1024);

/** Header fields of about `size` bytes in all, within the proxy's 256 fields. */
function padding(size: number): string {
  const fields: string[] = [];
  for (let i = 0, left = size; left > 64; i++) {
    const value = "v".repeat(Math.min(4000, left - 16));
    fields.push(`x-pad-${i}: ${value}\r\n`);
    left -= value.length + 12;
  }
  return fields.join("");
}

/** Writes `next()` as long as the socket takes it (until it returns undefined), counting what went out. */
function pump(socket: TLSSocket, next: () => Buffer | string | undefined, sent: { bytes: number }): void {
  const go = (): void => {
    for (;;) {
      if (socket.destroyed) return;
      const piece = next();
      if (piece === undefined) return;
      const length = Buffer.byteLength(piece, "latin1");
      if (!socket.write(piece, "latin1", () => (sent.bytes += length))) {
        socket.once("drain", go);
        return;
      }
    }
  };
  go();
}

for (const connections of connectionCounts) for (const scenario of chosen) {
  for (const config of configs) {
    const { child: upstream, ready } = await startBenchUpstream(ca, 100);
    const stats = (): Promise<UpstreamStats> => ask<UpstreamStats>(upstream, "stats", { kind: "stats" }, 10_000);
    const proxy = await startProxy(config);
    const port = scenario.endsWith("h2up") ? ready.h2Port : ready.port;
    const hostOf = (c: number): string => (origins > 1 && scenario === "down-h2up" ? `o${c % origins}.bench.test` : originHost);
    // The leaf, an upstream connection, the code paths: before the baseline.
    const warm = await h1Guest(proxy.url, proxy.caPem, originHost, ready.port);
    warm.write(`GET /small HTTP/1.1\r\nHost: ${originHost}:${ready.port}\r\nConnection: close\r\n\r\n`);
    warm.resume();
    await once(warm, "close");
    await new Promise((r) => setTimeout(r, 500));
    const before = await ask<WindowsProxyMemory>(proxy.child, "memory", { kind: "measure" }, 30_000);
    const wroteBefore = (await stats()).downloadBytes;
    const held: TLSSocket[] = [];
    const sent = { bytes: 0 };
    const refused = new Map<string, number>();
    const refuse = (what: string): void => void refused.set(what, (refused.get(what) ?? 0) + 1);
    /** The first bytes the guest reads: a status other than the one expected is counted; then it stops reading. */
    const readStatus = (socket: TLSSocket, expected: string): void => {
      socket.once("data", (data: Buffer) => {
        socket.pause();
        const status = /^HTTP\/1\.1 (\d{3})/.exec(data.toString("latin1"))?.[1];
        if (status !== expected) refuse(`HTTP ${status ?? "?"}`);
      });
    };
    for (let c = 0; c < connections; c++) {
      const host = hostOf(c);
      const authority = `${host}:${port}`;
      let socket: TLSSocket;
      try {
        socket = await h1Guest(proxy.url, proxy.caPem, host, port);
      } catch (error) {
        refuse(`CONNECT: ${(error as Error).message.replace(/^CONNECT \S+: /, "")}`);
        continue;
      }
      held.push(socket);
      if (scenario === "up-h1up" || scenario === "up-h2up") {
        readStatus(socket, "none");
        let left = bytes;
        socket.write(`POST /hold HTTP/1.1\r\nHost: ${authority}\r\nContent-Length: ${bytes}\r\n\r\n`);
        pump(socket, () => (left > 0 ? ((left -= chunk.length), chunk) : undefined), sent);
      } else if (scenario === "down-h1up" || scenario === "down-h2up") {
        socket.write(`GET /download?bytes=${bytes} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
        readStatus(socket, "200");
      } else if (scenario === "pipe-h1up" || scenario === "pipe-up-h1up") {
        readStatus(socket, "200");
        const pad = padding(headBytes);
        let first = true;
        // pipe-up-h1up: what is left of the body being written.
        let left = 0;
        pump(
          socket,
          () => {
            if (first) {
              first = false;
              return `GET /download?bytes=${64 * bytes} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`;
            }
            if (scenario === "pipe-h1up") return `GET /small HTTP/1.1\r\nHost: ${authority}\r\n${pad}\r\n`;
            if (left > 0) {
              const piece = chunk.subarray(0, Math.min(left, chunk.length));
              left -= piece.length;
              return piece;
            }
            left = bytes;
            return `POST /upload HTTP/1.1\r\nHost: ${authority}\r\nContent-Length: ${bytes}\r\n\r\n`;
          },
          sent,
        );
      } else if (scenario === "head") {
        readStatus(socket, "none");
        const head = `GET /small HTTP/1.1\r\nHost: ${authority}\r\n${padding(headBytes)}`;
        socket.write(head, "latin1", () => (sent.bytes += head.length));
      } else {
        const path = scenario === "ws-up" ? "/ws-hold" : "/ws-flood";
        socket.write(
          `GET ${path} HTTP/1.1\r\nHost: ${authority}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`,
        );
        if (scenario === "ws-down") readStatus(socket, "101");
        else {
          let open = false;
          socket.once("data", (data: Buffer) => {
            const status = /^HTTP\/1\.1 (\d{3})/.exec(data.toString("latin1"))?.[1];
            if (status !== "101") return refuse(`HTTP ${status ?? "?"}`);
            socket.pause();
            if (!open) pump(socket, () => chunk, sent);
            open = true;
          });
        }
      }
    }
    // Settled: nothing moved for a second.
    const moved = async (): Promise<number> => (scenario.startsWith("down") || scenario === "ws-down" ? (await stats()).downloadBytes - wroteBefore : sent.bytes);
    let last = -1;
    let still = 0;
    for (let waited = 0; waited < 120_000 && still < 4; waited += 250) {
      await new Promise((r) => setTimeout(r, 250));
      const now = await moved();
      still = now === last ? still + 1 : 0;
      last = now;
    }
    const rssHeld = statusKb(proxy.child.pid, "VmRSS") ?? Number.NaN;
    const after = await ask<WindowsProxyMemory>(proxy.child, "memory", { kind: "measure" }, 30_000);
    const alive = held.filter((s) => !s.destroyed).length;
    const reading: Reading = {
      config: config.label,
      scenario,
      connections,
      refused: Object.fromEntries(refused),
      rssBeforeMiB: before.rss / 2 ** 20,
      rssHeldMiB: rssHeld / 1024,
      rssHeldGcMiB: after.rss / 2 ** 20,
      arrayBuffersMiB: after.arrayBuffers / 2 ** 20,
      heapGrowthMiB: (after.heapUsed - before.heapUsed) / 2 ** 20,
      externalGrowthMiB: (after.external - before.external) / 2 ** 20,
      movedMiB: last / 2 ** 20,
      loadavg: loadavg()[0]!,
    };
    readings.push(reading);
    log(
      `  ${scenario.padEnd(12)} ${config.label.padEnd(8)} ${connections} connections (${alive} open): RSS ${reading.rssBeforeMiB.toFixed(1)} -> ${reading.rssHeldMiB.toFixed(1)} MiB (${reading.rssHeldGcMiB.toFixed(1)} after gc), ` +
        `arrayBuffers ${reading.arrayBuffersMiB.toFixed(1)} MiB (heap +${reading.heapGrowthMiB.toFixed(1)}, external +${reading.externalGrowthMiB.toFixed(1)}), moved ${((reading.movedMiB * 1024) / connections).toFixed(0)} KiB per connection` +
        `${refused.size > 0 ? `, refused ${[...refused].map(([k, n]) => `${k}: ${n}`).join(", ")}` : ""} (load ${reading.loadavg.toFixed(2)})`,
    );
    for (const h of held) h.destroy();
    await stopChild(proxy.child);
    await stopChild(upstream);
  }
}

console.log(`\n| scenario | configuration | connections | RSS before MiB | held MiB | after gc MiB | growth MiB (after gc) | per connection KiB | arrayBuffers MiB | heap growth MiB | moved per connection KiB | refused | load |`);
console.log(`|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|`);
for (const r of readings) {
  const refusedText = Object.entries(r.refused).map(([code, n]) => `${code}: ${n}`).join(", ") || "–";
  console.log(
    `| ${r.scenario} | ${r.config} | ${r.connections} | ${r.rssBeforeMiB.toFixed(1)} | ${r.rssHeldMiB.toFixed(1)} | ${r.rssHeldGcMiB.toFixed(1)} | ${(r.rssHeldGcMiB - r.rssBeforeMiB).toFixed(1)} | ${(((r.rssHeldGcMiB - r.rssBeforeMiB) * 1024) / r.connections).toFixed(0)} | ${r.arrayBuffersMiB.toFixed(1)} | ${r.heapGrowthMiB.toFixed(1)} | ${((r.movedMiB * 1024) / r.connections).toFixed(0)} | ${refusedText} | ${r.loadavg.toFixed(2)} |`,
  );
}
if (values.json !== undefined) writeFileSync(values.json, JSON.stringify({ connections: connectionCounts, origins, mib: bytes / 2 ** 20, headKiB: headBytes / 1024, readings }, null, 2));
await cleanup();
process.exit(0);
