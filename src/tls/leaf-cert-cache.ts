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
  readonly context: Promise<SecureContext>;
  /** Until the signing settles, Infinity: an in-flight entry is never considered stale. */
  notAfter: number;
}

const renewMargin = 24 * 60 * 60 * 1000;

/**
 * A bounded LRU of TLS contexts per hostname or IP. It holds promises, so concurrent first
 * handshakes for one name share a single signing, and a failed signing is not cached.
 */
export class LeafCertCache {
  private readonly entries = new Map<string, Entry>();
  /** How many leaves have been signed: lets tests and benches see cache hits. */
  signed = 0;
  private readonly queue: SigningQueue;

  constructor(
    private readonly signer: LeafSigner,
    private readonly options: LeafCertCacheOptions,
  ) {
    this.queue = new SigningQueue(options.signingsPerSource ?? 32);
  }

  get size(): number {
    return this.entries.size;
  }

  /**
   * The context for `name`, signed on a miss. `source` (the guest's address) decides whose turn
   * the signing waits for; see {@link SigningQueue}.
   */
  get(name: string, source = ""): Promise<SecureContext> {
    const hit = this.entries.get(name);
    this.entries.delete(name);
    if (hit !== undefined && hit.notAfter - renewMargin > Date.now()) {
      // Map keeps insertion order, so re-inserting marks the entry as most recently used.
      this.entries.set(name, hit);
      return hit.context;
    }
    const entry: Entry = { context: this.create(name, source, () => entry), notAfter: Number.POSITIVE_INFINITY };
    this.entries.set(name, entry);
    if (this.entries.size > this.options.maxEntries) {
      const oldest = this.entries.keys().next().value;
      if (oldest !== undefined) this.entries.delete(oldest);
    }
    return entry.context;
  }

  private async create(name: string, source: string, self: () => Entry): Promise<SecureContext> {
    try {
      return await this.queue.run(source, async () => {
        const { certPem, notAfter } = await this.signer.sign(name, this.options.validityDays);
        this.signed += 1;
        if (leafSignedChannel.hasSubscribers) leafSignedChannel.publish({ name });
        self().notAfter = notAfter;
        // Most of a new leaf's cost is this call, not the signature: OpenSSL 3.0 parses the key PEM
        // (~0.5 ms) and the certificate for every context, and Node has no way to share a parsed key
        // between contexts. Skipping the root store (`ca: []`) measured no faster.
        return createSecureContext({ key: this.signer.leafKey.privateKeyPem, cert: certPem });
      });
    } catch (error) {
      if (this.entries.get(name) === self()) this.entries.delete(name);
      throw error;
    }
  }
}
