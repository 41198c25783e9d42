import { execFileSync, spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { request } from "node:http";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { prettyLine } from "../../src/log-pretty.js";
import { descendantPids } from "../helpers/processes.js";
import { tempDir } from "../helpers/proxy.js";

// SGR sequences, as the pretty log colours with them.
const ansi = new RegExp(`${String.fromCharCode(27)}\\[[0-9;]*m`, "g");
const root = fileURLToPath(new URL("../../", import.meta.url));
const version = (JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { version: string }).version;
const hasSystemdAnalyze = (() => {
  try {
    execFileSync("systemd-analyze", ["--version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
})();
const hasScript = (() => {
  try {
    execFileSync("script", ["--version"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
})();

function run(args: readonly string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["dist/cli/bin.js", ...args], { cwd: root, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    child.once("error", reject);
    child.once("exit", (code) => resolve({ code, stdout, stderr }));
  });
}

/** A detached child (its own process group), killed as a group when the test finishes. */
function spawnGroup(command: string, args: readonly string[]): { child: ChildProcess; output: () => string; waitFor: (pattern: RegExp) => Promise<RegExpExecArray> } {
  const child = spawn(command, args, { cwd: root, stdio: ["ignore", "pipe", "pipe"], detached: true, env: { ...process.env, TERM: "xterm" } });
  onTestFinished(() => {
    // `script` gives the proxy a terminal in a session of its own, out of this group: killing the
    // group left it running (it takes the SIGHUP of the closed terminal as a reload).
    for (const pid of [...descendantPids(child.pid!), -child.pid!]) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // Gone already.
      }
    }
  });
  let out = "";
  const waiters: Array<() => void> = [];
  const onData = (chunk: Buffer): void => {
    out += chunk.toString();
    for (const waiter of waiters.splice(0)) waiter();
  };
  child.stdout!.on("data", onData);
  child.stderr!.on("data", onData);
  const waitFor = (pattern: RegExp): Promise<RegExpExecArray> =>
    new Promise((resolve, reject) => {
      const check = (): void => {
        const match = pattern.exec(out);
        if (match !== null) resolve(match);
        else if (child.exitCode !== null) reject(new Error(`exited: ${out}`));
        else waiters.push(check);
      };
      child.once("exit", () => waiters.push(check) && check());
      check();
    });
  return { child, output: () => out, waitFor };
}

function plainRequest(port: number, url: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request({ host: "127.0.0.1", port, path: url, headers: { host: new URL(url).host } }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("error", reject);
    req.end();
  });
}

describe("CLI conventions", () => {
  it("--version prints the package's version and exits 0", async () => {
    const result = await run(["--version"]);
    expect(result).toMatchObject({ code: 0, stdout: `${version}\n` });
  });

  it("--help groups the flags by topic", async () => {
    const { code, stdout } = await run(["--help"]);
    expect(code).toBe(0);
    for (const title of ["Listening:", "Policy:", "Secrets:", "Hooks:", "Guests:", "Logs and metrics:", "Limits:"]) expect(stdout).toContain(`\n${title}\n`);
    const section = (title: string): string => stdout.slice(stdout.indexOf(`\n${title}\n`)).split("\n\n")[0]!;
    expect(section("Listening:")).toContain("--watch");
    expect(section("Policy:")).toContain("--allow-host");
    expect(section("Secrets:")).toContain("--host-secret");
    expect(section("Hooks:")).toContain("--hooks-script");
    expect(section("Hooks:")).toContain("--hook-url");
    expect(section("Logs and metrics:")).toContain("--log-format");
    expect(section("Logs and metrics:")).toContain("--metrics-listen");
    expect(section("Limits:")).toContain("--max-connections");
  });

  // `env --help` described --listen as serve's ("port 0 picks a free port"), and env then refused
  // port 0 (a run of the README against the CLI found it).
  it("env --help describes --listen as the running proxy's address, as env refuses port 0", async () => {
    const help = await run(["env", "--help"]);
    expect(help.code).toBe(0);
    const listen = help.stdout.slice(help.stdout.indexOf("--listen")).split("\n").slice(0, 2).join(" ");
    expect(listen).not.toContain("picks a free port");
    expect(listen).toContain("running proxy");
    const zero = await run(["env", "--listen", "127.0.0.1:0"]);
    expect(zero.code).toBe(2);
    expect(zero.stdout).toBe("");
    expect(zero.stderr).toContain("--listen needs the proxy's real port, not 0");
  });

  // `-h` was an unknown argument (exit 2), at the top and after every command, though operators
  // expect it beside --help (a black-box run found it).
  it("-h prints the same help as --help, at the top and after each command", async () => {
    for (const command of [[], ["serve"], ["ca"], ["env"], ["har"], ["har", "check"], ["check"], ["check-config"]]) {
      const [short, long] = await Promise.all([run([...command, "-h"]), run([...command, "--help"])]);
      expect({ command, code: short.code, stderr: short.stderr }).toEqual({ command, code: 0, stderr: "" });
      expect(short.stdout).toBe(long.stdout);
    }
  });

  // `ca`, `har check` and `check-config` took the global --listen (the last two --ca-dir too) and
  // ignored it: a check-config run "with" --ca-dir checked the file's own (black-box finding).
  it("a global flag a command does not read is a usage error naming the flag and the command", async () => {
    const dir = tempDir();
    const file = join(dir, "c.yaml");
    writeFileSync(file, "{}\n");
    const cases: Array<[string[], string]> = [
      [["ca", "--listen", "127.0.0.1:1", "--ca-dir", join(dir, "ca")], "ca: --listen has no effect"],
      [["check-config", file, "--ca-dir", join(dir, "ca")], "check-config: --ca-dir has no effect"],
      [["--listen", "127.0.0.1:1", "check-config", file], "check-config: --listen has no effect"],
      [["har", "check", join(dir, "x.har"), "--listen=127.0.0.1:1"], "har check: --listen has no effect"],
      [["har", "check", join(dir, "x.har"), "--ca-dir", dir], "har check: --ca-dir has no effect"],
    ];
    for (const [args, message] of cases) {
      const result = await run(args);
      expect({ args, code: result.code, stdout: result.stdout }).toEqual({ args, code: 2, stdout: "" });
      expect(result.stderr).toContain(`egressgate: ${message}`);
    }
    // Nothing was made, and each command still runs without them.
    expect(existsSync(join(dir, "ca"))).toBe(false);
    expect((await run(["ca", "--ca-dir", join(dir, "ca")])).code).toBe(0);
    expect((await run(["check-config", file])).code).toBe(0);
  });

  // The README's flag table had no row for --help (a run of the README against the CLI found it).
  it("every flag --help prints has a row in the README's flag table, and every row names a flag --help prints", async () => {
    const { code, stdout } = await run(["--help"]);
    expect(code).toBe(0);
    // `-h, --help` puts every other flag four columns further in.
    const printed = new Set([...stdout.matchAll(/^ {2}(?:-[a-zA-Z], | {4})?(--[a-z][a-z0-9-]*)/gm)].map((m) => m[1]!));
    const readme = readFileSync(join(root, "README.md"), "utf8");
    const table = readme.slice(readme.indexOf("| flag | default | meaning |"));
    const rows = table.slice(0, table.indexOf("\n\n")).split("\n").slice(2);
    // A row's first cell names the flag; `--no-auth` documents the negation of `--auth`.
    const documented = new Set(rows.map((row) => /^\| `(--[a-z][a-z0-9-]*)/.exec(row)?.[1]).filter((flag) => flag !== undefined));
    const positive = (flag: string): string => (flag.startsWith("--no-") && printed.has(`--${flag.slice(5)}`) ? `--${flag.slice(5)}` : flag);
    expect(printed.size).toBeGreaterThan(40);
    expect([...printed].filter((flag) => ![...documented].some((row) => positive(row) === flag))).toEqual([]);
    expect([...documented].filter((row) => !printed.has(positive(row)))).toEqual([]);
  });

  // A start that failed wrote plain text and a "--help" hint whatever --log-format said, and the
  // hint whatever failed (a file, not the command line).
  it.each([
    ["an audit log path that is a folder", (dir: string) => ["--audit-log", dir], /cannot open .* for appending \(EISDIR\)/],
    ["a config file that does not parse", (dir: string) => ["--config", join(dir, "broken.yaml")], /broken\.yaml/],
  ])("a start that fails on %s: with --log-format json, one JSON line; without, plain text and no --help hint", async (_name, flags, reason) => {
    const dir = tempDir();
    writeFileSync(join(dir, "broken.yaml"), "allowHosts: [unclosed\n");
    const args = ["--listen", "127.0.0.1:0", "--ca-dir", join(dir, "ca"), ...flags(dir)];
    const json = await run([...args, "--log-format", "json"]);
    expect(json.code).toBe(2);
    const lines = json.stderr.trim().split("\n");
    expect(lines).toHaveLength(1);
    const line = JSON.parse(lines[0]!) as Record<string, unknown>;
    expect(line).toMatchObject({ level: "error", msg: "egressgate could not start", exit: 2 });
    expect(String(line["error"])).toMatch(reason);
    const plain = await run(args);
    expect(plain.code).toBe(2);
    expect(plain.stderr).toMatch(/^egressgate: /);
    expect(plain.stderr).not.toContain("--help");
    // A command line that was wrong still gets the hint.
    expect((await run(["--no-such-flag"])).stderr).toContain('Run "egressgate --help" for usage.');
  });

  it("formats a pretty line for a request and for a refusal with its reason", () => {
    expect(prettyLine({ time: "2026-06-01T12:00:00.123Z", level: "info", msg: "request", guest: "default", method: "GET", target: "https://a.test/x", status: 200, ms: 8.5 })).toBe(
      "12:00:00.123 default GET https://a.test/x 200 8.5ms",
    );
    expect(
      prettyLine({ time: "2026-06-01T12:00:00.123Z", level: "info", msg: "request", guest: "g", method: "GET", target: "http://b.test/", status: 403, reason: 'host "b.test" is not in allowedHosts', code: "EG_DENIED", ms: 1 }),
    ).toBe('12:00:00.123 g GET http://b.test/ 403 1ms — host "b.test" is not in allowedHosts [EG_DENIED]');
  });

  // The pretty line printed parsed strings raw: a policy's reason or console line quoting a
  // guest's CR LF and ANSI escapes forged a coloured request line of its own (a hunt).
  const forged = "\r\n\u001b[32m12:00:00.000 default GET https://forged.test/ 200 1ms\u001b[0m";
  it.each([
    ["a refusal's reason", { msg: "request", guest: "g", method: "POST", target: "https://a.test/", status: 422, reason: `not JSON: ${forged}`, ms: 1 }],
    ["a request's target and method", { msg: "request", guest: "g", method: `GET${forged}`, target: `https://a.test/${forged}`, status: 200, ms: 1 }],
    ["another line's field", { msg: "policy console", line: `quoted ${forged}` }],
    ["another line's message and a key", { msg: `policy console${forged}`, [`key${forged}`]: { nested: forged } }],
    ["C1 controls and line separators", { msg: "policy console", line: "csi\u009b31m nel\u0085 ls\u2028 ps\u2029 del\u007f" }],
  ])("a pretty line escapes the control characters in %s: one line, no escape sequence of its own", (_what, fields) => {
    const line = prettyLine({ time: "2026-06-01T12:00:00.123Z", level: "info", ...fields });
    // eslint-disable-next-line no-control-regex
    expect(line).not.toMatch(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/);
    expect(line).toMatch(/\\u001b\[32m|\\u009b|\\u2028/);
  });

  it("a pretty line keeps what JSON would show: CR LF as \\r\\n", () => {
    expect(prettyLine({ time: "2026-06-01T12:00:00.123Z", level: "warn", msg: "x", reason: "a\r\nb\tc" })).toBe("12:00:00.123 WARN  x reason=a\\r\\nb\\tc");
  });

  it.skipIf(!hasScript)("under a terminal the log is one compact coloured line per request, with a refusal's reason", async () => {
    const caDir = tempDir();
    const command = `exec ${process.execPath} dist/cli/bin.js --listen 127.0.0.1:0 --ca-dir ${caDir} --allow-host allowed.test`;
    const proxy = spawnGroup("script", ["-q", "-e", "-c", command, "/dev/null"]);
    const [, port] = await proxy.waitFor(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    expect(await plainRequest(Number(port), "http://denied.test/path")).toBe(403);
    const [line] = await proxy.waitFor(/^.*denied\.test.*$/m);
    expect(line).toContain("\u001b[");
    expect(line.replace(ansi, "")).toMatch(/^\d\d:\d\d:\d\d\.\d{3} default GET http:\/\/denied\.test\/path 403 [\d.]+ms — host "denied\.test" is not in allowedHosts.*\[EG_DENIED\]/);
    expect(proxy.output()).not.toContain('{"time"');
  });

  it.skipIf(!hasScript)("--log-format json under a terminal, and any log on a pipe, stays one JSON object per line", async () => {
    const caDir = tempDir();
    const command = `exec ${process.execPath} dist/cli/bin.js --listen 127.0.0.1:0 --ca-dir ${caDir} --allow-host allowed.test --log-format json`;
    const tty = spawnGroup("script", ["-q", "-e", "-c", command, "/dev/null"]);
    const [, port] = await tty.waitFor(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    expect(await plainRequest(Number(port), "http://denied.test/path")).toBe(403);
    const [line] = await tty.waitFor(/^\{"time".*"msg":"request".*$/m);
    const parsed = JSON.parse(line.trim()) as Record<string, unknown>;
    // The same bytes the logger has always written: JSON.stringify of the entry, in its key order.
    expect(JSON.stringify(parsed)).toBe(line.trim());
    expect(Object.keys(parsed)).toEqual(["time", "level", "msg", "guest", "id", "method", "target", "status", "reason", "code", "ms"]);

    const piped = spawnGroup(process.execPath, ["dist/cli/bin.js", "--listen", "127.0.0.1:0", "--ca-dir", caDir, "--allow-host", "allowed.test"]);
    const [, pipedPort] = await piped.waitFor(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    expect(await plainRequest(Number(pipedPort), "http://denied.test/path")).toBe(403);
    const [pipedLine] = await piped.waitFor(/^\{"time".*"msg":"request".*$/m);
    expect(Object.keys(JSON.parse(pipedLine) as object)).toEqual(Object.keys(parsed));
    expect(piped.output()).not.toContain("\u001b[");
  }, 60_000);

  it("examples/egressgate.service restarts on failure, runs as a dynamic user with the CA in its state directory, and raises the open-file limit", () => {
    const unit = readFileSync(join(root, "examples/egressgate.service"), "utf8");
    for (const line of ["Restart=on-failure", "DynamicUser=yes", "StateDirectory=egressgate", "LimitNOFILE=65536"]) expect(unit).toContain(`\n${line}\n`);
    expect(unit).toContain("--ca-dir ${STATE_DIRECTORY}");
  });

  // systemd-analyze is absent from most containers and macOS: the lint runs where systemd is.
  it.skipIf(!hasSystemdAnalyze)("systemd-analyze verify accepts examples/egressgate.service without a warning", () => {
    // verify exits 0 on a bad value and only warns on stderr: the test wants no output at all.
    const result = spawnSync("systemd-analyze", ["verify", join(root, "examples/egressgate.service")], { encoding: "utf8" });
    expect(result.stderr).toBe("");
    expect(result.status).toBe(0);
  });
});
