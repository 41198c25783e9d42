/**
 * Preloaded (`node --import`) into the Node peer proxies, mockttp and http-mitm-proxy, so that they
 * can reach nothing but this machine while they resolve hostnames their own way:
 *
 * - `dns.lookup` (callback and promise forms) answers 127.0.0.1 for `bench.test`, its subdomains
 *   and `localhost`, and ENOTFOUND for every other name, without asking the system resolver.
 *   `*.test` is reserved (RFC 2606), so even a query that escaped would find nothing.
 * - `net.Socket#connect` (which tls.connect and every http agent go through) refuses an IP literal
 *   outside loopback, and replaces any caller-supplied `lookup` with the one above, so a library
 *   with its own resolver cannot route around it.
 * - `net.Server#listen` binds to 127.0.0.1 when asked for no host or a wildcard one: mockttp
 *   listens on every interface by default, and http-mitm-proxy's per-host servers on 0.0.0.0.
 *
 * bench/run.ts transpiles this file into its temp dir and preloads it; nothing else imports it.
 */
import dns from "node:dns";
import { syncBuiltinESMExports } from "node:module";
import net from "node:net";

type LookupCallback = (error: NodeJS.ErrnoException | null, address?: string | dns.LookupAddress[], family?: number) => void;

function isBenchName(hostname: string): boolean {
  const name = hostname.toLowerCase().replace(/\.$/, "");
  return name === "localhost" || name === "bench.test" || name.endsWith(".bench.test");
}

/** 127.0.0.0/8, ::1, an IPv4-mapped loopback, or a wildcard address (which dials this machine). */
function isLocalIp(ip: string): boolean {
  const bare = ip.startsWith("[") && ip.endsWith("]") ? ip.slice(1, -1) : ip;
  if (net.isIP(bare) === 4) return bare.startsWith("127.") || bare === "0.0.0.0";
  const lower = bare.toLowerCase();
  return lower === "::1" || lower === "::" || lower.startsWith("::ffff:127.");
}

function benchLookup(hostname: string, options: unknown, callback?: LookupCallback): void {
  const done = (typeof options === "function" ? options : callback) as LookupCallback;
  const all = typeof options === "object" && options !== null && (options as { all?: boolean }).all === true;
  const family = net.isIP(hostname);
  let error: NodeJS.ErrnoException | undefined;
  let address = "127.0.0.1";
  let addressFamily = 4;
  if (family !== 0) {
    if (isLocalIp(hostname)) [address, addressFamily] = [hostname, family];
    else error = Object.assign(new Error(`bench loopback guard: ${hostname} is not a loopback address`), { code: "EACCES" });
  } else if (!isBenchName(hostname)) {
    error = Object.assign(new Error(`bench loopback guard: ${hostname} is not a bench hostname`), { code: "ENOTFOUND", hostname });
  }
  process.nextTick(() => {
    if (error !== undefined) done(error);
    else if (all) done(null, [{ address, family: addressFamily }]);
    else done(null, address, addressFamily);
  });
}

const lookup = benchLookup as unknown as typeof dns.lookup;
dns.lookup = lookup;
dns.promises.lookup = ((hostname: string, options?: unknown) =>
  new Promise((resolve, reject) =>
    benchLookup(hostname, options ?? {}, (error, address, family) => {
      if (error !== null) reject(error);
      else resolve(Array.isArray(address) ? address : { address: address!, family: family! });
    }),
  )) as typeof dns.promises.lookup;
syncBuiltinESMExports();

/** What a `connect` call was given first: an options object (net.connect passes [options, cb]). */
function connectOptions(args: unknown[]): Record<string, unknown> | undefined {
  const first = args[0];
  const normalized = Array.isArray(first) ? first[0] : first;
  return normalized !== null && typeof normalized === "object" ? (normalized as Record<string, unknown>) : undefined;
}

const originalConnect = net.Socket.prototype.connect as (...args: unknown[]) => net.Socket;
net.Socket.prototype.connect = function guardedConnect(this: net.Socket, ...args: unknown[]): net.Socket {
  const options = connectOptions(args);
  let host: string | undefined;
  if (options !== undefined) {
    if (options["path"] === undefined) {
      host = typeof options["host"] === "string" ? options["host"] : "localhost";
      if (net.isIP(host) === 0) options["lookup"] = lookup;
    }
  } else if (typeof args[0] === "number" || (typeof args[0] === "string" && /^\d+$/.test(args[0]))) {
    host = typeof args[1] === "string" ? args[1] : "localhost";
  }
  if (host !== undefined && net.isIP(host) !== 0 && !isLocalIp(host)) {
    const error = Object.assign(new Error(`bench loopback guard: refusing to dial ${host}`), { code: "EACCES" });
    process.nextTick(() => this.destroy(error));
    return this;
  }
  return originalConnect.apply(this, args);
} as typeof net.Socket.prototype.connect;

const localHost = (host: unknown): string => (typeof host === "string" && (host === "localhost" || (net.isIP(host) !== 0 && isLocalIp(host) && host !== "0.0.0.0" && host !== "::")) ? host : "127.0.0.1");

const originalListen = net.Server.prototype.listen as (...args: unknown[]) => net.Server;
net.Server.prototype.listen = function guardedListen(this: net.Server, ...args: unknown[]): net.Server {
  const first = args[0];
  if (first === undefined || typeof first === "function") args.unshift(0, "127.0.0.1");
  else if (typeof first === "number" || (typeof first === "string" && /^\d+$/.test(first))) {
    if (typeof args[1] === "string") args[1] = localHost(args[1]);
    else args.splice(1, 0, "127.0.0.1");
  } else if (first !== null && typeof first === "object") {
    const options = first as Record<string, unknown>;
    if (options["path"] === undefined && options["handle"] === undefined && options["fd"] === undefined && !("_handle" in options)) {
      args[0] = { ...options, host: localHost(options["host"]) };
    }
  }
  return originalListen.apply(this, args);
} as typeof net.Server.prototype.listen;
