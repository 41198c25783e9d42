import { execFile, spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { tempDir } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { startUpstream } from "../helpers/upstream.js";

const root = fileURLToPath(new URL("../../", import.meta.url));

/** The commands in the README's "Quick start" shell block, as a user would copy them. */
function quickStartCommands(): string[] {
  const readme = readFileSync(join(root, "README.md"), "utf8");
  const section = readme.slice(readme.indexOf("## Quick start"));
  const block = /```sh\n([\s\S]*?)```/.exec(section);
  if (block === null) throw new Error("README has no quick-start sh block");
  return block[1]!.split("\n").filter((line) => line.trim() !== "");
}

function cleanEnv(home: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, XDG_CONFIG_HOME: home };
  for (const name of ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"]) delete env[name];
  return env;
}

function run(command: string, args: readonly string[], env: NodeJS.ProcessEnv): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(command, args, { cwd: root, env, timeout: 30_000 }, (error, stdout, stderr) => {
      resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, stderr });
    });
  });
}

describe("the README's quick start", () => {
  it("the quick-start command runs a proxy that a guest configured by `egressgate env` fetches through", async () => {
    const commands = quickStartCommands();
    expect(commands[0]).toBe("npm install");
    const start = commands.find((c) => c.startsWith("npx egressgate "));
    expect(start).toMatch(/^npx egressgate --allow-host \S+/);

    const home = tempDir();
    const env = cleanEnv(home);
    const upstream = await startUpstream();
    const caFile = join(home, "upstream-ca.pem");
    writeFileSync(caFile, (await testCa()).certPem);
    // The README's own flags, plus what keeps this test on loopback: a free port, a pinned test
    // name allowed as internal, and trust for the test upstream.
    const args = [
      ...start!.split(/\s+/).slice(1),
      "--listen", "127.0.0.1:0",
      "--allow-internal-host", "api.test",
      "--resolve", "api.test=127.0.0.1",
      "--upstream-ca", caFile,
      "--log-level", "warn",
    ];
    // npx runs the bin in a child of its own: give them a process group to signal together.
    const child = spawn("npx", args, { cwd: root, env, stdio: ["ignore", "pipe", "pipe"], detached: true });
    const exited = new Promise((resolve) => child.once("close", resolve));
    onTestFinished(async () => {
      try {
        process.kill(-child.pid!, "SIGTERM");
      } catch {
        // already gone
      }
      await exited;
    });
    let stdout = "";
    child.stdout.setEncoding("utf8");
    const port = await new Promise<number>((resolve, reject) => {
      // A hang guard, not a timing check: npx and a cold node took over 20 s on a loaded CI machine.
      const timer = setTimeout(() => reject(new Error(`no listening line: ${stdout}`)), 60_000);
      child.stdout.on("data", (chunk: string) => {
        stdout += chunk;
        const match = /^egressgate listening on http:\/\/127\.0\.0\.1:(\d+)\n/.exec(stdout);
        if (match !== null) {
          clearTimeout(timer);
          resolve(Number(match[1]));
        }
      });
    });

    // As the README's guest does: eval "$(npx egressgate env)", with the real port.
    const printed = await run("npx", ["egressgate", "env", "--listen", `127.0.0.1:${port}`], env);
    expect(printed.code).toBe(0);
    const guest: NodeJS.ProcessEnv = { PATH: process.env["PATH"] };
    for (const match of printed.stdout.matchAll(/^export (\w+)='([^']*)'$/gm)) guest[match[1]!] = match[2]!;
    expect(guest["HTTPS_PROXY"]).toBe(`http://127.0.0.1:${port}`);

    const allowed = await run("curl", ["-sS", `https://api.test:${upstream.port}/echo`], guest);
    expect(allowed.stderr).toBe("");
    expect(JSON.parse(allowed.stdout)).toMatchObject({ path: "/echo" });

    const refused = await run("curl", ["-sS", "-x", guest["HTTP_PROXY"]!, `http://not-allowed.test:${upstream.port}/`], guest);
    expect(refused.stdout).toMatch(/^403 Forbidden: host "not-allowed\.test" is not in allowedHosts/);
    expect(upstream.hits()).toBe(1);
  }, 120_000);
});
