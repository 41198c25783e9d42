import { execFile, execFileSync, spawn, type ChildProcessByStdio } from "node:child_process";
import { generateKeyPairSync } from "node:crypto";
import { closeSync, existsSync, openSync, readFileSync, renameSync, statSync, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import { connect, createServer } from "node:net";
import { join, relative } from "node:path";
import type { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import { ProxyAgent, request } from "undici";
import { beforeAll, describe, expect, it, onTestFinished } from "vitest";
import { startTestProxy, tempDir } from "../helpers/proxy.js";
import { chainFlags, optionFlags } from "../../src/config/flags.js";
import { configFileSchema, schemaPaths } from "../../src/config/schema.js";
import { testCa } from "../helpers/test-ca.js";
import { startUpstream } from "../helpers/upstream.js";
import { childPids } from "../helpers/processes.js";

const root = fileURLToPath(new URL("../../", import.meta.url));
const bin = join(root, "dist", "cli", "bin.js");
const listeningLine = /^egressgate listening on http:\/\/127\.0\.0\.1:(\d+)\n$/;

interface Exit {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
}

interface Cli {
  readonly process: ChildProcessByStdio<null, Readable, Readable>;
  stdout(): string;
  stderr(): string;
  /** Settles once the process has exited and its output is read. */
  readonly exited: Promise<Exit>;
  /** Resolves with the first match in stdout; rejects if the process exits or time runs out first. */
  waitForStdout(pattern: RegExp, ms?: number): Promise<RegExpExecArray>;
}

/** The host's environment without its proxy variables, which would otherwise steer curl. */
function withoutProxyEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const name of ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy", "NO_PROXY", "no_proxy"]) {
    delete env[name];
  }
  return env;
}

/** For the CLI: also a default caDir that is never the user's own. */
function cliEnv(): NodeJS.ProcessEnv {
  return { ...withoutProxyEnv(), XDG_CONFIG_HOME: tempDir("egressgate-xdg-") };
}

/** Spawns the built CLI; it is killed (after at most `limitMs`, or when the test ends) and awaited. */
function startCli(args: readonly string[], limitMs = 90_000, extraEnv: NodeJS.ProcessEnv = {}): Cli {
  const child = spawn(process.execPath, [bin, ...args], { cwd: root, env: { ...cliEnv(), ...extraEnv }, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => (out += chunk));
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => (err += chunk));
  const exited = new Promise<Exit>((resolve) => child.once("close", (code, signal) => resolve({ code, signal })));
  const limit = setTimeout(() => child.kill("SIGKILL"), limitMs);
  void exited.then(() => clearTimeout(limit));
  onTestFinished(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
  });
  return {
    process: child,
    stdout: () => out,
    stderr: () => err,
    exited,
    // A deadline against a hang, not a timing check: the line ends the wait as soon as it comes,
    // and two workers starting on a machine whose cores are busy took more than 15 s in CI.
    waitForStdout(pattern, ms = 60_000) {
      return new Promise((resolve, reject) => {
        const check = (): boolean => {
          const match = pattern.exec(out);
          if (match === null) return false;
          cleanup();
          resolve(match);
          return true;
        };
        const onExit = (): void => {
          if (check()) return;
          cleanup();
          reject(new Error(`egressgate exited before printing ${pattern}\nstdout: ${out}\nstderr: ${err}`));
        };
        const timer = setTimeout(() => {
          cleanup();
          reject(new Error(`no ${pattern} on stdout within ${ms} ms\nstdout: ${out}\nstderr: ${err}`));
        }, ms);
        const onData = (): void => void check();
        const cleanup = (): void => {
          clearTimeout(timer);
          child.stdout.off("data", onData);
          child.off("close", onExit);
        };
        child.stdout.on("data", onData);
        child.once("close", onExit);
        check();
      });
    },
  };
}

/** Runs the CLI to completion. */
async function runCli(args: readonly string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const cli = startCli(args);
  const { code } = await cli.exited;
  return { code, stdout: cli.stdout(), stderr: cli.stderr() };
}

/** Starts the proxy and returns its port once the listening line is out. */
async function serve(args: readonly string[], extraEnv: NodeJS.ProcessEnv = {}): Promise<{ cli: Cli; port: number; url: string }> {
  const logLevel = args.includes("--log-level") ? [] : ["--log-level", "warn"];
  const cli = startCli(["--listen", "127.0.0.1:0", ...logLevel, ...args], 90_000, extraEnv);
  const match = await cli.waitForStdout(listeningLine);
  const port = Number(match[1]);
  return { cli, port, url: `http://127.0.0.1:${port}` };
}

/** The test upstream CA, as a file for --upstream-ca. */
/** The JSON lines on `stderr` whose `msg` is `msg`. */
function linesOf(stderr: string, msg: string): Record<string, unknown>[] {
  return stderr
    .split("\n")
    .filter((line) => line.startsWith("{"))
    .map((line) => JSON.parse(line) as Record<string, unknown>)
    .filter((line) => line["msg"] === msg);
}

/** Every line of `stderr` is one JSON object (`--log-format json`, the default off a terminal). */
function expectAllJson(stderr: string): void {
  for (const line of stderr.split("\n").filter((l) => l !== "")) expect(() => JSON.parse(line) as unknown, line).not.toThrow();
}

async function upstreamCaFile(dir: string): Promise<string> {
  const file = join(dir, "upstream-ca.pem");
  writeFileSync(file, (await testCa()).certPem);
  return file;
}

function curl(args: readonly string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile("curl", ["--max-time", "15", ...args], { env: withoutProxyEnv(), timeout: 20_000 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof error.code === "number" ? error.code : -1;
      resolve({ code, stdout, stderr });
    });
  });
}

function proxyAgent(url: string, caDir: string): ProxyAgent {
  const agent = new ProxyAgent({ uri: url, requestTls: { ca: readFileSync(join(caDir, "ca.crt"), "utf8") } });
  onTestFinished(() => agent.close());
  return agent;
}

beforeAll(() => {
  // `npm ci` builds through `prepare`; a fresh checkout run straight from vitest may not have.
  if (!existsSync(bin)) execFileSync("npm", ["run", "build"], { cwd: root, stdio: "inherit", timeout: 170_000 });
}, 180_000);

describe("egressgate serve", () => {
  it("prints exactly one listening line, and curl and undici fetch an allowed host through it", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const upstream = await startUpstream();
    const { cli, url } = await serve([
      "--ca-dir",
      caDir,
      "--allow-internal-host",
      "api.test",
      "--resolve",
      "api.test=127.0.0.1",
      "--upstream-ca",
      await upstreamCaFile(dir),
    ]);

    const viaCurl = await curl(["-sS", "-x", url, "--cacert", join(caDir, "ca.crt"), `https://api.test:${upstream.port}/echo?from=curl`]);
    expect(viaCurl.stderr).toBe("");
    expect(viaCurl.code).toBe(0);
    expect(JSON.parse(viaCurl.stdout)).toMatchObject({ method: "GET", path: "/echo?from=curl" });

    const res = await request(`https://api.test:${upstream.port}/echo?from=undici`, { dispatcher: proxyAgent(url, caDir) });
    expect(res.statusCode).toBe(200);
    expect(await res.body.json()).toMatchObject({ method: "GET", path: "/echo?from=undici" });
    expect(upstream.hits()).toBe(2);

    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
    expect(cli.stdout()).toMatch(listeningLine);
  });

  it("a reader of its log that goes away (`2>&1 | head -c1`) does not end the proxy: it keeps serving", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const upstream = await startUpstream();
    const { cli, url } = await serve(["--log-level", "info", "--ca-dir", caDir, "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--upstream-ca", await upstreamCaFile(dir)]);
    // The log's reader is gone: every line written from now on meets EPIPE.
    cli.process.stderr.destroy();
    for (const n of [1, 2, 3]) {
      const res = await curl(["-sS", "-x", url, "--cacert", join(caDir, "ca.crt"), `https://api.test:${upstream.port}/echo?n=${n}`]);
      expect(res.code, res.stderr).toBe(0);
      expect(JSON.parse(res.stdout)).toMatchObject({ path: `/echo?n=${n}` });
    }
    expect(cli.process.exitCode).toBe(null);
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });

  it("a host that is not allowed gets 403, through CONNECT and as plain HTTP, and never reaches the upstream", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const upstream = await startUpstream({ names: ["other.test"] });
    const plain = await startUpstream({ tls: false });
    const { url } = await serve([
      "--ca-dir",
      caDir,
      "--allow-internal-host",
      "api.test",
      "--resolve",
      "api.test=127.0.0.1",
      "--resolve",
      "other.test=127.0.0.1",
      "--upstream-ca",
      await upstreamCaFile(dir),
    ]);

    const tunnelled = await curl(["-sS", "-x", url, "--cacert", join(caDir, "ca.crt"), `https://other.test:${upstream.port}/echo`]);
    expect(tunnelled.code).toBe(56);
    expect(tunnelled.stderr).toMatch(/CONNECT.*403/);

    const direct = await curl(["-sS", "-x", url, "-w", "\n%{http_code}", `http://other.test:${plain.port}/echo`]);
    expect(direct.code).toBe(0);
    const lines = direct.stdout.trimEnd().split("\n");
    expect(lines.at(-1)).toBe("403");
    expect(lines.slice(0, -1).join("\n")).toMatch(/other\.test/);

    await expect(request(`https://other.test:${upstream.port}/echo`, { dispatcher: proxyAgent(url, caDir) })).rejects.toThrow(/403/);
    expect(upstream.hits()).toBe(0);
    expect(plain.hits()).toBe(0);
  });

  it("--guest-env-file writes KEY=value lines with the real port", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const envFile = join(dir, "guest.env");
    const { url } = await serve(["--ca-dir", caDir, "--guest-env-file", envFile]);
    const lines = readFileSync(envFile, "utf8").trimEnd().split("\n");
    for (const line of lines) expect(line).toMatch(/^[A-Za-z_][A-Za-z0-9_]*=/);
    const env = Object.fromEntries(lines.map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]));
    for (const name of ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"]) expect(env[name]).toBe(url);
    expect(env["NODE_EXTRA_CA_CERTS"]).toBe(join(caDir, "ca.crt"));
    const caPem = readFileSync(join(caDir, "ca.crt"), "utf8");
    for (const name of ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"]) {
      expect(readFileSync(env[name] ?? "", "utf8")).toContain(caPem.trim());
    }
  });

  // Written as it was, a line break in the CA folder's path started variables of its own.
  it("a value with a line break is refused, not written: it would inject lines into the file", async () => {
    const dir = tempDir();
    const envFile = join(dir, "guest.env");
    const caDir = join(dir, "ca\nHTTPS_PROXY=http://elsewhere.test:1");
    await expect(startTestProxy({ allowedHosts: [] }, { caDir, guestEnvFile: envFile })).rejects.toThrow(
      /guestEnvFile cannot write .*guest\.env \(the value of SSL_CERT_FILE holds a line break or NUL, which a KEY=value line cannot carry\)/,
    );
    expect(existsSync(envFile)).toBe(false);
  });
});

describe("egressgate --host-secret", () => {
  it("gives the guest a placeholder, substitutes the value from the environment for its host, and never logs it", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const envFile = join(dir, "guest.env");
    const upstream = await startUpstream();
    const value = "tok-from-env=@value";
    const cli = startCli(
      [
        "--listen", "127.0.0.1:0",
        "--ca-dir", caDir,
        "--allow-internal-host", "api.test",
        "--resolve", "api.test=127.0.0.1",
        "--upstream-ca", await upstreamCaFile(dir),
        "--host-secret", "GH_TOKEN@api.test",
        "--guest-env-file", envFile,
        "--log-level", "debug",
      ],
      20_000,
      { GH_TOKEN: value },
    );
    const url = `http://127.0.0.1:${(await cli.waitForStdout(listeningLine))[1]!}`;
    const guestEnv = readFileSync(envFile, "utf8");
    const placeholder = /^GH_TOKEN=(EGRESSGATE_SECRET_[0-9a-f]{48})$/m.exec(guestEnv)?.[1];
    expect(placeholder).toMatch(/^EGRESSGATE_SECRET_[0-9a-f]{48}$/);
    expect(guestEnv).not.toContain(value);
    const res = await curl([
      "-sS", "-x", url, "--cacert", join(caDir, "ca.crt"),
      "-H", `Authorization: Bearer ${placeholder!}`,
      `https://api.test:${upstream.port}/echo`,
    ]);
    expect(JSON.parse(res.stdout)).toMatchObject({ headers: { authorization: `Bearer ${value}` } });
    // The decision line is written once the response has finished, which may trail curl's exit.
    for (let i = 0; i < 40 && !cli.stderr().includes('"msg":"request"'); i++) await new Promise((r) => setTimeout(r, 50));
    expect(cli.stderr()).toMatch(/"msg":"request"/);
    expect(cli.stderr()).not.toContain(value);
  });

  it("a --host-secret without a value and without its environment variable exits 2 naming the variable", async () => {
    const { code, stderr } = await runCli(["--listen", "127.0.0.1:0", "--host-secret", "MISSING_TOKEN@api.test"]);
    expect(code).toBe(2);
    expect(stderr).toMatch(/environment variable MISSING_TOKEN is not set/);
  });

  it("a --host-secret value with a control character (ESC inline, DEL from its variable) exits 2 naming the secret, never quoting the value", async () => {
    const inline = await runCli(["--listen", "127.0.0.1:0", "--allow-host", "api.test", "--host-secret", "GH_TOKEN@api.test=s3cr3t\x1bvalue"]);
    expect(inline.code).toBe(2);
    expect(inline.stderr).toMatch(/--host-secret GH_TOKEN: holds a control character other than tab \(ESC, DEL, U\+0001 to U\+001F\) \(from inline\); a header field cannot carry one/);
    expect(inline.stderr).not.toContain("s3cr3t");
    const cli = startCli(["--listen", "127.0.0.1:0", "--allow-host", "api.test", "--host-secret", "DEL_TOKEN@api.test"], 20_000, { DEL_TOKEN: "s3cr3t\x7fvalue" });
    const { code } = await cli.exited;
    expect(code).toBe(2);
    expect(cli.stderr()).toMatch(/--host-secret DEL_TOKEN: holds a control character other than tab .* \(from env:DEL_TOKEN\)/);
    expect(cli.stderr()).not.toContain("s3cr3t");
  });

  it("a --host-secret whose host list ends with an empty host exits 2 naming it, never quoting the value", async () => {
    const { code, stderr } = await runCli(["--listen", "127.0.0.1:0", "--host-secret", "GH_TOKEN@api.test,=s3cr3t-value"]);
    expect(code).toBe(2);
    expect(stderr).toMatch(/--host-secret GH_TOKEN: host 2 of 2 is empty \(got "api\.test,"\)/);
    expect(stderr).not.toContain("s3cr3t-value");
  });
});

describe("egressgate shutdown", () => {
  it.each(["SIGTERM", "SIGINT"] as const)("%s closes the proxy and exits 0, even with a guest's keep-alive tunnel open", async (signal) => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const upstream = await startUpstream();
    const { cli, url, port } = await serve([
      "--log-level",
      "info",
      "--ca-dir",
      caDir,
      "--allow-internal-host",
      "api.test",
      "--resolve",
      "api.test=127.0.0.1",
      "--upstream-ca",
      await upstreamCaFile(dir),
    ]);
    const res = await request(`https://api.test:${upstream.port}/echo`, { dispatcher: proxyAgent(url, caDir) });
    expect(res.statusCode).toBe(200);
    await res.body.text();

    const started = Date.now();
    cli.process.kill(signal);
    expect(await cli.exited).toEqual({ code: 0, signal: null });
    // Nothing was in flight, so there is nothing to drain for.
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(linesOf(cli.stderr(), "closing")).toEqual([expect.objectContaining({ level: "info", signal })]);
    expectAllJson(cli.stderr());
    expect(cli.stdout()).toBe(`egressgate listening on http://127.0.0.1:${port}\n`);
  });
});

/** Whether a process is still running (a zombie is not). */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] !== "Z";
  } catch {
    return false;
  }
}

async function until(check: () => boolean, ms: number, what: string): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

// SIGTERM or Ctrl-C while the start waited for a FIFO's reader ended the process by the signal's
// default action (killed, no word after the "waits for one to open it" warning): seventeenth
// session's probes. Now it says so and exits 0, as a signal while serving does.
describe("a signal while the start waits for the guest environment FIFO's reader", () => {
  it.each(["SIGTERM", "SIGINT"] as const)("%s: a line saying so, exit 0", async (signal) => {
    const dir = tempDir();
    const fifo = join(dir, "guest.fifo");
    execFileSync("mkfifo", [fifo]);
    const cli = startCli(["--listen", "127.0.0.1:0", "--log-level", "info", "--log-format", "json", "--ca-dir", join(dir, "ca"), "--guest-env-file", fifo]);
    // Logged once the start is held on the FIFO, listening already and not yet serving.
    await until(() => cli.stderr().includes("the guest environment file is a FIFO with no reader"), 60_000, "the FIFO's warning");
    cli.process.kill(signal);
    expect(await cli.exited).toEqual({ code: 0, signal: null });
    expect(linesOf(cli.stderr(), "a signal came while the proxy was starting: stopping before it serves")).toEqual([expect.objectContaining({ level: "info", signal })]);
    expect(cli.stdout()).toBe("");
  });
});

// Each starts a primary and two whole proxies: minutes are a hang guard on a loaded machine.
describe("a SIGHUP while the proxy starts", () => {
  it("does not end it: once serving, it reloads", async () => {
    const dir = tempDir();
    const auditLog = join(dir, "audit.fifo");
    execFileSync("mkfifo", [auditLog]);
    const cli = startCli(["--listen", "127.0.0.1:0", "--log-level", "info", "--log-format", "json", "--ca-dir", join(dir, "ca"), "--audit-log", auditLog]);
    // Opening a FIFO to read waits for its writer: the open returns once the CLI opens its audit
    // log, inside startProxy, started and not serving. A SIGHUP there ended it (exit 129) before
    // it had a handler. (A FIFO is a log shipper's usual target; only files read are refused.)
    const reader = await open(auditLog, "r");
    cli.process.kill("SIGHUP");
    await cli.waitForStdout(listeningLine);
    await until(() => cli.stderr().includes('"msg":"configuration reloaded"'), 30_000, "the reload");
    expect(cli.stderr()).toContain("a SIGHUP came while the proxy started: reloading now");
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
    await reader.close();
  });
});

describe("a SIGHUP while --workers workers start", { timeout: 180_000 }, () => {
  // The primary passed it on to workers still starting; one still loading (no handler yet) died
  // of it, "a worker exited while starting (SIGHUP)", and the whole cluster stopped.
  it("reaches each worker once it serves: none exits, and each reloads once", async () => {
    const dir = tempDir();
    const auditLog = join(dir, "audit.fifo");
    execFileSync("mkfifo", [auditLog]);
    const cli = startCli(["--workers", "2", "--listen", "127.0.0.1:0", "--log-level", "info", "--log-format", "json", "--ca-dir", join(dir, "ca"), "--audit-log", auditLog]);
    // Returns once a worker opens its audit log: inside startProxy, started and not serving.
    const reader = await open(auditLog, "r");
    const workers = childPids(cli.process.pid!);
    cli.process.kill("SIGHUP");
    await cli.waitForStdout(listeningLine);
    await until(() => linesOf(cli.stderr(), "configuration reloaded").length === 2, 60_000, "both workers' reloads");
    expect(linesOf(cli.stderr(), "configuration reloaded").map((line) => line["worker"]).sort()).toEqual(childPids(cli.process.pid!).sort());
    // Sent once each served: not taken as one that came while it started.
    expect(cli.stderr()).not.toContain("a SIGHUP came while the proxy started");
    expect(cli.stderr()).not.toMatch(/worker exited|could not start/);
    for (const pid of workers) expect(running(pid)).toBe(true);
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
    await reader.close();
  });
});

describe("--workers with --listen HOST:0 when the port the primary picked is taken", { timeout: 180_000 }, () => {
  // The primary picks a free port, releases it and hands it to the workers, which bind it once
  // they have started (seconds, on busy cores). Another process took it in between in a CI run
  // ("bind EADDRINUSE"), and the whole start failed: "the workers could not start".
  it("picks another port and starts there; the taken one is left to its holder", async () => {
    const dir = tempDir();
    const auditLog = join(dir, "audit.fifo");
    execFileSync("mkfifo", [auditLog]);
    const upstream = await startUpstream();
    const cli = startCli([
      "--workers", "2", "--listen", "127.0.0.1:0", "--log-level", "debug", "--log-format", "json", "--ca-dir", join(dir, "ca"), "--audit-log", auditLog,
      "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--upstream-ca", await upstreamCaFile(dir),
    ]);
    // The primary names the port before it forks; the workers cannot bind it before they open
    // their audit log, which waits for this test to open the FIFO: the port is taken first.
    await until(() => linesOf(cli.stderr(), "workers to listen on a port picked free").length === 1, 60_000, "the picked port");
    const picked = linesOf(cli.stderr(), "workers to listen on a port picked free")[0]!["port"] as number;
    const holder = createServer();
    await new Promise<void>((resolve, reject) => holder.once("error", reject).listen(picked, "127.0.0.1", resolve));
    onTestFinished(() => new Promise<void>((resolve) => holder.close(() => resolve())));
    const reader = await open(auditLog, "r");
    // Kept open and not read: the workers that die leave it a reader for the next ones, and the
    // few records written here fit in the pipe's buffer.
    onTestFinished(() => reader.close());

    const match = await cli.waitForStdout(listeningLine);
    const port = Number(match[1]);
    expect(port).not.toBe(picked);
    expect(linesOf(cli.stderr(), "the port picked for the workers was taken before they bound it; picking another")).toEqual([
      expect.objectContaining({ level: "warn", port: picked, pick: 1 }),
    ]);
    expect(linesOf(cli.stderr(), "workers to listen on a port picked free").map((line) => line["port"])).toEqual([picked, port]);
    expect(linesOf(cli.stderr(), "the workers could not start")).toEqual([]);
    // Both workers of the second start serve there; the first start's are gone.
    const workers = childPids(cli.process.pid!);
    expect(workers).toHaveLength(2);
    const result = await curl(["-sS", "-x", `http://127.0.0.1:${port}`, "--cacert", join(dir, "ca", "ca.crt"), `https://api.test:${upstream.port}/echo?n=1`]);
    expect(result.stderr).toBe("");
    expect(JSON.parse(result.stdout)).toMatchObject({ path: "/echo?n=1" });
    // The holder's port is its own: a connection there reaches it, not the proxy.
    const accepted = new Promise<void>((resolve) => holder.once("connection", (socket) => (socket.destroy(), resolve())));
    const probe = connect(picked, "127.0.0.1");
    probe.on("error", () => undefined);
    await accepted;
    probe.destroy();

    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
    for (const pid of workers) await until(() => !running(pid), 5_000, `worker ${pid} to exit`);
  });
});

describe("a SIGHUP to --workers with a metrics listener and a guest env file", { timeout: 180_000 }, () => {
  // Each worker ran without the file's metricsListen (the primary serves it), the later ones
  // without its guestEnvFile; a reload compared the file's own with those, and every worker
  // warned on every SIGHUP that settings nobody changed needed a restart.
  it("reloads every worker without a warning about settings nobody changed", async () => {
    const dir = tempDir();
    const { cli } = await serve(["--workers", "2", "--log-level", "info", "--ca-dir", join(dir, "ca"), "--metrics-listen", "127.0.0.1:0", "--guest-env-file", join(dir, "guest.env")]);
    cli.process.kill("SIGHUP");
    await until(() => linesOf(cli.stderr(), "configuration reloaded").length === 2, 60_000, "both workers' reloads");
    expect(cli.stderr()).not.toContain("these settings apply only at a restart");
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });
});

describe("egressgate --workers", { timeout: 180_000 }, () => {
  it("two worker processes serve one port with the same secret placeholders; a killed worker is replaced; SIGTERM stops them all", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const envFile = join(dir, "guest.env");
    const upstream = await startUpstream();
    const value = "tok-for-workers";
    const { cli, url } = await serve(
      [
        "--workers", "2",
        "--log-level", "info",
        "--ca-dir", caDir,
        "--guest-env-file", envFile,
        "--host-secret", "GH_TOKEN@api.test",
        "--allow-internal-host", "api.test",
        "--resolve", "api.test=127.0.0.1",
        "--upstream-ca", await upstreamCaFile(dir),
      ],
      { GH_TOKEN: value },
    );
    const primary = cli.process.pid!;
    const workers = childPids(primary);
    expect(workers).toHaveLength(2);
    // The first worker wrote the guest environment, with the port they share.
    const guestEnv = readFileSync(envFile, "utf8");
    expect(guestEnv).toContain(`HTTPS_PROXY=${url}\n`);
    const placeholder = /^GH_TOKEN=(EGRESSGATE_SECRET_[0-9a-f]{48})$/m.exec(guestEnv)?.[1];
    expect(placeholder).toMatch(/^EGRESSGATE_SECRET_[0-9a-f]{48}$/);
    const envWritten = statSync(envFile).mtimeMs;

    // A new connection per request (curl), which the primary hands to the workers in turn: each
    // one must know the placeholder the first one wrote.
    const fetchOnce = async (tag: string): Promise<void> => {
      const result = await curl([
        "-sS", "-x", url, "--cacert", join(caDir, "ca.crt"),
        "-H", `Authorization: Bearer ${placeholder!}`,
        `https://api.test:${upstream.port}/echo?n=${tag}`,
      ]);
      expect(result.stderr).toBe("");
      expect(JSON.parse(result.stdout)).toMatchObject({ path: `/echo?n=${tag}`, headers: { authorization: `Bearer ${value}` } });
    };
    for (let i = 0; i < 4; i++) await fetchOnce(`a${i}`);
    const servedBy = (): Set<number> => {
      const lines = cli.stderr().split("\n").filter((line) => line.includes('"msg":"request"'));
      return new Set(lines.map((line) => (JSON.parse(line) as { worker: number }).worker));
    };
    await until(() => servedBy().size === 2, 5_000, "request lines from both workers");
    expect([...servedBy()].sort()).toEqual([...workers].sort());

    // A worker that dies is replaced, and the port goes on answering meanwhile.
    process.kill(workers[0]!, "SIGKILL");
    await until(() => linesOf(cli.stderr(), "worker replaced").some((line) => line["replaces"] === workers[0]), 15_000, "a replacement worker");
    expect(linesOf(cli.stderr(), "worker exited; starting another")).toEqual([expect.objectContaining({ level: "warn", worker: workers[0], exit: "SIGKILL" })]);
    const replaced = childPids(primary);
    expect(replaced).toHaveLength(2);
    expect(replaced).not.toContain(workers[0]);
    // A replacement never rewrites the file (a guest could catch it half-written); what it holds
    // still works with every worker.
    expect(readFileSync(envFile, "utf8")).toBe(guestEnv);
    expect(statSync(envFile).mtimeMs).toBe(envWritten);
    for (let i = 0; i < 4; i++) await fetchOnce(`b${i}`);
    expect(upstream.hits()).toBe(8);
    expect(cli.stderr()).not.toContain(value);

    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
    for (const pid of replaced) await until(() => !running(pid), 5_000, `worker ${pid} to exit`);
    expect(cli.stdout()).toMatch(listeningLine);
    expect(linesOf(cli.stderr(), "closing")).toEqual([expect.objectContaining({ signal: "SIGTERM", workers: 2 })]);
    // The primary's lines as much as the workers': one JSON object each.
    expectAllJson(cli.stderr());
    expect(linesOf(cli.stderr(), "workers listening")).toEqual([expect.objectContaining({ workers: 2 })]);
  });

  // The README said the primary did not pass SIGUSR1 on; it does, and logrotate's postrotate
  // may signal the main process alone.
  it("SIGUSR1 to the primary makes every worker reopen the audit log at its path", async () => {
    const dir = tempDir();
    const audit = join(dir, "audit.jsonl");
    const { cli } = await serve(["--workers", "2", "--log-level", "info", "--ca-dir", join(dir, "ca"), "--audit-log", audit]);
    const workers = childPids(cli.process.pid!);
    expect(workers).toHaveLength(2);
    renameSync(audit, `${audit}.1`);
    cli.process.kill("SIGUSR1");
    const reopenedBy = (): Set<number> =>
      new Set(cli.stderr().split("\n").filter((line) => line.includes('"msg":"audit log reopened"')).map((line) => (JSON.parse(line) as { worker: number }).worker));
    await until(() => reopenedBy().size === 2, 10_000, "both workers to reopen the audit log");
    expect([...reopenedBy()].sort()).toEqual([...workers].sort());
    expect(existsSync(audit)).toBe(true);
    // The primary kept serving: SIGUSR1 did not open its inspector or end it.
    expect(running(cli.process.pid!)).toBe(true);
    expect(cli.stderr()).not.toMatch(/Debugger listening/);
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });

  // Each worker counts request ids from 1: records without the worker's pid collided, and named
  // no log line for sure.
  it("every worker's audit records carry its pid, as its log lines do: worker and id name one decision line", async () => {
    const dir = tempDir();
    const audit = join(dir, "audit.jsonl");
    const { cli, url } = await serve(["--workers", "2", "--log-level", "info", "--ca-dir", join(dir, "ca"), "--audit-log", audit]);
    const workers = childPids(cli.process.pid!);
    expect(workers).toHaveLength(2);
    // A new connection each (the primary hands them to the workers in turn); refused, deny-all.
    for (let i = 0; i < 4; i++) expect((await curl(["-sS", "-x", url, "-o", "/dev/null", "-w", "%{http_code}", `http://api.test/${i}`])).stdout).toBe("403");
    const records = (): { worker?: number; id?: number; url: string }[] =>
      existsSync(audit) ? readFileSync(audit, "utf8").split("\n").filter((l) => l !== "").map((l) => JSON.parse(l) as { worker?: number; id?: number; url: string }) : [];
    await until(() => records().length === 4, 10_000, "four audit records");
    expect(new Set(records().map((r) => r.worker))).toEqual(new Set(workers));
    expect(new Set(records().map((r) => `${r.worker}:${r.id}`)).size).toBe(4);
    const lines = linesOf(cli.stderr(), "request");
    for (const record of records()) {
      expect(lines.filter((line) => line["worker"] === record.worker && line["id"] === record.id).map((line) => line["target"])).toEqual([record.url]);
    }
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });

  it("every worker refuses the primary's metrics listener as a target, as one process refuses its own", async () => {
    const dir = tempDir();
    const { cli, url } = await serve(["--workers", "2", "--log-level", "info", "--ca-dir", join(dir, "ca"), "--metrics-listen", "127.0.0.1:0", "--allow-internal-host", "127.0.0.1"]);
    const metricsUrl = linesOf(cli.stderr(), "metrics listening")[0]?.["url"] as string | undefined;
    expect(metricsUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    // A new connection per request, which the primary hands to the workers in turn. Before, every
    // worker answered 200 with the metrics: only the primary knew the listener's address.
    for (let i = 0; i < 4; i++) {
      const result = await curl(["-sS", "-x", url, "-o", "/dev/null", "-w", "%{http_code}", `${metricsUrl!}/metrics`]);
      expect(result.stdout).toBe("403");
    }
    const refusals = cli.stderr().split("\n").filter((line) => line.includes('"msg":"request"') && line.includes("own listening address"));
    expect(new Set(refusals.map((line) => (JSON.parse(line) as { worker: number }).worker)).size).toBe(2);
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });

  // An emptied file (a truncate half-way through a save) is the default configuration, deny-all,
  // at a first start; a replacement would serve it alone, beside workers on the real one.
  it.each([
    ["broken", "allowHosts: [nope.test\n"],
    ["emptied", "# saving…\n"],
  ])("a replacement that cannot start on a config file %s since the last reload is tried again while the other worker serves", async (_what, text) => {
    const dir = tempDir();
    const file = join(dir, "egressgate.yaml");
    writeFileSync(file, "allowHosts: [nope.test]\n");
    const { cli, url } = await serve(["--workers", "2", "--log-level", "info", "--ca-dir", join(dir, "ca"), "--config", file]);
    const workers = childPids(cli.process.pid!);
    expect(workers).toHaveLength(2);
    writeFileSync(file, text);
    process.kill(workers[0]!, "SIGKILL");
    // Before, the primary stopped the worker still serving, and exited 1.
    const failed = (): Record<string, unknown>[] => linesOf(cli.stderr(), "a replacement worker could not start; trying again");
    await until(() => failed().length > 0, 30_000, "the replacement's failure");
    expect(failed()[0]).toMatchObject({ level: "warn", serving: 1, workers: 2, retryInS: 5 });
    const refused = await curl(["-sS", "-x", url, "-o", "/dev/null", "-w", "%{http_code}", "http://elsewhere.test/"]);
    expect(refused.stdout).toBe("403");
    writeFileSync(file, "allowHosts: [nope.test]\n");
    await until(() => linesOf(cli.stderr(), "worker replaced").some((line) => line["replaces"] === workers[0]), 30_000, "a replacement worker");
    expect(childPids(cli.process.pid!)).toHaveLength(2);
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });

  // Retired values lived only in each worker's memory: a replacement built its guests from the
  // file and sent a rotated-out value upstream, writing it in clear into the log and the audit log.
  it("a replacement worker refuses and redacts the values the other workers retired at a reload", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const audit = join(dir, "audit.jsonl");
    const tokenFile = join(dir, "token");
    const file = join(dir, "egressgate.yaml");
    const upstream = await startUpstream();
    const old = "old-value-for-workers-7f3a";
    writeFileSync(tokenFile, old);
    writeFileSync(
      file,
      [
        "allowInternalHosts: [api.test]",
        "resolve: { api.test: [127.0.0.1] }",
        `upstreamCa: [${JSON.stringify(await upstreamCaFile(dir))}]`,
        `secrets: { TOK: { hosts: [api.test], value: ${JSON.stringify(`file:${tokenFile}`)} } }`,
        "",
      ].join("\n"),
    );
    const { cli, url } = await serve(["--workers", "2", "--log-level", "info", "--ca-dir", caDir, "--config", file, "--audit-log", audit]);
    const primary = cli.process.pid!;
    const workers = childPids(primary);
    expect(workers).toHaveLength(2);
    writeFileSync(tokenFile, "new-value-for-workers-9c1d");
    cli.process.kill("SIGHUP");
    await until(() => linesOf(cli.stderr(), "configuration reloaded").length === 2, 30_000, "both workers to reload");

    // A new connection per request, which the primary hands to the workers in turn.
    const send = async (tag: string): Promise<string> =>
      (await curl(["-sS", "-x", url, "--cacert", join(caDir, "ca.crt"), "-o", "/dev/null", "-w", "%{http_code}", `https://api.test:${upstream.port}/echo/${tag}/${old}`])).stdout;
    for (let i = 0; i < 2; i++) expect(await send(`a${i}`)).toBe("403");
    // A worker writes its audit records after it answered, through a queue: SIGKILL loses what
    // the queue still holds, so the kill waits until the first two records are in the file.
    const records = (): number => (existsSync(audit) ? readFileSync(audit, "utf8").split("\n").filter((l) => l !== "").length : 0);
    await until(() => records() === 2, 10_000, "two audit records");
    process.kill(workers[0]!, "SIGKILL");
    await until(() => linesOf(cli.stderr(), "worker replaced").some((line) => line["replaces"] === workers[0]), 30_000, "a replacement worker");
    const replacement = childPids(primary).find((pid) => !workers.includes(pid));
    expect(replacement).toBeDefined();
    for (let i = 0; i < 4; i++) expect(await send(`b${i}`)).toBe("403");
    expect(upstream.hits()).toBe(0);
    const refusals = (): Record<string, unknown>[] => linesOf(cli.stderr(), "request").filter((line) => String(line["target"]).includes("/echo/b"));
    await until(() => refusals().length === 4, 10_000, "four request lines");
    // Both workers answered, the replacement among them, each for the same reason.
    expect(new Set(refusals().map((line) => line["worker"]))).toEqual(new Set([workers[1], replacement]));
    for (const line of refusals()) expect(String(line["reason"])).toMatch(/retired value of secret TOK/);
    await until(() => records() === 6, 10_000, "six audit records");
    expect(cli.stderr()).not.toContain(old);
    expect(readFileSync(audit, "utf8")).not.toContain(old);
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });

  // A worker that started after a file: secret changed, before the SIGHUP, never held the old
  // value: it learns that the others retired it from their reports, passed on by the primary.
  it("a worker that read a rotated file before the reload refuses the value the other workers retired at it", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const tokenFile = join(dir, "token");
    const file = join(dir, "egressgate.yaml");
    const upstream = await startUpstream();
    const old = "old-value-for-workers-5b2e";
    writeFileSync(tokenFile, old);
    writeFileSync(
      file,
      [
        "allowInternalHosts: [api.test]",
        "resolve: { api.test: [127.0.0.1] }",
        `upstreamCa: [${JSON.stringify(await upstreamCaFile(dir))}]`,
        `secrets: { TOK: { hosts: [api.test], value: ${JSON.stringify(`file:${tokenFile}`)} } }`,
        "",
      ].join("\n"),
    );
    const { cli, url } = await serve(["--workers", "2", "--log-level", "info", "--ca-dir", caDir, "--config", file]);
    const primary = cli.process.pid!;
    const workers = childPids(primary);
    expect(workers).toHaveLength(2);
    writeFileSync(tokenFile, "new-value-for-workers-0e4c");
    process.kill(workers[0]!, "SIGKILL");
    await until(() => linesOf(cli.stderr(), "worker replaced").some((line) => line["replaces"] === workers[0]), 30_000, "a replacement worker");
    const replacement = childPids(primary).find((pid) => !workers.includes(pid));
    cli.process.kill("SIGHUP");
    await until(() => linesOf(cli.stderr(), "configuration reloaded").length === 2, 30_000, "both workers to reload");
    // The report that follows the other worker's reload reaches it a moment later.
    await until(() => linesOf(cli.stderr(), "took the secret values other workers retired").some((line) => line["worker"] === replacement), 10_000, "the replacement to take the retired value");
    const send = async (tag: string): Promise<string> =>
      (await curl(["-sS", "-x", url, "--cacert", join(caDir, "ca.crt"), "-o", "/dev/null", "-w", "%{http_code}", `https://api.test:${upstream.port}/echo/${tag}/${old}`])).stdout;
    for (let i = 0; i < 4; i++) expect(await send(`c${i}`)).toBe("403");
    expect(upstream.hits()).toBe(0);
    const refusals = (): Record<string, unknown>[] => linesOf(cli.stderr(), "request").filter((line) => String(line["target"]).includes("/echo/c"));
    await until(() => refusals().length === 4, 10_000, "four request lines");
    expect(new Set(refusals().map((line) => line["worker"]))).toEqual(new Set([workers[1], replacement]));
    expect(cli.stderr()).not.toContain(old);
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });

  // A reload keeps proxy-wide options until a restart; a replacement read them from the file as
  // it was then, and served beside the other workers with a CA of its own (`caDir` edited), which
  // the guests did not trust, or on a second port (`listen`).
  it("a replacement worker serves the proxy-wide options the cluster started with, not the file's edited ones", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const otherCaDir = join(dir, "other-ca");
    const file = join(dir, "egressgate.yaml");
    const upstream = await startUpstream();
    const body = (ca: string): string =>
      [
        `caDir: ${JSON.stringify(ca)}`,
        "allowInternalHosts: [api.test]",
        "resolve: { api.test: [127.0.0.1] }",
        `upstreamCa: [${JSON.stringify(join(dir, "upstream-ca.pem"))}]`,
        "",
      ].join("\n");
    await upstreamCaFile(dir);
    writeFileSync(file, body(caDir));
    const { cli, url } = await serve(["--workers", "2", "--log-level", "info", "--config", file]);
    const primary = cli.process.pid!;
    const workers = childPids(primary);
    expect(workers).toHaveLength(2);
    writeFileSync(file, body(otherCaDir));
    process.kill(workers[0]!, "SIGKILL");
    await until(() => linesOf(cli.stderr(), "worker replaced").some((line) => line["replaces"] === workers[0]), 60_000, "a replacement worker");
    const replacement = childPids(primary).find((pid) => !workers.includes(pid));
    expect(replacement).toBeDefined();
    // A new connection per request, handed to the workers in turn: each one's leaf certificate
    // is signed by the CA the guests trust.
    for (let i = 0; i < 4; i++) {
      const result = await curl(["-sS", "-x", url, "--cacert", join(caDir, "ca.crt"), "-o", "/dev/null", "-w", "%{http_code}", `https://api.test:${upstream.port}/echo?n=${i}`]);
      expect(result.stderr).toBe("");
      expect(result.stdout).toBe("200");
    }
    const served = (): Set<unknown> => new Set(linesOf(cli.stderr(), "request").map((line) => line["worker"]));
    await until(() => served().size === 2, 10_000, "request lines from both workers");
    expect(served()).toEqual(new Set([workers[1], replacement]));
    expect(existsSync(otherCaDir)).toBe(false);
    expect(linesOf(cli.stderr(), "the config file changes settings that apply only at a restart: this worker serves them as the cluster started with them")).toEqual([
      expect.objectContaining({ level: "warn", worker: replacement, settings: ["caDir"] }),
    ]);
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });

  // A reload refuses to make a proxy that required credentials serve one guest without them; a
  // replacement that read the edited file served without them, beside a worker that asked for them.
  it("a replacement worker does not serve without credentials where the cluster started with them: it is refused and tried again", async () => {
    const dir = tempDir();
    const file = join(dir, "egressgate.yaml");
    writeFileSync(file, "resolve: { api.test: [127.0.0.1] }\nguests:\n  a:\n    allowHosts: [api.test]\n");
    const { cli, url } = await serve(["--workers", "2", "--log-level", "info", "--ca-dir", join(dir, "ca"), "--config", file]);
    const workers = childPids(cli.process.pid!);
    expect(workers).toHaveLength(2);
    writeFileSync(file, "resolve: { api.test: [127.0.0.1] }\nallowHosts: [api.test]\n");
    process.kill(workers[0]!, "SIGKILL");
    const refused = (): number => linesOf(cli.stderr(), "a replacement worker could not start; trying again").length;
    await until(() => refused() > 0 || linesOf(cli.stderr(), "worker replaced").length > 0, 60_000, "the replacement to start or be refused");
    expect(linesOf(cli.stderr(), "worker replaced")).toEqual([]);
    expect(cli.stderr()).toContain("a worker started after the config file changed: the cluster serves one guest without credentials, or with them, until a restart");
    // Whichever worker a connection reaches, a request without credentials is refused.
    for (let i = 0; i < 4; i++) expect((await curl(["-sS", "-x", url, "-o", "/dev/null", "-w", "%{http_code}", `http://api.test/${i}`])).stdout).toBe("407");
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });

  // What a reload applies, a worker started after it must accept too. `auth` reloads with the
  // guests, and the placeholders' form may change one reload at a time; a replacement pinned to
  // the start's `auth` or form was refused, and tried again for as long as the file stayed so,
  // while one process accepted the same reloads (review finding).
  it.each([
    {
      name: "auth: true with one guest, then guests:",
      files: ["resolve: { api.test: [127.0.0.1] }\nauth: true\nallowHosts: [api.test]\n", "resolve: { api.test: [127.0.0.1] }\nguests:\n  alice:\n    allowHosts: [api.test]\n"],
    },
    {
      name: "guests: to one guest with auth: true",
      files: ["resolve: { api.test: [127.0.0.1] }\nguests:\n  alice:\n    allowHosts: [api.test]\n", "resolve: { api.test: [127.0.0.1] }\nauth: true\nallowHosts: [api.test]\n"],
    },
    {
      name: "one guest, then guests: without default, then with it",
      files: [
        "resolve: { api.test: [127.0.0.1] }\nallowHosts: [api.test]\nauth: true\n",
        "resolve: { api.test: [127.0.0.1] }\nguests:\n  bob:\n    allowHosts: [api.test]\n",
        "resolve: { api.test: [127.0.0.1] }\nguests:\n  default:\n    allowHosts: [api.test]\n  bob:\n    allowHosts: [api.test]\n",
      ],
    },
  ])("after reloads ($name) that every worker applied, a replacement worker starts with the file as it is", async ({ files }) => {
    const dir = tempDir();
    const file = join(dir, "egressgate.yaml");
    writeFileSync(file, files[0]!);
    const { cli, url } = await serve(["--workers", "2", "--log-level", "info", "--ca-dir", join(dir, "ca"), "--config", file]);
    const primary = cli.process.pid!;
    const workers = childPids(primary);
    expect(workers).toHaveLength(2);
    for (const [index, body] of files.slice(1).entries()) {
      writeFileSync(file, body);
      process.kill(primary, "SIGHUP");
      await until(() => linesOf(cli.stderr(), "configuration reloaded").length === 2 * (index + 1), 60_000, `reload ${index + 1} in both workers`);
    }
    expect(linesOf(cli.stderr(), "reload failed; the old configuration keeps serving")).toEqual([]);
    process.kill(workers[0]!, "SIGKILL");
    await until(() => linesOf(cli.stderr(), "worker replaced").length > 0 || linesOf(cli.stderr(), "a replacement worker could not start; trying again").length > 0, 60_000, "the replacement to start or be refused");
    expect(linesOf(cli.stderr(), "a replacement worker could not start; trying again")).toEqual([]);
    expect(linesOf(cli.stderr(), "worker replaced")).toEqual([expect.objectContaining({ replaces: workers[0] })]);
    // Every file here requires credentials: a request without them is refused by each worker.
    for (let i = 0; i < 4; i++) expect((await curl(["-sS", "-x", url, "-o", "/dev/null", "-w", "%{http_code}", `http://api.test/${i}`])).stdout).toBe("407");
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });

  it("workers leave SIGINT to the primary: signalled alone they go on serving", async () => {
    const dir = tempDir();
    const { cli, url } = await serve(["--workers", "2", "--log-level", "info", "--ca-dir", join(dir, "ca"), "--allow-host", "nope.test"]);
    const workers = childPids(cli.process.pid!);
    for (const pid of workers) process.kill(pid, "SIGINT");
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(childPids(cli.process.pid!).sort()).toEqual([...workers].sort());
    for (let i = 0; i < 4; i++) {
      // A refused plain-HTTP request: answered by the proxy itself, whichever worker takes it.
      const result = await curl(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-x", url, "http://denied.test/"]);
      expect(result.stdout).toBe("403");
    }
    expect(cli.stderr()).not.toMatch(/"msg":"worker closed"|starting another/);
    cli.process.kill("SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });

  it("SIGINT to the whole process group (Ctrl-C) drains once: no worker is replaced", async () => {
    const dir = tempDir();
    const cli = startCli(["--workers", "2", "--listen", "127.0.0.1:0", "--log-level", "info", "--ca-dir", join(dir, "ca")]);
    await cli.waitForStdout(listeningLine);
    const workers = childPids(cli.process.pid!);
    expect(workers).toHaveLength(2);
    // What a terminal does: the signal reaches the primary and every worker at once.
    for (const pid of [...workers, cli.process.pid!]) process.kill(pid, "SIGINT");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
    expect(cli.stderr()).not.toMatch(/starting another|"msg":"worker closed"/);
    for (const pid of workers) await until(() => !running(pid), 5_000, `worker ${pid} to exit`);
  });

  it("a worker that cannot listen stops the start: exit 1 with its error, nothing left running", async () => {
    const dir = tempDir();
    const busy = createServer();
    await new Promise<void>((resolve) => busy.listen(0, "127.0.0.1", () => resolve()));
    onTestFinished(() => void busy.close());
    const port = (busy.address() as { port: number }).port;
    const cli = startCli(["--workers", "2", "--listen", `127.0.0.1:${port}`, "--ca-dir", join(dir, "ca")]);
    const primary = cli.process.pid!;
    const { code } = await cli.exited;
    expect(code).toBe(1);
    expect(cli.stderr()).toMatch(/EADDRINUSE/);
    expect(cli.stderr()).toMatch(/a worker exited while starting \(code 1\)/);
    expect(cli.stdout()).toBe("");
    await until(() => childPids(primary).length === 0, 5_000, "no workers left");
  });

  it.each(["--listen", "--metrics-listen"])("a port in use (%s) exits 1, as the machine's state and not a bad option", async (flag) => {
    const busy = createServer();
    await new Promise<void>((resolve) => busy.listen(0, "127.0.0.1", () => resolve()));
    onTestFinished(() => void busy.close());
    const taken = `127.0.0.1:${(busy.address() as { port: number }).port}`;
    const flags = flag === "--listen" ? ["--listen", taken] : ["--listen", "127.0.0.1:0", "--metrics-listen", taken];
    const result = await runCli([...flags, "--ca-dir", join(tempDir(), "ca")]);
    expect(result.code).toBe(1);
    expect(result.stderr).toMatch(flag === "--listen" ? /--listen: cannot listen on 127\.0\.0\.1:\d+ \(EADDRINUSE\)/ : /--metrics-listen: cannot listen on 127\.0\.0\.1:\d+ \(EADDRINUSE\)/);
  });

  // A --listen host that does not resolve failed "getaddrinfo ENOTFOUND HOST", naming neither the
  // flag nor the key (seventeenth session's "left alone"). The host's 64-character label fails in
  // the resolver itself: glibc sends no query for a name it cannot encode, so nothing leaves the
  // machine (checked with strace: no connect or send to the nameserver).
  it.each([["one process", []], ["--workers 2", ["--workers", "2"]]] as const)("a --listen host that does not resolve exits 1 naming --listen, no stack (%s)", async (_how, workers) => {
    const host = `${"a".repeat(64)}.invalid`;
    const dir = tempDir();
    for (const port of ["0", "8123"]) {
      const result = await runCli([...workers, "--listen", `${host}:${port}`, "--no-auth", "--ca-dir", join(dir, "ca")]);
      expect(result.code).toBe(1);
      expect(result.stderr).toContain(`egressgate: --listen: cannot listen on ${host}:${port} (ENOTFOUND: the host name does not resolve)\n`);
      expect(result.stderr).not.toMatch(/^\s+at /m);
      expect(result.stdout).toBe("");
    }
    const file = join(dir, "listen.yaml");
    writeFileSync(file, `listen: "${host}:0"\nauth: true\n`);
    const fromFile = await runCli([...workers, "--config", file, "--ca-dir", join(dir, "ca")]);
    expect(fromFile.code).toBe(1);
    expect(fromFile.stderr).toContain(`egressgate: ${file}: listen cannot listen on ${host}:0 (ENOTFOUND: the host name does not resolve)\n`);
  });

  // The primary's metrics listener failed with a bare "listen EADDRINUSE: address already in use
  // …", naming neither the flag nor the key, where one process names --metrics-listen.
  it("a metrics port in use with --workers 2 exits 1 naming --metrics-listen, as one process does", async () => {
    const busy = createServer();
    await new Promise<void>((resolve) => busy.listen(0, "127.0.0.1", () => resolve()));
    onTestFinished(() => void busy.close());
    const taken = `127.0.0.1:${(busy.address() as { port: number }).port}`;
    const result = await runCli(["--workers", "2", "--listen", "127.0.0.1:0", "--metrics-listen", taken, "--ca-dir", join(tempDir(), "ca")]);
    expect(result.code).toBe(1);
    expect(result.stderr).toBe(`egressgate: --metrics-listen: cannot listen on ${taken} (EADDRINUSE)\n`);
    expect(result.stdout).toBe("");
  });

  it.each([["--workers", "2"], ["--workers", "1"]])("a bad option with a policy loaded (%s %s) exits 2 at once", async (...workers) => {
    const result = await runCli([...workers, "--listen", "127.0.0.1:0", "--hooks-script", join(root, "policies", "strip-tracking.js"), "--upstream-ca", "/nonexistent/ca.pem"]);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/--upstream-ca.*\/nonexistent\/ca\.pem/);
  });

  it("a guest environment file that cannot be written stops the start: exit 2 naming the flag, like an unreadable --upstream-ca", async () => {
    const dir = tempDir();
    const result = await runCli(["--listen", "127.0.0.1:0", "--ca-dir", join(dir, "ca"), "--guest-env-file", join(dir, "missing", "guest.env")]);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/--guest-env-file: cannot write .*missing\/guest\.env \(ENOENT\)/);
    expect(result.stdout).toBe("");
  });

  // `--guest-env-file /dev/stdout` wrote the guest's credentials among the proxy's own output;
  // with stdout a file others could read, the "replace, not chmod" path renamed a new file over
  // the path, and /dev/stdout itself (a symlink every process shares) became a regular file
  // (seventeenth session's "left alone", and this machine's /dev/stdout found so). The
  // /proc/self/fd paths name the same files without touching /dev if the fix is missing.
  it.each([
    ["stdout", "/proc/self/fd/1"],
    ["stderr", "/proc/self/fd/2"],
  ] as const)("a guest environment file that is the proxy's own %s is refused: exit 2 naming the flag, nothing written", async (name, file) => {
    // The output a shell's `>` gives (a spawned child's pipes are sockets, which open() refuses).
    const dir = tempDir();
    const output = join(dir, `${name}.log`);
    const fd = openSync(output, "w", 0o644);
    const child = spawn(process.execPath, [bin, "--listen", "127.0.0.1:0", "--ca-dir", join(dir, "ca"), "--guest-env-file", file], {
      cwd: root,
      env: cliEnv(),
      stdio: ["ignore", name === "stdout" ? fd : "pipe", name === "stderr" ? fd : "pipe"],
    });
    closeSync(fd);
    onTestFinished(() => void child.kill("SIGKILL"));
    let piped = "";
    (name === "stdout" ? child.stderr : child.stdout)!.setEncoding("utf8").on("data", (chunk: string) => (piped += chunk));
    const code = await new Promise<number | null>((resolve) => child.once("close", (exit) => resolve(exit)));
    const written = readFileSync(output, "utf8");
    expect(written + piped).not.toContain("HTTPS_PROXY=");
    expect(code).toBe(2);
    const stderr = name === "stderr" ? written : piped;
    expect(stderr).toBe(`egressgate: --guest-env-file: cannot write ${file} (it is this process's ${name}, where the proxy writes its own output: the guest's credentials would go out among its lines; name a file, or a FIFO its reader opens)\n`);
  });

  it("a bad option exits 2 before any worker starts", async () => {
    const result = await runCli(["--workers", "2", "--listen", "127.0.0.1:0", "--upstream-ca", "/nonexistent/ca.pem"]);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/--upstream-ca.*\/nonexistent\/ca\.pem/);
    expect(result.stderr).not.toMatch(/worker/);
  });

  it("the workers stop when the primary is killed outright", async () => {
    const dir = tempDir();
    const { cli } = await serve(["--workers", "2", "--ca-dir", join(dir, "ca")]);
    const workers = childPids(cli.process.pid!);
    expect(workers).toHaveLength(2);
    cli.process.kill("SIGKILL");
    await cli.exited;
    for (const pid of workers) await until(() => !running(pid), 15_000, `worker ${pid} to exit`);
  });

  it.each(["0", "65", "1.5"])("--workers %s exits 2 naming the flag", async (value) => {
    const result = await runCli(["--workers", value, "--listen", "127.0.0.1:0"]);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/--workers: must be an integer/);
    expect(result.stdout).toBe("");
  });

  it("EGRESSGATE_PLACEHOLDER_KEY makes placeholders the same across runs; a short key exits 2", async () => {
    const dir = tempDir();
    const key = "k".repeat(40);
    const placeholders: string[] = [];
    for (const run of [1, 2]) {
      const envFile = join(dir, `guest-${run}.env`);
      const { cli } = await serve(["--ca-dir", join(dir, "ca"), "--host-secret", "T@api.test=v", "--guest-env-file", envFile], { EGRESSGATE_PLACEHOLDER_KEY: key });
      placeholders.push(/^T=(EGRESSGATE_SECRET_[0-9a-f]{48})$/m.exec(readFileSync(envFile, "utf8"))?.[1] ?? "");
      cli.process.kill("SIGTERM");
      await cli.exited;
    }
    expect(placeholders[0]).toMatch(/^EGRESSGATE_SECRET_[0-9a-f]{48}$/);
    expect(placeholders[1]).toBe(placeholders[0]);
    const short = startCli(["--listen", "127.0.0.1:0", "--host-secret", "T@api.test=v"], 20_000, { EGRESSGATE_PLACEHOLDER_KEY: "short" });
    expect((await short.exited).code).toBe(2);
    expect(short.stderr()).toMatch(/\$EGRESSGATE_PLACEHOLDER_KEY: must be at least 32 characters long/);
    expect(short.stderr()).not.toContain("short\n");
  });
});

describe("egressgate usage errors", () => {
  it("--help lists every flag of the one flags table, with the defaults table's values, and no flag outside it", async () => {
    const result = await runCli(["--help"]);
    expect(result.code).toBe(0);
    const lines = result.stdout.split("\n");
    for (const [path, flag] of Object.entries(optionFlags)) {
      const line = lines.find((l) => l.trimStart().startsWith(`${flag} `) || l.trimStart().startsWith(`${flag}  `));
      expect([flag, line !== undefined]).toEqual([flag, true]);
      const node = schemaPaths(configFileSchema).find((p) => p.path === path)!.node;
      // A default is shown from the table (a wrapped line may carry it on the next line).
      if ("default" in node && node.default !== undefined) {
        const from = lines.indexOf(line!);
        expect([flag, lines.slice(from, from + 3).join(" ")]).toEqual([flag, expect.stringContaining(`[default: ${String(node.default)}]`)]);
      }
    }
    // --log-format and --version are the CLI's own: they set no option of the schema.
    const commandFlags = ["--config", "--ca-dir", "--listen", "--help", "--version", "--log-format"];
    const listed = [...result.stdout.matchAll(/^\s+(--[a-z-]+)/gm)].map((m) => m[1]!);
    // The chain flags (--hook-command, --hook-url, --hook-opa) are in the flags table's module too.
    for (const flag of listed) expect([flag, [...Object.values(optionFlags), ...Object.values(chainFlags), ...commandFlags].includes(flag)]).toEqual([flag, true]);
    expect(result.stdout).not.toMatch(/listening on/);
  });

  it("an error nothing caught logs one JSON line with its stack and exits non-zero, for a supervisor to restart", async () => {
    // A preload plants the failure: SIGUSR2 throws inside the running proxy.
    const preload = join(tempDir(), "plant.mjs");
    writeFileSync(preload, `process.on("SIGUSR2", () => { throw new Error("planted failure"); });\n`);
    const { cli } = await serve([], { NODE_OPTIONS: `--import=${preload}` });
    cli.process.kill("SIGUSR2");
    const { code } = await cli.exited;
    expect(code).toBe(70);
    const fatal = cli
      .stderr()
      .split("\n")
      .filter((line) => line.includes('"level":"fatal"'));
    expect(fatal).toHaveLength(1);
    const entry = JSON.parse(fatal[0]!) as Record<string, string>;
    expect(entry["msg"]).toBe("uncaught exception");
    expect(entry["error"]).toBe("planted failure");
    expect(entry["stack"]).toMatch(/planted failure\n\s+at /);
  });

  it("the fatal line redacts the configured secrets from the error's message and stack", async () => {
    const preload = join(tempDir(), "plant.mjs");
    writeFileSync(preload, `process.on("SIGUSR2", () => { throw new Error("planted failure for https://api.test/?t=" + encodeURIComponent(process.env.FATAL_TOKEN)); });\n`);
    const value = "s3cr3t v4lue/for-the-fatal-line";
    const { cli } = await serve(["--host-secret", "FATAL_TOKEN@api.test"], { NODE_OPTIONS: `--import=${preload}`, FATAL_TOKEN: value });
    cli.process.kill("SIGUSR2");
    expect((await cli.exited).code).toBe(70);
    const fatal = cli.stderr().split("\n").find((line) => line.includes('"level":"fatal"'))!;
    const entry = JSON.parse(fatal) as Record<string, string>;
    expect(entry["error"]).toBe("planted failure for https://api.test/?t=[REDACTED:FATAL_TOKEN]");
    expect(entry["stack"]).toContain("[REDACTED:FATAL_TOKEN]");
    expect(fatal).not.toContain(encodeURIComponent(value));
  });

  it.each([
    { args: ["--upstream-body-timeout-ms", "0"], names: /--upstream-body-timeout-ms.*0/ },
    { args: ["--max-connections-per-source", "-3"], names: /--max-connections-per-source.*-3/ },
    { args: ["--bogus"], names: /bogus/ },
    { args: ["--listen", "nope"], names: /--listen.*nope/ },
    { args: ["--resolve", "x"], names: /--resolve.*"x"/ },
    { args: ["--allow-host", "https://x"], names: /--allow-host.*https:\/\/x/ },
    { args: ["--log-level", "loud"], names: /log-level[\s\S]*loud/ },
    { args: ["--max-redirects", "-1"], names: /--max-redirects.*-1/ },
    // With a policy loaded, its worker threads must not keep the failed start alive.
    { args: ["--hooks-script", join(root, "policies", "strip-tracking.js"), "--allow-host", "https://x"], names: /--allow-host.*https:\/\/x/ },
    { args: ["--hooks-script", join(root, "policies", "strip-tracking.js"), "--listen", "nope"], names: /--listen.*nope/ },
  ])("$args exits 2 with a message naming the flag", async ({ args, names }) => {
    const result = await runCli(["--ca-dir", join(tempDir(), "ca"), ...args]);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(names);
    expect(result.stdout).toBe("");
  });

  it("a missing --upstream-ca file exits 2 naming upstreamCa and the path", async () => {
    const dir = tempDir();
    const missing = join(dir, "missing-ca.pem");
    const result = await runCli(["--listen", "127.0.0.1:0", "--ca-dir", join(dir, "ca"), "--upstream-ca", missing]);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/upstreamCa|--upstream-ca/);
    expect(result.stderr).toContain(missing);
    expect(result.stdout).toBe("");
  });
});

describe("egressgate authentication", () => {
  const key = "cli-auth-test-deployment-key-0123456789abcdef";

  it("listening beyond loopback without guests exits 2 naming --auth and --no-auth; --no-auth starts", async () => {
    const dir = tempDir();
    const refused = await runCli(["--listen", "0.0.0.0:0", "--ca-dir", join(dir, "ca")]);
    expect(refused.code).toBe(2);
    expect(refused.stderr).toMatch(/--auth/);
    expect(refused.stderr).toMatch(/--no-auth/);
    expect(refused.stdout).toBe("");
    const open = startCli(["--listen", "0.0.0.0:0", "--no-auth", "--ca-dir", join(dir, "ca"), "--log-level", "warn"]);
    await open.waitForStdout(/^egressgate listening on http:\/\/0\.0\.0\.0:\d+\n$/);
    open.process.kill("SIGTERM");
    expect((await open.exited).code).toBe(0);
  });

  it("--auth: the guest env file and `egressgate env --guest default` carry the same credentials; without them, 407", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const envFile = join(dir, "guest.env");
    const upstream = await startUpstream();
    const { url, port } = await serve(
      ["--auth", "--ca-dir", caDir, "--guest-env-file", envFile, "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--upstream-ca", await upstreamCaFile(dir)],
      { EGRESSGATE_PLACEHOLDER_KEY: key },
    );
    const fromFile = Object.fromEntries(readFileSync(envFile, "utf8").trimEnd().split("\n").map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]));
    expect(fromFile["HTTPS_PROXY"]).toMatch(new RegExp(`^http://default:[0-9a-f]{64}@127\\.0\\.0\\.1:${port}$`));
    expect(fromFile["GIT_HTTP_PROXY_AUTHMETHOD"]).toBe("basic");

    const printed = startCli(["env", "--guest", "default", "--listen", `127.0.0.1:${port}`, "--ca-dir", caDir], 20_000, { EGRESSGATE_PLACEHOLDER_KEY: key });
    expect((await printed.exited).code).toBe(0);
    expect(printed.stdout()).toContain(`export HTTPS_PROXY='${fromFile["HTTPS_PROXY"]}'\n`);
    expect(printed.stdout()).toContain("export GIT_HTTP_PROXY_AUTHMETHOD='basic'\n");

    const target = `https://api.test:${upstream.port}/echo`;
    const without = await curl(["-sS", "-x", url, "--cacert", join(caDir, "ca.crt"), target]);
    expect([without.code, without.stderr]).toEqual([56, expect.stringMatching(/CONNECT.*407/)]);
    const withCredentials = await curl(["-sS", "-x", fromFile["HTTPS_PROXY"]!, "--cacert", join(caDir, "ca.crt"), target]);
    expect(withCredentials.code).toBe(0);
    expect(JSON.parse(withCredentials.stdout)).toMatchObject({ method: "GET", path: "/echo" });
    expect(upstream.hits()).toBe(1);
  });

  it("env --guest without EGRESSGATE_PLACEHOLDER_KEY exits 2 saying where the token comes from", async () => {
    const result = await runCli(["env", "--guest", "ci", "--listen", "127.0.0.1:3128"]);
    expect(result.code).toBe(2);
    expect(result.stderr).toMatch(/env --guest ci: needs \$EGRESSGATE_PLACEHOLDER_KEY .*--guest-env-file/);
    expect(result.stdout).toBe("");
  });

  // It printed HTTPS_PROXY='http://a b:80', a proxy URL no client parses, and exited 0.
  it("env --listen with a host that is no IP address or hostname exits 2 as the serve command does, printing nothing", async () => {
    const caDir = join(tempDir(), "ca");
    const env = await runCli(["env", "--ca-dir", caDir, "--listen", "a b:80"]);
    expect(env.code).toBe(2);
    expect(env.stderr).toContain('egressgate: --listen: must be an IP address or hostname (got "a b")');
    expect(env.stdout).toBe("");
    const serve = await runCli(["--ca-dir", caDir, "--listen", "a b:80"]);
    expect(serve.code).toBe(2);
    expect(serve.stderr).toContain('egressgate: --listen: must be an IP address or hostname (got "a b")');
  });
});

describe("egressgate ca", () => {
  it("prints the certificate path then its PEM, keeps the key at 0600, and prints the same CA on the next run", async () => {
    const caDir = join(tempDir(), "ca");
    const first = await runCli(["ca", "--ca-dir", caDir]);
    expect(first.code).toBe(0);
    const certPath = join(caDir, "ca.crt");
    const newline = first.stdout.indexOf("\n");
    expect(first.stdout.slice(0, newline)).toBe(certPath);
    const pem = first.stdout.slice(newline + 1);
    expect(pem).toMatch(/^-----BEGIN CERTIFICATE-----\n[\s\S]+\n-----END CERTIFICATE-----\n?$/);
    expect(pem).toBe(readFileSync(certPath, "utf8"));
    expect(statSync(join(caDir, "ca.key")).mode & 0o777).toBe(0o600);

    const second = await runCli(["ca", "--ca-dir", caDir]);
    expect(second.code).toBe(0);
    expect(second.stdout).toBe(first.stdout);
  });
  it.runIf(existsSync("/proc/self"))("a --ca-dir under /proc, where no directory can be made, exits 2 with the reason", async () => {
    const { code, stderr } = await runCli(["ca", "--ca-dir", "/proc/self/egressgate"]);
    expect(code).toBe(2);
    expect(stderr).toContain("egressgate: cannot load or create the CA in /proc/self/egressgate: ENOENT: no such file or directory, mkdir '/proc/self/egressgate'");
  });

  it.each([[[]], [["--workers", "2"]]])("a ca.key from another CA stops the start (flags %j) with exit 2 naming the file, before it listens", async (extra) => {
    const caDir = join(tempDir(), "ca");
    expect((await runCli(["ca", "--ca-dir", caDir])).code).toBe(0);
    const keyPath = join(caDir, "ca.key");
    writeFileSync(keyPath, generateKeyPairSync("ec", { namedCurve: "P-256" }).privateKey.export({ format: "pem", type: "pkcs8" }), { mode: 0o600 });
    const { code, stdout, stderr } = await runCli(["--listen", "127.0.0.1:0", "--ca-dir", caDir, ...extra]);
    expect(code).toBe(2);
    expect(stdout).not.toContain("listening");
    expect(stderr).toContain(`egressgate: cannot use the CA in ${caDir}: ${keyPath} is not the key of the certificate in ${join(caDir, "ca.crt")}`);
  });
});

describe("egressgate env", () => {
  // A relative --ca-dir printed relative paths, which name nothing where the guest runs.
  it("prints shell exports for the proxy and every CA variable, with absolute paths for a relative --ca-dir", async () => {
    const caDir = join(tempDir(), "ca");
    const result = await runCli(["env", "--ca-dir", relative(root, caDir), "--listen", "127.0.0.1:9999"]);
    expect(result.code).toBe(0);
    const exports = new Map<string, string>();
    for (const line of result.stdout.trimEnd().split("\n")) {
      const match = /^export ([A-Za-z_][A-Za-z0-9_]*)='([^']*)'$/.exec(line);
      expect(match, line).not.toBeNull();
      exports.set(match![1]!, match![2]!);
    }
    for (const name of ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"]) {
      expect(exports.get(name)).toBe("http://127.0.0.1:9999");
    }
    expect(exports.get("NODE_EXTRA_CA_CERTS")).toBe(join(caDir, "ca.crt"));
    const caPem = readFileSync(join(caDir, "ca.crt"), "utf8");
    for (const name of ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"]) {
      expect(readFileSync(exports.get(name) ?? "", "utf8")).toContain(caPem.trim());
    }
  });
});

describe("egressgate --hooks-script", () => {
  it("a TypeScript policy with an imported JSON file decides requests made with curl", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const upstream = await startUpstream();
    writeFileSync(join(dir, "paths.json"), JSON.stringify(["/echo"]));
    writeFileSync(
      join(dir, "policy.ts"),
      `import paths from "./paths.json" with { type: "json" };
       export function onRequest(request: Request): void {
         const path: string = new URL(request.url).pathname;
         if (!(paths as string[]).includes(path)) throw new HttpRequestBlockedError("path " + path + " is not allowed", 403);
         request.headers.set("x-policy", "ts");
       }`,
    );
    const { url } = await serve([
      "--ca-dir",
      caDir,
      "--allow-internal-host",
      "api.test",
      "--resolve",
      "api.test=127.0.0.1",
      "--upstream-ca",
      await upstreamCaFile(dir),
      "--hooks-script",
      join(dir, "policy.ts"),
      // Whatever else the machine is doing, the policy's answer decides, not its time limit.
      "--hooks-timeout-ms",
      "30000",
    ]);
    const allowed = await curl(["-sS", "-x", url, "--cacert", join(caDir, "ca.crt"), `https://api.test:${upstream.port}/echo`]);
    expect(allowed.code).toBe(0);
    expect(JSON.parse(allowed.stdout)).toMatchObject({ headers: { "x-policy": "ts" } });
    const refused = await curl(["-sS", "-x", url, "--cacert", join(caDir, "ca.crt"), "-w", "\n%{http_code}", `https://api.test:${upstream.port}/secret`]);
    expect(refused.stdout).toMatch(/^403 Forbidden: path \/secret is not allowed\n+403$/);
    expect(upstream.hits()).toBe(1);
  });

  it("--hooks-script repeated is a chain: the policies run in the order given, each seeing the one before's rewrite", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    const upstream = await startUpstream();
    writeFileSync(join(dir, "first.mjs"), `export function onRequest(r) { r.headers.set("x-trail", "first"); }`);
    writeFileSync(
      join(dir, "second.mjs"),
      `export function onRequest(r) {
         if (new URL(r.url).pathname === "/blocked") throw new HttpRequestBlockedError("second blocks", 451);
         r.headers.set("x-trail", r.headers.get("x-trail") + ",second");
       }`,
    );
    const { url } = await serve([
      ...["--ca-dir", caDir, "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--upstream-ca", await upstreamCaFile(dir)],
      ...["--hooks-script", join(dir, "first.mjs"), "--hooks-script", join(dir, "second.mjs"), "--hooks-timeout-ms", "30000"],
    ]);
    const chained = await curl(["-sS", "-x", url, "--cacert", join(caDir, "ca.crt"), `https://api.test:${upstream.port}/echo`]);
    expect(JSON.parse(chained.stdout)).toMatchObject({ headers: { "x-trail": "first,second" } });
    const blocked = await curl(["-sS", "-x", url, "--cacert", join(caDir, "ca.crt"), "-w", "\n%{http_code}", `https://api.test:${upstream.port}/blocked`]);
    expect(blocked.stdout).toMatch(/second blocks\n+451$/);
    expect(upstream.hits()).toBe(1);
  });

  it("a policy with a syntax error stops start-up with exit 2, naming the file and line", async () => {
    const dir = tempDir();
    const file = join(dir, "broken.mjs");
    writeFileSync(file, "export function onRequest(request) {\n  return request.headers.get(;\n}\n");
    const { code, stdout, stderr } = await runCli(["--listen", "127.0.0.1:0", "--hooks-script", file]);
    expect(code).toBe(2);
    expect(stdout).toBe("");
    expect(stderr).toContain(`--hooks-script: ${file}:2:`);
  });

  it("a policy that imports a package stops start-up with exit 2, naming the import", async () => {
    const dir = tempDir();
    const file = join(dir, "bare.ts");
    writeFileSync(file, `import _ from "lodash";\nexport const onRequest = () => void _;\n`);
    const { code, stderr } = await runCli(["--listen", "127.0.0.1:0", "--hooks-script", file]);
    expect(code).toBe(2);
    expect(stderr).toContain(`import "lodash" is refused`);
  });
});
