import { execFile, spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { parseDocument } from "yaml";
import { tempDir } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { startUpstream, type Upstream } from "../helpers/upstream.js";

/**
 * examples/egressgate.yaml, run by the real CLI (from source, so the test never runs a stale
 * build) and driven with each guest's own credentials. A test-only overlay keeps everything on
 * loopback: the example's hosts resolve to 127.0.0.1, which the guests may then reach, and the
 * test upstream's CA is trusted.
 */

const root = fileURLToPath(new URL("../../", import.meta.url));
const example = join(root, "examples", "egressgate.yaml");
const deploymentKey = "config-file-test-deployment-key-0123456789";
const secrets = { CI_NPM_TOKEN: "npm_real_value_for_ci_0001", AGENT_GH_TOKEN: "ghp_real_value_for_agent_0002" };
const listening = /egressgate listening on http:\/\/127\.0\.0\.1:(\d+)\n/;

function cleanEnv(extra: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { PATH: process.env["PATH"], HOME: process.env["HOME"], XDG_CONFIG_HOME: tempDir("egressgate-xdg-") };
  return { ...env, ...extra };
}

interface Cli {
  stdout(): string;
  stderr(): string;
  readonly exited: Promise<number | null>;
  stop(): Promise<void>;
}

/** Runs the built `egressgate ARGS` (test/global-setup.ts builds dist when the sources are newer); killed when the test ends. */
function startCli(args: readonly string[], env: NodeJS.ProcessEnv): Cli {
  const child = spawn(process.execPath, [join(root, "dist", "cli", "bin.js"), ...args], { cwd: root, env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => (out += chunk));
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => (err += chunk));
  const exited = new Promise<number | null>((resolve) => child.once("close", (code) => resolve(code)));
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM");
    await exited;
  };
  onTestFinished(stop);
  return { stdout: () => out, stderr: () => err, exited, stop };
}

async function waitForListening(cli: Cli): Promise<number> {
  for (let waited = 0; waited < 30_000; waited += 50) {
    const match = listening.exec(cli.stdout());
    if (match !== null) return Number(match[1]);
    if (await Promise.race([cli.exited.then(() => true), new Promise<false>((r) => setTimeout(() => r(false), 50))])) break;
  }
  throw new Error(`egressgate did not start\nstdout: ${cli.stdout()}\nstderr: ${cli.stderr()}`);
}

/** The example with the test's overlay, written next to nothing it refers to: its policy path made absolute. */
async function overlaidExample(dir: string): Promise<string> {
  const doc = parseDocument(readFileSync(example, "utf8"));
  const caFile = join(dir, "upstream-ca.pem");
  writeFileSync(caFile, (await testCa()).certPem);
  doc.set("upstreamCa", [caFile]);
  doc.set("resolve", Object.fromEntries(["registry.npmjs.org", "pypi.org", "api.github.com"].map((host) => [host, ["127.0.0.1"]])));
  for (const name of ["ci", "agent"]) {
    // The example's hosts resolve to loopback here, which the internal-range block would refuse.
    doc.setIn(["guests", name, "blockInternalRanges"], false);
    const script = doc.getIn(["guests", name, "hooksScript"]);
    if (typeof script === "string") doc.setIn(["guests", name, "hooksScript"], join(root, "examples", script));
  }
  const file = join(dir, "egressgate.yaml");
  writeFileSync(file, doc.toString());
  return file;
}

function readEnvFile(file: string): Record<string, string> {
  const lines = readFileSync(file, "utf8").trimEnd().split("\n");
  return Object.fromEntries(lines.map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]));
}

interface Curl {
  readonly code: number;
  readonly status: number;
  readonly body: string;
  readonly stderr: string;
}

/** curl through the proxy URL a guest was given, trusting the bundle it was given. */
function curlAs(guest: Record<string, string> | undefined, proxyUrl: string, caFile: string, url: string, extra: readonly string[] = []): Promise<Curl> {
  const args = ["-sS", "--max-time", "15", "--noproxy", "", "-x", guest?.["HTTPS_PROXY"] ?? proxyUrl, "--cacert", guest?.["CURL_CA_BUNDLE"] ?? caFile, "-w", "\n%{http_code}", ...extra, url];
  return new Promise((resolve) => {
    execFile("curl", args, { env: { PATH: process.env["PATH"] ?? "/usr/bin:/bin" }, timeout: 20_000 }, (error, stdout, stderr) => {
      const at = stdout.lastIndexOf("\n");
      resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : -1, status: Number(stdout.slice(at + 1)), body: stdout.slice(0, at), stderr });
    });
  });
}

function seenAuthorization(upstream: Upstream): Array<string | string[] | undefined> {
  return upstream.seen.map((s) => s.headers["authorization"]);
}

describe("examples/egressgate.yaml through the CLI", () => {
  it("each guest reaches only its own hosts with its own secrets, and a request without credentials gets 407", async () => {
    const dir = tempDir("egressgate-example-");
    const upstream = await startUpstream({ names: ["registry.npmjs.org", "api.github.com", "pypi.org"] });
    const file = await overlaidExample(dir);
    const envFile = join(dir, "guest.env");
    const cli = startCli(["--config", file, "--listen", "127.0.0.1:0", "--ca-dir", join(dir, "ca"), "--guest-env-file", envFile, "--log-level", "warn"], cleanEnv({ ...secrets, EGRESSGATE_PLACEHOLDER_KEY: deploymentKey }));
    const port = await waitForListening(cli);
    const bare = `http://127.0.0.1:${port}`;
    const caFile = join(dir, "ca", "ca.crt");
    const ci = readEnvFile(`${envFile}.ci`);
    const agent = readEnvFile(`${envFile}.agent`);
    expect(ci["HTTPS_PROXY"]).toMatch(new RegExp(`^http://ci:[0-9a-f]{64}@127\\.0\\.0\\.1:${port}$`));
    expect(agent["HTTPS_PROXY"]).toMatch(new RegExp(`^http://agent:[0-9a-f]{64}@127\\.0\\.0\\.1:${port}$`));
    // Each file holds only its own guest's placeholders.
    expect(ci["NPM_TOKEN"]).toMatch(/^EGRESSGATE_SECRET_[0-9a-f]{48}$/);
    expect(ci["GH_TOKEN"]).toBeUndefined();
    expect(agent["GH_TOKEN"]).toMatch(/^EGRESSGATE_SECRET_[0-9a-f]{48}$/);
    expect(agent["NPM_TOKEN"]).toBeUndefined();
    const npm = `https://registry.npmjs.org:${upstream.port}/echo`;
    const github = `https://api.github.com:${upstream.port}/echo`;

    const ciToNpm = await curlAs(ci, bare, caFile, npm, ["-H", `authorization: Bearer ${ci["NPM_TOKEN"]}`]);
    expect([ciToNpm.code, ciToNpm.status, ciToNpm.stderr]).toEqual([0, 200, ""]);
    expect(seenAuthorization(upstream)).toEqual([`Bearer ${secrets.CI_NPM_TOKEN}`]);

    const agentToGithub = await curlAs(agent, bare, caFile, github, ["-H", `authorization: token ${agent["GH_TOKEN"]}`]);
    expect([agentToGithub.code, agentToGithub.status]).toEqual([0, 200]);
    expect(seenAuthorization(upstream)).toEqual([`Bearer ${secrets.CI_NPM_TOKEN}`, `token ${secrets.AGENT_GH_TOKEN}`]);

    // The agent's tier-2 policy (github-readonly) refuses writes even to its allowed host.
    const agentPost = await curlAs(agent, bare, caFile, github, ["-X", "POST", "-d", "x"]);
    expect(agentPost.status).toBe(403);
    expect(agentPost.body).toMatch(/github-readonly: POST is refused/);

    // Neither guest reaches the other's hosts: CONNECT gets 403, which curl reports as exit 56.
    const ciToGithub = await curlAs(ci, bare, caFile, github);
    expect([ciToGithub.code, ciToGithub.stderr]).toEqual([56, expect.stringMatching(/CONNECT.*403/)]);
    const agentToNpm = await curlAs(agent, bare, caFile, npm);
    expect([agentToNpm.code, agentToNpm.stderr]).toEqual([56, expect.stringMatching(/CONNECT.*403/)]);

    // No credentials: 407, even for a host some guest may reach.
    const anonymous = await curlAs(undefined, bare, caFile, npm);
    expect([anonymous.code, anonymous.stderr]).toEqual([56, expect.stringMatching(/CONNECT.*407/)]);
    // Only the two allowed requests reached the upstream: not the refused POST, nor any refused CONNECT.
    expect(upstream.seen.map((r) => r.method)).toEqual(["GET", "GET"]);
  });

  // YAML's core schema reads 0012 as the number 12: the guest was served as "12", check-config
  // showed "12" with exit 0, and the credentials `egressgate env --guest 0012` printed got 407.
  it("guests named as YAML would read numbers (0012, 007, 1.0, true) and a quoted one keep their names: check-config, the env files and env --guest agree, and each guest's credentials pass", async () => {
    const dir = tempDir("egressgate-names-");
    const upstream = await startUpstream({ names: ["a.test"], tls: false });
    const names = ["0012", "007", "1.0", "true", "0013"];
    const file = join(dir, "names.yaml");
    const listed = names.map((name) => `  ${name === "0013" ? '"0013"' : name}:\n    allowInternalHosts: [a.test]\n    secrets: { T: { hosts: [a.test], value: env:T } }\n`).join("");
    writeFileSync(file, `resolve: { a.test: [127.0.0.1] }\nguests:\n${listed}`);
    const env = cleanEnv({ T: "the-real-value-0123456789", EGRESSGATE_PLACEHOLDER_KEY: deploymentKey });
    const check = startCli(["check-config", file], env);
    expect(await check.exited).toBe(0);
    // As YAML that reads back the same: quoted where a plain key would be read as a number or a boolean.
    for (const name of names) expect(check.stdout()).toContain(`\n  "${name}":\n`);
    expect(check.stdout()).not.toMatch(/\n {2}"?(12|7|1|13)"?:\n/);
    const envFile = join(dir, "guest.env");
    const cli = startCli(["--config", file, "--listen", "127.0.0.1:0", "--ca-dir", join(dir, "ca"), "--guest-env-file", envFile, "--log-level", "warn"], env);
    const port = await waitForListening(cli);
    // `env --guest` for two of them (each is a process of its own): the credentials it prints are the served guest's.
    for (const name of ["0012", "1.0"]) {
      const printed = startCli(["env", "--guest", name, "--listen", `127.0.0.1:${port}`, "--ca-dir", join(dir, "ca")], env);
      expect(await printed.exited).toBe(0);
      expect(printed.stdout()).toContain(`export HTTPS_PROXY='${readEnvFile(`${envFile}.${name}`)["HTTPS_PROXY"]}'`);
    }
    for (const name of names) {
      const written = readEnvFile(`${envFile}.${name}`);
      const proxyUrl = new URL(written["HTTPS_PROXY"]!);
      expect(decodeURIComponent(proxyUrl.username)).toBe(name);
      expect(written["T"]).toMatch(/^EGRESSGATE_SECRET_[0-9a-f]{48}$/);
      const answer = await curlAs(written, "", join(dir, "ca", "ca.crt"), `http://a.test:${upstream.port}/echo`);
      expect([name, answer.status, answer.body]).toEqual([name, 200, expect.any(String)]);
    }
    expect(upstream.seen).toHaveLength(names.length);
  }, 120_000);

  it("check-config prints both guests with their hosts and secret sources, and never a value", async () => {
    const cli = startCli(["check-config", example], cleanEnv(secrets));
    expect(await cli.exited).toBe(0);
    const out = cli.stdout();
    expect(out).toMatch(/guests:\n {2}ci:\n/);
    expect(out).toMatch(/\n {2}agent:\n/);
    expect(out).toContain("(redacted; from env:CI_NPM_TOKEN)");
    expect(out).toContain(join(root, "policies", "github-readonly.ts"));
    for (const value of Object.values(secrets)) expect(out + cli.stderr()).not.toContain(value);
  });

  it("check-config exits 2 naming the file, line and path of every problem, before loading anything", async () => {
    const file = join(tempDir("egressgate-bad-config-"), "bad.yaml");
    writeFileSync(file, "guests:\n  ci:\n    allowHost: [a.test]\n    secrets: { T: { hosts: [a.test], value: literal-secret-text } }\n");
    const cli = startCli(["check-config", file], cleanEnv({}));
    expect(await cli.exited).toBe(2);
    expect(cli.stderr()).toContain(`${file}:3: unknown option "guests.ci.allowHost"; did you mean "allowHosts"?`);
    expect(cli.stderr()).toContain(`${file}:4: guests.ci.secrets.T.value must be "env:VAR" or "file:PATH"`);
    expect(cli.stderr()).not.toContain("literal-secret-text");
    expect(cli.stdout()).toBe("");
  });

  // JSON is read as YAML, and a repeated key was refused, but as "not valid YAML: Map keys must
  // be unique" on line 1 of a one-line file: neither the key nor where it was (carried from an
  // earlier session).
  it("a key given twice in a JSON file: check-config, a start and check each exit 2 naming its path and both columns", async () => {
    const dir = tempDir("egressgate-bad-config-");
    const file = join(dir, "egressgate.json");
    const text = '{"listen":"127.0.0.1:0","guests":{"ci":{"allowHosts":["a.test"],"allowHosts":["b.test"]}}}';
    writeFileSync(file, `${text}\n`);
    const named = `${file}:1: guests.ci.allowHosts is given twice in one mapping (first at line 1, column ${text.indexOf('"allowHosts"') + 1}; this one at column ${text.lastIndexOf('"allowHosts"') + 1})`;
    for (const args of [["check-config", file], ["--config", file, "--ca-dir", join(dir, "ca")], ["check", "GET", "https://b.test/", "--config", file, "--ca-dir", join(dir, "ca")]]) {
      const cli = startCli(args, cleanEnv({}));
      expect(await cli.exited, args[0]).toBe(2);
      expect(cli.stderr()).toContain(named);
      expect(cli.stdout()).not.toContain("listening");
    }
  });

  // check-config said 0 for files that start refused with exit 2: the listen address taken
  // twice, and a recording with several workers (a hunt); and the workers' refusal named
  // `--workers` and "Run egressgate --help" for a key of the file.
  it.each([
    ["metricsListen on the listen address", "listen: 127.0.0.1:18999\nmetricsListen: 127.0.0.1:18999\n", /bad\.yaml: metricsListen is 127\.0\.0\.1:18999, the proxy's own listen address \(127\.0\.0\.1:18999\): the metrics listener needs a port of its own/],
    ["metricsListen on the port of a wildcard listen", "listen: 0.0.0.0:18998\nauth: false\nmetricsListen: 127.0.0.1:18998\n", /metricsListen is 127\.0\.0\.1:18998, the proxy's own listen address \(0\.0\.0\.0:18998\)/],
    ["workers: 2 with a recording", "listen: 127.0.0.1:0\nworkers: 2\nupstream:\n  record: { path: DIR/run.har }\n", /bad\.yaml: workers is 2 with a recording \(upstream\.record or upstream\.replay\.recordMissing\): a recording has one writer; record with workers: 1/],
  ])("%s: check-config exits 2, and so does a start, with the same words and no --help hint", async (_what, text, message) => {
    const dir = tempDir("egressgate-bad-config-");
    const file = join(dir, "bad.yaml");
    writeFileSync(file, text.replace("DIR", dir));
    const check = startCli(["check-config", file], cleanEnv({}));
    expect(await check.exited).toBe(2);
    expect(check.stderr()).toMatch(message);
    const start = startCli(["--config", file, "--ca-dir", join(dir, "ca")], cleanEnv({}));
    expect(await start.exited).toBe(2);
    expect(start.stderr()).toMatch(message);
    expect(start.stderr()).not.toContain("--help");
  });

  it("with --workers 2, both workers load the file and accept the same guest token", async () => {
    const dir = tempDir("egressgate-example-");
    const upstream = await startUpstream({ names: ["registry.npmjs.org"] });
    const file = await overlaidExample(dir);
    const envFile = join(dir, "guest.env");
    const cli = startCli(
      ["--config", file, "--workers", "2", "--listen", "127.0.0.1:0", "--ca-dir", join(dir, "ca"), "--guest-env-file", envFile, "--log-level", "info"],
      cleanEnv({ ...secrets, EGRESSGATE_PLACEHOLDER_KEY: deploymentKey }),
    );
    const port = await waitForListening(cli);
    const ci = readEnvFile(`${envFile}.ci`);
    // Each curl is a new connection; the cluster hands them round-robin to the two workers.
    const results = await Promise.all(
      Array.from({ length: 6 }, () => curlAs(ci, `http://127.0.0.1:${port}`, join(dir, "ca", "ca.crt"), `https://registry.npmjs.org:${upstream.port}/echo`)),
    );
    expect(results.map((r) => r.status)).toEqual([200, 200, 200, 200, 200, 200]);
    const workers = new Set([...cli.stderr().matchAll(/"worker":(\d+)/g)].map((m) => m[1]));
    expect(workers.size).toBe(2);
    // A primary and two workers, each loading the file's policies (through tsx, before the tests
    // ran the built CLI): 13 s on a machine at load 8, past 30 s at load 16.
  }, 60_000);
});
