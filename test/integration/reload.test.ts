import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { createHttpHooks } from "../../src/index.js";
import { fetchVia, startTestProxy, tempDir } from "../helpers/proxy.js";
import { basic, credentialsOf, startGuestsProxy } from "../helpers/guests.js";
import { openRaw, type RawClient } from "../helpers/raw.js";
import { startUpstream } from "../helpers/upstream.js";

const root = fileURLToPath(new URL("../../", import.meta.url));

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

describe("SIGHUP", () => {
  it("re-reads the config file and its policy: a new allowlist applies, and a broken policy is refused whole with the old configuration serving", async () => {
    const upstream = await startUpstream({ tls: false });
    const dir = tempDir();
    const config = join(dir, "egressgate.yaml");
    const policy = join(dir, "policy.js");
    writeFileSync(policy, "function isRequestAllowed(request) { return true; }\n");
    const write = (host: string): void =>
      writeFileSync(config, `listen: 127.0.0.1:0\nallowInternalHosts: [${host}]\nresolve: { a.test: [127.0.0.1], b.test: [127.0.0.1] }\nhooksScript: policy.js\n`);
    write("a.test");
    const child = spawn(process.execPath, ["--import", "tsx", "src/cli/bin.ts", "--config", config, "--ca-dir", dir, "--log-format", "json"], {
      cwd: root,
      stdio: ["ignore", "pipe", "pipe"],
    });
    onTestFinished(() => {
      child.kill("SIGKILL");
    });
    let out = "";
    const waiters: Array<() => void> = [];
    const onData = (chunk: Buffer): void => {
      out += chunk.toString();
      for (const waiter of waiters.splice(0)) waiter();
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    const waitFor = (pattern: RegExp, from = 0): Promise<RegExpExecArray> =>
      new Promise((resolve, reject) => {
        const check = (): void => {
          const match = pattern.exec(out.slice(from));
          if (match !== null) resolve(match);
          else if (child.exitCode !== null) reject(new Error(`exited: ${out}`));
          else waiters.push(check);
        };
        check();
      });
    const port = Number((await waitFor(/listening on http:\/\/127\.0\.0\.1:(\d+)/))[1]);
    const ask = (host: string): Promise<number> =>
      new Promise((resolve, reject) => {
        const req = httpRequest({ host: "127.0.0.1", port, path: `http://${host}:${upstream.port}/echo`, headers: { host: `${host}:${upstream.port}` }, agent: false }, (res) => {
          res.resume();
          res.on("end", () => resolve(res.statusCode ?? 0));
        });
        req.on("error", reject);
        req.end();
      });
    expect(await ask("a.test")).toBe(200);
    expect(await ask("b.test")).toBe(403);

    write("b.test");
    let mark = out.length;
    child.kill("SIGHUP");
    await waitFor(/"msg":"configuration reloaded"/, mark);
    expect(await ask("b.test")).toBe(200);
    expect(await ask("a.test")).toBe(403);

    writeFileSync(policy, "function isRequestAllowed(request) { return ; ) }\n");
    write("a.test");
    mark = out.length;
    child.kill("SIGHUP");
    const [failed] = await waitFor(/.*"msg":"reload failed; the old configuration keeps serving".*/, mark);
    expect(failed).toContain("policy.js");
    // The old configuration (b.test) still serves; the process is alive.
    expect(await ask("b.test")).toBe(200);
    expect(await ask("a.test")).toBe(403);
    child.kill("SIGTERM");
    await new Promise((resolve) => child.once("exit", resolve));
  }, 120_000);
});
