import { createSecureContext, type SecureContext } from "node:tls";
import { createCaCertificate, importKeyPair, LeafSigner, parseCertificate } from "../../src/tls/x509.js";

export interface TestCa {
  readonly certPem: string;
  /** TLS contexts for an upstream test server, one per name; the first is the SNI-less default. */
  serverContexts(names: readonly string[]): Promise<ReadonlyMap<string, SecureContext>>;
}

let shared: Promise<TestCa> | undefined;

/** One CA per test worker for the *upstream* servers; the proxy has its own CA. */
export function testCa(): Promise<TestCa> {
  shared ??= (async () => {
    const { certPem, keyPem } = await createCaCertificate("egressgate test upstream CA");
    const ca = { cert: parseCertificate(certPem), key: await importKeyPair(keyPem) };
    return {
      certPem,
      async serverContexts(names) {
        const signer = await LeafSigner.create(ca, "ecdsa");
        const certs = await Promise.all(names.map((n) => signer.sign(n, 30)));
        return new Map(
          names.map((n, i) => [n, createSecureContext({ key: signer.leafKey.privateKeyPem, cert: certs[i]!.certPem })]),
        );
      },
    };
  })();
  return shared;
}
