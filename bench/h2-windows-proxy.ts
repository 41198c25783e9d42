/**
 * The proxy side of bench/h2-windows.ts: startProxy from a built source tree (argv[2], its
 * `dist/index.js`: this checkout, or an older one extracted elsewhere), with `limits` from
 * argv[4] (JSON; `{}` for the tree's defaults, the only choice an older tree may understand).
 * Reports its port and CA on IPC, answers `measure` with its memory after two collections
 * (run with --expose-gc), and exits when the parent disconnects.
 */
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import type * as Egressgate from "../src/index.js";

export interface WindowsProxyReady {
  readonly kind: "ready";
  readonly port: number;
  readonly caPem: string;
}

export interface WindowsProxyMemory {
  readonly kind: "memory";
  /** After two full collections. */
  readonly rss: number;
  readonly heapUsed: number;
  readonly external: number;
  readonly arrayBuffers: number;
}

const [tree, upstreamCaFile, limitsJson] = process.argv.slice(2) as [string, string, string];
const { createHttpHooks, startProxy } = (await import(pathToFileURL(join(tree, "dist", "index.js")).href)) as typeof Egressgate;
const { httpHooks, env } = createHttpHooks({ allowedInternalHosts: ["*.bench.test"] });
const limits = JSON.parse(limitsJson) as Record<string, number>;
const proxy = await startProxy({
  httpHooks,
  env,
  listen: { host: "127.0.0.1", port: 0 },
  caDir: mkdtempSync(join(tmpdir(), "eg-h2win-")),
  upstreamCa: [readFileSync(upstreamCaFile, "utf8")],
  // H2WIN_ORIGINS (bench/h2-held.ts --origins): o0…oN-1.bench.test besides, each an origin of its own.
  resolve: { "origin.bench.test": ["127.0.0.1"], ...Object.fromEntries(Array.from({ length: Number(process.env["H2WIN_ORIGINS"] ?? 0) }, (_, i) => [`o${i}.bench.test`, ["127.0.0.1"]])) },
  logLevel: (process.env["H2WIN_LOG"] ?? "warn") as "warn",
  ...(Object.keys(limits).length > 0 ? { limits } : {}),
});
process.on("message", (message: { kind?: string }) => {
  if (message.kind !== "measure") return;
  const gc = (globalThis as { gc?: () => void }).gc;
  gc?.();
  gc?.();
  const { rss, heapUsed, external, arrayBuffers } = process.memoryUsage();
  process.send!({ kind: "memory", rss, heapUsed, external, arrayBuffers } satisfies WindowsProxyMemory);
});
process.on("disconnect", () => void proxy.close().then(() => process.exit(0)));
process.send!({ kind: "ready", port: proxy.port, caPem: proxy.caCertPem } satisfies WindowsProxyReady);
