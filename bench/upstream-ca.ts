/**
 * The bench upstreams' certificates, and bench/upstream.ts started with them: a CA made fresh
 * for each run, and one `*.bench.test` leaf that covers the origin and every new hostname
 * (bench/targets.ts's names). The CA is written to the run's folder, the file a proxy under
 * test is given as its `upstreamCa`.
 */
import type { ChildProcess } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { ask, forkTs } from "./children.js";
import type { UpstreamMessage, UpstreamSetup } from "./upstream.js";
import { createCaCertificate, importKeyPair, LeafSigner, parseCertificate } from "../src/tls/x509.js";

export interface UpstreamCa {
  /** The CA's certificate, and the file in the run's folder that holds it: the proxies' `upstreamCa`. */
  readonly caPem: string;
  readonly caFile: string;
  /** The `*.bench.test` leaf's key and certificate, for the upstreams. */
  readonly keyPem: string;
  readonly certPem: string;
}

/** Makes the CA and the leaf, and writes the CA to `dir`/upstream-ca.pem. */
export async function createUpstreamCa(dir: string, name = "egressgate bench upstream CA"): Promise<UpstreamCa> {
  const ca = await createCaCertificate(name);
  const signer = await LeafSigner.create({ cert: parseCertificate(ca.certPem), key: await importKeyPair(ca.keyPem) }, "ecdsa");
  const leaf = await signer.sign("*.bench.test", 30);
  const caFile = join(dir, "upstream-ca.pem");
  writeFileSync(caFile, ca.certPem);
  return { caPem: ca.certPem, caFile, keyPem: signer.leafKey.privateKeyPem, certPem: leaf.certPem };
}

export type UpstreamReady = Extract<UpstreamMessage, { kind: "ready" }>;

/**
 * bench/upstream.ts in its own process, serving the leaf and `bodyBytes` for `/small`; tracked,
 * so children.ts's cleanup ends it. Resolves once it listens, with its ports.
 */
export async function startBenchUpstream(ca: UpstreamCa, bodyBytes: number): Promise<{ readonly child: ChildProcess; readonly ready: UpstreamReady }> {
  const child = forkTs("./upstream.ts", "upstream");
  const setup: UpstreamSetup = { kind: "setup", keyPem: ca.keyPem, certPem: ca.certPem, bodyBytes };
  return { child, ready: await ask<UpstreamReady>(child, "ready", setup, 30_000) };
}
