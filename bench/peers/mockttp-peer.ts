/**
 * mockttp as a MITM proxy for the bench: one `forAnyRequest().thenPassThrough()` rule, so every
 * request is decrypted with mockttp's own CA and re-sent to its destination over a new TLS
 * connection that trusts the bench upstream CA. Traffic recording is off and no body is kept
 * (`recordTraffic: false`, `maxBodySize: 0`): a proxy that passes bodies through should not
 * store them, and egressgate without hooks does not either.
 *
 *   node --import loopback-guard.mjs mockttp-peer.mjs --dir DIR --upstream-ca FILE
 *
 * writes its CA certificate to DIR/ca.pem, prints `peer listening on http://127.0.0.1:PORT`,
 * and serves until SIGINT or SIGTERM. bench/run.ts transpiles it and runs it with plain node.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import * as mockttp from "mockttp";

function parseArgs(argv: readonly string[]): { dir: string; upstreamCaFile: string } {
  let dir: string | undefined;
  let upstreamCaFile: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--dir") dir = argv[++i];
    else if (argv[i] === "--upstream-ca") upstreamCaFile = argv[++i];
    else throw new TypeError(`mockttp-peer: unknown argument ${JSON.stringify(argv[i])}`);
  }
  if (dir === undefined || upstreamCaFile === undefined) throw new TypeError("usage: mockttp-peer --dir DIR --upstream-ca FILE");
  return { dir, upstreamCaFile };
}

async function main(): Promise<void> {
  const { dir, upstreamCaFile } = parseArgs(process.argv.slice(2));
  const ca = await mockttp.generateCACertificate({ subject: { commonName: "mockttp bench CA" } });
  writeFileSync(join(dir, "ca.pem"), ca.cert);
  const server = mockttp.getLocal({ https: { cert: ca.cert, key: ca.key }, recordTraffic: false, maxBodySize: 0 });
  await server.start(0);
  await server.forAnyRequest().thenPassThrough({ additionalTrustedCAs: [{ cert: readFileSync(upstreamCaFile, "utf8") }] });
  process.stdout.write(`peer listening on http://127.0.0.1:${server.port}\n`);
  let stopping = false;
  const stop = (): void => {
    if (stopping) process.exit(130);
    stopping = true;
    void server.stop().finally(() => process.exit(0));
  };
  process.on("SIGINT", stop);
  process.on("SIGTERM", stop);
}

main().catch((error: unknown) => {
  process.stderr.write(`mockttp-peer: ${(error as Error)?.stack ?? String(error)}\n`);
  process.exit(1);
});
