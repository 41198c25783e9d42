/**
 * Starting what the bench measures and what it measures against, each in its own process:
 *
 * - the Node upstream (bench/upstream.ts) and `openssl s_server -HTTP` for bulk downloads, both
 *   with a `*.bench.test` certificate from a CA made for the run;
 * - tcp-relay (bench/tcp-relay.ts), the cost of any hop;
 * - egressgate: the CLI, and bench/hooked-proxy.ts without and with no-op hooks, and with an
 *   external decider: a local webhook (bench/decider-webhook.ts, a process of its own) or a command;
 * - the peers, configured to do the same MITM work: mockttp and http-mitm-proxy (devDependencies,
 *   bench/peers/, preloaded with bench/peers/loopback-guard.ts) and mitmdump when it is installed.
 *
 * Every hostname the bench uses is a `bench.test` name (RFC 2606 reserves `.test`), and every
 * process dials it on 127.0.0.1: the load generator and tcp-relay by their own lookup, egressgate
 * through `--resolve`, the Node peers through the loopback guard, mitmdump through its addon.
 */
import { spawnSync, type ChildProcess } from "node:child_process";
import { chmodSync, closeSync, existsSync, ftruncateSync, mkdirSync, openSync, readFileSync, writeFileSync, writeSync } from "node:fs";
import { get as httpGet } from "node:http";
import { connect, createServer } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ask, exitWithParent, forkTs, root, spawnListening, startNodeProxy, transpile } from "./children.js";
import type { TargetName } from "./load.js";
import { headerAllowlistSource, noopPairSource, onResponseOnlySource } from "./policies.js";
import type { RelayMessage, RelaySetup } from "./tcp-relay.js";
import { createUpstreamCa, startBenchUpstream } from "./upstream-ca.js";

export const allTargets: readonly TargetName[] = [
  "direct",
  "tcp-relay",
  "egressgate",
  "egressgate-w2",
  "egressgate+metrics",
  "egressgate-api",
  "egressgate+hooks",
  "egressgate+djs",
  "egressgate+djs-allowlist",
  "egressgate+webhook",
  "egressgate+command",
  "mockttp",
  "http-mitm-proxy",
  "mitmdump",
];
export const peerTargets: readonly TargetName[] = ["mockttp", "http-mitm-proxy", "mitmdump"];
export type EgressgateTarget =
  | "egressgate"
  | "egressgate-w2"
  | "egressgate+metrics"
  | "egressgate-api"
  | "egressgate+hooks"
  | "egressgate+djs"
  | "egressgate+djs-allowlist"
  | "egressgate+webhook"
  | "egressgate+command";
export const egressgateTargets: readonly EgressgateTarget[] = [
  "egressgate",
  "egressgate-w2",
  "egressgate+metrics",
  "egressgate-api",
  "egressgate+hooks",
  "egressgate+djs",
  "egressgate+djs-allowlist",
  "egressgate+webhook",
  "egressgate+command",
];
/**
 * The CLI targets: egressgate in one process, with `--workers 2` (node:cluster), and with
 * `--metrics-listen` scraped every second. The others embed startProxy.
 */
const cliTargets: readonly EgressgateTarget[] = ["egressgate", "egressgate-w2", "egressgate+metrics"];
/** Targets that take part in small GETs only: the CLI with metrics is compared with the CLI there (DESIGN §8: under 3%). */
export const smallOnlyTargets: readonly TargetName[] = ["egressgate+metrics"];
/** How often the bench scrapes egressgate+metrics, as a Prometheus with a short interval would (its default is 60 s). */
const scrapeEveryMs = 1_000;
/** The embedded targets that differ from egressgate-api only in their hooks: they take part in small GETs only. */
export const hookedTargets: readonly TargetName[] = ["egressgate+hooks", "egressgate+djs", "egressgate+djs-allowlist", "egressgate+webhook", "egressgate+command"];
/** The hooked targets whose one source is an external decider (bench/decider-webhook.ts, or a command that allows). */
export const deciderTargets: readonly TargetName[] = ["egressgate+webhook", "egressgate+command"];

/** The command decider's script: it reads the document, as any decider does, and allows (exit 0, no answer). */
const allowCommandSource = "#!/bin/sh\ncat > /dev/null\n";
function writePolicy(dir: string, name: string, source: string): string {
  const file = join(dir, name);
  writeFileSync(file, source);
  return file;
}

/**
 * Each hooked target's flags for bench/hooked-proxy.ts; tier-2 policies and the command decider's
 * script are written into the work dir first.
 */
function hookedArgs(target: TargetName, dir: string, webhookUrl: string | undefined): string[] {
  if (target === "egressgate+hooks") return ["--hooks"];
  if (target === "egressgate+webhook") return ["--webhook", webhookUrl!];
  if (target === "egressgate+command") {
    const script = writePolicy(dir, "allow-decider.sh", allowCommandSource);
    chmodSync(script, 0o755);
    return ["--command", script];
  }
  if (target === "egressgate+djs") return ["--djs", writePolicy(dir, "noop-pair.mjs", noopPairSource)];
  if (target === "egressgate+djs-allowlist") return ["--djs", writePolicy(dir, "header-allowlist.mjs", headerAllowlistSource)];
  return [];
}

/** The name every scenario but the new-hostname one requests. */
export const originHost = "origin.bench.test";
export const smallBodyBytes = 100;

/**
 * The i-th new hostname for `target` in the new-hostnames scenario (`w` for warm-up names, `n` for
 * measured ones): a single label under bench.test, so the upstream's `*.bench.test` leaf covers it.
 */
export function newHostname(target: TargetName, i: number, prefix: "w" | "n"): string {
  return `${prefix}${i}-${target.replace(/[^a-z0-9-]/g, "-")}.bench.test`;
}

export interface ProxyChild {
  readonly child: ChildProcess;
  readonly url: string;
  /** The CA the proxy signs its leaf certificates with (the client trusts only this one). */
  readonly caPem: string;
}

export interface StartedTargets {
  readonly upstream: ChildProcess;
  readonly upstreamPort: number;
  /** The same upstream without TLS session resumption (the new-hostnames scenario). */
  readonly upstreamNoResumePort: number;
  /** The Node upstream's HTTP/2-only port (ALPN `h2` alone, like a gRPC server): the h2 scenario. */
  readonly upstreamH2Port: number;
  readonly upstreamCaPem: string;
  readonly upstreamCaFile: string;
  /** openssl s_server, when bulk downloads come from it. */
  readonly bulk: { readonly child: ChildProcess; readonly port: number } | undefined;
  /** Where a download of `bytes` comes from: s_server's file of that size, or the Node upstream. */
  readonly downloadUrl: (bytes: number) => string;
  readonly relay: ChildProcess | undefined;
  readonly relayPort: number | undefined;
  readonly proxies: Map<TargetName, ProxyChild>;
  /** Targets asked for that could not run, and why (mitmdump not installed, …). */
  readonly skipped: Map<TargetName, string>;
  /** A second egressgate CLI child that serves only the 1 GiB download, so its idle RSS is a fresh process's. */
  readonly freshEgressgate: ProxyChild | undefined;
  /** The same with an onResponse-only tier-2 policy (`--hooks-script`): the download must stream past it. */
  readonly freshEgressgateDjs: ProxyChild | undefined;
  /** One more, for the h2 scenario's 1 GiB downloads over one HTTP/2 stream. */
  readonly freshEgressgateH2: ProxyChild | undefined;
  readonly versions: Readonly<Record<string, string>>;
}

export interface StartOptions {
  readonly dir: string;
  readonly targets: readonly TargetName[];
  /** Hostnames the egressgate CLI must resolve to 127.0.0.1 besides the origin (new-hostname scenario). */
  readonly egressgateHostnames: readonly string[];
  /** Download sizes the scenarios need; with `openssl`, s_server gets a file of each size. */
  readonly downloadSizes: readonly number[];
  readonly bulkUpstream: "openssl" | "node";
  readonly cpuProf: EgressgateTarget | undefined;
  readonly profileDir: string | undefined;
  /** Start `freshEgressgate` too (the 1 GiB scenario). */
  readonly freshEgressgate: boolean;
  /** Start `freshEgressgateH2` too (the h2 scenario's downloads). */
  readonly freshEgressgateH2?: boolean;
}

export function hasCommand(name: string): boolean {
  return spawnSync("sh", ["-c", `command -v ${name}`], { stdio: "ignore" }).status === 0;
}

function commandVersion(command: string, args: readonly string[]): string {
  const out = spawnSync(command, args, { encoding: "utf8", timeout: 20_000 });
  return `${out.stdout ?? ""}${out.stderr ?? ""}`.split("\n")[0]?.trim() ?? "";
}

function packageVersion(name: string): string {
  return (JSON.parse(readFileSync(join(root, "node_modules", name, "package.json"), "utf8")) as { version: string }).version;
}

/** A free 127.0.0.1 port, for a child that cannot report the port it bound (mitmdump when quiet). */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/** Waits (bounded) until 127.0.0.1:port accepts a connection. */
export async function waitForPort(port: number, ms: number, name: string, child: ChildProcess): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) throw new Error(`${name} exited (${child.exitCode ?? child.signalCode}) while starting`);
    const open = await new Promise<boolean>((resolve) => {
      const socket = connect({ host: "127.0.0.1", port });
      socket.once("connect", () => {
        socket.destroy();
        resolve(true);
      });
      socket.once("error", () => resolve(false));
    });
    if (open) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`${name} did not listen on 127.0.0.1:${port} within ${ms / 1000} s`);
}

/**
 * A file that `openssl s_server -HTTP` serves as a whole response: an HTTP/1.0 head with
 * Content-Length, then `bytes` zero bytes as a sparse hole, so even 1 GiB takes no disk or page cache.
 */
function writeBulkFile(file: string, bytes: number): void {
  const head = Buffer.from(`HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: ${bytes}\r\nConnection: close\r\n\r\n`);
  const fd = openSync(file, "w");
  try {
    writeSync(fd, head);
    ftruncateSync(fd, head.length + bytes);
  } finally {
    closeSync(fd);
  }
}

/**
 * `openssl s_server -HTTP` on 127.0.0.1, serving `dir` (one connection at a time, which is all a
 * concurrency-1 transfer needs). It has no IPC and ignores stdin, so a shell wrapper holds it: the
 * wrapper kills it when its own stdin (the bench) closes, and on SIGTERM.
 */
async function startBulkServer(dir: string, certFile: string, keyFile: string): Promise<{ child: ChildProcess; port: number }> {
  const script = [
    "exec 3<&0",
    'openssl s_server -accept 127.0.0.1:0 -cert "$1" -key "$2" -HTTP &',
    "server=$!",
    'trap \'kill "$server" "$watch" 2>/dev/null\' EXIT',
    "trap 'exit 143' TERM INT HUP",
    "cat <&3 >/dev/null &",
    "watch=$!",
    'wait "$watch"',
  ].join("\n");
  const { child, match } = await spawnListening("openssl s_server", "sh", ["-c", script, "bulk-server", certFile, keyFile], /ACCEPT 127\.0\.0\.1:(\d+)/, { cwd: dir });
  return { child, port: Number(match) };
}

/**
 * Scrapes a metrics endpoint for the rest of the run, as Prometheus would: the proxy pays for
 * building the text inside the measured windows. A failed scrape is left for the next one.
 */
function scrapeEvery(url: string, ms: number): void {
  const timer = setInterval(() => {
    const req = httpGet(url, (res) => {
      res.on("error", () => undefined);
      res.resume();
    });
    req.on("error", () => undefined);
    req.setTimeout(ms, () => req.destroy());
  }, ms);
  timer.unref();
}

export async function startTargets(options: StartOptions): Promise<StartedTargets> {
  const { dir, targets } = options;
  const cliPath = join(root, "dist", "cli", "bin.js");
  if (!existsSync(cliPath)) throw new Error(`${cliPath} is missing: run "npm run build" first`);
  const skipped = new Map<TargetName, string>();
  const versions: Record<string, string> = { node: process.version, openssl: commandVersion("openssl", ["version"]) };

  // The upstreams' CA and one `*.bench.test` leaf, which covers the origin and every new hostname.
  const upstreamCa = await createUpstreamCa(dir);
  const upstreamCaFile = upstreamCa.caFile;

  const { child: upstream, ready } = await startBenchUpstream(upstreamCa, smallBodyBytes);
  const { port: upstreamPort, noResumePort: upstreamNoResumePort, h2Port: upstreamH2Port } = ready;

  let bulk: StartedTargets["bulk"];
  const fileOf = (bytes: number): string => `download-${bytes}`;
  if (options.downloadSizes.length > 0 && options.bulkUpstream === "openssl") {
    const bulkDir = join(dir, "bulk");
    mkdirSync(bulkDir);
    const certFile = join(dir, "bulk-cert.pem");
    const keyFile = join(dir, "bulk-key.pem");
    writeFileSync(certFile, upstreamCa.certPem);
    writeFileSync(keyFile, upstreamCa.keyPem, { mode: 0o600 });
    for (const bytes of options.downloadSizes) writeBulkFile(join(bulkDir, fileOf(bytes)), bytes);
    bulk = await startBulkServer(bulkDir, certFile, keyFile);
  }
  const bulkPort = bulk?.port;
  const downloadUrl = (bytes: number): string =>
    bulkPort !== undefined ? `https://${originHost}:${bulkPort}/${fileOf(bytes)}` : `https://${originHost}:${upstreamPort}/download?bytes=${bytes}`;
  const ports = [upstreamPort, upstreamNoResumePort, upstreamH2Port, ...(bulk !== undefined ? [bulk.port] : [])];

  let relay: ChildProcess | undefined;
  let relayPort: number | undefined;
  if (targets.includes("tcp-relay")) {
    relay = forkTs("./tcp-relay.ts", "tcp-relay");
    const relaySetup: RelaySetup = { kind: "setup", allowedPorts: ports };
    relayPort = (await ask<Extract<RelayMessage, { kind: "ready" }>>(relay, "ready", relaySetup, 30_000)).port;
  }

  const proxies = new Map<TargetName, ProxyChild>();
  // The peers start in the background, side by side, while the egressgate children start one by
  // one: http-mitm-proxy's RSA CA and mitmdump's Python start-up each take a few seconds.
  const peerStarts: Promise<void>[] = [];
  // Awaited after the egressgate children; marked handled now, so a failure that lands while an
  // egressgate child is starting is not an unhandled rejection (allSettled still reports it).
  const background = (start: Promise<void>): void => {
    start.catch(() => undefined);
    peerStarts.push(start);
  };
  const nodePeers = (["mockttp", "http-mitm-proxy"] as const).filter((t) => targets.includes(t));
  if (nodePeers.length > 0) {
    const guard = await transpile(dir, fileURLToPath(new URL("./peers/loopback-guard.ts", import.meta.url)));
    for (const target of nodePeers) {
      versions[target] = packageVersion(target);
      const script = await transpile(dir, fileURLToPath(new URL(`./peers/${target}-peer.ts`, import.meta.url)), [target]);
      const peerDir = join(dir, target);
      mkdirSync(peerDir);
      background(
        startNodeProxy(target, script, ["--dir", peerDir, "--upstream-ca", upstreamCaFile], { preload: [guard] }).then((started) => {
          const caFile = target === "mockttp" ? join(peerDir, "ca.pem") : join(peerDir, "certs", "ca.pem");
          proxies.set(target, { ...started, caPem: readFileSync(caFile, "utf8") });
        }),
      );
    }
  }
  if (targets.includes("mitmdump")) {
    if (!hasCommand("mitmdump")) {
      skipped.set("mitmdump", "mitmdump is not installed (Debian: apt-get install mitmproxy)");
    } else {
      versions["mitmdump"] = commandVersion("mitmdump", ["--version"]).replace(/^Mitmproxy:\s*/, "");
      const confDir = join(dir, "mitmdump");
      mkdirSync(confDir);
      background(
        (async () => {
          const port = await freePort();
          const args = [
            ...["--listen-host", "127.0.0.1", "--listen-port", String(port), "--set", `confdir=${confDir}`],
            ...["--set", `ssl_verify_upstream_trusted_ca=${upstreamCaFile}`, "--set", "stream_large_bodies=1m"],
            // No per-flow or per-connection lines: printing them is not the work being compared.
            ...["--set", "flow_detail=0", "--set", "termlog_verbosity=warn"],
            ...["-s", fileURLToPath(new URL("./peers/mitmdump_addon.py", import.meta.url))],
          ];
          const { child } = await spawnListening("mitmdump", "mitmdump", args, /(bench addon running)/, { cwd: confDir });
          await waitForPort(port, 30_000, "mitmdump", child);
          proxies.set("mitmdump", { child, url: `http://127.0.0.1:${port}`, caPem: readFileSync(join(confDir, "mitmproxy-ca-cert.pem"), "utf8") });
        })(),
      );
    }
  }
  // The egressgate children share one CA dir. They start one after another: the first creates
  // the CA, the others load it, and none races another to create it.
  const caDir = join(dir, "proxy-ca");
  const profileFor = (target: EgressgateTarget): string | undefined => (options.cpuProf === target ? options.profileDir : undefined);
  const cliArgs = (extraHosts: readonly string[]): string[] => [
    ...["--listen", "127.0.0.1:0", "--ca-dir", caDir, "--allow-internal-host", "*.bench.test"],
    ...[originHost, ...extraHosts].flatMap((host) => ["--resolve", `${host}=127.0.0.1`]),
    ...["--upstream-ca", upstreamCaFile, "--log-level", "warn"],
  ];
  const startCli = async (name: string, extraHosts: readonly string[], profileDir: string | undefined, extraArgs: readonly string[] = []): Promise<ProxyChild> => {
    const started = await startNodeProxy(name, cliPath, [...cliArgs(extraHosts), ...extraArgs], { profileDir });
    return { ...started, caPem: readFileSync(join(caDir, "ca.crt"), "utf8") };
  };
  if (targets.includes("egressgate")) proxies.set("egressgate", await startCli("egressgate", options.egressgateHostnames, profileFor("egressgate")));
  if (targets.includes("egressgate-w2")) proxies.set("egressgate-w2", await startCli("egressgate-w2", [], undefined, ["--workers", "2"]));
  if (targets.includes("egressgate+metrics")) {
    const metricsPort = await freePort();
    proxies.set("egressgate+metrics", await startCli("egressgate+metrics", [], profileFor("egressgate+metrics"), ["--metrics-listen", `127.0.0.1:${metricsPort}`]));
    scrapeEvery(`http://127.0.0.1:${metricsPort}/metrics`, scrapeEveryMs);
  }
  const freshEgressgate = options.freshEgressgate ? await startCli("egressgate (1 GiB)", [], undefined) : undefined;
  const freshEgressgateDjs = options.freshEgressgate
    ? await startCli("egressgate + onResponse policy (1 GiB)", [], undefined, ["--hooks-script", writePolicy(dir, "on-response-only.mjs", onResponseOnlySource)])
    : undefined;
  const freshEgressgateH2 = options.freshEgressgateH2 === true ? await startCli("egressgate (1 GiB over h2)", [], undefined) : undefined;
  const apiTargets = egressgateTargets.filter((t) => !cliTargets.includes(t) && targets.includes(t));
  let webhookUrl: string | undefined;
  if (targets.includes("egressgate+webhook")) {
    const script = await transpile(dir, fileURLToPath(new URL("./decider-webhook.ts", import.meta.url)));
    const started = await spawnListening("decider webhook", process.execPath, ["--import", exitWithParent, script], /listening on (http:\/\/127\.0\.0\.1:\d+)/);
    webhookUrl = `${started.match}/decide`;
  }
  if (apiTargets.length > 0) {
    const hookedProxy = await transpile(dir, fileURLToPath(new URL("./hooked-proxy.ts", import.meta.url)), ["egressgate"]);
    for (const target of apiTargets) {
      const args = ["--ca-dir", caDir, "--upstream-ca", upstreamCaFile, "--host", originHost, ...hookedArgs(target, dir, webhookUrl)];
      const started = await startNodeProxy(target, hookedProxy, args, { profileDir: profileFor(target) });
      proxies.set(target, { ...started, caPem: readFileSync(join(caDir, "ca.crt"), "utf8") });
    }
  }

  const settled = await Promise.allSettled(peerStarts);
  const failed = settled.find((s): s is PromiseRejectedResult => s.status === "rejected");
  if (failed !== undefined) throw failed.reason;

  return {
    upstream,
    upstreamPort,
    upstreamNoResumePort,
    upstreamH2Port,
    upstreamCaPem: upstreamCa.caPem,
    upstreamCaFile,
    bulk,
    downloadUrl,
    relay,
    relayPort,
    proxies,
    skipped,
    freshEgressgate,
    freshEgressgateDjs,
    freshEgressgateH2,
    versions,
  };
}
