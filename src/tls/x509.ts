// @peculiar/x509 resolves its ASN.1 schemas through tsyringe, which needs the Reflect metadata
// polyfill loaded before the library itself.
import "reflect-metadata";
import { createPrivateKey, createPublicKey, KeyObject, randomBytes, sign as signWithKey, webcrypto } from "node:crypto";
import { isIP, isIPv4 } from "node:net";
import * as x509 from "@peculiar/x509";

// @types/node names the WebCrypto types under `webcrypto`; @peculiar/x509 expects the DOM globals,
// which this Node-only tsconfig does not load.
x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

export type LeafKeyType = "ecdsa" | "rsa";

const ecdsa = { name: "ECDSA", namedCurve: "P-256" } as const;
const rsa = { name: "RSASSA-PKCS1-v1_5", hash: "SHA-256", publicExponent: new Uint8Array([1, 0, 1]), modulusLength: 2048 };

export interface KeyPair {
  readonly type: LeafKeyType;
  readonly keys: webcrypto.CryptoKeyPair;
  readonly privateKeyPem: string;
}

export async function generateKeyPair(type: LeafKeyType): Promise<KeyPair> {
  const algorithm = type === "ecdsa" ? ecdsa : rsa;
  const keys = (await webcrypto.subtle.generateKey(algorithm, true, ["sign", "verify"])) as webcrypto.CryptoKeyPair;
  const der = await webcrypto.subtle.exportKey("pkcs8", keys.privateKey);
  return { type, keys, privateKeyPem: toPem("PRIVATE KEY", Buffer.from(der)) };
}

/** Imports a PEM private key (EC P-256 or RSA) for signing, with its public half. */
export async function importKeyPair(pem: string): Promise<KeyPair> {
  const keyObject = createPrivateKey(pem);
  const kind = keyObject.asymmetricKeyType;
  if (kind !== "rsa" && kind !== "ec") throw new TypeError(`unsupported key type ${String(kind)}`);
  const type: LeafKeyType = kind === "rsa" ? "rsa" : "ecdsa";
  const algorithm = type === "ecdsa" ? ecdsa : { name: rsa.name, hash: rsa.hash };
  const pkcs8 = keyObject.export({ format: "der", type: "pkcs8" });
  const spki = createPublicKey(keyObject).export({ format: "der", type: "spki" });
  const privateKey = await webcrypto.subtle.importKey("pkcs8", pkcs8, algorithm, true, ["sign"]);
  const publicKey = await webcrypto.subtle.importKey("spki", spki, algorithm, true, ["verify"]);
  return { type, keys: { privateKey, publicKey } as webcrypto.CryptoKeyPair, privateKeyPem: toPem("PRIVATE KEY", pkcs8) };
}

export function toPem(label: string, der: Buffer | ArrayBuffer): string {
  const b64 = Buffer.from(der as ArrayBuffer).toString("base64");
  const lines = b64.match(/.{1,64}/g) ?? [];
  return `-----BEGIN ${label}-----\n${lines.join("\n")}\n-----END ${label}-----\n`;
}

/** Positive (RFC 5280 §4.1.2.2), minimally encoded and always 16 bytes: the top bits are 01. */
function serialNumber(): Buffer {
  const bytes = randomBytes(16);
  bytes[0] = (bytes[0]! & 0x3f) | 0x40;
  return bytes;
}

const day = 24 * 60 * 60 * 1000;


export interface CaMaterial {
  readonly cert: x509.X509Certificate;
  readonly key: KeyPair;
}

export async function createCaCertificate(commonName: string): Promise<{ certPem: string; keyPem: string }> {
  const key = await generateKeyPair("ecdsa");
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serialNumber().toString("hex"),
    name: `CN=${commonName}, O=egressgate`,
    notBefore: new Date(now - day),
    notAfter: new Date(now + 3650 * day),
    signingAlgorithm: { name: "ECDSA", hash: "SHA-256" },
    keys: key.keys,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign | x509.KeyUsageFlags.digitalSignature, true),
      await x509.SubjectKeyIdentifierExtension.create(key.keys.publicKey),
    ],
  });
  return { certPem: cert.toString("pem") + "\n", keyPem: key.privateKeyPem };
}

/** DER tag-length-value (X.690 §8.1), definite length. */
function tlv(tag: number, ...content: Uint8Array[]): Buffer {
  const body = content.length === 1 ? content[0]! : Buffer.concat(content);
  const n = body.length;
  const head =
    n < 0x80 ? [tag, n] : n < 0x100 ? [tag, 0x81, n] : n < 0x10000 ? [tag, 0x82, n >> 8, n & 0xff] : [tag, 0x83, n >> 16, (n >> 8) & 0xff, n & 0xff];
  return Buffer.concat([Buffer.from(head), body]);
}

/** The byte ranges of the elements inside a DER SEQUENCE's content. */
function derChildren(der: Uint8Array, start: number, end: number): Array<{ start: number; content: number; end: number }> {
  const out = [];
  for (let at = start; at < end; ) {
    let lengthByte = der[at + 1]!;
    let content = at + 2;
    let length = lengthByte;
    if (lengthByte & 0x80) {
      lengthByte &= 0x7f;
      length = 0;
      for (let i = 0; i < lengthByte; i++) length = length * 256 + der[content++]!;
    }
    out.push({ start: at, content, end: content + length });
    at = content + length;
  }
  return out;
}

/** The CA certificate's subject Name exactly as encoded, to be each leaf's issuer byte for byte. */
function rawSubject(certDer: Uint8Array): Buffer {
  const [cert] = derChildren(certDer, 0, certDer.length);
  const [tbs] = derChildren(certDer, cert!.content, cert!.end);
  const fields = derChildren(certDer, tbs!.content, tbs!.end);
  // TBSCertificate: [0] version (present in v3), serialNumber, signature, issuer, validity, subject.
  const hasVersion = fields[0] !== undefined && certDer[fields[0].start] === 0xa0;
  const subject = fields[hasVersion ? 5 : 4];
  if (subject === undefined) throw new TypeError("the CA certificate has no subject");
  return Buffer.from(certDer.subarray(subject.start, subject.end));
}

/** RFC 5280 §4.1.2.5: UTCTime through 2049, GeneralizedTime from 2050; whole seconds, in Z. */
function derTime(ms: number): Buffer {
  const iso = new Date(ms).toISOString();
  const digits = `${iso.slice(0, 4)}${iso.slice(5, 7)}${iso.slice(8, 10)}${iso.slice(11, 13)}${iso.slice(14, 16)}${iso.slice(17, 19)}Z`;
  return Number(iso.slice(0, 4)) < 2050 ? tlv(0x17, Buffer.from(digits.slice(2), "latin1")) : tlv(0x18, Buffer.from(digits, "latin1"));
}

/** An address that `isIP` accepted, as the 4 or 16 bytes of an iPAddress GeneralName. */
function ipBytes(ip: string): Buffer {
  if (isIPv4(ip)) return Buffer.from(ip.split(".").map(Number));
  const out = Buffer.alloc(16);
  let text = ip;
  const dotted = /(\d+\.\d+\.\d+\.\d+)$/.exec(text)?.[1];
  // RFC 4291 §2.2: the last 32 bits may be written as dotted IPv4 (::ffff:10.0.0.1).
  if (dotted !== undefined) text = `${text.slice(0, -dotted.length)}0:0`;
  const [head = "", tail] = text.split("::");
  const left = head === "" ? [] : head.split(":");
  const right = tail === undefined || tail === "" ? [] : tail.split(":");
  const groups = [...left, ...new Array<string>(8 - left.length - right.length).fill("0"), ...right];
  groups.forEach((group, i) => out.writeUInt16BE(Number.parseInt(group, 16), i * 2));
  if (dotted !== undefined) Buffer.from(dotted.split(".").map(Number)).copy(out, 12);
  return out;
}

const oid = {
  commonName: Buffer.from("0603550403", "hex"),
  subjectAltName: Buffer.from("0603551d11", "hex"),
};
/** AlgorithmIdentifier: ecdsa-with-SHA256 has no parameters; sha256WithRSAEncryption has NULL (RFC 4055 §5). */
const signatureAlgorithmDer: Record<LeafKeyType, Buffer> = {
  ecdsa: Buffer.from("300a06082a8648ce3d040302", "hex"),
  rsa: Buffer.from("300d06092a864886f70d01010b0500", "hex"),
};
const version3 = Buffer.from("a003020102", "hex");

/**
 * Signs leaf certificates for one CA with one shared leaf key.
 *
 * Everything that is the same for every leaf (issuer, public key, key identifiers, usages) is
 * encoded to DER once, with @peculiar/x509; a new hostname then costs a few small DER splices and
 * one signature by node:crypto. Going through X509CertificateGenerator for each leaf instead
 * rebuilt and re-parsed the whole ASN.1 tree: 4–6 ms per leaf against 0.1–0.2 ms (docs/certificates.md).
 */
export class LeafSigner {
  private constructor(
    readonly leafKey: KeyPair,
    private readonly caSigningKey: KeyObject,
    private readonly signatureAlgorithm: Buffer,
    private readonly issuer: Buffer,
    private readonly subjectPublicKeyInfo: Buffer,
    private readonly fixedExtensions: Buffer,
  ) {}

  static async create(ca: CaMaterial, leafKeyType: LeafKeyType): Promise<LeafSigner> {
    const leafKey = await generateKeyPair(leafKeyType);
    // RFC 5246 §7.4.2: RSA key exchange encrypts to the key, so RSA leaves also need keyEncipherment.
    const usage =
      leafKeyType === "ecdsa"
        ? x509.KeyUsageFlags.digitalSignature
        : x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyEncipherment;
    // RFC 5280 §4.2.1.1: the AKI repeats the issuer's SKI. A CA an operator brings may have derived
    // its SKI other than by SHA-1 of the key, and OpenSSL skips an issuer whose SKI differs.
    const caKeyId = ca.cert.getExtension(x509.SubjectKeyIdentifierExtension)?.keyId;
    const fixed = [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(usage, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth], false),
      await x509.SubjectKeyIdentifierExtension.create(leafKey.keys.publicKey),
      caKeyId === undefined
        ? await x509.AuthorityKeyIdentifierExtension.create(ca.key.keys.publicKey)
        : new x509.AuthorityKeyIdentifierExtension(caKeyId),
    ];
    const spki = Buffer.from(await webcrypto.subtle.exportKey("spki", leafKey.keys.publicKey));
    return new LeafSigner(
      leafKey,
      KeyObject.from(ca.key.keys.privateKey),
      signatureAlgorithmDer[ca.key.type],
      rawSubject(new Uint8Array(ca.cert.rawData)),
      spki,
      Buffer.concat(fixed.map((extension) => new Uint8Array(extension.rawData))),
    );
  }

  /** A PEM leaf certificate for a hostname or an IP address (as an IP SAN). */
  async sign(name: string, validityDays: number): Promise<{ certPem: string; notAfter: number }> {
    const ip = isIP(name) !== 0;
    // IA5String (RFC 5280 §4.2.1.6): a dNSName is ASCII; an IDN arrives here as its A-label.
    if (name === "" || (!ip && !/^[\x21-\x7e]+$/.test(name))) {
      throw new TypeError(`cannot issue a certificate for ${JSON.stringify(name)}: not an ASCII hostname or IP`);
    }
    const now = Math.floor(Date.now() / 1000) * 1000;
    const notAfter = now + validityDays * day;
    const generalName = ip ? tlv(0x87, ipBytes(name)) : tlv(0x82, Buffer.from(name, "latin1"));
    const subjectAltName = tlv(0x30, oid.subjectAltName, tlv(0x04, tlv(0x30, generalName)));
    // ub-common-name is 64 (RFC 5280 Appendix A); the SAN, not the CN, is what clients match.
    const commonName = name.length <= 64 ? name : "egressgate leaf";
    const subject = tlv(0x30, tlv(0x31, tlv(0x30, oid.commonName, tlv(0x0c, Buffer.from(commonName, "utf8")))));
    const tbs = tlv(
      0x30,
      version3,
      tlv(0x02, serialNumber()),
      this.signatureAlgorithm,
      this.issuer,
      tlv(0x30, derTime(now - day), derTime(notAfter)),
      subject,
      this.subjectPublicKeyInfo,
      tlv(0xa3, tlv(0x30, this.fixedExtensions, subjectAltName)),
    );
    // node:crypto emits an ECDSA signature as the DER Ecdsa-Sig-Value that X.509 carries (RFC 3279
    // §2.2.3); WebCrypto's is raw r||s. Synchronous on purpose: a P-256 signature takes ~50 µs, less
    // than a hop through the libuv pool, which dns.lookup also queues on. An RSA CA's ~0.5 ms is
    // still less than the synchronous createSecureContext that follows it.
    const signature = signWithKey("sha256", tbs, this.caSigningKey);
    const cert = tlv(0x30, tbs, this.signatureAlgorithm, tlv(0x03, Buffer.of(0), signature));
    return { certPem: toPem("CERTIFICATE", cert), notAfter };
  }
}

export function parseCertificate(pem: string): x509.X509Certificate {
  return new x509.X509Certificate(pem);
}
