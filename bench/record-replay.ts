/**
 * Records a large download through the proxy to a HAR file (the body goes to a sidecar file),
 * then replays it, and prints the throughput and how much the proxy's RSS grew in each phase.
 * `npm run bench:record -- [MiB]` (default 256). The proxy runs in this process, so RSS covers
 * the proxy, the client and the upstream together: an upper bound on the proxy's share.
 */
import { createServer } from "node:https";
import type { SecureContext } from "node:tls";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ProxyAgent, request } from "undici";
import { createHttpHooks, startProxy } from "../src/index.js";
import type { ProxyOptions } from "../src/proxy/options.js";
import { testCa } from "../test/helpers/test-ca.js";

const mib = Number(process.argv[2] ?? 256);
const size = mib * 1024 * 1024;
const dir = mkdtempSync(join(tmpdir(), "egressgate-bench-record-"));
const ca = await testCa();
const context = (await ca.serverContexts(["api.test"])).get("api.test")!;
const chunk = Buffer.alloc(64 * 1024, 7);
const upstream = createServer({ secureContext: context, SNICallback: (_name: string, cb: (error: Error | null, ctx?: SecureContext) => void) => cb(null, context) } as Parameters<typeof createServer>[0], (_req, res) => {
  res.writeHead(200, { "content-type": "application/octet-stream", "content-length": size });
  let sent = 0;
  const pump = (): void => {
    while (sent < size) {
      sent += chunk.length;
      if (!res.write(chunk)) return void res.once("drain", pump);
    }
    res.end();
  };
  pump();
});
await new Promise<void>((resolve) => upstream.listen(0, "127.0.0.1", resolve));
const port = (upstream.address() as { port: number }).port;
const har = join(dir, "bench.har");

async function phase(name: string, upstreamOptions: NonNullable<ProxyOptions["upstream"]>): Promise<void> {
  const { httpHooks, env } = createHttpHooks({ allowedInternalHosts: ["api.test"] });
  const proxy = await startProxy({ httpHooks, env, listen: { port: 0 }, caDir: join(dir, "ca"), upstreamCa: [ca.certPem], resolve: { "api.test": ["127.0.0.1"] }, logLevel: "error", upstream: upstreamOptions });
  const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caCertPem } });
  global.gc?.();
  const before = process.memoryUsage().rss;
  let peak = before;
  const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 50);
  const started = performance.now();
  const res = await request(`https://api.test:${port}/big`, { dispatcher: agent });
  let bytes = 0;
  let head = "";
  for await (const part of res.body) {
    bytes += (part as Buffer).length;
    if (head.length < 300) head += (part as Buffer).toString("latin1", 0, 300);
  }
  if (res.statusCode !== 200) console.error(head);
  const seconds = (performance.now() - started) / 1000;
  clearInterval(sampler);
  await agent.close();
  await proxy.close();
  if (bytes !== size) throw new Error(`${name}: got ${res.statusCode} and ${bytes} bytes, expected ${size}`);
  console.log(`${name}: ${mib} MiB in ${seconds.toFixed(2)} s (${(mib / seconds).toFixed(0)} MiB/s), RSS growth ${((peak - before) / 1048576).toFixed(1)} MiB (peak ${(peak / 1048576).toFixed(0)} MiB)`);
}

try {
  await phase("record", { record: { path: har } });
  upstream.close();
  await phase("replay", { replay: { path: har } });
} finally {
  upstream.close();
  rmSync(dir, { recursive: true, force: true });
}
