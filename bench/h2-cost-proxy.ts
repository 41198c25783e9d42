/**
 * The proxy side of bench/h2-cost.ts: startProxy from the source tree given as argv[2] (this
 * checkout, or an older one extracted elsewhere), reporting its port and CA on IPC.
 */
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import type * as Egressgate from "../src/index.js";

const srcRoot = process.argv[2]!;
const upstreamCa = process.argv[3]!;
const { createHttpHooks, startProxy } = (await import(pathToFileURL(join(srcRoot, "src/index.ts")).href)) as typeof Egressgate;
const { httpHooks, env } = createHttpHooks({ allowedInternalHosts: ["api.test"] });
const proxy = await startProxy({
  httpHooks,
  env,
  listen: { host: "127.0.0.1", port: 0 },
  caDir: mkdtempSync(join(tmpdir(), "eg-h2cost-")),
  upstreamCa: [upstreamCa],
  resolve: { "api.test": ["127.0.0.1"] },
  logLevel: "warn",
});
process.send!({ port: proxy.port, ca: proxy.caCertPem });
process.on("disconnect", () => void proxy.close().then(() => process.exit(0)));
