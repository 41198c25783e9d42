/**
 * What the soak (bench/soak.ts) sends and what each request must get back: the request kinds,
 * their weights, and the deterministic bodies that the upstream (bench/soak-upstream.ts) serves
 * and the client checks byte for byte.
 *
 * Every body is a slice of one 2 MiB pool that both processes derive from the same seed
 * (sha256 in counter mode), so the client knows the sha256 of what the upstream sent without
 * the upstream hashing anything or sending it alongside.
 */
import { createHash } from "node:crypto";
import { gzipSync } from "node:zlib";

export const poolBytes = 2 * 1024 * 1024;

/** The body pool: 2 MiB of sha256(seed ‖ counter) blocks. */
export function bodyPool(seed = "egressgate soak"): Buffer {
  const pool = Buffer.alloc(poolBytes);
  for (let i = 0; i * 32 < poolBytes; i++) createHash("sha256").update(`${seed}:${i}`).digest().copy(pool, i * 32);
  return pool;
}

/** The body at `offset` with `bytes` bytes, gzipped when asked (zlib is deterministic for one Node). */
export function sliceBody(pool: Buffer, offset: number, bytes: number, gzip = false): Buffer {
  const slice = pool.subarray(offset, offset + bytes);
  return gzip ? gzipSync(slice, { level: 6 }) : slice;
}

/** The hostnames the proxy maps with `resolve`; the upstream's leaf certificate covers them all. */
export const names = { a: "a.soak.test", b: "b.soak.test" } as const;
export const addresses = { [names.a]: ["127.0.0.1"], [names.b]: ["127.0.0.2"] } as const;
/** Allowed, but in no `resolve` entry: the system resolver answers NXDOMAIN for `.invalid` (RFC 6761). */
export const unresolvable = (i: number): string => `nx-${i % 8}.soak.invalid`;
/** Not allowed at all. */
export const deniedHost = "denied.soak.example";

/** Request headers the hooks act on; the upstream checks that both tiers marked every request. */
export const headers = {
  tier2: "x-soak-t2",
  tier3: "x-soak-t3",
  seen2: "x-soak-tier2",
  seen3: "x-soak-tier3",
} as const;

/** The texts the hooks answer with, which the client checks exactly. */
export const replaced = { tier2: "replaced by tier 2\n", tier3: "replaced by tier 3\n" } as const;

/**
 * The tier-2 policy (a module, loaded like `--hooks-script`): marks every request, and on the
 * soak's headers runs into a limit (time, memory, stack), blocks, or replaces, reads or
 * re-wraps the response.
 */
export const policySource = `
export async function onRequest(request) {
  const t2 = request.headers.get("${headers.tier2}");
  if (t2 === "loop") for (;;) {}
  if (t2 === "memory") { const held = []; for (;;) held.push(new Uint8Array(1 << 20)); }
  if (t2 === "stack") { const f = (n) => f(n + 1) + 1; f(0); }
  if (t2 === "block") throw new HttpRequestBlockedError("soak: tier 2 blocks this request", 451, "Unavailable For Legal Reasons");
  request.headers.set("${headers.seen2}", "seen");
}
export async function onResponse(response, request) {
  const t2 = request.headers.get("${headers.tier2}");
  if (t2 === "replace") return new Response(${JSON.stringify(replaced.tier2)}, { status: 200, headers: { "content-type": "text/plain" } });
  if (t2 === "read") { await response.arrayBuffer(); return undefined; }
  if (t2 === "rewrap") return new Response(response.body, response);
  return undefined;
}
`;

/** What a request of a kind must end with. */
export type Expectation =
  /** This status, and (for 200) the exact bytes of the planned body. */
  | { readonly type: "status"; readonly statuses: readonly number[] }
  /** The response is cut mid-body: the guest must see an error, never a clean end. A status in `orStatus` also counts (the fault came before the head). */
  | { readonly type: "cut"; readonly orStatus: readonly number[] }
  /** The guest gives up itself; anything but a hang is fine. */
  | { readonly type: "abort" };

/**
 * The upstream's routes (all on every server that speaks HTTP; `close` on the raw servers;
 * `trailers` on the HTTP/2 ones, where `reset` is a RST_STREAM rather than a TCP reset).
 */
export type Route = "bytes" | "upload" | "reset" | "reset-head" | "stall" | "redirect" | "close" | "trailers";

/**
 * Which upstream server a request goes to. `h2` and `h2-goaway` speak only HTTP/2 (ALPN `h2`, no
 * HTTP/1.1); `h2-goaway` ends each of its sessions with a GOAWAY after a few dozen streams.
 */
export type Server = "https-a" | "https-b" | "http" | "close-tls" | "close-plain" | "nx" | "denied" | "h2" | "h2-goaway";

/** The trailer field the HTTP/2 upstream's `/trailers` route ends with: the sha256 (hex) of the body it sent. */
export const digestTrailer = "x-soak-sha256";

/** How long a `read: "pause"` guest stops reading: past the soak proxy's 2 s upstream body timeout. */
export const guestPauseMs = 2_500;

/** RST_STREAM codes the HTTP/2 upstream's `/reset` cycles through (NO_ERROR, INTERNAL_ERROR, CANCEL): Node ends a stream's body on the first and last as if whole. */
export const h2ResetCodes = [0, 2, 8] as const;

export interface KindSpec {
  readonly name: string;
  /**
   * The guest's protocol: HTTP/1.1 (undici, the default) or HTTP/2 (node:http2 inside a CONNECT
   * tunnel, on a few sessions per target that live for the whole run; a `read: "abort"` is then
   * RST_STREAM(CANCEL) on its stream, the connection kept).
   */
  readonly guest?: "h1" | "h2";
  /** Share of requests, in parts per 10,000. */
  readonly weight: number;
  readonly what: string;
  readonly server: Server;
  readonly route: Route;
  readonly method: "GET" | "POST";
  /** Body size range (response body for GET, upload for POST). */
  readonly bytes: readonly [number, number];
  readonly gzip?: boolean;
  readonly chunked?: boolean;
  readonly hook2?: string;
  readonly hook3?: string;
  /** How the guest sends its upload. */
  readonly upload?: "fast" | "slow" | "abort";
  /** How the guest reads the response ("pause": it stops for {@link guestPauseMs} after the first chunk, then reads on; HTTP/2 guests only). */
  readonly read: "full" | "slow" | "abort" | "pause";
  readonly expect: Expectation;
  /** The body the guest must get, when not the planned slice. */
  readonly text?: string;
  /** The response must end with the {@link digestTrailer} trailer, naming the body's sha256. */
  readonly trailers?: boolean;
}

const ok: Expectation = { type: "status", statuses: [200] };

/** The mix: ordinary traffic first, then faults. Weights add up to 10,000. */
export const kinds: readonly KindSpec[] = [
  { name: "get-small", weight: 2_560, what: "GET, 64 B–16 KiB, Content-Length", server: "https-a", route: "bytes", method: "GET", bytes: [64, 16_384], read: "full", expect: ok },
  { name: "get-small-b", weight: 1_000, what: "GET to a second name and address (127.0.0.2)", server: "https-b", route: "bytes", method: "GET", bytes: [64, 16_384], read: "full", expect: ok },
  { name: "get-chunked", weight: 800, what: "GET, chunked response", server: "https-a", route: "bytes", method: "GET", bytes: [1_024, 65_536], chunked: true, read: "full", expect: ok },
  { name: "get-gzip", weight: 300, what: "GET, gzip response read by the tier-3 hook (guest gets the compressed bytes)", server: "https-a", route: "bytes", method: "GET", bytes: [4_096, 65_536], gzip: true, hook3: "read", read: "full", expect: ok },
  { name: "get-large", weight: 60, what: "GET, 256 KiB–1 MiB", server: "https-b", route: "bytes", method: "GET", bytes: [262_144, 1_048_576], read: "full", expect: ok },
  { name: "post-upload", weight: 600, what: "POST 1–64 KiB; the upstream answers the sha256 it received", server: "https-a", route: "upload", method: "POST", bytes: [1_024, 65_536], upload: "fast", read: "full", expect: ok },
  { name: "post-read-by-hook", weight: 150, what: "POST read by tier 3 through request.clone()", server: "https-a", route: "upload", method: "POST", bytes: [1_024, 65_536], hook3: "read-request", upload: "fast", read: "full", expect: ok },
  { name: "plain-http", weight: 500, what: "plain http:// GET, absolute-form", server: "http", route: "bytes", method: "GET", bytes: [64, 16_384], read: "full", expect: ok },
  { name: "redirect", weight: 200, what: "302 with a body, followed by the proxy", server: "https-a", route: "redirect", method: "GET", bytes: [64, 16_384], read: "full", expect: ok },
  { name: "close-tls", weight: 300, what: "HTTP/1.0 close-delimited body over TLS (no Content-Length)", server: "close-tls", route: "close", method: "GET", bytes: [1_024, 262_144], read: "full", expect: ok },
  { name: "close-plain", weight: 100, what: "HTTP/1.0 close-delimited body over plain http://", server: "close-plain", route: "close", method: "GET", bytes: [1_024, 262_144], read: "full", expect: ok },
  { name: "t2-read", weight: 150, what: "tier 2 reads the response body and passes it on", server: "https-a", route: "bytes", method: "GET", bytes: [64, 65_536], hook2: "read", read: "full", expect: ok },
  { name: "t2-rewrap", weight: 150, what: "tier 2 returns new Response(response.body, response)", server: "https-a", route: "bytes", method: "GET", bytes: [64, 65_536], hook2: "rewrap", read: "full", expect: ok },
  { name: "t2-replace", weight: 100, what: "tier 2 onResponse returns a new Response (upstream body unread)", server: "https-a", route: "bytes", method: "GET", bytes: [64, 65_536], hook2: "replace", read: "full", expect: ok, text: replaced.tier2 },
  { name: "t3-replace", weight: 100, what: "tier 3 onResponse returns a new Response (upstream body unread)", server: "https-a", route: "bytes", method: "GET", bytes: [64, 65_536], hook3: "replace", read: "full", expect: ok, text: replaced.tier3 },
  { name: "t3-throw", weight: 50, what: "tier 3 onResponse throws (upstream body unread)", server: "https-a", route: "bytes", method: "GET", bytes: [64, 65_536], hook3: "throw", read: "full", expect: { type: "status", statuses: [502] } },
  { name: "t2-block", weight: 100, what: "tier 2 onRequest throws HttpRequestBlockedError(451)", server: "https-a", route: "bytes", method: "GET", bytes: [64, 1_024], hook2: "block", read: "full", expect: { type: "status", statuses: [451] } },
  { name: "t3-block", weight: 100, what: "tier 3 onRequest throws HttpRequestBlockedError(429)", server: "https-b", route: "bytes", method: "GET", bytes: [64, 1_024], hook3: "block", read: "full", expect: { type: "status", statuses: [429] } },
  { name: "denied-host", weight: 100, what: "a host outside the allowlist", server: "denied", route: "bytes", method: "GET", bytes: [64, 1_024], read: "full", expect: { type: "status", statuses: [403] } },
  { name: "dns-fail", weight: 150, what: "an allowed name that does not resolve (*.soak.invalid)", server: "nx", route: "bytes", method: "GET", bytes: [64, 1_024], read: "full", expect: { type: "status", statuses: [502, 504] } },
  { name: "reset-head", weight: 60, what: "upstream closes before its response head", server: "https-a", route: "reset-head", method: "GET", bytes: [64, 1_024], read: "full", expect: { type: "status", statuses: [502] } },
  { name: "reset-body", weight: 100, what: "upstream resets (RST) mid-body", server: "https-b", route: "reset", method: "GET", bytes: [65_536, 262_144], read: "full", expect: { type: "cut", orStatus: [502] } },
  { name: "stall-body", weight: 40, what: "upstream stalls mid-body (proxy's upstream body timeout)", server: "https-a", route: "stall", method: "GET", bytes: [65_536, 262_144], read: "full", expect: { type: "cut", orStatus: [502] } },
  { name: "slow-read", weight: 40, what: "guest reads 512 KiB slowly", server: "https-b", route: "bytes", method: "GET", bytes: [524_288, 524_288], read: "slow", expect: ok },
  { name: "slow-upload", weight: 30, what: "guest uploads 256 KiB slowly", server: "https-a", route: "upload", method: "POST", bytes: [262_144, 262_144], upload: "slow", read: "full", expect: ok },
  { name: "abort-download", weight: 100, what: "guest aborts after the first chunk of 1 MiB", server: "https-b", route: "bytes", method: "GET", bytes: [1_048_576, 1_048_576], read: "abort", expect: { type: "abort" } },
  { name: "abort-upload", weight: 80, what: "guest aborts its upload of 256 KiB after 32 KiB", server: "https-a", route: "upload", method: "POST", bytes: [262_144, 262_144], upload: "abort", read: "full", expect: { type: "abort" } },
  { name: "hostile-time", weight: 6, what: "tier 2 loops forever (time limit)", server: "https-a", route: "bytes", method: "GET", bytes: [64, 1_024], hook2: "loop", read: "full", expect: { type: "status", statuses: [502] } },
  { name: "hostile-memory", weight: 12, what: "tier 2 allocates without end (memory limit)", server: "https-a", route: "bytes", method: "GET", bytes: [64, 1_024], hook2: "memory", read: "full", expect: { type: "status", statuses: [502] } },
  { name: "hostile-stack", weight: 12, what: "tier 2 recurses without end (stack limit)", server: "https-b", route: "bytes", method: "GET", bytes: [64, 1_024], hook2: "stack", read: "full", expect: { type: "status", statuses: [502] } },
  // HTTP/2, on either side or both (get-small gave up the shares).
  { name: "h2-get-small", weight: 600, guest: "h2", what: "HTTP/2 guest, GET 64 B–16 KiB to the HTTP/1.1 upstream", server: "https-a", route: "bytes", method: "GET", bytes: [64, 16_384], read: "full", expect: ok },
  { name: "h2-get-h2", weight: 400, guest: "h2", what: "HTTP/2 guest, GET 64 B–64 KiB to the HTTP/2-only upstream", server: "h2", route: "bytes", method: "GET", bytes: [64, 65_536], read: "full", expect: ok },
  { name: "h1-get-h2", weight: 200, what: "HTTP/1.1 guest, GET 64 B–64 KiB to the HTTP/2-only upstream", server: "h2", route: "bytes", method: "GET", bytes: [64, 65_536], read: "full", expect: ok },
  { name: "h2-get-large", weight: 40, guest: "h2", what: "HTTP/2 guest, GET 64–512 KiB (past the default flow-control window) from the HTTP/2-only upstream", server: "h2", route: "bytes", method: "GET", bytes: [65_536, 524_288], read: "full", expect: ok },
  { name: "h2-get-large-h1", weight: 30, guest: "h2", what: "HTTP/2 guest, GET 64–512 KiB from the HTTP/1.1 upstream", server: "https-b", route: "bytes", method: "GET", bytes: [65_536, 524_288], read: "full", expect: ok },
  { name: "h2-pause-read", weight: 20, guest: "h2", what: "HTTP/2 guest stops reading 256 KiB from the HTTP/2-only upstream for 2.5 s after the first chunk (past the proxy's 2 s upstream body timeout), then reads on", server: "h2", route: "bytes", method: "GET", bytes: [262_144, 262_144], read: "pause", expect: ok },
  { name: "h2-upload-h2", weight: 150, guest: "h2", what: "HTTP/2 guest, POST 1–256 KiB to the HTTP/2-only upstream", server: "h2", route: "upload", method: "POST", bytes: [1_024, 262_144], upload: "fast", read: "full", expect: ok },
  { name: "h2-upload-h1", weight: 100, guest: "h2", what: "HTTP/2 guest, POST 1–256 KiB to the HTTP/1.1 upstream", server: "https-a", route: "upload", method: "POST", bytes: [1_024, 262_144], upload: "fast", read: "full", expect: ok },
  { name: "h2-trailers", weight: 100, guest: "h2", what: "HTTP/2 both sides: a body, then a trailer with its sha256", server: "h2", route: "trailers", method: "GET", bytes: [64, 65_536], read: "full", expect: ok, trailers: true },
  { name: "h2-cancel-h2", weight: 60, guest: "h2", what: "HTTP/2 guest resets its stream (CANCEL) after the first chunk of 1 MiB from the HTTP/2-only upstream", server: "h2", route: "bytes", method: "GET", bytes: [1_048_576, 1_048_576], read: "abort", expect: { type: "abort" } },
  { name: "h2-cancel-h1", weight: 40, guest: "h2", what: "HTTP/2 guest resets its stream (CANCEL) after the first chunk of 1 MiB from the HTTP/1.1 upstream", server: "https-b", route: "bytes", method: "GET", bytes: [1_048_576, 1_048_576], read: "abort", expect: { type: "abort" } },
  { name: "h2-reset-body", weight: 60, guest: "h2", what: "the HTTP/2-only upstream resets its stream mid-body (NO_ERROR, INTERNAL_ERROR or CANCEL)", server: "h2", route: "reset", method: "GET", bytes: [65_536, 262_144], read: "full", expect: { type: "cut", orStatus: [502] } },
  { name: "h2-goaway", weight: 150, guest: "h2", what: "HTTP/2 guest, GET 64 B–16 KiB to an HTTP/2 upstream whose sessions end with GOAWAY after 20–60 streams", server: "h2-goaway", route: "bytes", method: "GET", bytes: [64, 16_384], read: "full", expect: ok },
];

/** Where a body slice may start: 4 KiB steps, so hashes repeat and can be cached. */
export function offsetFor(random: number, bytes: number): number {
  const steps = Math.floor((poolBytes - bytes) / 4096);
  return Math.floor(random * (steps + 1)) * 4096;
}

/** Sizes are drawn from 16 values per kind, for the same reason. */
export function sizeFor(random: number, [min, max]: readonly [number, number]): number {
  if (min === max) return min;
  return Math.round(min + ((max - min) * Math.floor(random * 16)) / 15);
}
