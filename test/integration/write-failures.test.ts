import { execFileSync, spawn, spawnSync, type ChildProcessByStdio } from "node:child_process";
import { request as httpRequest } from "node:http";
import { join } from "node:path";
import type { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import { closeSync, mkdirSync, openSync, readdirSync, readFileSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { describe, expect, it, onTestFinished } from "vitest";
import { maxStderrBacklogBytes } from "../../src/log.js";
import { fetchVia, startTestProxy, tempDir } from "../helpers/proxy.js";
import { fillDisk, smallDisk, tmpfsRefused } from "../helpers/small-disk.js";
import { startUpstream } from "../helpers/upstream.js";

const root = fileURLToPath(new URL("../../", import.meta.url));
const bin = join(root, "dist", "cli", "bin.js");
const listening = /egressgate listening on http:\/\/127\.0\.0\.1:(\d+)\n/;

/** A plain-HTTP request in absolute form through the proxy at `proxyPort`: its status. */
function viaProxy(proxyPort: number, target: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: "127.0.0.1", port: proxyPort, path: target, headers: { host: new URL(target).host } }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode!));
    });
    req.on("error", reject);
    req.end();
  });
}

interface Spawned {
  readonly child: ChildProcessByStdio<null, Readable, Readable>;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** The port from the listening line on stdout. */
  readonly port: Promise<number>;
  /** stderr so far, when it is read (`readStderr`). */
  stderr(): string;
}

/**
 * The built CLI, killed when the test finishes. Its stderr is read as it comes with
 * `readStderr`; otherwise it is a pipe this test reads only when it chooses to (`child.stderr`
 * left paused: once the pipe and the stream's buffer are full, the CLI's writes wait).
 * `fileSizeKiB` runs it under `ulimit -f` (RLIMIT_FSIZE): a write past that size is cut short and
 * the next fails with EFBIG, as on a full disk, without privileges.
 */
function spawnCli(args: readonly string[], options: { readonly readStderr?: boolean; readonly fileSizeKiB?: number } = {}): Spawned {
  const env: NodeJS.ProcessEnv = { ...process.env, XDG_CONFIG_HOME: tempDir("egressgate-xdg-") };
  for (const name of ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy", "NO_PROXY", "no_proxy"]) delete env[name];
  const stdio: ["ignore", "pipe", "pipe"] = ["ignore", "pipe", "pipe"];
  const child =
    options.fileSizeKiB === undefined
      ? spawn(process.execPath, [bin, ...args], { cwd: root, env, stdio })
      : spawn("bash", ["-c", `ulimit -f ${options.fileSizeKiB} && exec "$0" "$@"`, process.execPath, bin, ...args], { cwd: root, env, stdio });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once("close", (code, signal) => resolve({ code, signal })));
  onTestFinished(async () => {
    child.kill("SIGKILL");
    child.stderr.resume();
    await exited;
  });
  let out = "";
  let err = "";
  if (options.readStderr === true) child.stderr.setEncoding("utf8").on("data", (chunk: string) => (err += chunk));
  const port = new Promise<number>((resolve, reject) => {
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
      out += chunk;
      const found = listening.exec(out);
      if (found) resolve(Number(found[1]));
    });
    void exited.then(() => reject(new Error(`egressgate exited before listening; stdout: ${out}\nstderr: ${err}`)));
  });
  return { child, exited, port, stderr: () => err };
}

/** Waits, polling every 10 ms, until `check` holds; fails naming `what` after 10 s. */
async function until(check: () => boolean | Promise<boolean>, what: string): Promise<void> {
  const deadline = performance.now() + 10_000;
  while (!(await check())) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** Everything `stream` gives until it ends. */
function readAll(stream: Readable): Promise<string> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    stream.on("data", (chunk: Buffer) => chunks.push(chunk));
    stream.once("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
  });
}

function jsonLines(text: string): Record<string, unknown>[] {
  return text
    .split("\n")
    .filter((line) => line.startsWith("{"))
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

// stderr a pipe is written asynchronously: a reader that stopped reading (a stalled log shipper)
// had every later log line kept in the proxy's memory, without bound (80,000 logged requests
// grew it by over 120 MiB, and it went on growing).
describe("stderr a pipe whose reader does not read", { timeout: 120_000 }, () => {
  it("keeps at most maxStderrBacklogBytes of log lines waiting, says how many it dropped once the reader reads, and serves throughout", async () => {
    const upstream = await startUpstream({ tls: false });
    const dir = tempDir();
    // 100 console lines of 8,000 characters per call: about 0.8 MB of log per request (a call
    // that makes them can pass the default 100 ms on a loaded machine).
    const policy = join(dir, "loud.js");
    writeFileSync(policy, 'function onRequest(request) { for (let i = 0; i < 100; i++) console.log("x".repeat(8000)); }\n');
    const cli = spawnCli(["--listen", "127.0.0.1:0", "--ca-dir", join(dir, "ca"), "--log-format", "json", "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--hooks-script", policy, "--hooks-timeout-ms", "10000"]);
    const port = await cli.port;
    const target = `http://api.test:${upstream.port}/echo`;
    // About 32 MB of log, twice the bound, with nothing read.
    const requests = 40;
    for (let i = 0; i < requests; i++) expect(await viaProxy(port, target)).toBe(200);
    // Still serving, still unread.
    expect(await viaProxy(port, target)).toBe(200);
    expect(upstream.hits()).toBe(requests + 1);
    cli.child.kill("SIGTERM");
    const text = await readAll(cli.child.stderr);
    expect(await cli.exited).toEqual({ code: 0, signal: null });
    // What waited for the reader: the bound, the pipe's 64 KiB and the stream's buffer, and the lines after the reader caught up.
    expect(text.length).toBeLessThan(maxStderrBacklogBytes + 1024 * 1024);
    const lines = jsonLines(text);
    const reports = lines.filter((line) => line["msg"] === "log lines were dropped: stderr's reader did not keep up");
    expect(reports).toHaveLength(1);
    const dropped = reports[0]!["dropped"] as number;
    const consoleLines = lines.filter((line) => line["msg"] === "policy console").length;
    expect(consoleLines).toBeGreaterThan(0);
    // Every line was either written or counted.
    expect(consoleLines + dropped).toBeGreaterThanOrEqual((requests + 1) * 100);
  });
});

/** A name whose audit record, which has it in its URL, its reason (twice) and its rule, is over 1 KiB. */
const longHost = `${"a".repeat(60)}.${"b".repeat(60)}.${"c".repeat(60)}.test`;

// A record that a full disk took only in part (ENOSPC, a quota, a file size limit) stayed in the
// file without its newline, and the next record appended, by the same proxy once there was room
// or by the next start, was glued to it: a JSON-lines reader lost both.
describe("an audit log that a full disk cut short", { timeout: 120_000 }, () => {
  it("EFBIG mid-record is warned about and the proxy serves; the next start puts its first record on a line of its own", async () => {
    const upstream = await startUpstream({ tls: false });
    const dir = tempDir();
    const caDir = join(dir, "ca");
    // Made first: under the limit, only the audit log is written.
    execFileSync(process.execPath, [bin, "ca", "--ca-dir", caDir], { stdio: "ignore" });
    const file = join(dir, "audit.jsonl");
    const args = ["--listen", "127.0.0.1:0", "--ca-dir", caDir, "--log-format", "json", "--audit-log", file, "--allow-internal-host", longHost, "--resolve", `${longHost}=127.0.0.1`];
    const target = `http://${longHost}:${upstream.port}/echo`;
    const first = spawnCli(args, { readStderr: true, fileSizeKiB: 1 });
    const port = await first.port;
    expect(await viaProxy(port, target)).toBe(200);
    await until(() => jsonLines(first.stderr()).some((line) => line["msg"] === "audit log: a write failed; records are dropped until the file can be written again"), "the write failure's warning");
    expect(jsonLines(first.stderr()).find((line) => String(line["msg"]).startsWith("audit log: a write failed"))).toMatchObject({ error: "EFBIG", file });
    // The record was cut at the limit: 1 KiB of it, without its newline.
    expect(readFileSync(file, "utf8")).toHaveLength(1024);
    expect(await viaProxy(port, target)).toBe(200);
    first.child.kill("SIGTERM");
    expect((await first.exited).code).toBe(0);
    expect(jsonLines(first.stderr()).find((line) => line["msg"] === "audit log: records were lost while it ran")).toMatchObject({ dropped: 2 });

    const second = spawnCli(args, { readStderr: true });
    const again = await second.port;
    for (let i = 0; i < 2; i++) expect(await viaProxy(again, target)).toBe(200);
    second.child.kill("SIGTERM");
    expect((await second.exited).code).toBe(0);
    const lines = readFileSync(file, "utf8").split("\n");
    // The cut record alone on its line, then the second run's two records whole.
    expect(lines).toHaveLength(4);
    expect(lines[0]).toHaveLength(1024);
    expect(lines[3]).toBe("");
    expect(lines.slice(1, 3).map((line) => (JSON.parse(line) as { url: string; status: number }).status)).toEqual([200, 200]);
    expect(jsonLines(second.stderr()).filter((line) => String(line["msg"]).startsWith("audit log: the file ends in part of a record"))).toHaveLength(1);
  });
});

/** Each line of `text` but the last (empty) one, parsed, or undefined where it is not JSON. */
function parsedLines(text: string): Array<Record<string, unknown> | undefined> {
  return text
    .split("\n")
    .slice(0, -1)
    .map((line) => {
      try {
        return JSON.parse(line) as Record<string, unknown>;
      } catch {
        return undefined;
      }
    });
}

describe("an audit log on a disk that fills and frees while the proxy runs", { timeout: 120_000 }, () => {
  it("loses the records the disk refused (counted), and the first record once there is room again starts a line of its own", async (context) => {
    context.skip(tmpfsRefused !== undefined, tmpfsRefused);
    const disk = smallDisk();
    const file = join(disk, "audit.jsonl");
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { auditLog: file, metrics: true });
    const url = `https://api.test:${upstream.port}/echo`;
    let sent = 0;
    const send = async (): Promise<void> => {
      sent += 1;
      expect((await fetchVia(proxy, url)).status).toBe(200);
    };
    await send();
    await until(() => readFileSync(file, "utf8").endsWith("\n"), "the first record in the file");
    const filler = fillDisk(disk);
    // The file's last block has room for a few records: the one that crosses its end is cut short.
    const failed = (): boolean => proxy.logs.some((line) => String(line["msg"]).startsWith("audit log: a write failed") && line["error"] === "ENOSPC");
    while (!failed()) {
      if (sent > 40) throw new Error("the disk never refused a record");
      await send();
      await until(() => failed() || readFileSync(file, "utf8").split("\n").length > sent, "the record written or refused");
    }
    // (Where the block's end falls between two records, nothing was cut: the checks below hold all the same.)
    unlinkSync(filler);
    // The file is opened again on the first record a second after the failure.
    const whole = (): number => parsedLines(readFileSync(file, "utf8")).filter((line) => line !== undefined).length;
    const before = whole();
    await until(async () => (await send(), whole() > before), "a record in the file once there is room");
    expect(upstream.hits()).toBe(sent);
    await proxy.close();
    const lines = parsedLines(readFileSync(file, "utf8"));
    // At most the cut record is not JSON, alone on its line; every record after it is whole.
    expect(lines.filter((line) => line === undefined).length).toBeLessThanOrEqual(1);
    const dropped = Number(/^egressgate_audit_records_dropped_total (\d+)$/m.exec(await proxy.metrics())?.[1]);
    expect(dropped).toBeGreaterThan(0);
    expect(lines.filter((line) => line !== undefined).length + dropped).toBe(sent);
    expect(lines.at(-1)).toMatchObject({ status: 200 });
  });
});

// The journal's write that a full disk cut short was indexed as whole: the HAR written at the
// end held the rest of that entry as NUL bytes, not JSON, and replaced FILE.har with a file
// `--replay` refuses whole (every exchange recorded before the disk filled lost with it).
describe("a recording on a disk that fills", { timeout: 120_000 }, () => {
  it("stops recording with an error, serves on, and writes a valid HAR of the exchanges it journaled whole", async (context) => {
    context.skip(tmpfsRefused !== undefined, tmpfsRefused);
    const disk = smallDisk();
    const har = join(disk, "r.har");
    const upstream = await startUpstream({ tls: false });
    const cli = spawnCli(
      ["--listen", "127.0.0.1:0", "--ca-dir", join(tempDir(), "ca"), "--log-format", "json", "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1", "--record", har],
      { readStderr: true },
    );
    const port = await cli.port;
    const url = `http://api.test:${upstream.port}/echo`;
    const journal = `${har}.journal`;
    expect(await viaProxy(port, url)).toBe(200);
    await until(() => readFileSync(journal, "utf8").endsWith("\n"), "the first entry in the journal");
    const filler = fillDisk(disk);
    const failed = (): boolean => jsonLines(cli.stderr()).some((line) => line["msg"] === "cannot append to the recording's journal");
    let sent = 1;
    // The journal's last block has room for a few entries: the one that crosses its end is cut short.
    while (!failed()) {
      if (sent > 40) throw new Error("the disk never refused an entry");
      const size = statSync(journal).size;
      expect(await viaProxy(port, url)).toBe(200);
      sent += 1;
      await until(() => failed() || statSync(journal).size > size, "the entry journaled or refused");
    }
    expect(jsonLines(cli.stderr()).find((line) => line["msg"] === "cannot append to the recording's journal")).toMatchObject({ code: "EG_RECORD_FAILED", error: expect.stringContaining("ENOSPC") });
    expect(await viaProxy(port, url)).toBe(200);
    unlinkSync(filler);
    cli.child.kill("SIGTERM");
    expect((await cli.exited).code).toBe(0);
    const check = spawnSync(process.execPath, [bin, "har", "check", har], { encoding: "utf8" });
    expect(check.stdout).toMatch(/^valid HAR 1\.2$/m);
    expect(check.status).toBe(0);
    const entries = (JSON.parse(readFileSync(har, "utf8")) as { log: { entries: unknown[] } }).log.entries;
    // The entries journaled before the disk filled, not the one it cut nor any after.
    expect(entries.length).toBeGreaterThan(0);
    expect(entries.length).toBeLessThan(sent);
  });
});

// ca-bundle.crt was written in place when the system roots changed: a full disk left it cut
// short, without the CA at its end, and the start went on giving guests that file as their
// SSL_CERT_FILE (every request through the proxy then failed to verify, and nothing said why).
describe("a ca-bundle.crt that cannot be written again", { timeout: 120_000 }, () => {
  it("is left whole: guests get it while it holds the CA, else ca.crt; the proxy starts and serves", async (context) => {
    const upstream = await startUpstream({ tls: false });
    const dir = tempDir();
    const caDir = join(dir, "ca");
    execFileSync(process.execPath, [bin, "ca", "--ca-dir", caDir], { stdio: "ignore" });
    const bundle = join(caDir, "ca-bundle.crt");
    const caPem = readFileSync(join(caDir, "ca.crt"), "utf8");
    const size = statSync(bundle).size;
    context.skip(size < 4096, `no system roots here: a bundle of ${size} bytes is too small to be cut by a file size limit`);
    // Under half the bundle: the new one cannot be written whole (EFBIG), as on a full disk.
    const limitKiB = Math.floor(size / 2048);
    for (const [old, named] of [
      [`# an older bundle\n${caPem}`, bundle],
      ["# a bundle of some other CA\n", join(caDir, "ca.crt")],
    ] as const) {
      writeFileSync(bundle, old);
      const envFile = join(dir, `guest-${named === bundle ? "bundle" : "ca"}.env`);
      const cli = spawnCli(["--listen", "127.0.0.1:0", "--ca-dir", caDir, "--guest-env-file", envFile, "--allow-internal-host", "api.test", "--resolve", "api.test=127.0.0.1"], {
        readStderr: true,
        fileSizeKiB: limitKiB,
      });
      const port = await cli.port;
      expect(readFileSync(bundle, "utf8")).toBe(old);
      expect(readFileSync(envFile, "utf8")).toContain(`SSL_CERT_FILE=${named}\n`);
      expect(await viaProxy(port, `http://api.test:${upstream.port}/echo`)).toBe(200);
      cli.child.kill("SIGTERM");
      expect((await cli.exited).code).toBe(0);
      expect(readdirSync(caDir).sort()).toEqual(["ca-bundle.crt", "ca.crt", "ca.key"]);
    }
  });
});

// main() listens for stdout's errors so that a serving proxy outlives a closed pipe; `ca` and
// `env`, whose output is what they are run for, then exited 0 with nothing written, and a script
// (`egressgate env > guest.env && start-guest`) went on with an empty file.
describe("ca and env with a stdout that cannot be written", { timeout: 60_000 }, () => {
  it.each([["ca"], ["env"]])("%s exits 1 and says why", (command) => {
    const caDir = join(tempDir(), "ca");
    const full = openSync("/dev/full", "w");
    onTestFinished(() => closeSync(full));
    const run = spawnSync(process.execPath, [bin, command, "--ca-dir", caDir], { stdio: ["ignore", full, "pipe"], encoding: "utf8" });
    expect(run.stderr).toBe("egressgate: cannot write the output to stdout (ENOSPC)\n");
    expect(run.status).toBe(1);
    // Written where it can be, the same command succeeds.
    const ok = spawnSync(process.execPath, [bin, command, "--ca-dir", caDir], { encoding: "utf8" });
    expect(ok.status).toBe(0);
    expect(ok.stdout).toContain(command === "ca" ? "-----BEGIN CERTIFICATE-----" : "export HTTPS_PROXY=");
  });
});

// The recording's lock is written under a name of its own first: a full disk failed that write
// once the file was made, and the start left it behind (`r.har.lock.PID.HEX`), with a message
// that named no file.
describe("--record where nothing can be written", { timeout: 60_000 }, () => {
  it("fails the start naming the lock, and leaves nothing in the folder", async () => {
    const dir = tempDir();
    const caDir = join(dir, "ca");
    execFileSync(process.execPath, [bin, "ca", "--ca-dir", caDir], { stdio: "ignore" });
    const folder = join(dir, "rec");
    mkdirSync(folder);
    const har = join(folder, "r.har");
    // A file size limit of 0: every write to a file fails (EFBIG), as on a full disk.
    const cli = spawnCli(["--listen", "127.0.0.1:0", "--ca-dir", caDir, "--record", har], { readStderr: true, fileSizeKiB: 0 });
    await expect(cli.port).rejects.toThrow("exited before listening");
    expect(await cli.exited).toEqual({ code: 2, signal: null });
    expect(readdirSync(folder)).toEqual([]);
    expect(cli.stderr()).toContain(`cannot record to ${har}: cannot write its lock ${har}.lock (EFBIG)`);
  });
});
