/**
 * `node --import tsx bench/h2-floor.ts [--rounds N] [--requests N]`: what HTTP/2 saves Node's own
 * servers, with no proxy work at all (issue 20; docs/performance.md, "The floor").
 *
 * A child process runs two servers that answer every GET with the bench upstream's 100-byte
 * body: `node:https` (HTTP/1.1) and `node:http2` (its core API, one `respond()` and `end()` per
 * stream). h2load (Debian's nghttp2-client), one client for both protocols, drives them at
 * concurrency 32 as the h2 scenario does: 32 HTTP/1.1 connections, 8 HTTP/2 connections of 4
 * streams, one HTTP/2 connection of 32. Rounds alternate their order. Reported: the server's CPU
 * time per request (from /proc) and the ratio of the HTTP/1.1 figure to each HTTP/2 one, per round.
 *
 * Why: a proxy's cost per request is the guest side plus work that is the same on both protocols
 * (its pipeline and the upstream exchange). HTTP/2 can only save on the guest side, so the
 * proxy's ratio is below this floor's, the more so the larger the shared part.
 */
import { execFileSync, fork, type ChildProcess } from "node:child_process";
import { createServer } from "node:https";
import { createSecureServer } from "node:http2";
import type { AddressInfo } from "node:net";
import { createCaCertificate, importKeyPair, LeafSigner, parseCertificate } from "../src/tls/x509.js";
import { cpuSeconds } from "./children.js";
import { hasCommand, smallBodyBytes } from "./targets.js";

interface Ports {
  readonly h1: number;
  readonly h2: number;
}

interface ServerPems {
  readonly keyPem: string;
  readonly certPem: string;
}

function serve({ keyPem, certPem }: ServerPems): void {
  const body = Buffer.alloc(smallBodyBytes, 120);
  const head = { "content-type": "text/plain", "content-length": String(body.length) };
  const h1 = createServer({ key: keyPem, cert: certPem, keepAliveTimeout: 60_000 }, (_req, res) => {
    res.writeHead(200, head);
    res.end(body);
  });
  const h2 = createSecureServer({ key: keyPem, cert: certPem, allowHTTP1: false });
  h2.on("session", (session) => session.on("error", () => undefined));
  h2.on("stream", (stream) => {
    stream.on("error", () => undefined);
    stream.respond({ ":status": 200, ...head });
    stream.end(body);
  });
  let listening = 0;
  const ready = (): void => {
    if (++listening < 2) return;
    process.send?.({ h1: (h1.address() as AddressInfo).port, h2: (h2.address() as AddressInfo).port } satisfies Ports);
  };
  h1.listen(0, "127.0.0.1", ready);
  h2.listen(0, "127.0.0.1", ready);
}

interface Lane {
  readonly name: string;
  readonly args: readonly string[];
  readonly port: keyof Ports;
}

const lanes: readonly Lane[] = [
  { name: "HTTP/1.1, 32 connections", args: ["--h1", "-c", "32", "-m", "1"], port: "h1" },
  { name: "HTTP/2, 8 connections x 4 streams", args: ["-c", "8", "-m", "4"], port: "h2" },
  { name: "HTTP/2, 1 connection x 32 streams", args: ["-c", "1", "-m", "32"], port: "h2" },
];

/** h2load's count of 2xx answers (it exits 0 whatever the answers were). */
function h2load(url: string, args: readonly string[], requests: number): number {
  const out = execFileSync("h2load", ["-n", String(requests), ...args, url], { encoding: "utf8", timeout: 300_000 });
  const match = /status codes: (\d+) 2xx/.exec(out);
  if (match === null) throw new Error(`h2load printed no status counts:\n${out}`);
  return Number(match[1]);
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  if (args[0] === "--serve") {
    // The key comes over the IPC channel, not the environment (which /proc shows).
    process.once("message", (pems) => serve(pems as ServerPems));
    process.on("disconnect", () => process.exit(0));
    return;
  }
  if (!hasCommand("h2load")) {
    console.log("h2load is not installed (Debian: apt-get install nghttp2-client); nothing measured.");
    return;
  }
  const flag = (name: string, fallback: number): number => {
    const at = args.indexOf(name);
    if (at < 0) return fallback;
    const value = Number(args[at + 1]);
    if (!Number.isInteger(value) || value < 1) throw new Error(`${name} takes a whole number of at least 1, not ${String(args[at + 1])}`);
    return value;
  };
  const rounds = flag("--rounds", 6);
  const requests = flag("--requests", 100_000);
  const caPem = await createCaCertificate("egressgate h2-floor CA");
  const signer = await LeafSigner.create({ cert: parseCertificate(caPem.certPem), key: await importKeyPair(caPem.keyPem) }, "ecdsa");
  const leaf = await signer.sign("127.0.0.1", 1);
  const child: ChildProcess = fork(new URL(import.meta.url), ["--serve"], { execArgv: ["--import", "tsx"] });
  // A child that is gone makes send() and disconnect() emit 'error': the exit says why instead.
  child.on("error", () => undefined);
  const serverCpu = (): number => {
    const seconds = cpuSeconds(child.pid);
    if (seconds === undefined) throw new Error("the floor's servers are gone");
    return seconds;
  };
  try {
    const ports = await new Promise<Ports>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("the floor's servers did not start within 30 s")), 30_000);
      child.once("message", (message) => {
        clearTimeout(timer);
        resolve(message as Ports);
      });
      child.once("exit", (code) => {
        clearTimeout(timer);
        reject(new Error(`the floor's servers exited (${code})`));
      });
      child.send({ keyPem: signer.leafKey.privateKeyPem, certPem: leaf.certPem } satisfies ServerPems);
    });
    const url = (lane: Lane): string => `https://127.0.0.1:${ports[lane.port]}/small`;
    for (const lane of lanes) {
      const warm = h2load(url(lane), lane.args, 5_000);
      if (warm < 5_000) throw new Error(`${lane.name}: ${warm} of 5000 warm-up requests answered 2xx`);
    }
    const perRequest = new Map<string, number[]>(lanes.map((lane) => [lane.name, []]));
    for (let round = 0; round < rounds; round++) {
      const order = round % 2 === 0 ? lanes : [...lanes].reverse();
      const line: string[] = [];
      for (const lane of order) {
        const before = serverCpu();
        const ok = h2load(url(lane), lane.args, requests);
        if (ok < requests) throw new Error(`${lane.name}: ${ok} of ${requests} requests answered 2xx`);
        const spent = serverCpu() - before;
        // /proc counts in 10 ms ticks: a lane too short to move it measures nothing.
        if (spent <= 0) throw new Error(`${lane.name}: ${requests} requests took under one CPU tick; give --requests more`);
        const micros = (spent * 1e6) / ok;
        perRequest.get(lane.name)!.push(micros);
        line.push(`${lane.name} ${micros.toFixed(1)} µs`);
      }
      console.log(`round ${round + 1}/${rounds}: ${line.join(", ")}`);
    }
    const median = (values: readonly number[]): number => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
    const h1 = perRequest.get(lanes[0]!.name)!;
    console.log(`\n| Node's own server, concurrency 32, ${requests} requests x ${rounds} rounds | server CPU µs/req, median | HTTP/1.1 CPU ÷ this, per round: median (range) |`);
    console.log("|---|---:|---|");
    for (const lane of lanes) {
      const values = perRequest.get(lane.name)!;
      const ratios = values.map((value, i) => h1[i]! / value);
      const range = `${Math.min(...ratios).toFixed(2)}–${Math.max(...ratios).toFixed(2)}×`;
      console.log(`| ${lane.name} | ${median(values).toFixed(1)} | ${median(ratios).toFixed(2)}× (${range}) |`);
    }
  } finally {
    if (child.connected) child.disconnect();
    else child.kill();
  }
}

await main();
