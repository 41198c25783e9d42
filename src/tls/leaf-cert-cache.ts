import { channel } from "node:diagnostics_channel";
import { createSecureContext, type SecureContext } from "node:tls";
import { SigningQueue } from "./signing-queue.js";
import type { LeafSigner } from "./x509.js";

export interface LeafCertCacheOptions {
  readonly maxEntries: number;
  readonly validityDays: number;
  /** Signings one source may have waiting; one more is refused. Default 32. */
  readonly signingsPerSource?: number;
  /** Leaves for names the allowlist refuses, kept apart (see {@link LeafCertCache.get}). Default min(64, maxEntries). */
  readonly maxRefusedEntries?: number;
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
 *
 * Names the allowlist refuses (a tunnel opened to answer the refusal inside it) go to a second,
 * small LRU: a guest cycling through refused names evicts only other refused names, never the
 * leaves every guest's allowed hosts use.
 */
export class LeafCertCache {
  private readonly entries = new Map<string, Entry>();
  private readonly refusedEntries = new Map<string, Entry>();
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

  /** Signed entries only, not signings in flight, refused names' included. */
  get size(): number {
    return this.entries.size + this.refusedEntries.size;
  }

  /**
   * The context for `name`, signed on a miss. `source` (the guest's address) decides whose turn
   * the signing waits for; see {@link SigningQueue}. `refused`: the tunnel's host is one the
   * allowlist refuses, and a leaf signed for it goes to the refused names' LRU. A name already in
   * either LRU is a hit whichever asks (an allowlist is per guest).
   */
  get(name: string, source = "", refused = false): Promise<SecureContext> {
    const hit = this.touch(this.entries, name) ?? this.touch(this.refusedEntries, name);
    if (hit !== undefined) {
      this.hits += 1;
      return Promise.resolve(hit.context);
    }
    const inFlight = this.signing.get(name);
    if (inFlight !== undefined) return inFlight;
    const context = this.create(name, source, refused ? this.refusedEntries : this.entries, refused ? (this.options.maxRefusedEntries ?? Math.min(64, this.options.maxEntries)) : this.options.maxEntries);
    this.signing.set(name, context);
    // Whatever the outcome, the name is no longer in flight; a failure is not cached.
    const settled = (): void => {
      if (this.signing.get(name) === context) this.signing.delete(name);
    };
    context.then(settled, settled);
    return context;
  }

  /** A fresh entry of `lru`, marked most recently used. */
  private touch(lru: Map<string, Entry>, name: string): Entry | undefined {
    const entry = lru.get(name);
    if (entry === undefined || entry.notAfter - renewMargin <= Date.now()) return undefined;
    // Map keeps insertion order, so re-inserting marks the entry as most recently used.
    lru.delete(name);
    lru.set(name, entry);
    return entry;
  }

  private create(name: string, source: string, lru: Map<string, Entry>, maxEntries: number): Promise<SecureContext> {
    return this.queue.run(source, async () => {
      const { certPem, notAfter } = await this.signer.sign(name, this.options.validityDays);
      this.signed += 1;
      if (leafSignedChannel.hasSubscribers) leafSignedChannel.publish({ name });
      // Most of a new leaf's cost is this call, not the signature: OpenSSL 3.0 parses the key PEM
      // (~0.5 ms) and the certificate for every context, and Node has no way to share a parsed key
      // between contexts. Skipping the root store (`ca: []`) measured no faster.
      const context = createSecureContext({ key: this.signer.leafKey.privateKeyPem, cert: certPem });
      // A renewal replaces the name's entry wherever it was.
      this.entries.delete(name);
      this.refusedEntries.delete(name);
      lru.set(name, { context, notAfter });
      while (lru.size > maxEntries) {
        const oldest = lru.keys().next().value;
        if (oldest === undefined) break;
        lru.delete(oldest);
      }
      return context;
    });
  }
}
