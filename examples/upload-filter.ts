/**
 * Embedding egressgate with a tier-3 `onRequest` hook that inspects upload bodies: an upload
 * that carries a private key is refused with 422, and every other body streams through as the
 * guest's own bytes.
 *
 *   npx tsx examples/upload-filter.ts api.github.com '*.npmjs.org'
 *
 * prints the guest environment and serves until Ctrl-C. Tests call `startUploadFilterProxy()`.
 * The package name resolves to dist/, so run `npm run build` first.
 *
 * The hook reads `request.clone()`, never `request` itself: the original body stays unread, so
 * returning `undefined` forwards it unchanged (DESIGN.md §2, tier 3). Reading the original and
 * then forwarding it would get 400. Bodies a hook reads are bounded by `maxHttpBodyBytes` (413).
 * This is a pattern scan for an example, not data-loss prevention: an encoded key gets past it.
 */
import { pathToFileURL } from "node:url";
import {
  createHttpHooks,
  HttpRequestBlockedError,
  startProxy,
  type HttpHooksOptions,
  type ProxyOptions,
  type RunningProxy,
} from "egressgate";

/** PEM armour of PKCS#8 and the older RSA, EC, DSA and OpenSSH private key formats. */
const privateKeyArmour = /-----BEGIN (?:[A-Z0-9]+ )?PRIVATE KEY-----/;

/** An `onRequest` hook: throws for a body with a private key, else returns undefined. */
export async function refusePrivateKeyUploads(request: Request): Promise<undefined> {
  if (request.body === null) return undefined;
  const encoding = request.headers.get("content-encoding");
  if (encoding !== null && encoding.trim().toLowerCase() !== "identity") {
    // The proxy decodes responses for hooks, not requests: a gzip upload would hide the key
    // from the scan, so a body that cannot be read is not let through either.
    throw new HttpRequestBlockedError(`uploads with Content-Encoding ${encoding} cannot be inspected`, 415, "Unsupported Media Type");
  }
  const text = await request.clone().text();
  if (privateKeyArmour.test(text)) {
    throw new HttpRequestBlockedError("upload contains a private key", 422, "Unprocessable Content");
  }
  return undefined;
}

export async function startUploadFilterProxy(
  policy: Omit<HttpHooksOptions, "onRequest">,
  options: Omit<ProxyOptions, "httpHooks" | "env"> = {},
): Promise<RunningProxy> {
  const { httpHooks, env } = createHttpHooks({ ...policy, onRequest: refusePrivateKeyUploads });
  return startProxy({ httpHooks, env, listen: { host: "127.0.0.1", port: 0 }, ...options });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const hosts = process.argv.slice(2);
  const proxy = await startUploadFilterProxy({ allowedHosts: hosts.length > 0 ? hosts : ["api.github.com"] });
  for (const [key, value] of Object.entries(proxy.guestEnv())) console.log(`${key}=${value}`);
  process.once("SIGINT", () => void proxy.close());
}
