/**
 * Embedding egressgate with a layer: an in-memory cache of GET responses, as a tier-3
 * `handle(request, next)`. A hit answers without calling `next`, so no upstream request leaves;
 * a miss calls `next` once, which runs every check and the upstream, and keeps the answer if the
 * upstream said it may be kept.
 *
 *   npx tsx examples/cache-layer.ts api.github.com
 *   # in the guest: curl -i https://api.github.com/zen   (twice: the second is "x-cache: hit")
 *
 * prints the guest environment and serves until Ctrl-C. Tests call `startCacheProxy()`.
 * The package name resolves to dist/, so run `npm run build` first.
 *
 * What is kept, like a small shared cache (RFC 9111, simplified): a 200 to a GET with
 * `Cache-Control: max-age=N` (or `s-maxage`), and without `no-store`, `no-cache`, `private` or
 * `Vary: *`, for N seconds. Entries are keyed by URL and the request's Authorization header.
 * Layers run before secrets are substituted, so that header holds the guest's placeholder, never
 * the value, and one guest's cached answer is never another's. Bodies over `maxEntryBytes` go
 * through uncached; past `maxEntries`, the oldest entry goes.
 */
import { pathToFileURL } from "node:url";
import { createHttpHooks, startProxy, type HttpHooksOptions, type Layer, type ProxyOptions, type RunningProxy } from "egressgate";

export interface CacheOptions {
  /** Default 1,000. */
  readonly maxEntries?: number;
  /** Default 1 MiB. */
  readonly maxEntryBytes?: number;
}

interface Entry {
  readonly status: number;
  readonly headers: [string, string][];
  readonly body: Uint8Array;
  readonly stored: number;
  readonly expires: number;
}

/** How long a response may be kept, in ms, or 0 if it may not. */
function freshFor(response: Response): number {
  if (response.status !== 200 || response.headers.get("vary")?.includes("*") === true) return 0;
  const directives = (response.headers.get("cache-control") ?? "").toLowerCase().split(",").map((d) => d.trim());
  if (directives.some((d) => d === "no-store" || d === "no-cache" || d === "private" || d.startsWith("private="))) return 0;
  const age = (name: string): number | undefined => {
    const found = directives.find((d) => d.startsWith(`${name}=`));
    const seconds = found === undefined ? NaN : Number(found.slice(name.length + 1));
    return Number.isInteger(seconds) && seconds > 0 ? seconds : undefined;
  };
  return (age("s-maxage") ?? age("max-age") ?? 0) * 1000;
}

/** Reads at most `limit` bytes: the body, or undefined once it is longer (the stream is then released). */
async function readUpTo(response: Response, limit: number): Promise<{ body: Uint8Array } | { prefix: Uint8Array[]; rest: ReadableStreamDefaultReader<Uint8Array> }> {
  const reader = response.body!.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    size += value.byteLength;
    if (size > limit) return { prefix: chunks, rest: reader };
  }
  const body = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    body.set(chunk, at);
    at += chunk.byteLength;
  }
  return { body };
}

/** The prefix already read, then the rest of the stream: a large body still reaches the guest whole. */
function rejoin(prefix: Uint8Array[], rest: ReadableStreamDefaultReader<Uint8Array>): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const first = prefix.shift();
      if (first !== undefined) return controller.enqueue(first);
      const { done, value } = await rest.read();
      if (done) controller.close();
      else controller.enqueue(value);
    },
    cancel: (reason) => rest.cancel(reason),
  });
}

/** A GET cache as a layer. */
export function cacheLayer(options: CacheOptions = {}): Layer & { readonly size: () => number } {
  const maxEntries = options.maxEntries ?? 1_000;
  const maxEntryBytes = options.maxEntryBytes ?? 1024 * 1024;
  const entries = new Map<string, Entry>();
  const layer: Layer = async (request, next) => {
    if (request.method !== "GET") return next(request);
    const key = `${request.url}\n${request.headers.get("authorization") ?? ""}`;
    const now = Date.now();
    const hit = entries.get(key);
    if (hit !== undefined && hit.expires > now) {
      const headers = new Headers(hit.headers);
      headers.set("age", String(Math.floor((now - hit.stored) / 1000)));
      headers.set("x-cache", "hit");
      return new Response(hit.body.slice(), { status: hit.status, headers });
    }
    entries.delete(key);
    const response = await next(request);
    const ttl = freshFor(response);
    if (ttl === 0 || response.body === null) return response;
    const read = await readUpTo(response, maxEntryBytes);
    const headers = new Headers(response.headers);
    headers.set("x-cache", "miss");
    if (!("body" in read)) return new Response(rejoin(read.prefix, read.rest), { status: response.status, headers });
    entries.set(key, { status: response.status, headers: [...response.headers], body: read.body, stored: now, expires: now + ttl });
    // Map keeps insertion order: the first key is the oldest entry.
    if (entries.size > maxEntries) entries.delete(entries.keys().next().value!);
    return new Response(read.body.slice(), { status: response.status, headers });
  };
  return Object.assign(layer, { size: () => entries.size });
}

export async function startCacheProxy(
  policy: Omit<HttpHooksOptions, "layers" | "handle">,
  options: Omit<ProxyOptions, "httpHooks" | "env"> = {},
  cache: CacheOptions = {},
): Promise<RunningProxy> {
  const { httpHooks, env } = createHttpHooks({ ...policy, layers: [cacheLayer(cache)] });
  return startProxy({ httpHooks, env, listen: { host: "127.0.0.1", port: 0 }, ...options });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const proxy = await startCacheProxy({ allowedHosts: process.argv.slice(2) });
  for (const [key, value] of Object.entries(proxy.guestEnv())) console.log(`${key}=${value}`);
  process.once("SIGINT", () => void proxy.close());
}
