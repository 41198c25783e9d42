/**
 * A proxy in its own process, so that a test can read its RSS alone (with `--expose-gc`, after a
 * collection) and count its leaf signings through the diagnostics channel. Started by
 * test/integration/sni.test.ts with the CA directory as its argument; answers "measure" and
 * "close" over IPC.
 */
import { subscribe } from "node:diagnostics_channel";
import { createHttpHooks, startProxy } from "../../src/index.js";

let signed = 0;
subscribe("egressgate:tls:leaf-signed", () => {
  signed++;
});
let refusals = 0;
const { httpHooks } = createHttpHooks({ allowedInternalHosts: ["api.test"] });
const proxy = await startProxy({
  httpHooks,
  listen: { host: "127.0.0.1", port: 0 },
  caDir: process.argv[2]!,
  logLevel: "info",
  logSink: (line) => {
    if (line.includes("TLS SNI names")) refusals++;
  },
  resolve: { "api.test": ["127.0.0.1"] },
});
const gc = (globalThis as { gc?: () => void }).gc;

/** Once every guest connection is gone (the listener is a server handle, not a socket), after a collection. */
function measure(waited = 0): void {
  const open = process.getActiveResourcesInfo().filter((kind) => kind === "TCPSocketWrap").length;
  if (open > 0 && waited < 200) {
    setTimeout(() => measure(waited + 1), 25);
    return;
  }
  gc?.();
  setImmediate(() => {
    gc?.();
    const { rss, heapUsed } = process.memoryUsage();
    process.send!({ kind: "measure", rss, heapUsed, open, signed, refusals, gc: gc !== undefined });
  });
}

process.on("message", (message) => {
  if (message === "measure") measure();
  else if (message === "close") void proxy.close().then(() => process.exit(0));
});
process.send!({ kind: "ready", port: proxy.port, ca: proxy.caCertPem });
