import type * as NodeInspector from "node:inspector";
import { createRequire } from "node:module";
import { isIP } from "node:net";
import type { ListenAddress } from "../policy/declarative-policy.js";
import { listenAddresses } from "./listen-addresses.js";

/**
 * Node's inspector runs any code sent to it inside this process: secret values, the CA's key.
 * While it is open (`node --inspect`, `inspector.open()`, a SIGUSR1 that nothing else handles)
 * its port is one of the proxy's own addresses, refused as a target like the listener: a guest
 * allowed loopback fetched `/json/list` through the proxy, then drove the debugger's WebSocket
 * through the upgrade relay (black-box finding).
 */

/** `inspector.url()`; node:inspector cannot be loaded from a Node built without it. */
const inspectorUrl: () => string | undefined = process.features.inspector
  ? (createRequire(import.meta.url)("node:inspector") as typeof NodeInspector).url
  : () => undefined;

/**
 * Where the inspector listens now, as `{ host, port }`, or undefined while it is closed. A host
 * it was given by name (`--inspect=localhost:9229`) is the wildcard: it listens on whatever the
 * name resolved to, which can only be an address of this machine.
 */
export function inspectorListen(): { readonly host: string; readonly port: number } | undefined {
  const url = inspectorUrl();
  if (url === undefined) return undefined;
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return undefined;
  }
  const host = parsed.hostname.startsWith("[") ? parsed.hostname.slice(1, -1) : parsed.hostname;
  const port = Number(parsed.port);
  if (!Number.isInteger(port) || port <= 0) return undefined;
  return { host: isIP(host) === 0 ? "0.0.0.0" : host, port };
}

/**
 * The proxy's own addresses with the inspector's added while it is open: `own` itself (the same
 * array, nothing allocated) while it is closed, as it nearly always is. Read at every check,
 * since the inspector can open after the proxy started.
 */
export function withInspector(own: readonly ListenAddress[]): () => readonly ListenAddress[] {
  let seen: string | undefined;
  let inspector: readonly ListenAddress[] = [];
  return () => {
    const url = inspectorUrl();
    if (url === undefined) return own;
    if (url !== seen) {
      seen = url;
      const listen = inspectorListen();
      inspector = listen === undefined ? [] : listenAddresses(listen.host, listen.port);
    }
    return [...own, ...inspector];
  };
}
