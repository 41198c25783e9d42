// @peculiar/x509 needs the Reflect metadata polyfill before it loads (see x509.ts).
import "reflect-metadata";
import { createPrivateKey, X509Certificate, type KeyObject } from "node:crypto";
import * as x509 from "@peculiar/x509";
import { parseCertificate } from "./x509.js";

/** A CA file as read: its text, and the owner and mode of the file it came from. */
export interface CaFile {
  readonly path: string;
  readonly text: string;
  readonly mode: number;
  readonly uid: number;
}

/**
 * Why ca.key's permissions let another user read or replace it, or undefined if they do not.
 * Whoever reads ca.key can impersonate any host to every guest that trusts the CA.
 *
 * The rule follows PostgreSQL's for its server key, and OpenSSH's for a user's key agrees: a key
 * the proxy's own user owns must be 0600 or less. A key another user owns (root, handing it to the
 * service user through the file's group: `root:egressgate 0640` in /etc/egressgate) may also be
 * read by its group; by everyone, never. Execute bits grant nothing on a file that is only read.
 */
export function keyPermissionProblem(key: CaFile, uid: number | undefined): string | undefined {
  // Windows has no such bits (process.getuid is undefined there).
  if (uid === undefined) return undefined;
  const mode = key.mode & 0o777;
  const octal = mode.toString(8).padStart(4, "0");
  if (key.uid === uid && (mode & 0o066) !== 0) {
    return `${key.path} can be read or written by users other than its owner (mode ${octal}), and whoever reads it can impersonate any host to the guests: run "chmod 600 ${key.path}"`;
  }
  if (key.uid !== uid && (mode & 0o026) !== 0) {
    return `${key.path} can be read or written by users other than its owner and group (mode ${octal}), and whoever reads it can impersonate any host to the guests: run "chmod 640 ${key.path}" (or make the proxy's user its owner, mode 0600)`;
  }
  return undefined;
}

function whatFailed(error: unknown): string {
  return (error as Error)?.message ?? String(error);
}

function parseKey(key: CaFile, problems: string[]): KeyObject | undefined {
  if (key.text.trim() === "") {
    problems.push(`${key.path} is empty`);
    return undefined;
  }
  // PKCS#8's encrypted form, and OpenSSL's traditional one (RFC 1421 headers).
  if (/-----BEGIN ENCRYPTED PRIVATE KEY-----|^Proc-Type:\s*4,ENCRYPTED/m.test(key.text)) {
    problems.push(`${key.path} is encrypted with a passphrase, and egressgate takes none: store it unencrypted, mode 0600 ("openssl pkey -in ${key.path} -out ca.key.plain", then replace the file with it)`);
    return undefined;
  }
  let keyObject: KeyObject;
  try {
    keyObject = createPrivateKey(key.text);
  } catch (error) {
    problems.push(`${key.path} is not a PEM private key (${whatFailed(error)})`);
    return undefined;
  }
  const type = keyObject.asymmetricKeyType;
  // LeafSigner signs with ecdsa-with-SHA256 or sha256WithRSAEncryption, and imports an EC key as P-256.
  if (type === "ec" && keyObject.asymmetricKeyDetails?.namedCurve !== "prime256v1") {
    problems.push(`${key.path} is an EC key on ${String(keyObject.asymmetricKeyDetails?.namedCurve)}; the CA key must be EC P-256 or RSA`);
    return undefined;
  }
  if (type !== "ec" && type !== "rsa") {
    problems.push(`${key.path} is an ${String(type)} key; the CA key must be EC P-256 or RSA`);
    return undefined;
  }
  return keyObject;
}

function parseCert(cert: CaFile, problems: string[]): { node: X509Certificate; peculiar: x509.X509Certificate } | undefined {
  if (cert.text.trim() === "") {
    problems.push(`${cert.path} is empty`);
    return undefined;
  }
  try {
    return { node: new X509Certificate(cert.text), peculiar: parseCertificate(cert.text) };
  } catch (error) {
    problems.push(`${cert.path} is not a PEM certificate (${whatFailed(error)})`);
    return undefined;
  }
}

/**
 * Adds to `problems` everything that would make every guest's handshake fail, each naming its
 * file, so that a proxy refuses to start on such a CA rather than failing every guest. Returns
 * the certificate if it parsed.
 */
export function checkCa(cert: CaFile, key: CaFile, problems: string[], now = Date.now()): x509.X509Certificate | undefined {
  const permissions = keyPermissionProblem(key, process.getuid?.());
  if (permissions !== undefined) problems.push(permissions);
  const keyObject = parseKey(key, problems);
  const parsed = parseCert(cert, problems);
  if (parsed === undefined) return undefined;
  const { node, peculiar } = parsed;
  if (keyObject !== undefined && !node.checkPrivateKey(keyObject)) {
    problems.push(`${key.path} is not the key of the certificate in ${cert.path}: they are from different CAs`);
  }
  const validFrom = Date.parse(node.validFrom);
  const validTo = Date.parse(node.validTo);
  if (now < validFrom) {
    problems.push(`${cert.path} is not valid until ${new Date(validFrom).toISOString()} (it is ${new Date(now).toISOString()} here): guests would refuse it`);
  }
  if (now > validTo) problems.push(`${cert.path} expired on ${new Date(validTo).toISOString()}: guests would refuse it`);
  // RFC 5280 §4.2.1.9 and §4.2.1.3: what a client checks of the issuer of the leaves it is shown.
  if (peculiar.getExtension(x509.BasicConstraintsExtension)?.ca !== true) {
    problems.push(`${cert.path} is not a CA certificate (its basicConstraints lack CA:TRUE): guests would refuse every certificate it signs`);
  }
  const usage = peculiar.getExtension(x509.KeyUsagesExtension);
  if (usage !== null && (usage.usages & x509.KeyUsageFlags.keyCertSign) === 0) {
    problems.push(`${cert.path} may not sign certificates (its keyUsage lacks keyCertSign): guests would refuse every certificate it signs`);
  }
  return peculiar;
}
