/**
 * http-mitm-proxy as a MITM proxy for the bench, in its default shape: it makes its own CA in
 * DIR/certs/ca.pem, generates a 2048-bit RSA key and certificate for each new hostname (and
 * starts a local HTTPS server for it), and re-sends every request upstream through one
 * keep-alive `https.Agent` that trusts the bench upstream CA. No handlers are registered, so
 * bodies stream through untouched.
 *
 *   node --import loopback-guard.mjs http-mitm-proxy-peer.mjs --dir DIR --upstream-ca FILE
 *
 * prints `peer listening on http://127.0.0.1:PORT` and serves until SIGINT or SIGTERM.
 * bench/run.ts transpiles it and runs it with plain node.
 */
import { readFileSync } from "node:fs";
import { Agent } from "node:https";
import { Proxy } from "http-mitm-proxy";

function parseArgs(argv: readonly string[]): { dir: string; upstreamCaFile: string } {
  let dir: string | undefined;
  let upstreamCaFile: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--dir") dir = argv[++i];
    else if (argv[i] === "--upstream-ca") upstreamCaFile = argv[++i];
    else throw new TypeError(`http-mitm-proxy-peer: unknown argument ${JSON.stringify(argv[i])}`);
  }
  if (dir === undefined || upstreamCaFile === undefined) throw new TypeError("usage: http-mitm-proxy-peer --dir DIR --upstream-ca FILE");
  return { dir, upstreamCaFile };
}

const { dir, upstreamCaFile } = parseArgs(process.argv.slice(2));
// It logs "starting server for HOST" on console.debug for every new hostname; the bench drains
// stdout, but formatting 1,000 lines is not the work being measured.
console.debug = () => undefined;
const proxy = new Proxy();
let errors = 0;
proxy.onError((_ctx, error, kind) => {
  errors += 1;
  if (errors <= 3) process.stderr.write(`http-mitm-proxy-peer: ${kind ?? "error"}: ${error?.message ?? String(error)}\n`);
});
const httpsAgent = new Agent({ keepAlive: true, ca: readFileSync(upstreamCaFile, "utf8") });
proxy.listen({ host: "127.0.0.1", port: 0, sslCaDir: dir, keepAlive: true, httpsAgent }, (error?: Error | null) => {
  if (error) {
    process.stderr.write(`http-mitm-proxy-peer: ${error.message}\n`);
    process.exit(1);
  }
  process.stdout.write(`peer listening on http://127.0.0.1:${proxy.httpPort}\n`);
});
let stopping = false;
const stop = (): void => {
  if (stopping) process.exit(130);
  stopping = true;
  proxy.close();
  process.exit(0);
};
process.on("SIGINT", stop);
process.on("SIGTERM", stop);
