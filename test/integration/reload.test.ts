import { describe, expect, it } from "vitest";
import { createHttpHooks } from "../../src/index.js";
import { fetchVia, startTestProxy, tempDir } from "../helpers/proxy.js";
import { basic, credentialsOf, startGuestsProxy } from "../helpers/guests.js";
import { openRaw, type RawClient } from "../helpers/raw.js";
import { startUpstream } from "../helpers/upstream.js";

describe("proxy.reload", () => {
  it("swaps a secret's value under a running request loop, with no failed request and the new rules from then on", async () => {
    const upstream = await startUpstream();
    // Placeholders derive from the key (the CLI's deployment key), so they survive the reload.
    const key = "k".repeat(32);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], secrets: { TOKEN: { hosts: ["api.test"], value: "old-value" } }, secretPlaceholderKey: key }, { logLevel: "warn" });
    const placeholder = proxy.guestEnv()["TOKEN"]!;
    const base = `https://api.test:${upstream.port}`;
    let running = true;
    const statuses: number[] = [];
    const loop = (async () => {
      while (running) statuses.push((await fetchVia(proxy, `${base}/echo`, { headers: { authorization: `Bearer ${placeholder}` } })).status);
    })();
    while (statuses.length < 5) await new Promise((resolve) => setImmediate(resolve));
    const next = createHttpHooks({ allowedInternalHosts: ["api.test"], secrets: { TOKEN: { hosts: ["api.test"], value: "new-value" } }, secretPlaceholderKey: key });
    expect(next.env["TOKEN"]).toBe(placeholder);
    await proxy.reload({ httpHooks: next.httpHooks, env: next.env, resolve: { "api.test": ["127.0.0.1"] } });
    const seenAtReload = upstream.seen.length;
    while (upstream.seen.length < seenAtReload + 5) await new Promise((resolve) => setImmediate(resolve));
    running = false;
    await loop;
    expect(statuses.every((status) => status === 200)).toBe(true);
    const values = upstream.seen.map((request) => request.headers["authorization"]);
    expect(values[0]).toBe("Bearer old-value");
    expect(values.at(-1)).toBe("Bearer new-value");
  });

  it("a removed guest's tunnel is closed, and a kept guest's tunnel takes the new allowlist from its next request", async () => {
    const upstream = await startUpstream({ tls: false });
    const proxy = await startGuestsProxy({ keep: { allowedInternalHosts: ["api.test"] }, drop: { allowedInternalHosts: ["api.test"] } }, { logLevel: "warn" });
    const keep = credentialsOf(proxy, "keep");
    const drop = credentialsOf(proxy, "drop");
    const tunnel = async (authorization: string): Promise<RawClient> => {
      const client = await openRaw(proxy.port);
      client.write(`CONNECT api.test:${upstream.port} HTTP/1.1\r\nHost: api.test:${upstream.port}\r\nProxy-Authorization: ${authorization}\r\n\r\n`);
      expect((await client.readResponse({ forConnect: true })).status).toBe(200);
      return client;
    };
    const kept = await tunnel(basic(keep.user, keep.token));
    const dropped = await tunnel(basic(drop.user, drop.token));
    const ask = async (client: RawClient): Promise<number> => {
      client.write(`GET /echo HTTP/1.1\r\nHost: api.test:${upstream.port}\r\n\r\n`);
      return (await client.readResponse()).status;
    };
    expect(await ask(kept)).toBe(200);
    expect(await ask(dropped)).toBe(200);
    const hooks = createHttpHooks({ allowedInternalHosts: ["other.test"] });
    await proxy.reload({ guests: { keep: { httpHooks: hooks.httpHooks, env: hooks.env } }, resolve: { "api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"] } });
    expect(await ask(kept)).toBe(403);
    await dropped.closed;
    expect(credentialsOf(proxy, "keep").token).toBe(keep.token);
    expect(proxy.guestNames()).toEqual(["keep"]);
  });

  it("rejects invalid options whole and keeps the old configuration serving", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { logLevel: "warn", caDir: tempDir() });
    await expect(proxy.reload({ httpHooks: { isRequestAllowed: 7 } as never })).rejects.toThrow();
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
  });
});
