import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { hostname } from "node:os";
import { join } from "node:path";
import { describe, expect, it, onTestFinished } from "vitest";
import { startProxy, type ProxyOptions } from "../../src/index.js";
import { invalidOptionCode } from "../../src/option-error.js";
import { fetchVia, startTestProxy, tempDir } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";

/** This process's open descriptors. */
function openFds(): number {
  return readdirSync("/proc/self/fd").length;
}

async function takenPort(): Promise<Server> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return server;
}

function portOf(server: Server): number {
  return (server.address() as { port: number }).port;
}

async function startError(options: ProxyOptions): Promise<Error> {
  try {
    const proxy = await startProxy(options);
    await proxy.close();
  } catch (error) {
    return error as Error;
  }
  throw new Error("the proxy started");
}

// A start that failed closed its audit log but not its recording: the journal's descriptor stayed
// open, and FILE.har.journal and FILE.har.d/ stayed on disk (black-box finding).
describe("a start that fails with a recording", () => {
  it("keeps no descriptor open and leaves no journal, lock or sidecar folder behind", async () => {
    const dir = tempDir();
    const caDir = tempDir();
    const har = join(dir, "runs", "today.har");
    const blocker = await takenPort();
    const options: ProxyOptions = { caDir, logLevel: "silent", listen: { host: "127.0.0.1", port: portOf(blocker) }, upstream: { record: { path: har } } };
    // The first start makes the CA (its files are closed once made).
    expect(await startError(options)).toMatchObject({ code: "EADDRINUSE" });
    const before = openFds();
    for (let i = 0; i < 5; i++) expect(await startError(options)).toMatchObject({ code: "EADDRINUSE" });
    expect(openFds()).toBe(before);
    // The folder the HAR goes in was made for it, and goes with it.
    expect(readdirSync(dir, { recursive: true })).toEqual([]);
  });

  it("past the listen (metricsListen taken), keeps the HAR a previous run wrote as it was", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    writeFileSync(har, '{"log":{"version":"1.2","creator":{"name":"earlier","version":"1"},"entries":[]}}\n');
    const blocker = await takenPort();
    const error = await startError({
      caDir: tempDir(),
      logLevel: "silent",
      listen: { host: "127.0.0.1", port: 0 },
      metricsListen: `127.0.0.1:${portOf(blocker)}`,
      upstream: { record: { path: har } },
    });
    expect(error).toMatchObject({ code: invalidOptionCode, path: "metricsListen" });
    expect(readFileSync(har, "utf8")).toContain('"earlier"');
    expect(readdirSync(dir)).toEqual(["run.har"]);
  });

  it("an audit log that cannot be opened leaves the recording's files behind no more", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const error = await startError({ caDir: tempDir(), logLevel: "silent", listen: { host: "127.0.0.1", port: 0 }, auditLog: join(dir, "missing", "audit.log"), upstream: { record: { path: har } } });
    expect(error).toMatchObject({ code: invalidOptionCode, path: "auditLog" });
    expect(readdirSync(dir)).toEqual([]);
  });
});

// Two proxies recording to one path each truncated the other's journal, and the last to close
// wrote the file: the first one's entries were lost without a word (black-box finding).
describe("two recordings of one HAR file", () => {
  it("the second is refused, naming the first; once the first closes, the path is free again", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const upstream = await startUpstream();
    const first = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    const error = await startError({ caDir: tempDir(), logLevel: "silent", listen: { host: "127.0.0.1", port: 0 }, upstream: { record: { path: har } } });
    expect(error).toMatchObject({ code: invalidOptionCode, path: "upstream.record.path" });
    expect(error.message).toContain(`another proxy is recording to it (pid ${process.pid})`);
    // The refused start touched nothing of the first's: its entries are all in the file.
    expect((await fetchVia(first, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
    await first.close();
    const entries = (JSON.parse(readFileSync(har, "utf8")) as { log: { entries: unknown[] } }).log.entries;
    expect(entries).toHaveLength(1);
    expect(existsSync(`${har}.lock`)).toBe(false);
    const second = await startTestProxy({}, { upstream: { record: { path: har } } });
    await second.close();
  });

  it("a replay that records its misses into the file a recording writes is refused too", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const first = await startTestProxy({}, { upstream: { record: { path: har } } });
    await first.flushRecording();
    const error = await startError({ caDir: tempDir(), logLevel: "silent", listen: { host: "127.0.0.1", port: 0 }, upstream: { replay: { path: har, recordMissing: true } } });
    expect(error).toMatchObject({ code: invalidOptionCode, path: "upstream.replay.path" });
    expect(error.message).toMatch(/another proxy is recording to it/);
  });

  it("a lock left by a process that is gone is taken over, and the log says so", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    // A pid that was a process and is no more.
    const gone = spawnSync(process.execPath, ["-e", ""]).pid!;
    writeFileSync(`${har}.lock`, `${gone} ${hostname()}\n`);
    const proxy = await startTestProxy({}, { upstream: { record: { path: har } } });
    expect(proxy.logs.find((line) => line["code"] === "EG_RECORD_LOCK_STALE")).toMatchObject({ level: "warn", pid: gone });
    expect(readFileSync(`${har}.lock`, "utf8")).toBe(`${process.pid} ${hostname()}\n`);
    await proxy.close();
    expect(existsSync(`${har}.lock`)).toBe(false);
  });

  it("a lock held by a live process, or by one on another host, is not taken over", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    // pid 1 is alive on every host (EPERM for a non-root user counts as alive).
    for (const holder of [`1 ${hostname()}`, `${process.pid} another-host.example`]) {
      writeFileSync(`${har}.lock`, `${holder}\n`);
      const error = await startError({ caDir: tempDir(), logLevel: "silent", listen: { host: "127.0.0.1", port: 0 }, upstream: { record: { path: har } } });
      expect(error.message).toMatch(/another proxy is recording to it \(pid \d+/);
      expect(readFileSync(`${har}.lock`, "utf8")).toBe(`${holder}\n`);
    }
  });
});
