import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import type { CheckReport } from "../../src/cli/check.js";
import { guestPlaceholderKey } from "../../src/config/build.js";
import { createHttpHooks } from "../../src/hooks/http-hooks.js";
import { loadPolicy } from "../helpers/djs.js";
import { startTestProxy, tempDir } from "../helpers/proxy.js";
import { openRaw } from "../helpers/raw.js";
import { startUpstream } from "../helpers/upstream.js";

const root = fileURLToPath(new URL("../../", import.meta.url));

/** Runs the built `egressgate check …`, as the other CLI tests do (test/global-setup.ts keeps dist current); nothing listens, nothing is sent. */
function check(args: readonly string[], env: Record<string, string> = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const home = tempDir();
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["dist/cli/bin.js", "check", ...args], {
      cwd: root,
      env: { PATH: process.env["PATH"] ?? "", HOME: home, XDG_CONFIG_HOME: home, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    child.once("error", reject);
    child.once("exit", (code) => resolve({ code, stdout, stderr }));
  });
}

async function checkJson(args: readonly string[], env: Record<string, string> = {}): Promise<{ code: number | null; report: CheckReport }> {
  const run = await check([...args, "--json"], env);
  expect(run.stderr).toBe("");
  return { code: run.code, report: JSON.parse(run.stdout) as CheckReport };
}

describe("egressgate check", () => {
  it("allows a request the allowlist matches, printing the allowlist step, the pinned resolution, the address verdict and where it would go", async () => {
    const run = await check(["GET", "https://api.example.test/user", "--allow-internal-host", "api.example.test", "--resolve", "api.example.test=10.1.2.3"]);
    expect(run.code).toBe(0);
    expect(run.stdout).toContain('declarative allowlist (declarative): allow — host "api.example.test" matches "api.example.test"');
    expect(run.stdout).toContain("api.example.test: 10.1.2.3");
    expect(run.stdout).toMatch(/10\.1\.2\.3: allowed \(allowedInternalHosts:api\.example\.test\)/);
    expect(run.stdout).toContain("would send: GET https://api.example.test/user to 10.1.2.3 (nothing was sent)");
    expect(run.stdout).toMatch(/answer: ALLOWED/);
  });

  it("denies a host outside the allowlist with exit 1, naming the rule, before any resolution", async () => {
    const { code, report } = await checkJson(["GET", "https://evil.test/", "--allow-host", "api.github.com", "--no-dns"]);
    expect(code).toBe(1);
    expect(report.steps).toEqual([expect.objectContaining({ source: "declarative", phase: "allowlist", decision: "block", status: 403 })]);
    expect(report.resolution).toEqual([]);
    expect(report.answer).toMatchObject({ allowed: false, status: 403, code: "EG_DENIED" });
    expect(report.answer.reason).toContain('host "evil.test" is not in allowedHosts');
  });

  it("denies by a tier-2 policy, naming the policy's step, and runs the response phase on --response", async () => {
    const dir = tempDir();
    const policy = join(dir, "policy.js");
    writeFileSync(
      policy,
      `function isRequestAllowed(request) { return request.method === "GET"; }
function onResponse(response) { if (response.headers.get("x-bad") === "1") return new Response("rewritten", { status: 451 }); }
`,
    );
    const flags = ["--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--hooks-script", policy, "--no-dns"];
    const denied = await checkJson(["POST", "https://api.test/x", ...flags]);
    expect(denied.code).toBe(1);
    expect(denied.report.steps).toContainEqual(expect.objectContaining({ source: policy, phase: "isRequestAllowed", decision: "block" }));
    expect(denied.report.answer).toMatchObject({ allowed: false, status: 403 });
    const answered = await checkJson(["GET", "https://api.test/x", ...flags, "--response", "200", "-R", "x-bad: 1"]);
    expect(answered.code).toBe(0);
    expect(answered.report.steps.map((step) => `${step.source.replace(dir, "")}:${step.phase}:${step.decision}`)).toEqual([
      "/policy.js:isRequestAllowed:allow",
      "declarative:allowlist:allow",
      "/policy.js:onResponse:rewrite",
    ]);
    expect(answered.report.answer).toMatchObject({ allowed: true, status: 451 });
  });

  // The answer said "see the proxy log", and check has none: a policy author saw no cause.
  it("shows a failing policy's error and its console lines, redacted, where the proxy would log them", async () => {
    const dir = tempDir();
    const policy = join(dir, "policy.mjs");
    writeFileSync(
      policy,
      `export function isRequestAllowed(request) {
  console.log("saw", request.headers.get("authorization"));
  throw new TypeError("no rule for " + request.headers.get("authorization"));
}
`,
    );
    const flags = ["--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--host-secret", "GH_TOKEN@api.test", "--hooks-script", policy, "--no-dns", "-H", "Authorization: Bearer {{GH_TOKEN}}"];
    const env = { GH_TOKEN: "ghp_realvalue123456" };
    const { code, report } = await checkJson(["GET", "https://api.test/", ...flags], env);
    expect(code).toBe(1);
    expect(report.answer).toMatchObject({ allowed: false, status: 502, code: "EG_HOOK_FAILED" });
    expect(report.answer.detail).toMatch(/^TypeError \(.*policy\.mjs\): no rule for Bearer \[REDACTED:GH_TOKEN\]$/);
    expect(report.log).toEqual([expect.objectContaining({ msg: "policy console", text: "saw Bearer [REDACTED:GH_TOKEN]" })]);
    const text = await check(["GET", "https://api.test/", ...flags], env);
    expect(text.stdout).toMatch(/\n {2}detail: TypeError \(.*policy\.mjs\): no rule for Bearer \[REDACTED:GH_TOKEN\]\nlog:\n {2}\{.*"text":"saw Bearer \[REDACTED:GH_TOKEN\]"\}\n$/);
    for (const printed of [JSON.stringify(report), text.stdout]) expect(printed).not.toContain("ghp_realvalue123456");
  });

  it("refuses a secret's placeholder sent to a host outside its hosts, and never prints the value", async () => {
    const { code, report } = await checkJson(
      ["GET", "https://api.test/", "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--host-secret", "GH_TOKEN@api.github.com", "-H", "Authorization: Bearer {{GH_TOKEN}}"],
      { GH_TOKEN: "ghp_realvalue123456" },
    );
    expect(code).toBe(1);
    expect(report.steps).toContainEqual(expect.objectContaining({ source: "declarative", phase: "secrets", decision: "block" }));
    expect(report.answer.reason).toContain("GH_TOKEN");
    expect(JSON.stringify(report)).not.toContain("ghp_realvalue123456");
  });

  // A typo in {{NAME}} was sent as the literal text: the check then had no placeholder in it, and
  // answered that the request could go.
  it.each([
    ["a name the guest holds no secret by", ["--host-secret", "GH_TOKEN@api.github.com"], "{{GH_TOKN}}", /\{\{GH_TOKN\}\} names no secret of guest "default" \(it holds GH_TOKEN\)/],
    ["a guest with no secrets", [], "{{GH_TOKEN}}", /\{\{GH_TOKEN\}\} names no secret of guest "default" \(it holds none\)/],
    ["an environment variable that is not a secret", ["--host-secret", "GH_TOKEN@api.github.com"], "{{HTTPS_PROXY}}", /\{\{HTTPS_PROXY\}\} names no secret/],
  ])("-H with {{NAME}} for %s is a usage error (exit 2), not text to send", async (_label, flags, reference, message) => {
    const run = await check(["GET", "https://api.test/", "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", ...flags, "-H", `Authorization: Bearer ${reference}`], { GH_TOKEN: "ghp_realvalue123456" });
    expect(run.code).toBe(2);
    expect(run.stdout).toBe("");
    expect(run.stderr).toMatch(message);
    expect(run.stderr).not.toContain("ghp_realvalue123456");
  });

  it("refuses another guest's placeholder, as the proxy serving both guests does", async () => {
    const key = "k".repeat(40);
    const file = join(tempDir(), "egressgate.yaml");
    writeFileSync(
      file,
      `resolve: { api.test: [127.0.0.1] }
guests:
  a:
    allowInternalHosts: [api.test]
    secrets: { A_TOKEN: { hosts: [api.test], value: env:A_TOKEN } }
  b:
    allowInternalHosts: [api.test]
    secrets: { B_TOKEN: { hosts: [api.test], value: env:B_TOKEN } }
`,
    );
    // b's placeholder as b's environment has it: the CLI derives each guest's from the key.
    const placeholderOfB = createHttpHooks({ secrets: { B_TOKEN: { hosts: ["api.test"], value: "unused" } }, secretPlaceholderKey: guestPlaceholderKey(key, "b") }).env["B_TOKEN"]!;
    const env = { EGRESSGATE_PLACEHOLDER_KEY: key, A_TOKEN: "a-real-value-1234", B_TOKEN: "b-real-value-5678" };
    const own = await checkJson(["--config", file, "--guest", "b", "GET", "https://api.test/", "-H", "Authorization: Bearer {{B_TOKEN}}"], env);
    expect(own.code).toBe(0);
    expect(own.report.wouldSend).toHaveLength(1);
    for (const where of [["GET", "https://api.test/", "-H", `Authorization: Bearer ${placeholderOfB}`], ["GET", `https://api.test/x?t=${placeholderOfB}`]]) {
      const { code, report } = await checkJson(["--config", file, "--guest", "a", ...where], env);
      expect(code).toBe(1);
      expect(report.steps).toContainEqual(expect.objectContaining({ source: "declarative", phase: "secrets", decision: "block" }));
      expect(report.answer).toMatchObject({ allowed: false, status: 403 });
      expect(report.answer.reason).toContain('the request carries the placeholder of secret "B_TOKEN", which this guest does not hold');
      expect(report.wouldSend).toEqual([]);
    }
  });

  it("refuses an internal address after resolution, with the address verdict", async () => {
    const { code, report } = await checkJson(["GET", "http://metadata.test/latest", "--allow-host", "*", "--resolve", "metadata.test=169.254.169.254"]);
    expect(code).toBe(1);
    expect(report.resolution).toEqual([{ host: "metadata.test", addresses: ["169.254.169.254"] }]);
    expect(report.addresses).toEqual([expect.objectContaining({ ip: "169.254.169.254", allowed: false })]);
    expect(report.steps.at(-1)).toMatchObject({ phase: "address", decision: "block" });
    expect(report.wouldSend).toEqual([]);
  });

  it("refuses the proxy's own listening address, as the proxy started with the same flags does", async () => {
    const flags = ["--allow-internal-host", "127.0.0.1", "--allow-internal-host", "self.test", "--resolve", "self.test=127.0.0.2"];
    const own = await checkJson(["GET", "http://127.0.0.1:8080/", "--listen", "127.0.0.1:8080", ...flags]);
    expect(own.code).toBe(1);
    expect(own.report.addresses).toEqual([expect.objectContaining({ ip: "127.0.0.1", allowed: false, rule: "self" })]);
    expect(own.report.answer).toMatchObject({ allowed: false, status: 403, code: "EG_DENIED" });
    expect(own.report.answer.reason).toContain("egressgate's own listening address (port 8080)");
    // Any loopback address reaches a loopback listener, by name too.
    const named = await checkJson(["GET", "http://self.test:8080/", "--listen", "127.0.0.1:8080", ...flags]);
    expect(named.report.answer).toMatchObject({ allowed: false, status: 403 });
    expect(named.report.answer.reason).toContain('host "self.test" resolves to egressgate\'s own listening address');
    // Another port is not the proxy's; nor is any with port 0, which the proxy picks when it starts.
    expect((await checkJson(["GET", "http://127.0.0.1:8081/", "--listen", "127.0.0.1:8080", ...flags])).report.answer.allowed).toBe(true);
    expect((await checkJson(["GET", "http://127.0.0.1:8080/", "--listen", "127.0.0.1:0", ...flags])).report.answer.allowed).toBe(true);
  });

  it("refuses a config file's listen and metricsListen addresses as the proxy's own", async () => {
    const file = join(tempDir(), "egressgate.yaml");
    writeFileSync(file, "listen: 127.0.0.1:3128\nmetricsListen: 127.0.0.1:9464\nallowInternalHosts: [127.0.0.1]\n");
    for (const port of [3128, 9464]) {
      const { code, report } = await checkJson(["--config", file, "GET", `http://127.0.0.1:${port}/`]);
      expect(code).toBe(1);
      expect(report.answer.reason).toContain(`egressgate's own listening address (port ${port})`);
    }
    // --listen overrides the file's, as when serving.
    expect((await checkJson(["--config", file, "--listen", "127.0.0.1:3129", "GET", "http://127.0.0.1:3128/"])).report.answer.allowed).toBe(true);
  });

  // What the proxy answers before any tier runs: check must answer the same, not run the pipeline.
  it.each([
    ["CONNECT", 405, "EG_METHOD_NOT_ALLOWED", "CONNECT inside a tunnel is not allowed"],
    ["TRACE", 405, "EG_METHOD_NOT_ALLOWED", "method TRACE is not allowed"],
    ["TRACK", 405, "EG_METHOD_NOT_ALLOWED", "method TRACK is not allowed"],
    ["GE T", 400, "EG_BAD_REQUEST", "invalid method"],
    ["GET\r\nX-Injected: 1", 400, "EG_BAD_REQUEST", "invalid method"],
  ])("answers %j as the proxy does: %i %s", async (method, status, code, reason) => {
    const { code: exit, report } = await checkJson([method, "https://api.example.test/", "--allow-internal-host", "api.example.test", "--resolve", "api.example.test=10.1.2.3"]);
    expect(exit).toBe(1);
    expect(report.answer).toMatchObject({ allowed: false, status, code });
    expect(report.answer.reason).toContain(reason);
    expect(report.steps).toEqual([]);
    expect(report.wouldSend).toEqual([]);
  });

  it.each([
    ["a value with a CR", "x-a: 1\rx-b: 2", "x-a"],
    ["a value with a LF", "x-a: 1\nx-b: 2", "x-a"],
    ["a name that is not a token", "x a: 1", "x a"],
  ])("answers 400 for a header with %s, as the proxy's parser does", async (_name, header, named) => {
    const { code, report } = await checkJson(["GET", "https://api.example.test/", "-H", header, "--allow-internal-host", "api.example.test", "--resolve", "api.example.test=10.1.2.3"]);
    expect(code).toBe(1);
    expect(report.answer).toMatchObject({ allowed: false, status: 400, code: "EG_BAD_REQUEST" });
    expect(report.answer.reason).toContain(JSON.stringify(named));
    expect(report.wouldSend).toEqual([]);
  });

  // These said ALLOWED where the proxy answers before any tier (guest-request.ts checkRequestHead).
  it.each([
    ["a Transfer-Encoding other than chunked", ["-H", "Transfer-Encoding: gzip"], 501, 'unsupported Transfer-Encoding "gzip"'],
    ["a Transfer-Encoding with a coding before chunked", ["-H", "Transfer-Encoding: gzip, chunked"], 501, "only chunked is accepted"],
    ["a Content-Length with a leading zero", ["-H", "Content-Length: 010"], 400, 'invalid Content-Length "010"'],
    ["two Content-Lengths", ["-H", "Content-Length: 1", "-H", "Content-Length: 1"], 400, "duplicate Content-Length header"],
    ["both Content-Length and Transfer-Encoding", ["-H", "Content-Length: 3", "-H", "Transfer-Encoding: chunked"], 400, "both Content-Length and Transfer-Encoding"],
    ["two Host headers", ["-H", "Host: api.example.test", "-H", "Host: api.example.test"], 400, "duplicate Host header"],
    ["a Host naming another host than an https URL's", ["-H", "Host: other.test"], 421, 'Host header names "other.test" but the tunnel was opened with CONNECT api.example.test:443'],
    ["an Expect other than 100-continue", ["-H", "Expect: fancy"], 417, 'unsupported Expect: "fancy"'],
    ["more header fields than the proxy takes", Array.from({ length: 257 }, (_, i) => ["-H", `x-f${i}: v`]).flat(), 431, "request head has more than 256 header fields"],
  ])("answers a head with %s as the proxy does", async (_name, flags, status, reason) => {
    const { code, report } = await checkJson(["POST", "https://api.example.test/", ...flags, "--allow-internal-host", "api.example.test", "--resolve", "api.example.test=10.1.2.3"]);
    expect(code).toBe(1);
    expect(report.answer).toMatchObject({ allowed: false, status });
    expect(report.answer.reason).toContain(reason);
    expect(report.steps).toEqual([]);
    expect(report.wouldSend).toEqual([]);
  });

  it("allows the framing and Host the proxy takes, and hands the tiers the fields the proxy hands on", async () => {
    const dir = tempDir();
    const policy = join(dir, "policy.js");
    // The guest's hop-by-hop fields and Expect never reach a tier behind the proxy; Host is the URL's.
    writeFileSync(policy, `function isRequestAllowed(request) { return ["connection", "x-hop", "upgrade", "expect", "proxy-authorization", "transfer-encoding"].every((name) => !request.headers.has(name)) && request.headers.get("x-kept") === "1" && request.headers.get("host") === "api.example.test"; }\n`);
    const { code, report } = await checkJson([
      "POST", "https://API.example.test./",
      "-H", "Transfer-Encoding: chunked", "-H", "Host: api.example.test:443", "-H", "Expect: 100-continue",
      "-H", "Connection: x-hop", "-H", "x-hop: 1", "-H", "Upgrade: websocket", "-H", "Proxy-Authorization: Basic eDp5", "-H", "x-kept: 1",
      "--hooks-script", policy, "--allow-internal-host", "api.example.test", "--resolve", "api.example.test=10.1.2.3",
    ]);
    expect(report.answer.reason).toContain("would be sent upstream");
    expect(code).toBe(0);
    expect((await checkJson(["POST", "https://api.example.test/", "-H", "Content-Length: 10", "--allow-internal-host", "api.example.test", "--resolve", "api.example.test=10.1.2.3"])).code).toBe(0);
  });

  // Black-box finding: check took -H's value as the argument's characters. `☃` (past U+00FF) was
  // refused 400 "invalid header", and `é` reached the tiers as one character; a guest's client
  // sends the UTF-8 bytes, which the proxy forwards and hands the tiers one Latin-1 character each.
  it.each(["é", "☃", "€ 10", "日本語", "😀"])("takes -H 'X-V: %s' as a guest's UTF-8 bytes, judged as the proxy judges them", async (value) => {
    const wire = Buffer.from(value, "utf8").toString("latin1");
    const source = `function isRequestAllowed(request) { return request.headers.get("x-v") === ${JSON.stringify(wire)}; }\n`;
    const upstream = await startUpstream({ tls: false });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [loadPolicy({ source, filename: "policy.js" })] });
    const client = await openRaw(proxy.port);
    client.write(Buffer.concat([Buffer.from(`GET http://api.test:${upstream.port}/echo HTTP/1.1\r\nHost: api.test:${upstream.port}\r\nX-V: `), Buffer.from(value, "utf8"), Buffer.from("\r\n\r\n")]));
    expect((await client.readResponse()).status).toBe(200);
    expect(upstream.seen[0]?.headers["x-v"]).toBe(wire);
    const policy = join(tempDir(), "policy.js");
    writeFileSync(policy, source);
    const { code, report } = await checkJson(["GET", "http://api.test/", "-H", `X-V: ${value}`, "--hooks-script", policy, "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1"]);
    expect(report.answer.reason).toContain("would be sent upstream");
    expect(report.steps).toContainEqual(expect.objectContaining({ source: policy, phase: "isRequestAllowed", decision: "allow" }));
    expect(code).toBe(0);
  });

  // The proxy normalises the host as the guest wrote it (normalizeHost) before any tier runs.
  it.each([
    ["a character no host name has", "https://api.exa$mple.test/", 'invalid host "api.exa$mple.test"'],
    ["an empty label", "https://api.test../", 'invalid host "api.test.."'],
    ["a percent-encoded dot", "https://api%2etest/", 'invalid host "api%2etest"'],
    ["port 0", "https://api.test:0/", "invalid port 0 in request target"],
  ])("answers 400 for a host with %s, as the proxy does", async (_name, url, reason) => {
    // --no-dns: nothing is looked up even where the host would not be refused.
    const { code, report } = await checkJson(["GET", url, "--allow-host", "*", "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--no-dns"]);
    expect(code).toBe(1);
    expect(report.answer).toMatchObject({ allowed: false, status: 400, code: "EG_BAD_REQUEST" });
    expect(report.answer.reason).toContain(reason);
    expect(report.steps).toEqual([]);
    expect(report.wouldSend).toEqual([]);
  });

  it("judges and sends a host the proxy normalises in its normal form (trailing dot, integer IPv4)", async () => {
    const flags = ["--allow-internal-host", "api.test", "--allow-internal-host", "127.0.0.1", "--resolve", "api.test=127.0.0.1"];
    const dotted = await checkJson(["GET", "https://API.test./x", ...flags]);
    expect(dotted.code).toBe(0);
    expect(dotted.report.request.url).toBe("https://api.test/x");
    expect(dotted.report.steps).toEqual([expect.objectContaining({ phase: "allowlist", decision: "allow", reason: 'host "api.test" matches "api.test"' })]);
    expect(dotted.report.wouldSend).toEqual([{ method: "GET", url: "https://api.test/x", address: "127.0.0.1" }]);
    const integer = await checkJson(["GET", "http://2130706433/", ...flags]);
    expect(integer.report.wouldSend).toEqual([{ method: "GET", url: "http://127.0.0.1/", address: "127.0.0.1" }]);
  });

  it("takes one value per flag, so the method and URL may follow the flags (the synopsis's order)", async () => {
    const { code, report } = await checkJson([
      "-H", "x-one: 1", "-H", "x-two: 2", "--response", "200", "-R", "x-up: 1",
      "--allow-internal-host", "api.example.test", "--resolve", "api.example.test=10.1.2.3",
      "POST", "https://api.example.test/items",
    ]);
    expect(code).toBe(0);
    expect(report.request).toEqual({ method: "POST", url: "https://api.example.test/items" });
    expect(report.answer).toMatchObject({ allowed: true, status: 200 });
  });

  // Each of these was taken, and check answered as if it worked (black-box findings): a missing
  // program said DENIED 502 "could not start: ENOENT" in its detail, and a replay's matchHeaders
  // entry that no request can carry matched nothing.
  it("refuses a configuration whose command decider cannot be started, or whose matchHeaders names no header, with exit 2 and the option", async () => {
    const dir = tempDir();
    const missing = join(dir, "missing.yaml");
    writeFileSync(missing, ["allowHosts: [api.test]", "hooks:", "  - command: [no-such-decider-program, --strict]", "  - command: ./gone.sh"].join("\n"));
    const run = await check(["--config", missing, "GET", "https://api.test/", "--no-dns"]);
    expect(run.code).toBe(2);
    expect(run.stdout).toBe("");
    expect(run.stderr).toContain(`${missing}:3: hooks[0].command names the program "no-such-decider-program", which is not an executable file in any folder of PATH`);
    expect(run.stderr).toContain(`${missing}:4: hooks[1].command names ${join(dir, "gone.sh")}, which does not exist`);
    const flags = await check(["--allow-host", "api.test", "--hook-command", "no-such-decider-program", "GET", "https://api.test/", "--no-dns"]);
    expect(flags.code).toBe(2);
    expect(flags.stderr).toContain('--hook-command: names the program "no-such-decider-program"');
    const replay = join(dir, "replay.yaml");
    writeFileSync(replay, ["allowHosts: [api.test]", "upstream:", "  replay:", "    path: rec.har", '    matchHeaders: ["bad header"]'].join("\n"));
    const header = await check(["--config", replay, "GET", "https://api.test/", "--no-dns"]);
    expect(header.code).toBe(2);
    expect(header.stderr).toContain(`${replay}:5: upstream.replay.matchHeaders[0] must be a header name`);
  });

  it("fills ${NAME} in a webhook's URL from the environment, for allowEnv names, and names the decider by the URL as written", async () => {
    const seen: string[] = [];
    const hook = createServer((req, res) => {
      seen.push(req.url ?? "");
      req.resume();
      if (req.url === "/decide") res.writeHead(200, { "content-type": "application/json" }).end('{"decision":"allow"}');
      else res.writeHead(404).end();
    });
    await new Promise<void>((resolve) => hook.listen(0, "127.0.0.1", resolve));
    onTestFinished(() => new Promise<void>((resolve) => hook.close(() => resolve())));
    const { port } = hook.address() as AddressInfo;
    const file = join(tempDir(), "hook.yaml");
    writeFileSync(file, ["allowHosts: [api.test]", "hooks:", `  - webhook: "http://127.0.0.1:${port}/\${HOOK_PATH}"`, "    allowEnv: [HOOK_PATH]"].join("\n"));
    const { code, report } = await checkJson(["--config", file, "GET", "https://api.test/", "--no-dns"], { HOOK_PATH: "decide" });
    expect(seen).toEqual(["/decide"]);
    expect(report.steps[0]).toMatchObject({ source: `webhook:http://127.0.0.1:${port}/\${HOOK_PATH}`, decision: "allow" });
    expect(report.answer.allowed).toBe(true);
    expect(code).toBe(0);
  });

  it("exits 2 on usage errors", async () => {
    expect((await check(["GET", "not a url"])).code).toBe(2);
    expect((await check(["GET"])).code).toBe(2);
    expect((await check(["GET", "https://a.test/", "-R", "x: 1"])).code).toBe(2);
  });
});
