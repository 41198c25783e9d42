/**
 * `node --import tsx bench/h2-held.ts [options]`: what one guest can make the proxy hold with
 * streams whose reader has stopped (docs/performance.md, "What a stopped HTTP/2 reader holds").
 * For each configuration and scenario, a fresh proxy (bench/h2-windows-proxy.ts: `startProxy`
 * from a built tree's `dist/`), its RSS after two collections; then `--connections` guest
 * connections of `--streams` streams each whose reader stops, and once nothing has moved for a
 * second, its RSS as it stands and after two collections, and `arrayBuffers`.
 *
 * Scenarios (`--scenarios`):
 *   up-h1up      HTTP/2 guests upload `--mib` MiB per stream to `POST /hold` on the bench
 *                upstream's HTTP/1.1 port, which reads nothing and never answers
 *   up-h2up      the same to its h2-only port (whose own window, Node's 65,535 bytes, fills)
 *   down-h2up    HTTP/2 guests (Node's 65,535-byte windows) ask the h2-only port for `--mib` MiB
 *                per stream and stop reading
 *   down-h1up    the same from the HTTP/1.1 port
 *   h1-down-h2up HTTP/1.1 guests, one download per connection (connections × streams of them,
 *                `--h1-guests` at most), from the h2-only port; a guest stops reading
 *   h1-down-h1up the same from the HTTP/1.1 port
 *   h1-idle-h1up as many HTTP/1.1 guests, each with one small request answered and its connection
 *                (and the proxy's upstream connection) left open: what a connection costs, held
 *                body or not
 *
 * Configurations: `--trees label=DIR[:limitsJSON],…` (each built: `npm run build`), default this
 * checkout as `new`. What the guests managed to send (uploads) or the upstream wrote
 * (downloads) is given per stream too. Every guest comes from one source address (127.0.0.1):
 * what one guest can make the proxy hold in sum, across its connections.
 *
 *   --connections 2   (a list, `32,64,256`: one run of each scenario and configuration per count)
 *   --streams 100   --mib 8   --h1-guests 200   --json FILE
 *   --origins 1       HTTP/2 guest connection i goes to origin `o<i mod N>.bench.test` (N > 1),
 *                     each name an upstream connection of its own: a guest whose streams go to
 *                     many h2-only origins
 *   --first-alone     HTTP/2 guests open one stream, wait 300 ms, then the rest at once: what a
 *                     guest may send before it has read a lowered window, had the proxy lowered
 *                     one (a guest connection's window is now fixed)
 */
import type { ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, writeFileSync } from "node:fs";
import { connect as h2Connect, type ClientHttp2Session } from "node:http2";
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

const scenarios = ["up-h1up", "up-h2up", "down-h2up", "down-h1up", "h1-down-h2up", "h1-down-h1up", "h1-idle-h1up"] as const;
type Scenario = (typeof scenarios)[number];

const { values } = parseArgs({
  options: {
    trees: { type: "string", default: `new=${root}` },
    scenarios: { type: "string", default: scenarios.join(",") },
    connections: { type: "string", default: "2" },
    origins: { type: "string", default: "1" },
    streams: { type: "string", default: "100" },
    mib: { type: "string", default: "8" },
    "h1-guests": { type: "string", default: "200" },
    "first-alone": { type: "boolean", default: false },
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
/** The origin HTTP/2 guest connection `c` asks: `o<c mod origins>.bench.test`, all on 127.0.0.1 (h2-windows-proxy.ts resolves them). */
const hostOf = (c: number): string => (origins > 1 ? `o${c % origins}.bench.test` : originHost);
const streams = Number(values.streams);
const bytes = Number(values.mib) * 2 ** 20;
const h1Guests = Number(values["h1-guests"]);

installCleanup();
const dir = mkdtempSync(join(tmpdir(), "eg-h2held-"));
setWorkDir(dir);
const ca = await createUpstreamCa(dir);

interface Reading {
  readonly config: string;
  readonly scenario: Scenario;
  /** Guest connections (HTTP/1.1 guests: one stream each) and origins they went to. */
  readonly connections: number;
  readonly origins: number;
  readonly streams: number;
  /** Streams the proxy reset or refused, by code; HTTP/1.1 guests answered with a status, by status. */
  readonly refused: Readonly<Record<string, number>>;
  readonly rssBeforeMiB: number;
  readonly rssHeldMiB: number;
  readonly rssHeldGcMiB: number;
  readonly arrayBuffersMiB: number;
  /** V8's heap in use and its external memory (arrayBuffers among it), after two collections, against before. */
  readonly heapGrowthMiB: number;
  readonly externalGrowthMiB: number;
  /** Uploads: what the guests' streams got onto the wire; downloads: what the upstream wrote. */
  readonly movedMiB: number;
  readonly loadavg: number;
}

const readings: Reading[] = [];
const log = (line: string): void => void process.stderr.write(`${line}\n`);

async function startUpstream(): Promise<{ child: ChildProcess; h1Port: number; h2Port: number }> {
  const { child, ready } = await startBenchUpstream(ca, 100);
  return { child, h1Port: ready.port, h2Port: ready.h2Port };
}

const startProxy = (config: HeldConfig): ReturnType<typeof startHeldProxy> => startHeldProxy(config, ca.caFile, origins, { connectionsPerSource: 1024 });

async function h2Guest(proxyUrl: string, caPem: string, authority: string, window?: number): Promise<ClientHttp2Session> {
  const tunnel = await connectThrough(proxyUrl, authority);
  const socket = tlsConnect({ socket: tunnel, servername: authority.slice(0, authority.lastIndexOf(":")), ca: caPem, ALPNProtocols: ["h2"] });
  await once(socket, "secureConnect");
  const session = h2Connect(`https://${authority}`, { createConnection: () => socket, ...(window !== undefined ? { settings: { initialWindowSize: window } } : {}) });
  session.on("error", () => undefined);
  await once(session, "remoteSettings");
  return session;
}

const chunk = Buffer.alloc(64 * 1024);

for (const connections of connectionCounts) for (const scenario of chosen) {
  for (const config of configs) {
    // A fresh upstream per run: its held requests and connections are not the next run's.
    const upstream = await startUpstream();
    const stats = (): Promise<UpstreamStats> => ask<UpstreamStats>(upstream.child, "stats", { kind: "stats" }, 10_000);
    const proxy = await startProxy(config);
    const port = scenario.endsWith("h1up") ? upstream.h1Port : upstream.h2Port;
    const authority = `${originHost}:${port}`;
    // The leaf, the ALPN answer and an upstream connection, before the baseline.
    const warm = await h2Guest(proxy.url, proxy.caPem, authority);
    await new Promise<void>((resolve) => {
      const stream = warm.request({ ":path": "/small" });
      stream.resume();
      stream.on("close", resolve);
    });
    warm.destroy();
    await new Promise((r) => setTimeout(r, 500));
    const before = await ask<WindowsProxyMemory>(proxy.child, "memory", { kind: "measure" }, 30_000);
    const wroteBefore = (await stats()).downloadBytes;
    const held: (ClientHttp2Session | TLSSocket)[] = [];
    let sent = 0;
    let count = 0;
    /** Streams the proxy reset, by code. */
    const resets = new Map<number | string, number>();
    const refuse = (code: number | string): void => void resets.set(code, (resets.get(code) ?? 0) + 1);
    if (scenario.startsWith("h1-")) {
      count = Math.min(h1Guests, connections * streams);
      for (let i = 0; i < count; i++) {
        const tunnel = await connectThrough(proxy.url, authority);
        const socket = tlsConnect({ socket: tunnel, servername: originHost, ca: proxy.caPem, ALPNProtocols: ["http/1.1"] });
        socket.on("error", () => undefined);
        await once(socket, "secureConnect");
        if (scenario === "h1-idle-h1up") {
          socket.write(`GET /small HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
          // The 100-byte answer, read whole; the connection stays open.
          await new Promise<void>((resolve) => {
            let got = "";
            const onData = (data: Buffer): void => {
              got += data.toString("latin1");
              if (/\r\n\r\n[\s\S]{100}$/.test(got)) {
                socket.off("data", onData);
                resolve();
              }
            };
            socket.on("data", onData);
          });
        } else {
          socket.write(`GET /download?bytes=${bytes} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
          // The status line is read, then nothing more: a guest refused is counted by its status.
          socket.once("data", (data: Buffer) => {
            socket.pause();
            const status = /^HTTP\/1\.1 (\d{3})/.exec(data.toString("latin1"))?.[1];
            if (status !== undefined && status !== "200") refuse(`HTTP ${status}`);
          });
        }
        held.push(socket);
      }
    } else {
      const upload = scenario.startsWith("up-");
      for (let c = 0; c < connections; c++) {
        // Downloads: Node's own 65,535-byte windows, so the guest itself takes little.
        const session = await h2Guest(proxy.url, proxy.caPem, `${hostOf(c)}:${port}`, upload ? 32 * 2 ** 20 - 1 : undefined);
        held.push(session);
        for (let s = 0; s < streams; s++) {
          if (s === 1 && values["first-alone"]) await new Promise((r) => setTimeout(r, 300));
          count += 1;
          if (upload) {
            const stream = session.request({ ":method": "POST", ":path": "/hold" }, { endStream: false });
            stream.on("error", () => undefined);
            stream.on("close", () => {
              if (stream.rstCode !== undefined && stream.rstCode !== 0) refuse(stream.rstCode);
            });
            stream.on("response", (head) => {
              if (head[":status"] !== 200) refuse(`HTTP ${head[":status"]}`);
            });
            let left = bytes;
            const pump = (): void => {
              while (left > 0) {
                left -= chunk.length;
                if (!stream.write(chunk, () => (sent += chunk.length))) {
                  stream.once("drain", pump);
                  return;
                }
              }
            };
            pump();
          } else {
            const stream = session.request({ ":path": `/download?bytes=${bytes}` });
            stream.on("error", () => undefined);
            stream.on("close", () => {
              if (stream.rstCode !== undefined && stream.rstCode !== 0) refuse(stream.rstCode);
            });
            stream.on("response", (head) => {
              if (head[":status"] !== 200) refuse(`HTTP ${head[":status"]}`);
            });
            stream.pause();
          }
        }
      }
    }
    // Settled: nothing moved for a second (every window and buffer on the way is full).
    const moved = async (): Promise<number> => (scenario.startsWith("up-") ? sent : (await stats()).downloadBytes - wroteBefore);
    let last = -1;
    let still = 0;
    for (let waited = 0; waited < 120_000 && still < 4; waited += 250) {
      await new Promise((r) => setTimeout(r, 250));
      const now = await moved();
      still = now === last ? still + 1 : 0;
      last = now;
    }
    const rssHeld = statusKb(proxy.child.pid, "VmRSS") ?? Number.NaN;
    const windows = held.filter((h): h is ClientHttp2Session => "remoteSettings" in h).map((h) => h.remoteSettings.initialWindowSize);
    if (windows.length > 0) log(`  the guests' stream windows from the proxy: ${[...new Set(windows)].join(", ")}`);
    if (resets.size > 0) log(`  streams reset or refused, by code: ${[...resets].map(([code, n]) => `${code}: ${n}`).join(", ")}`);
    const after = await ask<WindowsProxyMemory>(proxy.child, "memory", { kind: "measure" }, 30_000);
    const reading: Reading = {
      config: config.label,
      scenario,
      connections: scenario.startsWith("h1-") ? count : connections,
      origins: scenario.startsWith("h1-") ? 1 : Math.min(origins, connections),
      streams: count,
      refused: Object.fromEntries([...resets].map(([code, n]) => [String(code), n])),
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
      `  ${scenario.padEnd(12)} ${config.label.padEnd(8)} ${count} streams: RSS ${reading.rssBeforeMiB.toFixed(1)} -> ${reading.rssHeldMiB.toFixed(1)} MiB (${reading.rssHeldGcMiB.toFixed(1)} after gc), ` +
        `arrayBuffers ${reading.arrayBuffersMiB.toFixed(1)} MiB (heap +${reading.heapGrowthMiB.toFixed(1)}, external +${reading.externalGrowthMiB.toFixed(1)}), moved ${((reading.movedMiB * 1024) / count).toFixed(0)} KiB per stream (load ${reading.loadavg.toFixed(2)})`,
    );
    for (const h of held) h.destroy();
    await stopChild(proxy.child);
    await stopChild(upstream.child);
  }
}

console.log(`\n| scenario | configuration | connections | origins | streams | RSS before MiB | held MiB | after gc MiB | growth MiB (after gc) | per stream KiB | arrayBuffers MiB | moved per stream KiB | refused | load |`);
console.log(`|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|`);
for (const r of readings) {
  const refused = Object.entries(r.refused).map(([code, n]) => `${code}: ${n}`).join(", ") || "–";
  console.log(
    `| ${r.scenario} | ${r.config} | ${r.connections} | ${r.origins} | ${r.streams} | ${r.rssBeforeMiB.toFixed(1)} | ${r.rssHeldMiB.toFixed(1)} | ${r.rssHeldGcMiB.toFixed(1)} | ${(r.rssHeldGcMiB - r.rssBeforeMiB).toFixed(1)} | ${(((r.rssHeldGcMiB - r.rssBeforeMiB) * 1024) / r.streams).toFixed(0)} | ${r.arrayBuffersMiB.toFixed(1)} | ${((r.movedMiB * 1024) / r.streams).toFixed(0)} | ${refused} | ${r.loadavg.toFixed(2)} |`,
  );
}
if (values.json !== undefined) writeFileSync(values.json, JSON.stringify({ connections: connectionCounts, origins, streams, mib: bytes / 2 ** 20, readings }, null, 2));
await cleanup();
process.exit(0);
