// @peculiar/x509 needs the Reflect metadata polyfill before it loads (see src/tls/x509.ts).
import "reflect-metadata";
import { execFile, fork, spawnSync } from "node:child_process";
import { createPrivateKey, generateKeyPairSync, X509Certificate } from "node:crypto";
import { once } from "node:events";
import { existsSync } from "node:fs";
import { chmod, chown, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect, createServer, type SecureContext } from "node:tls";
import { promisify } from "node:util";
import * as x509 from "@peculiar/x509";
import { describe, expect, it, onTestFinished } from "vitest";
import { loadOrCreateCa, type LoadedCa } from "../../src/tls/ca-store.js";
import { LeafCertCache } from "../../src/tls/leaf-cert-cache.js";
import { LeafSigner, generateKeyPair, importKeyPair, parseCertificate, type CaMaterial, type LeafKeyType } from "../../src/tls/x509.js";

const day = 24 * 60 * 60 * 1000;
const run = promisify(execFile);
const hasPython = spawnSync("python3", ["--version"]).status === 0;
const firstRunChild = fileURLToPath(new URL("../fixtures/ca-first-run.ts", import.meta.url));

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "egressgate-tls-"));
  onTestFinished(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

async function freshCa(): Promise<LoadedCa> {
  return loadOrCreateCa(await tempDir());
}

async function leafCache(ca: CaMaterial, options: { keyType?: LeafKeyType; maxEntries?: number; maxRefusedEntries?: number; validityDays?: number } = {}) {
  const signer = await LeafSigner.create(ca, options.keyType ?? "ecdsa");
  const cache = new LeafCertCache(signer, {
    maxEntries: options.maxEntries ?? 100,
    validityDays: options.validityDays ?? 30,
    ...(options.maxRefusedEntries !== undefined ? { maxRefusedEntries: options.maxRefusedEntries } : {}),
  });
  return { signer, cache };
}

/**
 * A TLS server on 127.0.0.1:0 that answers every SNI name from the cache, as the proxy does.
 * Clients send no SNI for an IP address (RFC 6066 §3), so `defaultName`'s leaf is the default.
 */
async function startTlsServer(signer: LeafSigner, cache: LeafCertCache, defaultName = "127.0.0.1"): Promise<number> {
  const server = createServer({
    key: signer.leafKey.privateKeyPem,
    cert: (await signer.sign(defaultName, 30)).certPem,
    SNICallback: (name, callback) => {
      cache.get(name).then(
        (context) => callback(null, context),
        (error: Error) => callback(error),
      );
    },
  });
  server.on("secureConnection", (socket) => {
    socket.on("error", () => undefined);
    socket.end("ok\n");
  });
  server.on("tlsClientError", () => undefined);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return (server.address() as { port: number }).port;
}

function handshake(port: number, caPem: string, servername?: string): Promise<X509Certificate> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: "127.0.0.1", port, ca: caPem, ...(servername === undefined ? {} : { servername }) }, () => {
      const peer = socket.getPeerX509Certificate();
      socket.destroy();
      if (peer === undefined) reject(new Error("no peer certificate"));
      else resolve(peer);
    });
    socket.on("error", reject);
  });
}

describe("CA store", () => {
  it("creates the CA on first load with ca.key mode 0600, and the second load reuses it unchanged", async () => {
    const dir = await tempDir();
    const first = await loadOrCreateCa(dir);
    expect((await stat(first.keyPath)).mode & 0o777).toBe(0o600);
    const keyPem = await readFile(first.keyPath, "utf8");
    expect(await readFile(first.certPath, "utf8")).toBe(first.certPem);
    const ca = new X509Certificate(first.certPem);
    expect(ca.ca).toBe(true);
    expect(ca.verify(ca.publicKey)).toBe(true);

    const second = await loadOrCreateCa(dir);
    expect(second.certPem).toBe(first.certPem);
    expect(await readFile(second.keyPath, "utf8")).toBe(keyPem);
  });

  // Starting three processes under tsx takes seconds on a busy machine.
  it("several processes doing their first run on one empty directory at once all load the same CA, which works", { timeout: 90_000 }, async () => {
    const dir = join(await tempDir(), "ca");
    const children = Array.from({ length: 3 }, () => {
      const child = fork(firstRunChild, [dir], { execArgv: ["--import", "tsx"], stdio: ["ignore", "ignore", "inherit", "ipc"] });
      onTestFinished(() => void child.kill("SIGKILL"));
      return child;
    });
    await Promise.all(children.map((child) => once(child, "message")));
    const answers = children.map((child) => once(child, "message").then(([loads]) => loads as Array<{ certPem?: string; error?: string }>));
    for (const child of children) child.send("go");
    const loads = (await Promise.all(answers)).flat();
    expect(loads.filter((load) => load.error !== undefined)).toEqual([]);
    const certPem = await readFile(join(dir, "ca.crt"), "utf8");
    expect(new Set(loads.map((load) => load.certPem))).toEqual(new Set([certPem]));
    const cert = new X509Certificate(certPem);
    expect(cert.checkPrivateKey(createPrivateKey(await readFile(join(dir, "ca.key"), "utf8")))).toBe(true);
    expect((await stat(join(dir, "ca.key"))).mode & 0o777).toBe(0o600);
    // No temporary file of any process is left beside them.
    expect((await readdir(dir)).sort()).toEqual(["ca-bundle.crt", "ca.crt", "ca.key"]);
  });

  it("makes every missing directory of the caDir 0700", async () => {
    const top = await tempDir();
    await loadOrCreateCa(join(top, "a", "b", "c"));
    for (const dir of ["a", "a/b", "a/b/c"]) expect((await stat(join(top, dir))).mode & 0o777).toBe(0o700);
  });

  it.runIf(existsSync("/proc/self"))("a caDir under /proc, where no directory can be made, fails with the reason instead of never settling", async () => {
    // Node 20's recursive mkdir retried ENOENT there forever.
    for (const dir of ["/proc/nonexistent", "/proc/self/egressgate/ca"]) {
      const deadline = new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`loading ${dir} did not settle within 10 s`)), 10_000).unref());
      await expect(Promise.race([loadOrCreateCa(dir), deadline])).rejects.toMatchObject({
        code: "EG_CA",
        message: expect.stringMatching(new RegExp(`^cannot load or create the CA in ${dir}: ENOENT: no such file or directory, mkdir '/proc/`)) as unknown,
      });
    }
  });

  it("writes ca-bundle.crt holding the system roots and the CA, for a guest's SSL_CERT_FILE", async () => {
    const ca = await freshCa();
    expect(ca.bundlePath).toBe(join(ca.dir, "ca-bundle.crt"));
    const bundle = await readFile(ca.bundlePath!, "utf8");
    expect(bundle).toContain(ca.certPem.trim());
    expect(bundle.split("BEGIN CERTIFICATE").length - 1).toBeGreaterThan(1);
  });
});

interface OperatorCaOptions {
  readonly notBefore?: Date;
  readonly notAfter?: Date;
  readonly extensions?: x509.Extension[];
}

/** A CA as an operator might bring it, written to a new caDir with ca.key 0600. */
async function operatorCaDir(options: OperatorCaOptions = {}): Promise<{ dir: string; certPath: string; keyPath: string; keyPem: string }> {
  const dir = await tempDir();
  const key = await generateKeyPair("ecdsa");
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: "01",
    name: "CN=Operator CA",
    notBefore: options.notBefore ?? new Date(Date.now() - day),
    notAfter: options.notAfter ?? new Date(Date.now() + day),
    signingAlgorithm: { name: "ECDSA", hash: "SHA-256" },
    keys: key.keys,
    extensions: options.extensions ?? [
      new x509.BasicConstraintsExtension(true, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
    ],
  });
  const certPath = join(dir, "ca.crt");
  const keyPath = join(dir, "ca.key");
  await writeFile(keyPath, key.privateKeyPem, { mode: 0o600 });
  await writeFile(certPath, cert.toString("pem"));
  return { dir, certPath, keyPath, keyPem: key.privateKeyPem };
}

describe("a CA that cannot sign certificates guests accept is refused at load, naming the file", () => {
  it("an operator's CA that is valid, CA:TRUE and may sign certificates loads", async () => {
    const { dir } = await operatorCaDir();
    await expect(loadOrCreateCa(dir)).resolves.toMatchObject({ dir });
  });

  it.each<[string, OperatorCaOptions, RegExp]>([
    ["expired", { notBefore: new Date("2019-01-01T00:00:00Z"), notAfter: new Date("2020-01-02T00:00:00Z") }, /ca\.crt expired on 2020-01-02T00:00:00\.000Z/],
    ["not valid yet", { notBefore: new Date("2040-01-01T00:00:00Z"), notAfter: new Date("2041-01-01T00:00:00Z") }, /ca\.crt is not valid until 2040-01-01T00:00:00\.000Z/],
    ["CA:FALSE", { extensions: [new x509.BasicConstraintsExtension(false, undefined, true)] }, /ca\.crt is not a CA certificate \(its basicConstraints lack CA:TRUE\)/],
    ["without basicConstraints", { extensions: [new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign, true)] }, /ca\.crt is not a CA certificate/],
    [
      "CA:TRUE without keyCertSign",
      { extensions: [new x509.BasicConstraintsExtension(true, undefined, true), new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true)] },
      /ca\.crt may not sign certificates \(its keyUsage lacks keyCertSign\)/,
    ],
  ])("a CA certificate %s", async (_, options, message) => {
    const { dir } = await operatorCaDir(options);
    await expect(loadOrCreateCa(dir)).rejects.toMatchObject({ code: "EG_CA", message: expect.stringMatching(message) as unknown });
  });

  it("a ca.key that is not the certificate's key", async () => {
    const { dir, keyPath, certPath } = await operatorCaDir();
    await writeFile(keyPath, (await generateKeyPair("ecdsa")).privateKeyPem, { mode: 0o600 });
    await expect(loadOrCreateCa(dir)).rejects.toMatchObject({
      code: "EG_CA",
      message: `cannot use the CA in ${dir}: ${keyPath} is not the key of the certificate in ${certPath}: they are from different CAs`,
    });
  });

  const encryptedKey = (): string =>
    generateKeyPairSync("ec", { namedCurve: "P-256" }).privateKey.export({ format: "pem", type: "pkcs8", cipher: "aes-256-cbc", passphrase: "secret" }) as string;
  const pem = (kind: "ed25519" | "P-384"): string =>
    (kind === "ed25519" ? generateKeyPairSync("ed25519") : generateKeyPairSync("ec", { namedCurve: "P-384" })).privateKey.export({ format: "pem", type: "pkcs8" }) as string;

  it.each<[string, "ca.key" | "ca.crt", () => string, RegExp]>([
    ["garbage in ca.crt", "ca.crt", () => "junk\n", /ca\.crt is not a PEM certificate \(/],
    ["garbage in ca.key", "ca.key", () => "-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n", /ca\.key is not a PEM private key \(/],
    ["an empty ca.key", "ca.key", () => "", /ca\.key is empty$/],
    ["an encrypted ca.key", "ca.key", encryptedKey, /ca\.key is encrypted with a passphrase, and egressgate takes none/],
    ["an Ed25519 ca.key", "ca.key", () => pem("ed25519"), /ca\.key is an ed25519 key; the CA key must be EC P-256 or RSA/],
    ["a P-384 ca.key", "ca.key", () => pem("P-384"), /ca\.key is an EC key on secp384r1; the CA key must be EC P-256 or RSA/],
  ])("%s", async (_, file, content, message) => {
    const { dir } = await operatorCaDir();
    await writeFile(join(dir, file), content(), { mode: 0o600 });
    await expect(loadOrCreateCa(dir)).rejects.toMatchObject({ code: "EG_CA", message: expect.stringMatching(message) as unknown });
  });

  it("a ca.key others can read is refused with the chmod that fixes it; 0600 and 0400 load", async () => {
    const { dir, keyPath } = await operatorCaDir();
    for (const mode of [0o644, 0o640, 0o604, 0o620]) {
      await chmod(keyPath, mode);
      await expect(loadOrCreateCa(dir)).rejects.toMatchObject({
        code: "EG_CA",
        message: expect.stringContaining(`${keyPath} can be read or written by users other than its owner (mode 0${mode.toString(8)}), and whoever reads it can impersonate any host to the guests: run "chmod 600 ${keyPath}"`) as unknown,
      });
    }
    for (const mode of [0o600, 0o400]) {
      await chmod(keyPath, mode);
      await expect(loadOrCreateCa(dir)).resolves.toMatchObject({ keyPath });
    }
  });

  it.runIf(process.getuid?.() === 0)("a ca.key another user owns may be read by its group (root:egressgate 0640), not by everyone", async () => {
    const { dir, keyPath } = await operatorCaDir();
    await chown(keyPath, 65534, 65534);
    await chmod(keyPath, 0o640);
    await expect(loadOrCreateCa(dir)).resolves.toMatchObject({ keyPath });
    await chmod(keyPath, 0o644);
    await expect(loadOrCreateCa(dir)).rejects.toMatchObject({
      code: "EG_CA",
      message: expect.stringContaining(`${keyPath} can be read or written by users other than its owner and group (mode 0644), and whoever reads it can impersonate any host to the guests: run "chmod 640 ${keyPath}"`) as unknown,
    });
  });

  it("a ca.key that is a directory, or a FIFO (which would block a read until written), is refused at once", async () => {
    const { dir, keyPath } = await operatorCaDir();
    await rm(keyPath);
    await mkdir(keyPath);
    await expect(loadOrCreateCa(dir)).rejects.toMatchObject({ code: "EG_CA", message: expect.stringContaining(`${keyPath} is a directory, not a PEM file`) as unknown });
    await rm(keyPath, { recursive: true });
    expect(spawnSync("mkfifo", ["-m", "600", keyPath]).status).toBe(0);
    await expect(loadOrCreateCa(dir)).rejects.toMatchObject({ code: "EG_CA", message: expect.stringContaining(`${keyPath} is a FIFO, not a PEM file`) as unknown });
  });
});

describe("leaf certificates", () => {
  it("a leaf carries a DNS SAN, serverAuth EKU, critical key usage, AKI/SKI, a positive serial and notBefore a day back", async () => {
    const ca = await freshCa();
    const { signer } = await leafCache(ca);
    const before = Date.now();
    const { certPem, notAfter } = await signer.sign("api.example.test", 30);
    const leaf = new X509Certificate(certPem);
    expect(leaf.verify(new X509Certificate(ca.certPem).publicKey)).toBe(true);
    expect(leaf.checkIssued(new X509Certificate(ca.certPem))).toBe(true);
    expect(leaf.ca).toBe(false);
    expect(leaf.subjectAltName).toBe("DNS:api.example.test");
    expect(leaf.checkHost("api.example.test")).toBe("api.example.test");
    expect(leaf.checkHost("other.example.test")).toBeUndefined();
    expect(leaf.keyUsage).toEqual(["1.3.6.1.5.5.7.3.1"]); // Node reports the EKU here
    expect(leaf.serialNumber).toMatch(/^[4-7][0-9A-F]{31}$/);
    expect(Math.abs(Date.parse(leaf.validFrom) - (before - day))).toBeLessThan(5_000);
    expect(Date.parse(leaf.validTo)).toBe(notAfter);
    expect(Math.abs(notAfter - (before + 30 * day))).toBeLessThan(5_000);

    const parsed = new x509.X509Certificate(certPem);
    const usage = parsed.getExtension(x509.KeyUsagesExtension);
    expect(usage?.critical).toBe(true);
    expect(usage?.usages).toBe(x509.KeyUsageFlags.digitalSignature);
    expect(parsed.getExtension(x509.BasicConstraintsExtension)?.critical).toBe(true);
    const caSki = parseCertificate(ca.certPem).getExtension(x509.SubjectKeyIdentifierExtension)?.keyId;
    expect(parsed.getExtension(x509.AuthorityKeyIdentifierExtension)?.keyId).toBe(caSki);
    expect(parsed.getExtension(x509.SubjectKeyIdentifierExtension)?.keyId).toMatch(/^[0-9a-f]{40}$/);
    expect(parsed.issuer).toBe(parseCertificate(ca.certPem).subject);
    expect(parsed.subject).toBe("CN=api.example.test");
  });

  it.each([
    ["127.0.0.1", "IP Address:127.0.0.1"],
    ["::1", "IP Address:0:0:0:0:0:0:0:1"],
    ["2001:db8::a:1", "IP Address:2001:DB8:0:0:0:0:A:1"],
    ["::ffff:10.0.0.1", "IP Address:0:0:0:0:0:FFFF:A00:1"],
  ])("an IP name %s yields an IP SAN, not a DNS SAN", async (ip, san) => {
    const { signer } = await leafCache(await freshCa());
    const leaf = new X509Certificate((await signer.sign(ip, 30)).certPem);
    expect(leaf.subjectAltName).toBe(san);
    expect(leaf.checkIP(ip)).toBe(ip);
  });

  it("a name longer than 64 characters keeps its full SAN and gets a generic CN", async () => {
    const { signer } = await leafCache(await freshCa());
    const name = `${"a".repeat(60)}.example.test`;
    const leaf = new X509Certificate((await signer.sign(name, 30)).certPem);
    expect(leaf.subjectAltName).toBe(`DNS:${name}`);
    expect(leaf.subject).toBe("CN=egressgate leaf");
  });

  it("an RSA-2048 leaf has keyEncipherment, and an RSA CA signs with sha256WithRSAEncryption", async () => {
    const caKey = await generateKeyPair("rsa");
    const caCert = await x509.X509CertificateGenerator.createSelfSigned({
      serialNumber: "01",
      name: "CN=test RSA CA",
      notBefore: new Date(Date.now() - day),
      notAfter: new Date(Date.now() + day),
      signingAlgorithm: { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256" },
      keys: caKey.keys,
      extensions: [new x509.BasicConstraintsExtension(true, 0, true)],
    });
    const ca: CaMaterial = { cert: caCert, key: await importKeyPair(caKey.privateKeyPem) };
    const signer = await LeafSigner.create(ca, "rsa");
    const { certPem } = await signer.sign("legacy.example.test", 30);
    const leaf = new x509.X509Certificate(certPem);
    expect(leaf.signatureAlgorithm).toMatchObject({ name: "RSASSA-PKCS1-v1_5", hash: { name: "SHA-256" } });
    expect(leaf.getExtension(x509.KeyUsagesExtension)?.usages).toBe(
      x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyEncipherment,
    );
    expect(new X509Certificate(certPem).verify(new X509Certificate(caCert.toString("pem")).publicKey)).toBe(true);
  });

  it("a leaf's AKI repeats the CA's SKI even when the CA derived it other than from the key, and Node accepts the chain", async () => {
    const dir = await tempDir();
    const caKey = await generateKeyPair("ecdsa");
    const caCert = await x509.X509CertificateGenerator.createSelfSigned({
      serialNumber: "01",
      name: "CN=Operator CA, O=Example\\, Inc.",
      notBefore: new Date(Date.now() - day),
      notAfter: new Date(Date.now() + day),
      signingAlgorithm: { name: "ECDSA", hash: "SHA-256" },
      keys: caKey.keys,
      extensions: [
        new x509.BasicConstraintsExtension(true, 0, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign, true),
        new x509.SubjectKeyIdentifierExtension("00112233445566778899"),
      ],
    });
    await writeFile(join(dir, "ca.key"), caKey.privateKeyPem, { mode: 0o600 });
    await writeFile(join(dir, "ca.crt"), caCert.toString("pem"));
    const ca = await loadOrCreateCa(dir);
    const { signer, cache } = await leafCache(ca);
    const leaf = new x509.X509Certificate((await signer.sign("op.example.test", 30)).certPem);
    expect(leaf.getExtension(x509.AuthorityKeyIdentifierExtension)?.keyId).toBe("00112233445566778899");
    expect(leaf.issuer).toBe("CN=Operator CA, O=Example\\, Inc.");
    const port = await startTlsServer(signer, cache);
    expect((await handshake(port, ca.certPem, "op.example.test")).subjectAltName).toBe("DNS:op.example.test");
  });

  it("a name that is not an ASCII hostname or IP is refused", async () => {
    const { signer } = await leafCache(await freshCa());
    await expect(signer.sign("bücher.example", 30)).rejects.toThrow(TypeError);
    await expect(signer.sign("", 30)).rejects.toThrow(/not an ASCII hostname or IP/);
  });
});

describe("leaf cache", () => {
  it("concurrent get() calls for one name share a single signing and context", async () => {
    const { cache } = await leafCache(await freshCa());
    const contexts = await Promise.all(Array.from({ length: 8 }, () => cache.get("same.example.test")));
    expect(cache.signed).toBe(1);
    expect(cache.size).toBe(1);
    expect(new Set<SecureContext>(contexts).size).toBe(1);
  });

  it("evicts the least recently used name beyond maxEntries", async () => {
    const { cache } = await leafCache(await freshCa(), { maxEntries: 2 });
    await cache.get("a.test");
    await cache.get("b.test");
    await cache.get("a.test"); // a is now the most recently used
    await cache.get("c.test"); // evicts b
    expect(cache.size).toBe(2);
    expect(cache.signed).toBe(3);
    await cache.get("a.test");
    expect(cache.signed).toBe(3);
    await cache.get("b.test");
    expect(cache.signed).toBe(4);
    expect(cache.size).toBe(2);
  });

  it("a leaf within a day of its notAfter is signed again", async () => {
    const { cache } = await leafCache(await freshCa(), { validityDays: 1 });
    await cache.get("short.test");
    await cache.get("short.test");
    expect(cache.signed).toBe(2);
  });

  it("leaves for refused names go to an LRU of their own: cycling through them never evicts an allowed name's", async () => {
    const { cache } = await leafCache(await freshCa(), { maxEntries: 2 });
    await cache.get("a.test");
    await cache.get("b.test");
    // min(64, maxEntries) refused names are kept: the third evicts the first of them only.
    for (const name of ["x1.test", "x2.test", "x3.test"]) await cache.get(name, "guest", true);
    expect(cache.signed).toBe(5);
    expect(cache.size).toBe(4);
    await cache.get("a.test");
    await cache.get("b.test");
    expect(cache.signed).toBe(5);
    await cache.get("x3.test", "guest", true);
    expect(cache.signed).toBe(5);
    await cache.get("x1.test", "guest", true);
    expect(cache.signed).toBe(6);
    // A name in either LRU is a hit whoever asks: one guest's refused host is another's allowed one.
    await cache.get("a.test", "guest", true);
    await cache.get("x3.test");
    expect(cache.signed).toBe(6);
  });

  it("a name some guest is allowed ends in the main LRU, whoever named it first", async () => {
    const { cache } = await leafCache(await freshCa(), { maxEntries: 10, maxRefusedEntries: 1 });
    const flood = async (names: readonly string[]): Promise<void> => {
      for (const name of names) await cache.get(name, "flooder", true);
    };
    // Signed for a refused tunnel, then asked for by a guest allowed it: moved to the main LRU.
    await cache.get("moved.test", "flooder", true);
    await cache.get("moved.test", "allowed");
    // One signing, two callers, the refused one first: the allowed one decides the LRU.
    await Promise.all([cache.get("joined.test", "flooder", true), cache.get("joined.test", "allowed")]);
    expect(cache.signed).toBe(2);
    await flood(["f1.test", "f2.test", "f3.test"]);
    await cache.get("moved.test");
    await cache.get("joined.test");
    expect(cache.signed).toBe(5);
    // Refused names alone stay in their LRU of one.
    expect(cache.size).toBe(3);
  });

  it("a renewal asked for by a refused tunnel stays in the main LRU", async () => {
    // validityDays 1: every get is within a day of notAfter, so each one renews.
    const { cache } = await leafCache(await freshCa(), { validityDays: 1, maxEntries: 10, maxRefusedEntries: 1 });
    await cache.get("renewed.test", "allowed");
    await cache.get("renewed.test", "flooder", true);
    expect(cache.signed).toBe(2);
    for (const name of ["f1.test", "f2.test"]) await cache.get(name, "flooder", true);
    // renewed.test (main) and f2.test (the refused LRU's one entry): had the renewal gone to the
    // refused LRU, the flood would have evicted it.
    expect(cache.size).toBe(2);
  });

  it("a failed signing is not cached, so the next get() tries again", async () => {
    const { cache } = await leafCache(await freshCa());
    await expect(cache.get("bad\u00e9.test")).rejects.toThrow(TypeError);
    expect(cache.size).toBe(0);
    await expect(cache.get("bad\u00e9.test")).rejects.toThrow(TypeError);
    expect(cache.signed).toBe(0);
  });
});

describe("real TLS handshakes on 127.0.0.1", () => {
  it.each(["ecdsa", "rsa"] as const)(
    "Node's tls.connect with the CA and a servername accepts the cached %s leaf, and refuses it under another CA",
    async (keyType) => {
      const ca = await freshCa();
      const { signer, cache } = await leafCache(ca, { keyType });
      const port = await startTlsServer(signer, cache);

      const peer = await handshake(port, ca.certPem, "api.example.test");
      expect(peer.subjectAltName).toBe("DNS:api.example.test");
      expect(peer.publicKey.asymmetricKeyType).toBe(keyType === "ecdsa" ? "ec" : "rsa");
      expect(cache.signed).toBe(1);
      await handshake(port, ca.certPem, "api.example.test");
      expect(cache.signed).toBe(1);

      const ipPeer = await handshake(port, ca.certPem);
      expect(ipPeer.subjectAltName).toBe("IP Address:127.0.0.1");

      const other = await freshCa();
      await expect(handshake(port, other.certPem, "api.example.test")).rejects.toMatchObject({
        code: "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
      });
    },
  );

  it.for(["ecdsa", "rsa"] as const)(
    "Python's ssl module with cafile=CA and check_hostname verifies the %s leaf by name and by IP",
    async (keyType) => {
      // Python is a real guest client; CI installs it (.ci/run) rather than skipping this.
      expect(hasPython, "python3 must be on PATH for the Python client acceptance test").toBe(true);
      const ca = await freshCa();
      const { signer, cache } = await leafCache(ca, { keyType });
      const port = await startTlsServer(signer, cache);
      // VERIFY_X509_STRICT is in Python 3.13's default context; set it so older Pythons check the same.
      const script = `
import socket, ssl, sys
port, cafile = int(sys.argv[1]), sys.argv[2]
ctx = ssl.create_default_context(cafile=cafile)
assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
ctx.verify_flags |= ssl.VERIFY_X509_STRICT
for name in ("api.example.test", "127.0.0.1"):
    with socket.create_connection(("127.0.0.1", port)) as raw:
        with ctx.wrap_socket(raw, server_hostname=name) as tls:
            print(name, tls.version(), tls.getpeercert()["subjectAltName"][0][0])
`;
      const { stdout } = await run("python3", ["-c", script, String(port), ca.certPath]);
      expect(stdout).toMatch(/^api\.example\.test TLSv1\.3 DNS\n127\.0\.0\.1 TLSv1\.3 IP Address\n$/);

      const other = await freshCa();
      await expect(run("python3", ["-c", script, String(port), other.certPath])).rejects.toMatchObject({
        stderr: expect.stringContaining("CERTIFICATE_VERIFY_FAILED"),
      });
    },
  );
});
