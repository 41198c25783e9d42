import { request as httpRequest } from "node:http";
import inspector from "node:inspector";
import { join } from "node:path";
import { describe, expect, it, onTestFinished } from "vitest";
import { linesOf, startCli } from "../helpers/cli-process.js";
import { descendantPids } from "../helpers/processes.js";
import { startTestProxy, tempDir } from "../helpers/proxy.js";

/** A plain-HTTP request in absolute form through the proxy at `proxyPort`: its status and body. */
function viaProxy(proxyPort: number, target: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: "127.0.0.1", port: proxyPort, path: target, headers: { host: new URL(target).host, connection: "close" } }, (res) => {
      let body = "";
      res.setEncoding("utf8").on("data", (chunk: string) => (body += chunk));
      res.on("end", () => resolve({ status: res.statusCode!, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

const listening = /egressgate listening on http:\/\/127\.0\.0\.1:(\d+)\n/;
const debuggerListening = /Debugger listening on ws:\/\/127\.0\.0\.1:(\d+)\//g;
const nothingToReopen = "SIGUSR1: no audit log to reopen";

// Node's own meaning of SIGUSR1 is "open the inspector", which runs any code sent to it inside the
// proxy (its secrets, ca.key). Without --audit-log the CLI left it that way, and logrotate's
// postrotate (`systemctl kill -s USR1`, as the README had it) opened it; a guest allowed to reach
// loopback then reached the inspector through the proxy, its WebSocket through the upgrade relay
// (black-box finding). An inspector that opens says so on stderr: "Debugger listening on …", or
// "Starting inspector on 127.0.0.1:9229 failed" where the port is taken. One process gets
// --inspect-port=127.0.0.1:0, whatever 9229 holds; node:cluster would give a --workers primary's
// workers ports 1 and 2 from it, which they refuse to start with, so those keep 9229.
const inspectorOpened = /Debugger listening|Starting inspector/;
describe("SIGUSR1 without --audit-log", { timeout: 180_000 }, () => {
  it.each([[[]], [["--workers", "2"]]])("is logged as nothing to reopen, opens no inspector, and the proxy goes on serving (flags %j)", async (extra) => {
    const args = ["--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "info", "--ca-dir", join(tempDir(), "ca"), ...extra];
    const cli = startCli(args, extra.length > 0 ? undefined : "--inspect-port=127.0.0.1:0");
    await cli.until("the listening line", () => listening.test(cli.stdout()));
    const port = Number(listening.exec(cli.stdout())![1]);
    const workers = extra.length > 0 ? descendantPids(cli.pid) : [];
    expect(workers).toHaveLength(extra.length > 0 ? 2 : 0);
    // The primary, and each worker signalled alone (logrotate may name any pid of the unit).
    for (const [i, pid] of [cli.pid, ...workers].entries()) {
      process.kill(pid, "SIGUSR1");
      await cli.until("SIGUSR1 handled", () => linesOf(cli.stderr(), nothingToReopen).length > i || inspectorOpened.test(cli.stderr()));
    }
    expect(cli.stderr()).not.toMatch(inspectorOpened);
    expect(linesOf(cli.stderr(), nothingToReopen)).toHaveLength(1 + workers.length);
    expect((await viaProxy(port, "http://api.test/")).status).toBe(403);
    for (const pid of [cli.pid, ...workers]) process.kill(pid, 0);
    process.kill(cli.pid, "SIGTERM");
    expect(await cli.exited).toEqual({ code: 0, signal: null });
  });
});

describe("Node's inspector, when open, is one of the proxy's own addresses", { timeout: 180_000 }, () => {
  it("a CLI started with --inspect=127.0.0.1:0 refuses its inspector's port with 403, with 127.0.0.1 allowed", async () => {
    const cli = startCli(["--listen", "127.0.0.1:0", "--log-level", "warn", "--ca-dir", join(tempDir(), "ca"), "--allow-internal-host", "127.0.0.1"], "--inspect=127.0.0.1:0");
    await cli.until("the listening line", () => listening.test(cli.stdout()));
    const port = Number(listening.exec(cli.stdout())![1]);
    const inspectorPort = Number([...cli.stderr().matchAll(debuggerListening)][0]![1]);
    const refused = await viaProxy(port, `http://127.0.0.1:${inspectorPort}/json/list`);
    expect(refused.status).toBe(403);
    expect(refused.body).toMatch(/own/);
    expect(refused.body).not.toMatch(/webSocketDebuggerUrl/);
  });

  // node:cluster gave every worker an inspector of its own (the primary's port plus 1, 2, …),
  // which runs any code sent to it in a process holding the secrets and the CA's key; a worker
  // refuses its own and the primary's, not its siblings', so a guest allowed 127.0.0.1 got
  // /json/list of one worker's inspector through the other on every second connection (helper
  // finding, eleventh session). The workers now get no inspector options; the primary keeps its own.
  it.each([
    ["NODE_OPTIONS=--inspect=127.0.0.1:0", "--inspect=127.0.0.1:0", []],
    ["node --inspect=127.0.0.1:0", undefined, ["--inspect=127.0.0.1:0"]],
  ] as const)("with --workers under %s, only the primary opens an inspector, which every worker refuses as a target, and the primary says so", async (_how, nodeOptions, nodeArgs) => {
    const cli = startCli(["--listen", "127.0.0.1:0", "--log-level", "info", "--ca-dir", join(tempDir(), "ca"), "--allow-internal-host", "127.0.0.1", "--workers", "2"], nodeOptions, nodeArgs);
    await cli.until("the listening line", () => listening.test(cli.stdout()));
    // Each worker writes its inspector's line, when it opens one, before its own listening line.
    await cli.until("both workers' listening lines", () => linesOf(cli.stderr(), "listening").length === 2);
    const port = Number(listening.exec(cli.stdout())![1]);
    const inspectors = [...cli.stderr().matchAll(debuggerListening)].map((match) => Number(match[1]));
    expect(inspectors).toHaveLength(1);
    expect(linesOf(cli.stderr(), "--workers: the workers run without Node's inspector; the primary keeps its own")).toEqual([
      expect.objectContaining({ level: "warn", options: ["--inspect=127.0.0.1:0"] }),
    ]);
    // A new connection each, which the primary hands to the workers in turn.
    for (let i = 0; i < 4; i++) expect((await viaProxy(port, `http://127.0.0.1:${inspectors[0]!}/json/list`)).status).toBe(403);
  });

  it("with --workers under NODE_OPTIONS=--inspect-port=127.0.0.1:0, the workers start and open no inspector", async () => {
    // node:cluster gave them --inspect-port=1 and 2 from the primary's port 0, which Node refuses
    // to start with ("must be 0 or in range 1024 to 65535"): the workers could not start.
    const cli = startCli(["--listen", "127.0.0.1:0", "--log-level", "info", "--ca-dir", join(tempDir(), "ca"), "--workers", "2"], "--inspect-port=127.0.0.1:0");
    await cli.until("the listening line", () => listening.test(cli.stdout()));
    await cli.until("both workers' listening lines", () => linesOf(cli.stderr(), "listening").length === 2);
    expect(cli.stderr()).not.toMatch(inspectorOpened);
    expect((await viaProxy(Number(listening.exec(cli.stdout())![1]), "http://api.test/")).status).toBe(403);
  });

  it("startProxy refuses the embedding process's inspector, opened after the proxy started", async () => {
    const proxy = await startTestProxy({ allowedInternalHosts: ["127.0.0.1"] });
    inspector.open(0, "127.0.0.1", false);
    onTestFinished(() => inspector.close());
    const inspectorPort = Number(new URL(inspector.url()!).port);
    const refused = await viaProxy(proxy.port, `http://127.0.0.1:${inspectorPort}/json/version`);
    expect(refused.status).toBe(403);
    expect(refused.body).toMatch(/own/);
    inspector.close();
    // Closed, it is nobody's address: the request goes to the port (and finds nothing there).
    expect((await viaProxy(proxy.port, `http://127.0.0.1:${inspectorPort}/json/version`)).status).toBe(502);
  });
});
