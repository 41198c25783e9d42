import { channel } from "node:diagnostics_channel";
import { createSecureContext, type SecureContext } from "node:tls";
import { SigningQueue } from "./signing-queue.js";
import type { LeafSigner } from "./x509.js";

export interface LeafCertCacheOptions {
  readonly maxEntries: number;
  readonly validityDays: number;
  /** Signings one source may have waiting; one more is refused. Default 32. */
  readonly signingsPerSource?: number;
}

/**
 * Published with `{ name }` for every leaf signed: metrics and tests can count signings without
 * reaching into the proxy.
 */
export const leafSignedChannel = channel("egressgate:tls:leaf-signed");

interface Entry {
  readonly context: SecureContext;
  readonly notAfter: number;
}

const renewMargin = 24 * 60 * 60 * 1000;

/**
 * A bounded LRU of TLS contexts per hostname or IP. Signings in flight wait in a map of their
 * own, so concurrent first handshakes for one name share a single signing, and a name enters
 * the LRU only once signed: a signing the queue refuses (a flooder at its limit) or that fails
 * evicts nothing.
 */
export class LeafCertCache {
  private readonly entries = new Map<string, Entry>();
  private readonly signing = new Map<string, Promise<SecureContext>>();
  /** How many leaves have been signed: lets tests and benches see cache hits. */
  signed = 0;
  /** How many gets the cache answered (for the metrics). */
  hits = 0;
  private readonly queue: SigningQueue;

  constructor(
    private readonly signer: LeafSigner,
    private readonly options: LeafCertCacheOptions,
  ) {
    this.queue = new SigningQueue(options.signingsPerSource ?? 32);
  }

  /** Signed entries only, not signings in flight. */
  get size(): number {
    return this.entries.size;
  }

  /**
   * The context for `name`, signed on a miss. `source` (the guest's address) decides whose turn
   * the signing waits for; see {@link SigningQueue}.
   */
  get(name: string, source = ""): Promise<SecureContext> {
    const hit = this.entries.get(name);
    if (hit !== undefined && hit.notAfter - renewMargin > Date.now()) {
      // Map keeps insertion order, so re-inserting marks the entry as most recently used.
      this.entries.delete(name);
      this.entries.set(name, hit);
      this.hits += 1;
      return Promise.resolve(hit.context);
    }
    const inFlight = this.signing.get(name);
    if (inFlight !== undefined) return inFlight;
    const context = this.create(name, source);
    this.signing.set(name, context);
    // Whatever the outcome, the name is no longer in flight; a failure is not cached.
    const settled = (): void => {
      if (this.signing.get(name) === context) this.signing.delete(name);
    };
    context.then(settled, settled);
    return context;
  }

  private create(name: string, source: string): Promise<SecureContext> {
    return this.queue.run(source, async () => {
      const { certPem, notAfter } = await this.signer.sign(name, this.options.validityDays);
      this.signed += 1;
      if (leafSignedChannel.hasSubscribers) leafSignedChannel.publish({ name });
      // Most of a new leaf's cost is this call, not the signature: OpenSSL 3.0 parses the key PEM
      // (~0.5 ms) and the certificate for every context, and Node has no way to share a parsed key
      // between contexts. Skipping the root store (`ca: []`) measured no faster.
      const context = createSecureContext({ key: this.signer.leafKey.privateKeyPem, cert: certPem });
      this.entries.delete(name);
      this.entries.set(name, { context, notAfter });
      while (this.entries.size > this.options.maxEntries) {
        const oldest = this.entries.keys().next().value;
        if (oldest === undefined) break;
        this.entries.delete(oldest);
      }
      return context;
    });
  }
}
