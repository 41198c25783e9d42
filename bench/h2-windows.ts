/**
 * `node --import tsx bench/h2-windows.ts [options]`: what the proxy's HTTP/2 flow-control windows
 * (`limits.h2StreamWindowBytes`, `limits.h2ConnectionWindowBytes`) cost and buy
 * (docs/performance.md, "HTTP/2 flow-control windows").
 *
 *   speed    one large transfer at a time through each configuration: downloads from the HTTP/1.1
 *            and the h2-only port of the bench's Node upstream (bench/upstream.ts) to HTTP/1.1 and
 *            HTTP/2 guests, and uploads from them; idle, and with `--busy N` spinning processes
 *            (`node -e 'for(;;);'`, killed after each pass). Configurations take turns, their
 *            order rotated each round, so a machine that changes speed changes every row alike.
 *   memory   a fresh proxy per configuration; `--paused N` guests each ask the h2-only port for a
 *            download and stop reading; once the upstream has written nothing more for a second,
 *            the proxy's RSS (as it stands, then after two collections) against its RSS before.
 *
 * Configurations: `--old DIR` (a built tree from before the windows were options, with its
 * defaults) and `--windows S/C,…` (this tree with stream window S and connection window C, in
 * bytes; `default` for this tree's defaults). Each tree must be built (`npm run build`).
 *
 *   --sizes 64,256        MiB per transfer (fractions too: 0.5)
 *   --concurrency 1       transfers at once, each on a guest connection of its own, all to the
 *                         same upstream (so on one upstream HTTP/2 session, or a pool of HTTP/1.1
 *                         connections); the figure is the time until the last ends
 *   --rtt 0               milliseconds of round trip added between the proxy and the upstream
 *                         (bench/delay-relay.ts, its own process: half each way), as across a network
 *   --rounds 3            rounds of the speed phase
 *   --busy 2              spinning processes in the busy pass (0: idle pass only)
 *   --kinds LIST          of h1-h1up, h1-h2up, h2-h1up, h2-h2up, up-h1-h1up, up-h1-h2up, up-h2-h1up, up-h2-h2up
 *   --guest-window N      the HTTP/2 guests' stream and connection windows (default 32 MiB,
 *                         curl 7.88's HTTP2_HUGE_WINDOW_SIZE: the guest is not what limits)
 *   --paused 20           paused guests per configuration in the memory phase (0: no memory phase)
 *   --paused-kind h2|h1   what the paused guests speak (h2: Node's 65,535-byte windows, so the
 *                         guest itself takes little)
 *   --paused-bytes 256    MiB each paused guest asks for
 *   --paused-upstream h2  where the paused downloads come from: h2 (the h2-only port) or h1 (what an
 *                         HTTP/1.1 upstream's path holds, in the kernel's socket buffers mostly)
 *   --json FILE           every transfer and reading, for the record
 */
import { spawn, fork, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, writeFileSync } from "node:fs";
import { connect as h2Connect, type ClientHttp2Session } from "node:http2";
import { loadavg, tmpdir } from "node:os";
import { join, resolve as resolvePath } from "node:path";
import { Readable } from "node:stream";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { parseArgs } from "node:util";
import { ProxyAgent, request } from "undici";
import { ask, cleanup, installCleanup, root, setWorkDir, statusKb, stopChild, track } from "./children.js";
import type { DelayRelayReady, DelayRelaySetup } from "./delay-relay.js";
import { connectThrough } from "./h2-load.js";
import type { WindowsProxyMemory, WindowsProxyReady } from "./h2-windows-proxy.js";
import { originHost } from "./targets.js";
import type { UpstreamStats } from "./upstream.js";
import { createUpstreamCa, startBenchUpstream } from "./upstream-ca.js";

const kinds = ["h1-h1up", "h1-h2up", "h2-h1up", "h2-h2up", "up-h1-h1up", "up-h1-h2up", "up-h2-h1up", "up-h2-h2up"] as const;
type Kind = (typeof kinds)[number];

interface Config {
  readonly label: string;
  readonly tree: string;
  readonly limits: Readonly<Record<string, number>>;
}

interface Proxy {
  readonly config: Config;
  readonly child: ChildProcess;
  readonly url: string;
  readonly caPem: string;
}

interface Transfer {
  readonly round: number;
  readonly load: "idle" | "busy";
  readonly config: string;
  readonly kind: Kind;
  readonly mib: number;
  readonly ms: number | undefined;
  readonly error: string | undefined;
  /** The 1-minute load average when it ended. */
  readonly loadavg: number;
}

interface MemoryReading {
  readonly config: string;
  readonly paused: number;
  readonly pausedKind: "h1" | "h2";
  readonly pausedUpstream: "h1" | "h2";
  readonly rssBeforeMiB: number;
  readonly rssPausedMiB: number;
  readonly rssPausedGcMiB: number;
  readonly arrayBuffersMiB: number;
  /** What the upstream wrote for all the paused downloads: proxy, kernel buffers and guests hold it. */
  readonly upstreamWroteMiB: number;
  readonly loadavg: number;
}

const { values } = parseArgs({
  options: {
    old: { type: "string" },
    windows: { type: "string", default: "default" },
    sizes: { type: "string", default: "64,256" },
    rounds: { type: "string", default: "3" },
    busy: { type: "string", default: "2" },
    kinds: { type: "string", default: kinds.join(",") },
    "guest-window": { type: "string", default: String(32 * 2 ** 20) },
    paused: { type: "string", default: "20" },
    "paused-kind": { type: "string", default: "h2" },
    "paused-bytes": { type: "string", default: "256" },
    "paused-upstream": { type: "string", default: "h2" },
    json: { type: "string" },
    concurrency: { type: "string", default: "1" },
    rtt: { type: "string", default: "0" },
  },
});
const sizes = values.sizes.split(",").map(Number);
const rounds = Number(values.rounds);
const busyCount = Number(values.busy);
const chosenKinds = values.kinds.split(",").filter((k): k is Kind => (kinds as readonly string[]).includes(k));
const guestWindow = Number(values["guest-window"]);
const pausedCount = Number(values.paused);
const pausedKind = values["paused-kind"] === "h1" ? "h1" : "h2";
const pausedBytes = Number(values["paused-bytes"]) * 2 ** 20;
const pausedUpstream = values["paused-upstream"] === "h1" ? "h1" : "h2";
const concurrency = Number(values.concurrency);
const rttMs = Number(values.rtt);

const configs: Config[] = [];
if (values.old !== undefined) configs.push({ label: "before", tree: resolvePath(values.old), limits: {} });
for (const spec of values.windows.split(",").filter((s) => s !== "")) {
  if (spec === "default") {
    configs.push({ label: "default", tree: root, limits: {} });
    continue;
  }
  const [stream, connection] = spec.split("/").map(Number);
  if (!Number.isInteger(stream) || !Number.isInteger(connection)) throw new RangeError(`--windows: expected STREAM/CONNECTION in bytes, got ${spec}`);
  configs.push({ label: `${size(stream!)}/${size(connection!)}`, tree: root, limits: { h2StreamWindowBytes: stream!, h2ConnectionWindowBytes: connection! } });
}

function size(bytes: number): string {
  if (bytes % 2 ** 20 === 0) return `${bytes / 2 ** 20}M`;
  if (bytes % 1024 === 0) return `${bytes / 1024}K`;
  return String(bytes);
}

// Every child is tracked (children.ts): cleanup() and a signal end them, and remove the folder.
installCleanup();
const dir = mkdtempSync(join(tmpdir(), "eg-h2win-bench-"));
setWorkDir(dir);
const spinners = new Set<ChildProcess>();

// The upstream: bench/upstream.ts in its own process, `*.bench.test` from a CA of its own.
const ca = await createUpstreamCa(dir);
const { child: upstream, ready: ports } = await startBenchUpstream(ca, 100);
const upstreamStats = (): Promise<UpstreamStats> => ask<UpstreamStats>(upstream, "stats", { kind: "stats" }, 10_000);
let [h1Port, h2Port] = [ports.port, ports.h2Port];
if (rttMs > 0) {
  const relay = track(fork(join(root, "bench", "delay-relay.ts"), [], { execArgv: ["--import", "tsx"], stdio: ["ignore", "inherit", "inherit", "ipc"] }), "delay relay");
  const relaySetup: DelayRelaySetup = { kind: "setup", ports: [ports.port, ports.h2Port], delayMs: rttMs / 2, maxInFlight: 4 * 2 ** 20 };
  [h1Port, h2Port] = (await ask<DelayRelayReady>(relay, "ready", relaySetup, 30_000)).ports as [number, number];
}
const authorityOf = (up: "h1" | "h2"): string => `${originHost}:${up === "h1" ? h1Port : h2Port}`;

async function startProxy(config: Config): Promise<Proxy> {
  const child = track(
    fork(join(root, "bench", "h2-windows-proxy.ts"), [config.tree, ca.caFile, JSON.stringify(config.limits)], {
      execArgv: ["--import", "tsx", "--expose-gc"],
      cwd: config.tree,
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    }),
    `egressgate ${config.label}`,
  );
  const ready = await ask<WindowsProxyReady>(child, "ready", undefined, 60_000);
  return { config, child, url: `http://127.0.0.1:${ready.port}`, caPem: ready.caPem };
}

async function h2Guest(proxy: Proxy, authority: string, window: number | undefined): Promise<ClientHttp2Session> {
  const tunnel = await connectThrough(proxy.url, authority);
  const socket = tlsConnect({ socket: tunnel, servername: originHost, ca: proxy.caPem, ALPNProtocols: ["h2"] });
  await once(socket, "secureConnect");
  const session = h2Connect(`https://${authority}`, { createConnection: () => socket, ...(window !== undefined ? { settings: { initialWindowSize: window } } : {}) });
  session.on("error", () => undefined);
  if (window !== undefined) session.setLocalWindowSize(window);
  return session;
}

/** Resolves with the body's length once the stream ends; rejects on a status other than 200. */
function h2Exchange(session: ClientHttp2Session, path: string, uploadBytes: number | undefined): Promise<number> {
  return new Promise((resolve, reject) => {
    const stream = session.request({ ":path": path, ":method": uploadBytes === undefined ? "GET" : "POST" }, { endStream: uploadBytes === undefined });
    let received = 0;
    let status = 0;
    let text = "";
    stream.on("response", (head) => (status = Number(head[":status"])));
    stream.on("data", (chunk: Buffer) => {
      received += chunk.length;
      if (uploadBytes !== undefined) text += chunk.toString("latin1");
    });
    stream.on("error", (error: Error) => reject(new Error(`${error.message} after ${received} bytes (status ${status})`)));
    stream.on("end", () => (status === 200 ? resolve(uploadBytes === undefined ? received : Number(text)) : reject(new Error(`status ${status}`))));
    if (uploadBytes !== undefined) Readable.from(zeros(uploadBytes)).pipe(stream);
  });
}

function* zeros(bytes: number): Generator<Buffer> {
  const chunk = Buffer.alloc(64 * 1024);
  for (let left = bytes; left > 0; left -= chunk.length) yield left >= chunk.length ? chunk : chunk.subarray(0, left);
}

async function transfer(proxy: Proxy, kind: Kind, bytes: number): Promise<number> {
  const upload = kind.startsWith("up-");
  const [guest, up] = kind.replace(/^up-/, "").split("-") as ["h1" | "h2", "h1up" | "h2up"];
  const authority = authorityOf(up === "h1up" ? "h1" : "h2");
  const path = upload ? "/upload" : `/download?bytes=${bytes}`;
  const started = performance.now();
  let got: number;
  if (guest === "h2") {
    const session = await h2Guest(proxy, authority, guestWindow);
    try {
      got = await h2Exchange(session, path, upload ? bytes : undefined);
    } finally {
      session.destroy();
    }
  } else {
    const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caPem, servername: originHost } });
    try {
      const answer = await request(`https://${authority}${path}`, {
        dispatcher: agent,
        method: upload ? "POST" : "GET",
        ...(upload ? { body: Readable.from(zeros(bytes)), headers: { "content-length": String(bytes) } } : {}),
      });
      if (answer.statusCode !== 200) throw new Error(`status ${answer.statusCode}`);
      if (upload) got = Number(await answer.body.text());
      else {
        got = 0;
        for await (const chunk of answer.body) got += (chunk as Buffer).length;
      }
    } finally {
      await agent.destroy();
    }
  }
  if (got !== bytes) throw new Error(`${got} of ${bytes} bytes`);
  return performance.now() - started;
}

function spin(count: number): void {
  for (let i = 0; i < count; i++) {
    const child = track(spawn(process.execPath, ["-e", "for(;;);"], { stdio: "ignore" }), "spinner");
    spinners.add(child);
    child.once("exit", () => spinners.delete(child));
  }
}

async function unspin(): Promise<void> {
  const running = [...spinners];
  for (const child of running) child.kill("SIGKILL");
  await Promise.all(running.map((child) => (child.exitCode !== null || child.signalCode !== null ? undefined : once(child, "exit"))));
}

const transfers: Transfer[] = [];
const memory: MemoryReading[] = [];
const log = (line: string): void => void process.stderr.write(`${line}\n`);
const median = (xs: readonly number[]): number => {
  const sorted = [...xs].sort((a, b) => a - b);
  if (sorted.length === 0) return Number.NaN;
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
};

log(`h2-windows: configurations ${configs.map((c) => c.label).join(", ")}; load average ${loadavg().map((x) => x.toFixed(2)).join(" ")}`);
try {
  if (rounds > 0 && chosenKinds.length > 0) {
    const running = await Promise.all(configs.map((config) => startProxy(config)));
    // Warm-up: each proxy's leaf, its ALPN answers and its upstream sessions.
    for (const proxy of running) for (const kind of chosenKinds) await transfer(proxy, kind, 2 ** 20);
    const loads: ("idle" | "busy")[] = busyCount > 0 ? ["idle", "busy"] : ["idle"];
    for (let round = 1; round <= rounds; round++) {
      for (const load of loads) {
        if (load === "busy") spin(busyCount);
        try {
          const order = running.map((_, i) => running[(i + round) % running.length]!);
          for (const mib of sizes) {
            for (const kind of chosenKinds) {
              for (const proxy of order) {
                let ms: number | undefined;
                let error: string | undefined;
                try {
                  const started = performance.now();
                  await Promise.all(Array.from({ length: concurrency }, () => transfer(proxy, kind, Math.round(mib * 2 ** 20))));
                  ms = performance.now() - started;
                } catch (failure) {
                  error = (failure as Error).message;
                }
                const t: Transfer = { round, load, config: proxy.config.label, kind, mib, ms, error, loadavg: loadavg()[0]! };
                transfers.push(t);
                log(`  round ${round} ${load} ${kind.padEnd(10)} ${concurrency} × ${String(mib).padStart(4)} MiB ${proxy.config.label.padEnd(10)} ${ms === undefined ? `failed: ${error}` : `${ms.toFixed(0)} ms, ${((concurrency * mib * 2 ** 20) / 1e6 / (ms / 1000)).toFixed(0)} MB/s`}  (load ${t.loadavg.toFixed(2)})`);
              }
            }
          }
        } finally {
          await unspin();
        }
      }
    }
    await Promise.all(running.map((proxy) => stopChild(proxy.child)));
  }

  if (pausedCount > 0) {
    for (const config of configs) {
      const proxy = await startProxy(config);
      const authority = authorityOf(pausedUpstream);
      // The upstream session, the ALPN answer and the leaf, before the baseline.
      const warm = await h2Guest(proxy, authority, undefined);
      await h2Exchange(warm, "/download?bytes=65536", undefined);
      warm.destroy();
      await new Promise((r) => setTimeout(r, 500));
      const before = await ask<WindowsProxyMemory>(proxy.child, "memory", { kind: "measure" }, 30_000);
      const wroteBefore = (await upstreamStats()).downloadBytes;
      const held: (ClientHttp2Session | TLSSocket)[] = [];
      for (let i = 0; i < pausedCount; i++) {
        if (pausedKind === "h2") {
          // Node's default windows: the guest takes 64 KiB and stops.
          const session = await h2Guest(proxy, authority, undefined);
          const stream = session.request({ ":path": `/download?bytes=${pausedBytes}` });
          stream.on("error", () => undefined);
          stream.pause();
          held.push(session);
        } else {
          const tunnel = await connectThrough(proxy.url, authority);
          const socket = tlsConnect({ socket: tunnel, servername: originHost, ca: proxy.caPem, ALPNProtocols: ["http/1.1"] });
          socket.on("error", () => undefined);
          await once(socket, "secureConnect");
          socket.write(`GET /download?bytes=${pausedBytes} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
          socket.pause();
          held.push(socket);
        }
      }
      // Settled: the upstream wrote nothing for a second (every window and buffer on the way is full).
      let last = -1;
      let still = 0;
      for (let waited = 0; waited < 120_000 && still < 4; waited += 250) {
        await new Promise((r) => setTimeout(r, 250));
        const wrote = (await upstreamStats()).downloadBytes;
        still = wrote === last ? still + 1 : 0;
        last = wrote;
      }
      const rssPaused = statusKb(proxy.child.pid, "VmRSS") ?? Number.NaN;
      const after = await ask<WindowsProxyMemory>(proxy.child, "memory", { kind: "measure" }, 30_000);
      const reading: MemoryReading = {
        config: config.label,
        paused: pausedCount,
        pausedKind,
        pausedUpstream,
        rssBeforeMiB: before.rss / 2 ** 20,
        rssPausedMiB: rssPaused / 1024,
        rssPausedGcMiB: after.rss / 2 ** 20,
        arrayBuffersMiB: after.arrayBuffers / 2 ** 20,
        upstreamWroteMiB: (last - wroteBefore) / 2 ** 20,
        loadavg: loadavg()[0]!,
      };
      memory.push(reading);
      log(
        `  memory ${config.label.padEnd(10)} ${pausedCount} paused ${pausedKind} guests (${pausedUpstream} upstream): RSS ${reading.rssBeforeMiB.toFixed(1)} -> ${reading.rssPausedMiB.toFixed(1)} MiB (${reading.rssPausedGcMiB.toFixed(1)} after gc), ` +
          `arrayBuffers ${reading.arrayBuffersMiB.toFixed(1)} MiB, upstream wrote ${reading.upstreamWroteMiB.toFixed(1)} MiB  (load ${reading.loadavg.toFixed(2)})`,
      );
      for (const guest of held) guest.destroy();
      await stopChild(proxy.child);
    }
  }
} finally {
  await cleanup();
}

// The tables: median ms per (load, size, kind) and configuration, MB/s in brackets, and each
// configuration's h2-upstream download time against its HTTP/1.1-upstream one for the same guest.
const labels = configs.map((c) => c.label);
const cell = (xs: readonly Transfer[], mib: number): string => {
  const ok = xs.filter((t) => t.ms !== undefined).map((t) => t.ms!);
  if (ok.length === 0) return xs.length === 0 ? "–" : "failed";
  const ms = median(ok);
  return `${ms.toFixed(0)} (${((concurrency * mib * 2 ** 20) / 1e6 / (ms / 1000)).toFixed(0)})${ok.length < xs.length ? ` ${xs.length - ok.length} failed` : ""}`;
};
if (transfers.length > 0) {
  const loads = [...new Set(transfers.map((t) => t.load))];
  console.log(`\n${concurrency} at once, round trip to the upstream +${rttMs} ms; median ms until the last ends (MB/s), ${rounds} rounds\n`);
  console.log(`| load | MiB | transfer | ${labels.join(" | ")} |`);
  console.log(`|---|---:|---|${labels.map(() => "---:").join("|")}|`);
  for (const load of loads) {
    const avg = transfers.filter((t) => t.load === load).map((t) => t.loadavg);
    for (const mib of sizes) {
      for (const kind of chosenKinds) {
        const row = labels.map((label) => cell(transfers.filter((t) => t.load === load && t.mib === mib && t.kind === kind && t.config === label), mib));
        console.log(`| ${load} (load ${Math.min(...avg).toFixed(1)}–${Math.max(...avg).toFixed(1)}) | ${mib} | ${kind} | ${row.join(" | ")} |`);
      }
      for (const guest of ["h1", "h2"] as const) {
        for (const prefix of ["", "up-"]) {
          const h1k = `${prefix}${guest}-h1up` as Kind;
          const h2k = `${prefix}${guest}-h2up` as Kind;
          if (!chosenKinds.includes(h1k) || !chosenKinds.includes(h2k)) continue;
          const ratios = labels.map((label) => {
            const of = (kind: Kind): number => median(transfers.filter((t) => t.load === load && t.mib === mib && t.kind === kind && t.config === label && t.ms !== undefined).map((t) => t.ms!));
            return `${(of(h2k) / of(h1k)).toFixed(2)}×`;
          });
          console.log(`| ${load} | ${mib} | ${prefix === "" ? "download" : "upload"}, ${guest} guest: h2-only ÷ HTTP/1.1 upstream (time) | ${ratios.join(" | ")} |`);
        }
      }
    }
  }
}
if (memory.length > 0) {
  console.log(`\n| configuration | paused guests | RSS before MiB | RSS paused MiB | after gc MiB | growth per paused stream KiB (after gc) | arrayBuffers MiB | upstream wrote per stream KiB | load |`);
  console.log("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
  for (const m of memory) {
    console.log(
      `| ${m.config} | ${m.paused} ${m.pausedKind} (${m.pausedUpstream} upstream) | ${m.rssBeforeMiB.toFixed(1)} | ${m.rssPausedMiB.toFixed(1)} | ${m.rssPausedGcMiB.toFixed(1)} | ${(((m.rssPausedGcMiB - m.rssBeforeMiB) * 1024) / m.paused).toFixed(0)} | ${m.arrayBuffersMiB.toFixed(1)} | ${((m.upstreamWroteMiB * 1024) / m.paused).toFixed(0)} | ${m.loadavg.toFixed(2)} |`,
    );
  }
}
if (values.json !== undefined) writeFileSync(values.json, JSON.stringify({ configs, sizes, rounds, busy: busyCount, guestWindow, concurrency, rttMs, transfers, memory }, null, 2));
process.exit(0);
