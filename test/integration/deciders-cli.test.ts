import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { ProxyAgent, request } from "undici";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { caseOf, json, processesWith, shellDecider, startDecisionServer } from "../helpers/deciders.js";
import { tempDir } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { startUpstream, type Echo } from "../helpers/upstream.js";

const root = fileURLToPath(new URL("../../", import.meta.url));

/**
 * The CLI from its sources (through tsx, so the test needs no build), listening on 127.0.0.1:0;
 * killed when the test ends. Resolves with its proxy URL once it prints it.
 */
async function startCli(args: readonly string[]): Promise<{ url: string; stderr: () => string; exited: Promise<void>; signal: (name: NodeJS.Signals) => void; exitCode: () => number | null }> {
  const env: NodeJS.ProcessEnv = { ...process.env, XDG_CONFIG_HOME: tempDir("egressgate-xdg-") };
  for (const name of ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "NO_PROXY", "no_proxy"]) delete env[name];
  const child = spawn(process.execPath, ["--import", "tsx", join(root, "src", "cli", "bin.ts"), "--listen", "127.0.0.1:0", "--log-level", "warn", ...args], {
    cwd: root,
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  let err = "";
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => (err += chunk));
  const exited = new Promise<void>((resolve) => child.once("close", () => resolve()));
  onTestFinished(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
  });
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
      out += chunk;
      const match = /egressgate listening on (http:\/\/127\.0\.0\.1:\d+)\n/.exec(out);
      if (match !== null) resolve(match[1]!);
    });
    void exited.then(() => reject(new Error(`egressgate exited before listening\nstdout: ${out}\nstderr: ${err}`)));
  });
  return { url, stderr: () => err, exited, signal: (name) => void child.kill(name), exitCode: () => child.exitCode };
}

async function via(proxyUrl: string, caDir: string, url: string): Promise<{ status: number; text: string }> {
  const agent = new ProxyAgent({ uri: proxyUrl, requestTls: { ca: readFileSync(join(caDir, "ca.crt"), "utf8") } });
  onTestFinished(() => agent.close());
  const res = await request(url, { dispatcher: agent });
  return { status: res.statusCode, text: await res.body.text() };
}

describe("CLI: --hook-command and --hook-url", () => {
  it("run as a chain in command-line order: the command's rewrite reaches the webhook, whose block ends the chain", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const caFile = join(dir, "upstream-ca.pem");
    writeFileSync(caFile, (await testCa()).certPem);
    const upstream = await startUpstream();
    const hook = await startDecisionServer((doc, _req, res) => {
      const headers = (doc["request"] as { headers: Record<string, string> }).headers;
      if (caseOf(doc) === "block422") return json(res, 200, { decision: "block", reason: "webhook says no", status: 451 });
      // The webhook runs second: it sees the header the command set.
      if (headers["x-decided"] !== "shell") return json(res, 200, { decision: "block", reason: "the command did not run first" });
      json(res, 200, { decision: "allow" });
    });
    const { url } = await startCli([
      ...["--ca-dir", caDir, "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--upstream-ca", caFile],
      ...["--hook-command", `${shellDecider}`, "--hook-url", `${hook.url}/decide`],
    ]);
    const base = `https://api.test:${upstream.port}`;
    const rewritten = await via(url, caDir, `${base}/echo?case=rewrite`);
    expect(rewritten.status).toBe(200);
    expect((JSON.parse(rewritten.text) as Echo).headers["x-decided"]).toBe("shell");
    const blocked = await via(url, caDir, `${base}/echo?case=block422`);
    expect(blocked.status).toBe(451);
    expect(blocked.text).toContain("webhook says no");
    const byCommand = await via(url, caDir, `${base}/echo?case=exit2`);
    expect(byCommand.status).toBe(403);
    expect(byCommand.text).toContain("exit two says no");
    // The command blocked first: the webhook was asked about the first two requests only.
    expect(hook.received).toHaveLength(2);
    expect(upstream.hits()).toBe(1);
  });
});

// SIGTERM waited for a decider's whole timeoutMs (up to 10 minutes): the drain cut the guest's
// request, but a webhook that never answered, or a command still running, held the process
// (black-box finding). The deciders' timeouts here are far past the test's own.
describe("CLI: SIGTERM while external deciders are deciding", () => {
  it.each(["a webhook that never answers", "a command that never exits"] as const)("%s: the proxy exits 0 after its drain", async (which) => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const caFile = join(dir, "upstream-ca.pem");
    writeFileSync(caFile, (await testCa()).certPem);
    const upstream = await startUpstream();
    const hook = await startDecisionServer((_doc, _req, res) => json(res, 200, { decision: "allow" }), () => true);
    const decider = which === "a webhook that never answers" ? { webhook: `${hook.url}/decide`, timeoutMs: 600_000 } : { command: `sleep ${sleepFor}`, timeoutMs: 600_000 };
    const config = join(dir, "egressgate.json");
    writeFileSync(config, JSON.stringify({ caDir, allowInternalHosts: ["api.test"], resolve: { "api.test": ["127.0.0.1"] }, upstreamCa: [caFile], timeouts: { drainMs: 300 }, hooks: [decider] }));
    const cli = await startCli(["--config", config]);
    const answer = via(cli.url, caDir, `https://api.test:${upstream.port}/echo`).then(
      (res) => res.status,
      () => "cut",
    );
    // The decider has the request in hand.
    if (which === "a webhook that never answers") await vi.waitFor(() => expect(hook.held()).toBe(1), { timeout: 10_000, interval: 20 });
    else await vi.waitFor(() => expect(sleepers()).toBeGreaterThan(0), { timeout: 10_000, interval: 20 });
    cli.signal("SIGTERM");
    await cli.exited;
    expect(cli.exitCode()).toBe(0);
    expect([502, "cut"]).toContain(await answer);
    expect(upstream.hits()).toBe(0);
    // A command's process is gone with it.
    if (which === "a command that never exits") expect(sleepers()).toBe(0);
  }, 30_000);
});

/** What the command decider sleeps, in seconds: a fraction no other process on the machine uses. */
const sleepFor = `600.${process.pid}`;

/** The command decider's `sleep` processes on this machine. */
function sleepers(): number {
  return processesWith(["sleep", sleepFor]);
}
