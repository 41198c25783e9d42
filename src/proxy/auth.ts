import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { EgressError } from "../errors.js";

/** Guest names: what fits in a proxy URL's userinfo unencoded, and in a file name (`FILE.<guest>`). */
export { guestNamePattern } from "../config/nodes.js";

/**
 * A guest's token: HMAC-SHA256 of its name under the deployment key, as 64 lowercase hex digits
 * (nothing to percent-encode in a proxy URL). Every process given the same key (`--workers N`,
 * several instances, a restart) accepts the same token.
 *
 * @example
 * ```ts
 * const token = guestToken(process.env.EGRESSGATE_PLACEHOLDER_KEY!, "ci");
 * // HTTPS_PROXY=http://ci:${token}@proxy:8080
 * ```
 */
export function guestToken(key: string, guest: string): string {
  return createHmac("sha256", key).update(guest).digest("hex");
}

/** A key for one start, when the operator gave none: tokens then last as long as the process. */
export function randomKey(): string {
  return randomBytes(32).toString("hex");
}

/** What the header said, when it is well-formed Basic with both parts non-empty. */
export interface BasicCredentials {
  readonly user: string;
  readonly password: string;
}

const basic = /^basic[ \t]+([A-Za-z0-9+/]+={0,2})[ \t]*$/i;

/** `Proxy-Authorization: Basic base64(user:password)` (RFC 9110 §11.7.1, RFC 7617); undefined for anything else. */
export function parseBasic(header: string | undefined): BasicCredentials | undefined {
  if (header === undefined) return undefined;
  const match = basic.exec(header);
  if (match === null) return undefined;
  const decoded = Buffer.from(match[1]!, "base64").toString("utf8");
  const colon = decoded.indexOf(":");
  // Both parts must be there: a URL with only `tok@` makes wget, requests and undici send nothing,
  // so accepting a token as the user name would work for curl alone.
  if (colon <= 0 || colon === decoded.length - 1) return undefined;
  return { user: decoded.slice(0, colon), password: decoded.slice(colon + 1) };
}

/** The SHA-256 of a token: equal-length inputs for timingSafeEqual whatever the guest sent. */
export function tokenDigest(token: string): Buffer {
  return createHash("sha256").update(token).digest();
}

/** Constant-time comparison of what was sent with a guest's token digest. */
export function tokenMatches(sent: string, expected: Buffer): boolean {
  return timingSafeEqual(tokenDigest(sent), expected);
}

/** The challenge that goes with a 407 (RFC 9110 §11.7.1; RFC 7617 §2.1 for charset). */
export const proxyAuthenticate = 'Basic realm="egressgate", charset="UTF-8"';

/** The one answer to missing, malformed, unknown and wrong credentials alike. */
export function authenticationRequired(): EgressError {
  return new EgressError(
    "EG_AUTH",
    407,
    "proxy authentication required: use the proxy URL with credentials that `egressgate env --guest NAME` (or proxy.guestEnv(NAME)) prints, as HTTPS_PROXY=http://NAME:TOKEN@HOST:PORT",
    { headers: { "Proxy-Authenticate": proxyAuthenticate } },
  );
}

interface Bucket {
  tokens: number;
  at: number;
}

/**
 * Failed authentications per source address, as a token bucket: a burst (Java retries a 407
 * many times before it gives up) and then a steady trickle. Past it, failures are answered 429
 * at once. A valid credential always passes: a 256-bit token cannot be guessed at any rate, and
 * a neighbour behind the same NAT must not be able to lock a guest out.
 */
export class FailureLimiter {
  private readonly buckets = new Map<string, Bucket>();

  constructor(
    private readonly burst = 20,
    private readonly perSecond = 1,
    private readonly maxSources = 10_000,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** Counts one failure; returns the seconds to wait when the source is past its budget. */
  fail(source: string): number | undefined {
    const now = this.now();
    let bucket = this.buckets.get(source);
    if (bucket === undefined) {
      // Bounded: the oldest source goes first (a flood from many addresses must not grow this without end).
      if (this.buckets.size >= this.maxSources) this.buckets.delete(this.buckets.keys().next().value!);
      bucket = { tokens: this.burst, at: now };
      this.buckets.set(source, bucket);
    }
    bucket.tokens = Math.min(this.burst, bucket.tokens + ((now - bucket.at) / 1000) * this.perSecond);
    bucket.at = now;
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1;
      return undefined;
    }
    return Math.max(1, Math.ceil((1 - bucket.tokens) / this.perSecond));
  }

  clear(): void {
    this.buckets.clear();
  }
}

export function tooManyFailures(source: string, retryAfter: number): EgressError {
  return new EgressError("EG_AUTH", 429, `too many failed proxy authentications from ${source}; retry in ${retryAfter} s`, {
    headers: { "Retry-After": String(retryAfter) },
  });
}
