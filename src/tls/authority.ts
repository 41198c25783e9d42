import { createSecureContext, type SecureContext } from "node:tls";
import { loadOrCreateCa, type LoadedCa } from "./ca-store.js";
import { LeafCertCache } from "./leaf-cert-cache.js";
import { systemRootsPem } from "./system-roots.js";
import { LeafSigner, type LeafKeyType } from "./x509.js";

export interface TlsAuthorityOptions {
  readonly caDir: string;
  readonly leafKeyType: LeafKeyType;
  readonly leafCacheSize: number;
  readonly leafValidityDays: number;
  /** Extra PEM roots trusted for upstream TLS, on top of the system roots. */
  readonly upstreamCaPems: readonly string[];
}

/** Everything TLS for one proxy: the CA, leaf certificates for guests, and upstream trust. */
export interface TlsAuthority {
  readonly ca: LoadedCa;
  readonly leaves: LeafCertCache;
  /** Built once: a `ca` option on every upstream connect would re-parse ~140 roots each time. */
  readonly upstreamContext: SecureContext;
}

export async function createTlsAuthority(options: TlsAuthorityOptions): Promise<TlsAuthority> {
  const ca = await loadOrCreateCa(options.caDir);
  const signer = await LeafSigner.create(ca, options.leafKeyType);
  const leaves = new LeafCertCache(signer, {
    maxEntries: options.leafCacheSize,
    validityDays: options.leafValidityDays,
  });
  const upstreamContext = createSecureContext({ ca: [systemRootsPem(), ...options.upstreamCaPems] });
  return { ca, leaves, upstreamContext };
}
