import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { onTestFinished } from "vitest";
import { createHttpHooks, startProxy, type HttpHooksOptions, type ProxyOptions, type RunningProxy } from "../../src/index.js";
import { tempDir } from "./proxy.js";
import { testCa } from "./test-ca.js";

export interface GuestSpec extends HttpHooksOptions {
  readonly resolve?: Readonly<Record<string, readonly string[]>>;
  readonly sources?: readonly string[];
}

export interface GuestsProxy extends RunningProxy {
  readonly logs: Record<string, unknown>[];
  /** Every log line as written, to search for what must never appear. */
  readonly rawLog: string[];
  /** The proxy's CA in a file, for curl --cacert and friends. */
  readonly caFile: string;
}

/** Test names every guest may be given; all map to loopback, never to a real resolver. */
export const testNames = ["a.test", "b.test", "shared.test", "api.test"];

/**
 * A proxy serving several guests, each from its own createHttpHooks, on 127.0.0.1:0 with its own
 * CA dir; closed when the test finishes.
 */
export async function startGuestsProxy(guests: Record<string, GuestSpec>, options: Omit<ProxyOptions, "guests"> = {}): Promise<GuestsProxy> {
  const caDir = tempDir();
  const ca = await testCa();
  const logs: Record<string, unknown>[] = [];
  const rawLog: string[] = [];
  const proxy = await startProxy({
    guests: Object.fromEntries(
      Object.entries(guests).map(([name, { resolve, sources, ...hooks }]) => {
        const { httpHooks, env } = createHttpHooks(hooks);
        return [name, { httpHooks, env, ...(resolve !== undefined ? { resolve } : {}), ...(sources !== undefined ? { sources } : {}) }];
      }),
    ),
    listen: { host: "127.0.0.1", port: 0 },
    caDir,
    upstreamCa: [ca.certPem],
    logLevel: "debug",
    logSink: (line) => {
      rawLog.push(line);
      logs.push(JSON.parse(line) as Record<string, unknown>);
    },
    resolve: Object.fromEntries(testNames.map((name) => [name, ["127.0.0.1"]])),
    ...options,
  });
  onTestFinished(() => proxy.close());
  const caFile = join(caDir, "guest-ca.pem");
  writeFileSync(caFile, proxy.caCertPem);
  return Object.assign(proxy, { logs, rawLog, caFile });
}

/** `Basic base64(user:password)`. */
export function basic(user: string, password: string): string {
  return `Basic ${Buffer.from(`${user}:${password}`).toString("base64")}`;
}

/** The guest's name and token, read back from the proxy URL that guestEnv gives it. */
export function credentialsOf(proxy: RunningProxy, guest: string): { user: string; token: string; proxyUrl: string } {
  const proxyUrl = proxy.guestEnv(guest)["HTTPS_PROXY"]!;
  const url = new URL(proxyUrl);
  return { user: url.username, token: url.password, proxyUrl };
}
