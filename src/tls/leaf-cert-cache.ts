import { channel } from "node:diagnostics_channel";
import { constants } from "node:crypto";
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

/** Whether any caller waiting for a signing was not refused: it then goes to the main LRU. */
interface Pool {
  allowed: boolean;
}

interface Signing {
  readonly context: Promise<SecureContext>;
  readonly pool: Pool;
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
  private readonly signing = new Map<string, Signing>();
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
   * allowlist refuses, and a leaf signed only for such tunnels goes to the refused names' LRU.
   * Allowlists are per guest, so a name in either LRU is a hit for whoever asks, and one asked for
   * by a guest allowed it moves to (or is signed into) the main LRU: a guest that names a host
   * before the guests allowed it cannot keep its leaf among the refused.
   */
  get(name: string, source = "", refused = false): Promise<SecureContext> {
    const hit = this.touch(this.entries, name) ?? this.touch(this.refusedEntries, name);
    if (hit !== undefined) {
      this.hits += 1;
      if (!refused && this.refusedEntries.delete(name)) this.store(this.entries, this.options.maxEntries, name, hit);
      return Promise.resolve(hit.context);
    }
    const inFlight = this.signing.get(name);
    if (inFlight !== undefined) {
      if (!refused) inFlight.pool.allowed = true;
      return inFlight.context;
    }
    // A renewal stays in the main LRU whoever asks for it.
    const pool: Pool = { allowed: !refused || this.entries.has(name) };
    const signing: Signing = { context: this.create(name, source, pool), pool };
    this.signing.set(name, signing);
    // Whatever the outcome, the name is no longer in flight; a failure is not cached.
    const settled = (): void => {
      if (this.signing.get(name) === signing) this.signing.delete(name);
    };
    signing.context.then(settled, settled);
    return signing.context;
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

  /** `entry` as the most recently used of `lru`, the least recently used past `maxEntries` evicted. */
  private store(lru: Map<string, Entry>, maxEntries: number, name: string, entry: Entry): void {
    lru.delete(name);
    lru.set(name, entry);
    while (lru.size > maxEntries) {
      const oldest = lru.keys().next().value;
      if (oldest === undefined) break;
      lru.delete(oldest);
    }
  }

  private create(name: string, source: string, pool: Pool): Promise<SecureContext> {
    return this.queue.run(source, async () => {
      const { certPem, notAfter } = await this.signer.sign(name, this.options.validityDays);
      this.signed += 1;
      if (leafSignedChannel.hasSubscribers) leafSignedChannel.publish({ name });
      // Most of a new leaf's cost is this call, not the signature: OpenSSL 3.0 parses the key PEM
      // (~0.5 ms) and the certificate for every context, and Node has no way to share a parsed key
      // between contexts. Skipping the root store (`ca: []`) measured no faster. No renegotiation
      // (TLS 1.2): each costs a key exchange and a signature on a connection already paid for,
      // and Node's own limit let a guest run hundreds a second.
      const context = createSecureContext({ key: this.signer.leafKey.privateKeyPem, cert: certPem, secureOptions: constants.SSL_OP_NO_RENEGOTIATION });
      // A renewal replaces the name's entry wherever it was; the pool is decided now, once every
      // caller that joined this signing has said whether it was refused.
      this.entries.delete(name);
      this.refusedEntries.delete(name);
      if (pool.allowed) this.store(this.entries, this.options.maxEntries, name, { context, notAfter });
      else this.store(this.refusedEntries, this.options.maxRefusedEntries ?? Math.min(64, this.options.maxEntries), name, { context, notAfter });
      return context;
    });
  }
}
