import { createSecureContext, type SecureContext } from "node:tls";
import { createCaCertificate, importKeyPair, LeafSigner, parseCertificate } from "../../src/tls/x509.js";

export interface TestCa {
  readonly certPem: string;
  /** TLS contexts for an upstream test server, one per name; the first is the SNI-less default. */
  serverContexts(names: readonly string[]): Promise<ReadonlyMap<string, SecureContext>>;
  /** The key and certificate for each name, as PEM: a server's default for connections without SNI (an IP literal). */
  serverCredentials(names: readonly string[]): Promise<ReadonlyMap<string, { readonly key: string; readonly cert: string }>>;
}

let shared: Promise<TestCa> | undefined;

/** One CA per test worker for the *upstream* servers; the proxy has its own CA. */
export function testCa(): Promise<TestCa> {
  shared ??= (async () => {
    const { certPem, keyPem } = await createCaCertificate("egressgate test upstream CA");
    const ca = { cert: parseCertificate(certPem), key: await importKeyPair(keyPem) };
    const serverCredentials = async (names: readonly string[]): Promise<ReadonlyMap<string, { readonly key: string; readonly cert: string }>> => {
      const signer = await LeafSigner.create(ca, "ecdsa");
      const certs = await Promise.all(names.map((n) => signer.sign(n, 30)));
      return new Map(names.map((n, i) => [n, { key: signer.leafKey.privateKeyPem, cert: certs[i]!.certPem }]));
    };
    return {
      certPem,
      serverCredentials,
      async serverContexts(names) {
        const credentials = await serverCredentials(names);
        return new Map([...credentials].map(([n, pems]) => [n, createSecureContext(pems)]));
      },
    };
  })();
  return shared;
}
