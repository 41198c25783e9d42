/**
 * What a leaf certificate for a new hostname costs: one signature plus `tls.createSecureContext`,
 * for each way of making one, side by side in one run. Then what a guest sees: the extra time of
 * a real TLS handshake to a new hostname over one to a cached hostname.
 *
 *   npx tsx bench/certs.ts            (about 30 s on 2 cores; most of it is forge's pure-JS keygen)
 *
 * docs/certificates.md records the figures and the choice they support.
 */
import "reflect-metadata";
import { generateKeyPair as generateNodeKeyPair, generateKeyPairSync, randomBytes } from "node:crypto";
import { cpus } from "node:os";
import { performance } from "node:perf_hooks";
import { connect, createSecureContext, createServer, type SecureContext } from "node:tls";
import { promisify } from "node:util";
import * as x509 from "@peculiar/x509";
import forge from "node-forge";
import { LeafCertCache } from "../src/tls/leaf-cert-cache.js";
import {
  createCaCertificate,
  generateKeyPair,
  importKeyPair,
  LeafSigner,
  parseCertificate,
  type CaMaterial,
  type KeyPair,
  type LeafKeyType,
} from "../src/tls/x509.js";

const day = 24 * 60 * 60 * 1000;
const generateKeyPairAsync = promisify(generateNodeKeyPair);
const validityDays = 30;

interface Row {
  readonly label: string;
  readonly samples: number[];
  readonly signMs?: number;
  readonly contextMs?: number;
}

function quantile(sorted: readonly number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? Number.NaN;
}

function mean(values: readonly number[]): number {
  return values.reduce((a, b) => a + b, 0) / values.length;
}

/** Issues `count` leaves (after `warmup` unrecorded ones) and times each, split into sign and context. */
async function measureLeaves(
  label: string,
  count: number,
  issue: (name: string) => Promise<{ certPem: string }> | { certPem: string },
  keyPem: string,
): Promise<Row> {
  const warmup = Math.max(3, Math.floor(count / 10));
  const samples: number[] = [];
  let sign = 0;
  let context = 0;
  for (let i = 0; i < warmup + count; i++) {
    const name = `h${i}-${randomBytes(3).toString("hex")}.bench.test`;
    const t0 = performance.now();
    const { certPem } = await issue(name);
    const t1 = performance.now();
    createSecureContext({ key: keyPem, cert: certPem });
    const t2 = performance.now();
    if (i < warmup) continue;
    samples.push(t2 - t0);
    sign += t1 - t0;
    context += t2 - t1;
  }
  return { label, samples, signMs: sign / count, contextMs: context / count };
}

/** An RSA-2048 CA, for the rows that show what the CA's key type costs per signature. */
async function createRsaCa(): Promise<CaMaterial> {
  const key = await generateKeyPair("rsa");
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: "01",
    name: "CN=egressgate bench RSA CA",
    notBefore: new Date(Date.now() - day),
    notAfter: new Date(Date.now() + 3650 * day),
    signingAlgorithm: { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256" },
    keys: key.keys,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(key.keys.publicKey),
    ],
  });
  return { cert: parseCertificate(cert.toString("pem")), key: await importKeyPair(key.privateKeyPem) };
}

/** egressgate's signer before the DER template: X509CertificateGenerator.create for every leaf. */
async function generatorSigner(ca: CaMaterial, leafKey: KeyPair): Promise<(name: string) => Promise<{ certPem: string }>> {
  const usage =
    leafKey.type === "ecdsa"
      ? x509.KeyUsageFlags.digitalSignature
      : x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyEncipherment;
  const fixed = [
    new x509.BasicConstraintsExtension(false, undefined, true),
    new x509.KeyUsagesExtension(usage, true),
    new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth], false),
    await x509.SubjectKeyIdentifierExtension.create(leafKey.keys.publicKey),
    await x509.AuthorityKeyIdentifierExtension.create(ca.key.keys.publicKey),
  ];
  const signingAlgorithm = ca.key.type === "ecdsa" ? { name: "ECDSA", hash: "SHA-256" } : { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256" };
  return async (name) => {
    const now = Date.now();
    const bytes = randomBytes(16);
    bytes[0] = (bytes[0]! & 0x3f) | 0x40;
    const cert = await x509.X509CertificateGenerator.create({
      serialNumber: bytes.toString("hex"),
      subject: `CN=${name}`,
      issuer: ca.cert.subject,
      notBefore: new Date(now - day),
      notAfter: new Date(now + validityDays * day),
      signingAlgorithm,
      publicKey: leafKey.keys.publicKey,
      signingKey: ca.key.keys.privateKey,
      extensions: [...fixed, new x509.SubjectAlternativeNameExtension([{ type: "dns", value: name }], false)],
    });
    return { certPem: cert.toString("pem") };
  };
}

/** node-forge signing an RSA-2048 leaf with an RSA-2048 CA, both keys made beforehand. */
function forgeSigner(): { issue: (name: string) => { certPem: string }; leafKeyPem: string } {
  const pem = (type: "pkcs1") => generateKeyPairSync("rsa", { modulusLength: 2048, privateKeyEncoding: { type, format: "pem" }, publicKeyEncoding: { type: "spki", format: "pem" } });
  const caPair = pem("pkcs1");
  const leafPair = pem("pkcs1");
  const caKey = forge.pki.privateKeyFromPem(caPair.privateKey);
  const caPublic = forge.pki.publicKeyFromPem(caPair.publicKey);
  const leafPublic = forge.pki.publicKeyFromPem(leafPair.publicKey);
  const caCert = forge.pki.createCertificate();
  caCert.publicKey = caPublic;
  caCert.serialNumber = "01";
  caCert.validity.notBefore = new Date(Date.now() - day);
  caCert.validity.notAfter = new Date(Date.now() + 3650 * day);
  const caName = [{ name: "commonName", value: "egressgate bench forge CA" }];
  caCert.setSubject(caName);
  caCert.setIssuer(caName);
  caCert.setExtensions([{ name: "basicConstraints", cA: true, critical: true }, { name: "subjectKeyIdentifier" }]);
  caCert.sign(caKey, forge.md.sha256.create());
  const issue = (name: string): { certPem: string } => {
    const cert = forge.pki.createCertificate();
    cert.publicKey = leafPublic;
    cert.serialNumber = `40${randomBytes(15).toString("hex")}`;
    cert.validity.notBefore = new Date(Date.now() - day);
    cert.validity.notAfter = new Date(Date.now() + validityDays * day);
    cert.setSubject([{ name: "commonName", value: name }]);
    cert.setIssuer(caCert.subject.attributes);
    cert.setExtensions([
      { name: "basicConstraints", cA: false, critical: true },
      { name: "keyUsage", digitalSignature: true, keyEncipherment: true, critical: true },
      { name: "extKeyUsage", serverAuth: true },
      { name: "subjectKeyIdentifier" },
      { name: "authorityKeyIdentifier", keyIdentifier: caCert.generateSubjectKeyIdentifier().getBytes() },
      { name: "subjectAltName", altNames: [{ type: 2, value: name }] },
    ]);
    cert.sign(caKey, forge.md.sha256.create());
    return { certPem: forge.pki.certificateToPem(cert) };
  };
  return { issue, leafKeyPem: leafPair.privateKey };
}

/** Times `count` calls of a slow function, stopping early once `budgetMs` is spent (at least one). */
async function timeSamples(count: number, budgetMs: number, run: () => unknown): Promise<number[]> {
  const samples: number[] = [];
  const start = performance.now();
  while (samples.length < count && (samples.length === 0 || performance.now() - start < budgetMs)) {
    const t0 = performance.now();
    await run();
    samples.push(performance.now() - t0);
  }
  return samples;
}

/** Handshake time to a fresh hostname and to a cached one, interleaved so drift hits both alike. */
async function measureHandshakes(
  signer: LeafSigner,
  caPem: string,
  count: number,
): Promise<{ fresh: number[]; cached: number[]; signed: number }> {
  const cache = new LeafCertCache(signer, { maxEntries: 10_000, validityDays });
  const server = createServer({
    SNICallback: (name, callback) => {
      cache.get(name).then(
        (context) => callback(null, context),
        (error: Error) => callback(error),
      );
    },
  });
  server.on("secureConnection", (socket) => socket.end());
  server.on("tlsClientError", () => undefined);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;
  const clientContext: SecureContext = createSecureContext({ ca: caPem });
  const handshake = (servername: string): Promise<number> =>
    new Promise((resolve, reject) => {
      const t0 = performance.now();
      const socket = connect({ host: "127.0.0.1", port, servername, secureContext: clientContext }, () => {
        const elapsed = performance.now() - t0;
        socket.destroy();
        resolve(elapsed);
      });
      socket.on("error", reject);
    });
  const fresh: number[] = [];
  const cached: number[] = [];
  for (let i = 0; i < 20; i++) await handshake("cached.bench.test"); // warm both sides
  for (let i = 0; i < count; i++) {
    fresh.push(await handshake(`new-${i}-${randomBytes(3).toString("hex")}.bench.test`));
    cached.push(await handshake("cached.bench.test"));
  }
  await new Promise((resolve) => server.close(resolve));
  return { fresh, cached, signed: cache.signed };
}

const fmt = (ms: number): string => (ms >= 100 ? ms.toFixed(0) : ms >= 10 ? ms.toFixed(1) : ms.toFixed(2));

function table(rows: readonly Row[], baseline: number, what: string): string {
  const split = rows.some((row) => row.signMs !== undefined);
  const lines = [
    `| ${what} | mean ms | p50 ms | p99 ms |${split ? " sign ms | context ms |" : ""} × egressgate P-256 leaf |`,
    `|---|---:|---:|---:|---:|${split ? "---:|---:|" : ""}---:|`,
  ];
  for (const row of rows) {
    const sorted = [...row.samples].sort((a, b) => a - b);
    const m = mean(sorted);
    const parts = split ? ` ${fmt(row.signMs ?? Number.NaN)} | ${fmt(row.contextMs ?? Number.NaN)} |` : "";
    lines.push(
      `| ${row.label} | ${sorted.length} | ${fmt(m)} | ${fmt(quantile(sorted, 0.5))} | ${fmt(quantile(sorted, 0.99))} |${parts} ${(m / baseline).toFixed(1)}× |`,
    );
  }
  return lines.join("\n");
}

const started = performance.now();
console.log(`# leaf certificate cost — node ${process.version}, OpenSSL ${process.versions.openssl}, ${cpus().length}× ${cpus()[0]?.model.trim() ?? "cpu"}\n`);

const created = await createCaCertificate("egressgate bench CA");
const ecdsaCa = { cert: parseCertificate(created.certPem), key: await importKeyPair(created.keyPem), certPem: created.certPem };
const rsaCa = await createRsaCa();
const cas: Record<LeafKeyType, CaMaterial> = { ecdsa: ecdsaCa, rsa: rsaCa };
const caLabel = { ecdsa: "P-256 CA", rsa: "RSA-2048 CA" };
const leafLabel = { ecdsa: "P-256 leaf", rsa: "RSA-2048 leaf" };

const rows: Row[] = [];
const combos: Array<[LeafKeyType, LeafKeyType]> = [["ecdsa", "ecdsa"], ["rsa", "ecdsa"], ["ecdsa", "rsa"], ["rsa", "rsa"]];
for (const [leaf, caType] of combos) {
  const signer = await LeafSigner.create(cas[caType], leaf);
  rows.push(
    await measureLeaves(`egressgate LeafSigner (DER template + node:crypto), ${leafLabel[leaf]}, ${caLabel[caType]}`, 200, (name) =>
      signer.sign(name, validityDays), signer.leafKey.privateKeyPem),
  );
}
for (const [leaf, caType] of combos) {
  const leafKey = await generateKeyPair(leaf);
  const issue = await generatorSigner(cas[caType], leafKey);
  rows.push(await measureLeaves(`previous LeafSigner: @peculiar/x509 generator + WebCrypto, ${leafLabel[leaf]}, ${caLabel[caType]}`, 100, issue, leafKey.privateKeyPem));
}
const forgeLeaves = forgeSigner();
rows.push(await measureLeaves("node-forge, RSA-2048 leaf (key made beforehand), RSA-2048 CA", 40, forgeLeaves.issue, forgeLeaves.leafKeyPem));

const keygen: Row[] = [
  { label: "node:crypto generateKeyPair P-256 (per-host key, native)", samples: await timeSamples(50, 2_000, () => generateKeyPairAsync("ec", { namedCurve: "P-256" })) },
  { label: "node:crypto generateKeyPair RSA-2048 (per-host key, native)", samples: await timeSamples(8, 4_000, () => generateKeyPairAsync("rsa", { modulusLength: 2048 })) },
  {
    label: "node-forge rsa.generateKeyPair 2048 (default: native when Node has it)",
    samples: await timeSamples(5, 3_000, () => forge.pki.rsa.generateKeyPair({ bits: 2048, e: 0x10001 })),
  },
];
const forgeOptions = (forge as unknown as { options: { usePureJavaScript: boolean } }).options;
forgeOptions.usePureJavaScript = true;
keygen.push({
  label: "node-forge rsa.generateKeyPair 2048, pure JS (usePureJavaScript)",
  samples: await timeSamples(3, 8_000, () => forge.pki.rsa.generateKeyPair({ bits: 2048, e: 0x10001 })),
});
forgeOptions.usePureJavaScript = false;

const handshakes: Array<{ label: string; fresh: number[]; cached: number[]; signed: number }> = [];
{
  const signer = await LeafSigner.create(ecdsaCa, "ecdsa");
  handshakes.push({ label: "egressgate LeafSigner, P-256 leaf", ...(await measureHandshakes(signer, ecdsaCa.certPem, 150)) });
  // An RSA leaf costs the same to issue but more per handshake: the server signs with RSA-2048.
  const rsaSigner = await LeafSigner.create(ecdsaCa, "rsa");
  handshakes.push({ label: "egressgate LeafSigner, RSA-2048 leaf", ...(await measureHandshakes(rsaSigner, ecdsaCa.certPem, 60)) });
  // The same cache around the generator-per-leaf signer: LeafCertCache only calls leafKey and sign().
  const leafKey = await generateKeyPair("ecdsa");
  const issue = await generatorSigner(ecdsaCa, leafKey);
  const generator = {
    leafKey,
    sign: async (name: string, days: number) => ({ ...(await issue(name)), notAfter: Date.now() + days * day }),
  } as unknown as LeafSigner;
  handshakes.push({ label: "previous LeafSigner (@peculiar/x509 generator per leaf), P-256 leaf", ...(await measureHandshakes(generator, ecdsaCa.certPem, 60)) });
}

const baseline = mean(rows[0]!.samples);
console.log("## Issuing one leaf: signature + tls.createSecureContext\n");
console.log(table(rows, baseline, "leaf issued by | leaves"));
console.log("\n## Key generation, which a per-host-key design pays on every new hostname\n");
console.log(table(keygen, baseline, "key generated by | keys"));
console.log("\n## TLS 1.3 handshake on 127.0.0.1, P-256 CA (client and server in this process)\n");
console.log("| signer | handshake | count | mean ms | p50 ms | p99 ms | extra for a new hostname, mean (p50) |\n|---|---|---:|---:|---:|---:|---:|");
for (const { label, fresh, cached } of handshakes) {
  const freshSorted = [...fresh].sort((a, b) => a - b);
  const cachedSorted = [...cached].sort((a, b) => a - b);
  const extra = `${fmt(mean(fresh) - mean(cached))} (${fmt(quantile(freshSorted, 0.5) - quantile(cachedSorted, 0.5))})`;
  console.log(`| ${label} | new hostname | ${fresh.length} | ${fmt(mean(fresh))} | ${fmt(quantile(freshSorted, 0.5))} | ${fmt(quantile(freshSorted, 0.99))} | ${extra} |`);
  console.log(`| ${label} | cached hostname | ${cached.length} | ${fmt(mean(cached))} | ${fmt(quantile(cachedSorted, 0.5))} | ${fmt(quantile(cachedSorted, 0.99))} | |`);
}
console.log(`\ngoal (DESIGN §8): under 2 ms extra for a new hostname; leaves signed: ${handshakes.map((h) => h.signed).join(", ")}`);
const rsaKeygen = mean(keygen[1]!.samples);
console.log(`per-host RSA-2048 keygen (native) / egressgate P-256 leaf: ${(rsaKeygen / baseline).toFixed(0)}× (goal: at least 20×)`);
console.log(`\ntotal bench time: ${((performance.now() - started) / 1000).toFixed(1)} s`);
