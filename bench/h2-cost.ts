/**
 * `node --import tsx bench/h2-cost.ts [OLD_SRC_ROOT] [--seconds N] [--rounds N]`: what HTTP/2
 * costs or gains, small GETs at concurrency 32 through egressgate (issue 20; docs/performance.md):
 *
 *   h1 guest -> h1 upstream     ProxyAgent (a tunnel per connection), the issue 6 path; with
 *                               OLD_SRC_ROOT (a checkout before h2 upstreams, e.g. from
 *                               `git archive 8d85df5`) the same scenario there too, in alternate rounds
 *   h2 guest -> h1 upstream     one guest connection, 32 streams in flight
 *   h1 guest -> h2-only upstream
 *   h2 guest -> h2-only upstream
 *
 * The proxy runs in a child process; the upstreams and the load run here. Besides req/s, the
 * proxy process's CPU time per request (µs), which a busy machine disturbs far less than throughput.
 */
import { fork } from "node:child_process";
import { createSecureServer, connect as h2Connect, type ClientHttp2Session } from "node:http2";
import { createServer } from "node:https";
import type { AddressInfo } from "node:net";
import { connect as netConnect } from "node:net";
import { connect as tlsConnect, type SecureContext } from "node:tls";
import { ProxyAgent, request } from "undici";
import { testCa } from "../test/helpers/test-ca.js";
import { cpuSeconds, root } from "./children.js";

const args = process.argv.slice(2);
const flag = (name: string, fallback: number): number => {
  const at = args.indexOf(name);
  return at < 0 ? fallback : Number(args[at + 1]);
};
const oldRoot = args[0] !== undefined && !args[0].startsWith("--") ? args[0] : undefined;
const seconds = flag("--seconds", 5);
const rounds = flag("--rounds", 3);
const concurrency = 32;
const body = Buffer.alloc(1024, 97);

const ca = await testCa();
const context = (await ca.serverContexts(["api.test"])).get("api.test")!;
const sni = (_name: string, cb: (error: Error | null, ctx?: SecureContext) => void): void => cb(null, context);
const h1 = createServer({ SNICallback: sni } as Parameters<typeof createServer>[0], (_req, res) => {
  res.writeHead(200, { "content-type": "text/plain", "content-length": body.length });
  res.end(body);
});
h1.keepAliveTimeout = 60_000;
const h2 = createSecureServer({ allowHTTP1: false, SNICallback: sni } as Parameters<typeof createSecureServer>[0]);
h2.on("stream", (stream) => {
  stream.on("error", () => undefined);
  stream.respond({ ":status": 200, "content-type": "text/plain", "content-length": body.length });
  stream.end(body);
});
await new Promise<void>((resolve) => h1.listen(0, "127.0.0.1", resolve));
await new Promise<void>((resolve) => h2.listen(0, "127.0.0.1", resolve));
const h1Port = (h1.address() as AddressInfo).port;
const h2Port = (h2.address() as AddressInfo).port;

interface Proxy {
  readonly port: number;
  readonly ca: string;
  readonly pid: number | undefined;
  stop(): void;
}

async function startEgressgate(srcRoot: string): Promise<Proxy> {
  const child = fork(new URL("./h2-cost-proxy.ts", import.meta.url), [srcRoot, ca.certPem], { execArgv: ["--import", "tsx"], cwd: srcRoot });
  const ready = await new Promise<{ port: number; ca: string }>((resolve, reject) => {
    child.once("message", (m) => resolve(m as { port: number; ca: string }));
    child.once("exit", (code) => reject(new Error(`proxy exited ${code}`)));
  });
  return { ...ready, pid: child.pid, stop: () => child.disconnect() };
}

interface Rate {
  readonly perSecond: number;
  /** The proxy's CPU time per request, µs. */
  readonly cpuUs: number;
}

/** Requests completed in `seconds` by `concurrency` loops of `one`, and the proxy's CPU per request. */
async function measure(proxy: Proxy, one: () => Promise<void>): Promise<Rate> {
  const cpuBefore = cpuSeconds(proxy.pid) ?? 0;
  const until = performance.now() + seconds * 1000;
  let done = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < until) {
        await one();
        done += 1;
      }
    }),
  );
  const cpu = (cpuSeconds(proxy.pid) ?? 0) - cpuBefore;
  return { perSecond: done / seconds, cpuUs: (cpu * 1e6) / done };
}

async function viaH1(proxy: Proxy, port: number): Promise<Rate> {
  const agent = new ProxyAgent({ uri: `http://127.0.0.1:${proxy.port}`, requestTls: { ca: proxy.ca } });
  const url = `https://api.test:${port}/`;
  // Warm-up: tunnels, leaves, the ALPN answer.
  for (let i = 0; i < 64; i++) await (await request(url, { dispatcher: agent })).body.arrayBuffer();
  const rate = await measure(proxy, async () => void (await (await request(url, { dispatcher: agent })).body.arrayBuffer()));
  await agent.close();
  return rate;
}

async function h2Guest(proxy: Proxy, port: number): Promise<ClientHttp2Session> {
  const socket = netConnect({ host: "127.0.0.1", port: proxy.port });
  await new Promise<void>((resolve) => socket.once("connect", resolve));
  socket.write(`CONNECT api.test:${port} HTTP/1.1\r\nHost: api.test:${port}\r\n\r\n`);
  await new Promise<void>((resolve) => socket.once("data", () => resolve()));
  const tls = tlsConnect({ socket, servername: "api.test", ca: proxy.ca, ALPNProtocols: ["h2"] });
  await new Promise<void>((resolve) => tls.once("secureConnect", resolve));
  return h2Connect(`https://api.test:${port}`, { createConnection: () => tls });
}

function h2Get(session: ClientHttp2Session): Promise<void> {
  return new Promise((resolve, reject) => {
    const stream = session.request({ ":path": "/" });
    stream.on("error", reject);
    stream.resume();
    stream.on("end", resolve);
  });
}

async function viaH2(proxy: Proxy, port: number): Promise<Rate> {
  const session = await h2Guest(proxy, port);
  for (let i = 0; i < 64; i++) await h2Get(session);
  const rate = await measure(proxy, () => h2Get(session));
  session.close();
  return rate;
}

const results: Record<string, Rate[]> = {};
const add = (name: string, value: Rate): void => void (results[name] ??= []).push(value);
for (let round = 0; round < rounds; round++) {
  if (oldRoot !== undefined) {
    const old = await startEgressgate(oldRoot);
    add("before h2 upstreams: h1 guest -> h1 upstream", await viaH1(old, h1Port));
    old.stop();
  }
  const current = await startEgressgate(root);
  add("h1 guest -> h1 upstream", await viaH1(current, h1Port));
  add("h2 guest (1 connection) -> h1 upstream", await viaH2(current, h1Port));
  add("h1 guest -> h2-only upstream", await viaH1(current, h2Port));
  add("h2 guest (1 connection) -> h2-only upstream", await viaH2(current, h2Port));
  current.stop();
}
const median = (values: number[]): number => Math.round([...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!);
console.log(`| scenario (concurrency ${concurrency}, 1 KiB bodies, ${seconds} s x ${rounds} rounds) | proxy CPU µs/req, median | req/s, median | req/s by round |`);
console.log("|---|---:|---:|---|");
for (const [name, values] of Object.entries(results)) {
  console.log(`| ${name} | ${median(values.map((v) => v.cpuUs))} | ${median(values.map((v) => v.perSecond))} | ${values.map((v) => Math.round(v.perSecond)).join(", ")} |`);
}
h1.close();
h2.close();
process.exit(0);
