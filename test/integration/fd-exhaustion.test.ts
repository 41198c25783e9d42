// The proxy out of file descriptors (EMFILE) anywhere but at accept, each in a process of its own
// under a low open-file limit (prlimit), so the runner keeps its own. The table's rows run the CLI
// and have guests connect until every descriptor it may open is taken (an accepted connection
// holds one, and libuv accepts and closes any past the last), make it need one more at one place,
// and check what the guest is answered and what the log says; then the guests go, and the proxy
// must serve as before without a restart. The rest lower a running process's soft limit
// (`prlimit --pid`) to exactly what it holds, for what guests cannot reach: a --workers worker or
// primary, a reload, an embedder's createDjsHooks.
import { execFile, execFileSync } from "node:child_process";
import { readdirSync, writeFileSync } from "node:fs";
import { createServer, type RequestListener } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { describe, expect, it, onTestFinished } from "vitest";
import { linesOf, startCli, type Cli } from "../helpers/cli-process.js";
import { shellDecider, startDecisionServer } from "../helpers/deciders.js";
import { eventually } from "../helpers/fifo.js";
import { startH2Upstream } from "../helpers/h2-upstream.js";
import { childPids } from "../helpers/processes.js";
import { tempDir } from "../helpers/proxy.js";
import { openRaw, type RawClient, type RawResponse } from "../helpers/raw.js";
import { testCa } from "../helpers/test-ca.js";

/** The proxy's open-file limit: room for what it opens at start, and a few dozen guests. */
const openFiles = 128;

/** Descriptors of a process below the limit (those above it, inherited from the runner, do not count). */
function heldBy(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).filter((fd) => Number(fd) < openFiles).length;
}

interface LimitedProxy {
  readonly cli: Cli;
  readonly port: number;
}

/** The CLI under the limit, with a connection limit past it: guests can take every descriptor. */
async function startLimitedCli(args: readonly string[]): Promise<LimitedProxy> {
  const limits = args.includes("--config") ? [] : ["--max-connections", "100000", "--max-connections-per-source", "100000"];
  const cli = startCli(["--listen", "127.0.0.1:0", "--log-format", "json", ...limits, ...args], undefined, [], openFiles);
  await cli.until("the listening line", () => linesOf(cli.stderr(), args.includes("--workers") ? "workers listening" : "listening").length > 0);
  return { cli, port: Number(new URL(String(linesOf(cli.stderr(), "listening")[0]!["url"])).port) };
}

/**
 * Guests connect until the proxy (`pid`) holds every descriptor it may open. Returns the guests,
 * to be closed to give the descriptors back.
 */
async function takeEveryDescriptor(port: number, pid: number): Promise<RawClient[]> {
  const guests: RawClient[] = [];
  for (let free = openFiles - heldBy(pid); free > 0; free = openFiles - heldBy(pid)) {
    const before = heldBy(pid);
    const batch = await Promise.all(Array.from({ length: free }, () => openRaw(port)));
    guests.push(...batch);
    await eventually(() => heldBy(pid) === openFiles || heldBy(pid) - before >= batch.filter((guest) => !guest.isClosed).length, "the proxy to accept the guests");
  }
  return guests;
}

async function giveBack(pid: number, guests: readonly RawClient[]): Promise<void> {
  for (const guest of guests) guest.socket.destroy();
  await eventually(() => heldBy(pid) <= openFiles - guests.length / 2, "the proxy to close the guests' connections");
}

/** A plain upstream whose idle keep-alive connections stay: one it closed mid-row would free a descriptor. */
async function plainUpstream(listener: RequestListener): Promise<number> {
  const server = createServer(listener);
  server.keepAliveTimeout = 0;
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => new Promise<void>((resolve) => (server.closeAllConnections(), server.close(() => resolve()))));
  return (server.address() as AddressInfo).port;
}

async function ask(guest: RawClient, url: string): Promise<RawResponse> {
  guest.write(`GET ${url} HTTP/1.1\r\nHost: ${new URL(url).host}\r\n\r\n`);
  return guest.readResponse();
}

interface Upstreams {
  /** Plain HTTP/1.1: `/hop` redirects to b.test, anything else answers `hello PATH`. */
  readonly h1: number;
  /** HTTP/2 over TLS (api.test, api2.test): `/echo`, and `/goaway`, which ends the session past stream 1. */
  readonly h2: number;
  readonly caFile: string;
  readonly webhook: string;
}

async function startUpstreams(): Promise<Upstreams> {
  const h1 = await plainUpstream((req, res) => {
    if (req.url === "/hop") res.writeHead(302, { location: `http://b.test:${req.socket.localPort}/landed` }).end();
    else res.end(`hello ${req.url}`);
  });
  const h2 = await startH2Upstream({ "/goaway": (stream) => stream.session!.goaway(0, 1) }, ["api.test", "api2.test"]);
  const caFile = join(tempDir(), "upstream-ca.pem");
  writeFileSync(caFile, (await testCa()).certPem);
  // A webhook that closes each connection, so every decision needs a new one.
  const webhook = await startDecisionServer((_body, _req, res) => res.writeHead(200, { "content-type": "application/json", connection: "close" }).end("{}"));
  return { h1, h2: h2.port, caFile, webhook: webhook.url };
}

interface Row {
  readonly place: string;
  readonly args: (up: Upstreams) => string[];
  /** Asked before the descriptors are taken: what the row's request needs already open (a pooled connection, a session). */
  readonly warm?: (up: Upstreams) => string;
  /** Asked while every descriptor is taken. */
  readonly url: (up: Upstreams) => string;
  readonly status: number;
  /** What the answer's body names. */
  readonly says: RegExp;
  /** Asked once the descriptors are back: 200. */
  readonly after?: (up: Upstreams) => string;
}

const names = ["a.test", "b.test", "api.test", "api2.test"].flatMap((name) => ["--resolve", `${name}=127.0.0.1`]);
const base = (up: Upstreams): string[] => ["--upstream-ca", up.caFile, "--allow-internal-host", "*.test", ...names];

const rows: Row[] = [
  {
    place: "an HTTP/1.1 upstream connect",
    args: base,
    url: (up) => `http://b.test:${up.h1}/x`,
    status: 502,
    says: /^502 Bad Gateway: upstream request failed for b\.test:\d+: EMFILE$/,
  },
  {
    place: "an HTTP/2 upstream connect",
    args: base,
    url: (up) => `https://api2.test:${up.h2}/echo`,
    status: 502,
    says: /^502 Bad Gateway: upstream request failed for api2\.test:\d+: EMFILE$/,
  },
  {
    place: "a redirect hop's connect",
    args: base,
    warm: (up) => `http://a.test:${up.h1}/warm`,
    url: (up) => `http://a.test:${up.h1}/hop`,
    status: 502,
    says: /^502 Bad Gateway: upstream request failed for b\.test:\d+: EMFILE$/,
    after: (up) => `http://a.test:${up.h1}/hop`,
  },
  {
    place: "the retry on a new HTTP/2 session after GOAWAY",
    args: base,
    warm: (up) => `https://api.test:${up.h2}/echo`,
    url: (up) => `https://api.test:${up.h2}/goaway`,
    status: 502,
    says: /^502 Bad Gateway: upstream request failed for api\.test:\d+: EMFILE$/,
    after: (up) => `https://api.test:${up.h2}/echo`,
  },
  {
    place: "a lookup by the system resolver (localhost)",
    args: (up) => [...base(up), "--allow-internal-host", "localhost"],
    url: (up) => `http://localhost:${up.h1}/x`,
    status: 502,
    says: /^502 Bad Gateway: cannot resolve host "localhost": EMFILE \(the proxy is out of file descriptors\)$/,
  },
  {
    place: "a command decider (--hook-command)",
    args: (up) => [...base(up), "--hook-command", shellDecider],
    url: (up) => `http://a.test:${up.h1}/x`,
    status: 502,
    says: /^502 Bad Gateway: command:\S+decide\.sh could not decide \(see the proxy log\)$/,
  },
  {
    place: "a webhook decider (--hook-url)",
    args: (up) => [...base(up), "--hook-url", up.webhook],
    url: (up) => `http://a.test:${up.h1}/x`,
    status: 502,
    says: /^502 Bad Gateway: webhook:\S+ could not decide \(see the proxy log\)$/,
  },
];

describe("a proxy out of file descriptors", () => {
  it.each(rows)("at $place answers the guest with the error named, fails closed, and serves again once descriptors are back", async (row) => {
    const up = await startUpstreams();
    const proxy = await startLimitedCli(row.args(up));
    const guest = await openRaw(proxy.port);
    if (row.warm !== undefined) expect((await ask(guest, row.warm(up))).status).toBe(200);
    const others = await takeEveryDescriptor(proxy.port, proxy.cli.pid);

    const answer = await ask(guest, row.url(up));
    expect({ status: answer.status, body: answer.body.trimEnd() }).toMatchObject({ status: row.status, body: expect.stringMatching(row.says) });
    const refused = (): Record<string, unknown>[] => linesOf(proxy.cli.stderr(), "request").filter((line) => line["status"] === row.status);
    await proxy.cli.until("the request's line", () => refused().length > 0);
    expect(JSON.stringify(refused())).toMatch(/EMFILE/);

    await giveBack(proxy.cli.pid, others);
    const served = (row.after ?? row.url)(up);
    expect((await ask(guest, served)).status).toBe(200);
    expect((await ask(await openRaw(proxy.port), served)).status).toBe(200);
    expect(proxy.cli.stderr()).not.toMatch(/"level":"(error|fatal)"/);
  });
});

/**
 * Sets the soft open-file limit of a running process (`prlimit --pid`) so that `free` descriptors
 * are left below it (none: its next one is refused, EMFILE); `to` sets it back. The hard limit
 * stays: raising it again would take CAP_SYS_RESOURCE.
 */
function exhaust(pid: number, options: { free?: number; to?: number } = {}): void {
  let limit = options.to;
  if (limit === undefined) {
    const used = new Set(readdirSync(`/proc/${pid}/fd`).map(Number));
    limit = 0;
    for (let left = options.free ?? 0; used.has(limit) || left-- > 0; limit++);
  }
  execFileSync("prlimit", ["--pid", String(pid), `--nofile=${limit}:${openFiles}`]);
}

describe("an embedder out of file descriptors", () => {
  it("createDjsHooks fails at once naming EMFILE, rather than holding the event loop for the load's 30 s, and loads once descriptors are back", async () => {
    const fixture = fileURLToPath(new URL("../fixtures/djs-at-fd-limit.ts", import.meta.url));
    const { stdout } = await promisify(execFile)(process.execPath, ["--import", "tsx", fixture, tempDir()], { timeout: 60_000 });
    expect(JSON.parse(stdout)).toEqual({
      whileFull: expect.stringMatching(/\/policy\.ts: cannot start the policy's worker thread: the process is out of file descriptors \(EMFILE\)$/),
      after: "added",
      guests: ["a", "b"],
    });
  }, 60_000);
});

describe("a reload out of file descriptors", () => {
  it("a --watch reload that could not read the config file is tried again, and applies once descriptors are back", async () => {
    const up = await startUpstreams();
    const config = join(tempDir(), "egressgate.yaml");
    const allowing = (host: string): void =>
      writeFileSync(config, `allowInternalHosts: ["${host}"]\nresolve: { a.test: [127.0.0.1], b.test: [127.0.0.1] }\nlimits: { connections: 100000, connectionsPerSource: 100000 }\n`);
    allowing("a.test");
    const proxy = await startLimitedCli(["--config", config, "--watch"]);
    const guest = await openRaw(proxy.port);
    expect((await ask(guest, `http://a.test:${up.h1}/warm`)).status).toBe(200);
    expect((await ask(guest, `http://b.test:${up.h1}/x`)).status).toBe(403);

    exhaust(proxy.cli.pid);
    allowing("b.test");
    await proxy.cli.until("the failed reload", () => linesOf(proxy.cli.stderr(), "reload failed; the old configuration keeps serving").length > 0);
    expect(linesOf(proxy.cli.stderr(), "reload failed; the old configuration keeps serving")[0]).toMatchObject({ error: expect.stringMatching(/cannot read the config file: EMFILE/), retryInS: 5 });
    exhaust(proxy.cli.pid, { to: openFiles });
    // No change to the file: the retry alone reads it.
    await proxy.cli.until("the reload", () => linesOf(proxy.cli.stderr(), "configuration reloaded").length > 0);
    expect((await ask(guest, `http://b.test:${up.h1}/x`)).status).toBe(200);
    expect((await ask(guest, `http://a.test:${up.h1}/warm`)).status).toBe(403);
  });

  it("a tier-2 policy whose worker cannot start fails the reload with the reason, and the next reload applies", async () => {
    const up = await startUpstreams();
    const policy = join(tempDir(), "policy.ts");
    const blocking = (path: string): void => writeFileSync(policy, `export function isRequestAllowed(request: Request): boolean {\n  return !request.url.endsWith(${JSON.stringify(path)});\n}\n`);
    blocking("/blocked");
    const proxy = await startLimitedCli([...base(up), "--hooks-script", policy]);
    const guest = await openRaw(proxy.port);
    expect((await ask(guest, `http://a.test:${up.h1}/warm`)).status).toBe(200);
    expect((await ask(guest, `http://a.test:${up.h1}/blocked`)).status).toBe(403);

    blocking("/blocked2");
    // Room to read the files, none for a worker thread's event loop.
    exhaust(proxy.cli.pid, { free: 2 });
    process.kill(proxy.cli.pid, "SIGHUP");
    await proxy.cli.until("the failed reload", () => linesOf(proxy.cli.stderr(), "reload failed; the old configuration keeps serving").length > 0);
    const [failed] = linesOf(proxy.cli.stderr(), "reload failed; the old configuration keeps serving");
    expect(failed!["error"]).toMatch(/policy\.ts: the policy's worker thread stopped before the policy loaded: .*EMFILE/);
    expect((await ask(guest, `http://a.test:${up.h1}/blocked`)).status).toBe(403);

    exhaust(proxy.cli.pid, { to: openFiles });
    process.kill(proxy.cli.pid, "SIGHUP");
    await proxy.cli.until("the reload", () => linesOf(proxy.cli.stderr(), "configuration reloaded").length > 0);
    expect((await ask(guest, `http://a.test:${up.h1}/blocked`)).status).toBe(200);
    expect((await ask(guest, `http://a.test:${up.h1}/blocked2`)).status).toBe(403);
  });
});

describe("--workers 2 out of file descriptors", () => {
  it("a worker that a connection handed to it cannot reach is replaced, and guests are served before and after descriptors are back", async () => {
    const up = await startUpstreams();
    const proxy = await startLimitedCli(["--workers", "2", ...base(up)]);
    const workers = childPids(proxy.cli.pid);
    expect(workers).toHaveLength(2);
    for (const worker of workers) exhaust(worker);
    // node:cluster's round robin hands the first to one worker and the second to the other: the
    // descriptor of each is dropped on the way in. Without a replacement both workers were out of
    // the rotation for good, and every later guest waited for an answer that never came.
    const lost = [await openRaw(proxy.port), await openRaw(proxy.port)];
    for (const guest of lost) guest.write(`GET http://a.test:${up.h1}/lost HTTP/1.1\r\nHost: a.test\r\n\r\n`);
    const late = await openRaw(proxy.port);
    expect((await ask(late, `http://a.test:${up.h1}/late`)).status).toBe(200);
    await proxy.cli.until("both workers replaced", () => linesOf(proxy.cli.stderr(), "a replaced worker closed").length === 2);
    for (const worker of workers) expect(() => process.kill(worker, 0)).toThrow();
    const lostLines = linesOf(proxy.cli.stderr(), "a worker can be handed no more connections (it ran out of file descriptors); starting another in its place, then it drains");
    expect(lostLines.map((line) => line["worker"]).sort()).toEqual([...workers].sort());
    expect(linesOf(proxy.cli.stderr(), "worker replaced")).toHaveLength(2);
    expect(proxy.cli.stderr()).not.toMatch(/too often to replace|"level":"fatal"/);

    const now = childPids(proxy.cli.pid);
    expect(now).toHaveLength(2);
    for (let i = 0; i < 4; i++) expect((await ask(await openRaw(proxy.port), `http://a.test:${up.h1}/fresh${i}`)).status).toBe(200);
    process.kill(proxy.cli.pid, "SIGTERM");
    expect(await proxy.cli.exited).toEqual({ code: 0, signal: null });
  });

  it("a replacement the primary cannot fork is tried again and forked once it has descriptors, and SIGTERM still ends it", async () => {
    const up = await startUpstreams();
    const proxy = await startLimitedCli(["--workers", "2", ...base(up)]);
    const [gone, staying] = childPids(proxy.cli.pid) as [number, number];
    exhaust(proxy.cli.pid);
    process.kill(gone, "SIGKILL");
    await proxy.cli.until("the failed fork's line", () => linesOf(proxy.cli.stderr(), "a replacement worker could not start; trying again").length > 0);
    expect(linesOf(proxy.cli.stderr(), "a replacement worker could not start; trying again")[0]).toMatchObject({ error: expect.stringMatching(/EMFILE/), serving: 1, retryInS: 5 });
    // The other worker serves meanwhile.
    for (let i = 0; i < 2; i++) expect((await ask(await openRaw(proxy.port), `http://a.test:${up.h1}/meanwhile${i}`)).status).toBe(200);
    exhaust(proxy.cli.pid, { to: openFiles });
    await proxy.cli.until("the replacement", () => linesOf(proxy.cli.stderr(), "worker replaced").length > 0);
    const now = childPids(proxy.cli.pid);
    expect(now).toHaveLength(2);
    expect(now).toContain(staying);
    process.kill(proxy.cli.pid, "SIGTERM");
    expect(await proxy.cli.exited).toEqual({ code: 0, signal: null });
  });
});
