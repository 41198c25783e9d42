import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ProxyAgent, request } from "undici";
import { expect, onTestFinished, vi } from "vitest";
import {
  createHttpHooks,
  startProxy,
  type HttpHooksOptions,
  type ProxyOptions,
  type RunningProxy,
  type SecretManager,
} from "../../src/index.js";
import { testCa } from "./test-ca.js";

export interface TestProxy extends RunningProxy {
  readonly caDir: string;
  readonly logs: Record<string, unknown>[];
  readonly secretManager: SecretManager;
}

/** A fresh temporary directory, removed when the test finishes. */
export function tempDir(prefix = "egressgate-test-"): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * Starts a proxy on 127.0.0.1:0 with its own CA dir, trusting the test upstream CA, and with
 * test names mapped to loopback (never to a real resolver). Closed when the test finishes.
 */
export async function startTestProxy(
  hooks: HttpHooksOptions,
  options: Omit<ProxyOptions, "httpHooks"> = {},
): Promise<TestProxy> {
  const caDir = options.caDir ?? tempDir();
  const logs: Record<string, unknown>[] = [];
  const ca = await testCa();
  const { httpHooks, env, secretManager } = createHttpHooks(hooks);
  const proxy = await startProxy({
    httpHooks,
    env,
    listen: { host: "127.0.0.1", port: 0 },
    caDir,
    upstreamCa: [ca.certPem],
    logLevel: "debug",
    logSink: (line) => logs.push(JSON.parse(line) as Record<string, unknown>),
    ...options,
    resolve: { "api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"], ...options.resolve },
  });
  onTestFinished(() => proxy.close());
  return Object.assign(proxy, { caDir, logs, secretManager });
}

/** undici through the proxy, trusting the proxy's CA, as a guest would. */
export function proxyAgent(proxy: RunningProxy): ProxyAgent {
  const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caCertPem } });
  onTestFinished(() => agent.close());
  return agent;
}

/** The proxy's record of its guest connections: the tunnels opened, and any it closed for a limit. */
export function guestConnections(proxy: TestProxy): { tunnels: number; closed: unknown[] } {
  return {
    tunnels: proxy.logs.filter((line) => line["msg"] === "tunnel opened").length,
    closed: proxy.logs.filter((line) => line["msg"] === "guest h2 connection closed").map((line) => line["reason"]),
  };
}

export async function fetchVia(
  proxy: RunningProxy,
  url: string,
  init: { method?: string; headers?: Record<string, string>; body?: string | Buffer | NodeJS.ReadableStream } = {},
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; text: string }> {
  const res = await request(url, {
    dispatcher: proxyAgent(proxy),
    method: (init.method ?? "GET") as "GET",
    headers: init.headers ?? {},
    body: (init.body ?? null) as string | null,
  });
  return { status: res.statusCode, headers: res.headers, text: await res.body.text() };
}

/** The decision log line of the request whose target ends in `path`, once the proxy has logged it. */
export async function loggedRequest(proxy: TestProxy, path: string): Promise<Record<string, unknown>> {
  let line: Record<string, unknown> | undefined;
  await vi.waitFor(() => {
    line = proxy.logs.find((l) => l["msg"] === "request" && String(l["target"]).endsWith(path));
    expect(line, `a request line for ${path}`).not.toBe(undefined);
  }, { timeout: 15_000, interval: 50 });
  return line!;
}
