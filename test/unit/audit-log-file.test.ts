import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { AuditLogFile } from "../../src/metrics/audit-log.js";
import { createAuditSink } from "../../src/metrics/audit-sink.js";
import { buildAuditRecord, type AuditRecord } from "../../src/metrics/audit-record.js";
import { tempDir } from "../helpers/proxy.js";
import { eventually, FifoReader, makeFifo, within } from "../helpers/fifo.js";

function warnings(): { list: Array<{ kind: string; msg: string; fields?: Record<string, unknown> }>; warn: (kind: string, msg: string, fields?: Record<string, unknown>) => void } {
  const list: Array<{ kind: string; msg: string; fields?: Record<string, unknown> }> = [];
  return { list, warn: (kind, msg, fields) => void list.push({ kind, msg, ...(fields !== undefined ? { fields } : {}) }) };
}

const childScript = fileURLToPath(new URL("../helpers/audit-append-child.ts", import.meta.url));

/** What is written to stderr while the test runs, kept instead of written. */
function stderrWrites(): string[] {
  const written: string[] = [];
  const spy = vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => {
    written.push(String(chunk));
    return true;
  });
  onTestFinished(() => spy.mockRestore());
  return written;
}

/** What the process reports as `event` while the test runs (a listener of its own besides vitest's). */
function processEvents(event: "unhandledRejection" | "uncaughtException"): unknown[] {
  const seen: unknown[] = [];
  const listener = (reason: unknown): void => void seen.push(reason);
  process.on(event, listener);
  onTestFinished(() => void process.off(event, listener));
  return seen;
}

describe("AuditLogFile", () => {
  it("bounds what waits for the disk: past maxQueuedBytes records are dropped and counted, never queued", async () => {
    const file = join(tempDir(), "audit.jsonl");
    const warned = warnings();
    const log = await AuditLogFile.open({ file, warn: warned.warn, maxQueuedBytes: 1_000 });
    const line = `${"x".repeat(99)}\n`;
    // One turn: no write can complete in between, so the queue only grows.
    for (let i = 0; i < 100; i++) log.append(line);
    expect(log.dropped).toBe(90);
    await log.close();
    expect(readFileSync(file, "utf8")).toBe(line.repeat(10));
    expect(warned.list.map((w) => w.kind)).toContain("audit:queue");
    expect(warned.list.find((w) => w.kind === "audit:dropped")?.fields).toMatchObject({ dropped: 90 });
  });

  // CI: close() on a loaded machine warned "the disk did not take the last records in time;
  // closing without them" with every record in the file. A timer that comes due while the event
  // loop is held up runs first in the turn that follows, before that turn's I/O callbacks: here
  // the loop is held (a synchronous spin) past close()'s bound, as a loaded machine holds it, so
  // the bound passes with the work below still under way as far as the log can tell.
  const holdLoopPast = (due: number): void => {
    while (performance.now() <= due);
  };

  it("close() whose bound passes with only the descriptor's close under way loses nothing and says nothing", async () => {
    const file = join(tempDir(), "audit.jsonl");
    const warned = warnings();
    const log = await AuditLogFile.open({ file, warn: warned.warn });
    const due = performance.now() + 5;
    // Nothing is queued: close() only closes the descriptor, on the threadpool.
    const closing = log.close(5);
    holdLoopPast(due);
    await closing;
    expect(log.dropped).toBe(0);
    expect(warned.list).toEqual([]);
  });

  it("close() whose bound passes while the last write is under way waits for it, and counts nothing lost", async () => {
    const file = join(tempDir(), "audit.jsonl");
    const warned = warnings();
    const log = await AuditLogFile.open({ file, warn: warned.warn });
    log.append("one\n");
    const due = performance.now() + 5;
    const closing = log.close(5);
    holdLoopPast(due);
    await closing;
    expect(readFileSync(file, "utf8")).toBe("one\n");
    expect(log.dropped).toBe(0);
    expect(warned.list).toEqual([]);
  });

  it("refuses to open what cannot be appended to", async () => {
    await expect(AuditLogFile.open({ file: tempDir(), warn: () => undefined })).rejects.toMatchObject({ code: "EISDIR" });
  });

  it("counts the records of a failed write, warns with the error code, and drops records until retryMs has passed", async () => {
    const warned = warnings();
    const log = await AuditLogFile.open({ file: "/dev/full", warn: warned.warn, retryMs: 60_000 });
    log.append("one\n");
    log.append("two\n");
    await new Promise<void>((resolve) => {
      const check = (): void => (warned.list.some((w) => w.kind === "audit:error") ? resolve() : void setImmediate(check));
      check();
    });
    expect(warned.list.find((w) => w.kind === "audit:error")?.fields).toMatchObject({ error: "ENOSPC" });
    log.append("three\n");
    await log.close();
    expect(log.dropped).toBe(3);
  });

  // A record a full disk (here a file size limit) took all but the newline of was counted as
  // lost, although a reader of the file finds it whole: CI saw records in the file plus records
  // dropped come to one more than were written. `room` is how many bytes of the second record fit.
  const limitCases = [
    { room: "all of it", cut: 0, dropped: 0, whole: 2, failed: false },
    { room: "all but its newline", cut: 1, dropped: 0, whole: 2, failed: true },
    { room: "all but its last two bytes", cut: 2, dropped: 1, whole: 1, failed: true },
  ];
  for (const { room, cut, dropped, whole, failed } of limitCases) {
    it(`a record of which the file size limit leaves room for ${room} counts ${dropped} lost, and the file holds ${whole} whole`, async () => {
      const file = join(tempDir(), "audit.jsonl");
      const record = (pad: number): string => `${JSON.stringify({ pad: "x".repeat(pad) })}\n`;
      const first = record(100);
      // The limit is 1 KiB: the second record ends `cut` bytes past it.
      const second = record(1024 + cut - first.length - record(0).length);
      expect(first.length + second.length).toBe(1024 + cut);
      const child = spawnSync("bash", ["-c", `ulimit -f 1 && exec "$0" "$@"`, process.execPath, "--import", "tsx", childScript, file, JSON.stringify([first, second])], { encoding: "utf8", timeout: 60_000 });
      expect(child.status, child.stderr).toBe(0);
      const counted = JSON.parse(child.stdout) as { dropped: number; warned: string[] };
      expect(counted.dropped).toBe(dropped);
      expect(counted.warned.includes("audit:error")).toBe(failed);
      expect(readFileSync(file, "utf8")).toBe((first + second).slice(0, 1024));
      // Opened again with room, the next record starts a line of its own, after the whole ones.
      const log = await AuditLogFile.open({ file, warn: () => undefined });
      log.append(record(1));
      await log.close();
      const lines = readFileSync(file, "utf8").split("\n").slice(0, -1);
      const parsed = lines.filter((line) => {
        try {
          return JSON.parse(line) !== undefined;
        } catch {
          return false;
        }
      });
      expect(parsed).toEqual([first, second].slice(0, whole).map((line) => line.slice(0, -1)).concat(record(1).slice(0, -1)));
      expect(lines.length - parsed.length).toBe(whole === 2 ? 0 : 1);
    });
  }

  // The open of a new file ran its last steps in a promise's then() with no rejection handler: a
  // throw there (here reopen()'s callback; the proxy's, a log line, does not throw) was a
  // rejection nobody handled, which ends the process.
  it("a reopen whose last steps throw fails as a write would: the records queued for it counted, the file opened again after retryMs, and the process lives", async () => {
    const file = join(tempDir(), "audit.jsonl");
    const warned = warnings();
    const log = await AuditLogFile.open({ file, warn: warned.warn, retryMs: 0 });
    log.append("before\n");
    log.reopen(() => {
      throw new Error("the opened callback threw");
    });
    log.append("queued\n");
    await eventually(() => warned.list.some((w) => w.kind === "audit:error"), "the failed open's warning");
    expect(warned.list.find((w) => w.kind === "audit:error")?.fields).toMatchObject({ file, error: "the opened callback threw" });
    expect(log.dropped).toBe(1);
    log.append("after\n");
    await log.close();
    expect(readFileSync(file, "utf8")).toBe("before\nafter\n");
    expect(log.dropped).toBe(1);
  });

  // The handler of that failure warns, and a warn that throws made the same unhandled rejection
  // one step later (review finding): the chain ends in a handler that writes a line to stderr.
  it("a reopen whose last steps throw, with a warn that throws too, ends in a line on stderr, not an unhandled rejection", async () => {
    const rejections = processEvents("unhandledRejection");
    const written = stderrWrites();
    const file = join(tempDir(), "audit.jsonl");
    const log = await AuditLogFile.open({
      file,
      warn: (kind) => {
        throw new Error(`the warn for ${kind} threw`);
      },
      retryMs: 0,
    });
    log.append("before\n");
    log.reopen(() => {
      throw new Error("the opened callback threw");
    });
    await eventually(() => written.some((line) => line.includes("audit log: handling a failed open threw")), "the line on stderr");
    expect(JSON.parse(written.find((line) => line.includes("handling a failed open"))!)).toMatchObject({ level: "error", error: "the warn for audit:error threw" });
    // Node reports an unhandled rejection once the microtasks have run: an immediate is after.
    await new Promise((resolve) => setImmediate(resolve));
    expect(rejections).toEqual([]);
    log.append("after\n");
    await log.close();
    expect(readFileSync(file, "utf8")).toBe("before\nafter\n");
  });

  // A failed write's handling, in writev's callback, ends in the warn: one that throws was an
  // uncaught exception there, which ends the process (carried note, fourteenth session). The
  // proxy's warn is its throttled logger, which cannot throw (a logSink's throw stays in it), so
  // this is reachable only through AuditLogFile's own API, as the open's was.
  it("a failed write whose warn throws ends in a line on stderr, not an uncaught exception, and the file is written again after retryMs", async () => {
    const uncaught = processEvents("uncaughtException");
    const written = stderrWrites();
    const thrownFor: string[] = [];
    const log = await AuditLogFile.open({
      file: "/dev/full",
      warn: (kind) => {
        thrownFor.push(kind);
        throw new Error(`the warn for ${kind} threw`);
      },
      retryMs: 0,
    });
    const failedWrites = (): string[] => written.filter((line) => line.includes("audit log: handling a failed write threw"));
    log.append("one\n");
    await eventually(() => failedWrites().length === 1, "the first failed write's line on stderr");
    // Opened again for the next record, which fails the same way and is reported the same way.
    log.append("two\n");
    await eventually(() => failedWrites().length === 2, "the second failed write's line on stderr");
    expect(failedWrites().map((line) => JSON.parse(line) as Record<string, unknown>)).toEqual([
      expect.objectContaining({ level: "error", error: "the warn for audit:error threw" }),
      expect.objectContaining({ level: "error", error: "the warn for audit:error threw" }),
    ]);
    await new Promise((resolve) => setImmediate(resolve));
    expect(uncaught).toEqual([]);
    expect(log.dropped).toBe(2);
    // close() is the caller's: its own warning's throw reaches the caller, with the file closed.
    await expect(log.close()).rejects.toThrow("the warn for audit:dropped threw");
    expect(thrownFor).toEqual(["audit:error", "audit:error", "audit:dropped"]);
  });
});

// A log shipper's FIFO: the file was opened with a blocking open(), so once the reader went away,
// each reopen (the retry after a failed write, every logrotate SIGUSR1) held a libuv threadpool
// thread in open() until a reader came; after four, every DNS lookup and file operation of the
// process waited, and it never exited (black-box finding).
describe("AuditLogFile on a FIFO", () => {
  const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
  const ofKind = (warned: ReturnType<typeof warnings>, kind: string): Array<Record<string, unknown> | undefined> =>
    warned.list.filter((w) => w.kind === kind).map((w) => w.fields);
  /** Failed writes and opens, whatever their warning says. */
  const failures = (warned: ReturnType<typeof warnings>): number => warned.list.filter((w) => w.kind === "audit:reader" || w.kind === "audit:error").length;
  /** Opened as the proxy opens it, and closed (briefly) if a test fails half-way. */
  const openLog = async (file: string, warn: ReturnType<typeof warnings>["warn"], retryMs: number): Promise<AuditLogFile> => {
    const log = await AuditLogFile.open({ file, warn, retryMs });
    onTestFinished(() => log.close(100));
    return log;
  };

  it("whose reader went away holds no threadpool thread: each reopen fails at once, the records meanwhile are dropped and counted, and close() does not wait out its bound", async () => {
    const fifo = makeFifo();
    const reader = new FifoReader(fifo);
    const warned = warnings();
    const log = await openLog(fifo, warned.warn, 60_000);
    log.append("one\n");
    await eventually(() => reader.read() === "one\n", "the first record at the reader");
    reader.close();
    log.append("two\n");
    await eventually(() => failures(warned) === 1, "the warning of the failed write");
    let opened = 0;
    // More than the threadpool's four threads: each used to stay in open() for good.
    for (let i = 0; i < 6; i++) log.reopen(() => (opened += 1));
    // The threadpool is free: a file read (on it) goes through.
    expect(await within(readFile(fileURLToPath(import.meta.url), "utf8"), "a file read after six reopens")).toContain("AuditLogFile on a FIFO");
    await eventually(() => failures(warned) === 7, "a warning for each reopen");
    expect(ofKind(warned, "audit:reader")[0]).toMatchObject({ file: fifo, error: "EPIPE" });
    expect(ofKind(warned, "audit:reader").slice(1)).toEqual(Array.from({ length: 6 }, () => ({ file: fifo, error: "ENXIO", retryMs: 60_000 })));
    log.append("three\n");
    expect(opened).toBe(0);
    expect(log.dropped).toBe(2);
    const started = performance.now();
    await log.close(10_000);
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(ofKind(warned, "audit:close")).toEqual([]);
    expect(ofKind(warned, "audit:dropped")).toEqual([{ file: fifo, dropped: 2 }]);
  });

  it("a reader that comes back gets the records made after it came, none of those made while no reader had it", async () => {
    const fifo = makeFifo();
    const first = new FifoReader(fifo);
    const warned = warnings();
    const log = await openLog(fifo, warned.warn, 50);
    log.append("one\n");
    await eventually(() => first.read() === "one\n", "the first record at the reader");
    first.close();
    log.append("two\n");
    await eventually(() => failures(warned) === 1, "the warning of the failed write");
    await sleep(60);
    // Past retryMs: this record opens the FIFO again, which has no reader. It failed at once;
    // it waited in open() instead, and the record went to the next reader.
    log.append("three\n");
    await eventually(() => failures(warned) === 2, "the open without a reader to fail");
    expect(ofKind(warned, "audit:reader")).toMatchObject([{ error: "EPIPE" }, { error: "ENXIO" }]);
    const second = new FifoReader(fifo);
    await sleep(60);
    log.append("four\n");
    await eventually(() => second.read() !== "", "a record at the reader that came back");
    await log.close();
    expect(second.read()).toBe("four\n");
    expect(log.dropped).toBe(2);
  });

  it("whose reader stopped reading: close() gives up within its bound and counts each record it did not hand over", async () => {
    const fifo = makeFifo();
    // Open, never read: a shipper that hangs. The pipe holds 64 KiB; the records are 400 KiB.
    const reader = new FifoReader(fifo);
    const warned = warnings();
    const log = await openLog(fifo, warned.warn, 60_000);
    const record = `${"x".repeat(1_023)}\n`;
    for (let i = 0; i < 400; i++) log.append(record);
    await sleep(100);
    const started = performance.now();
    await log.close(300);
    expect(performance.now() - started).toBeLessThan(1_000);
    const handedOver = reader.read().split("\n").length - 1;
    expect(handedOver).toBeGreaterThan(0);
    expect(handedOver).toBeLessThan(400);
    expect(log.dropped).toBe(400 - handedOver);
    expect(ofKind(warned, "audit:close")).toEqual([{ file: fifo, timeoutMs: 300 }]);
    expect(ofKind(warned, "audit:dropped")).toEqual([{ file: fifo, dropped: 400 - handedOver }]);
  });
});

describe("the audit sink", () => {
  const record = (): AuditRecord => buildAuditRecord({ started: performance.now(), guest: "default", method: "GET", target: "https://a.test/", status: 200, reason: "ok" }, undefined, (t) => t);

  it("writes the line before onDecision can change the record, and survives a throw and a rejection", async () => {
    const file = join(tempDir(), "audit.jsonl");
    const warned = warnings();
    const log = await AuditLogFile.open({ file, warn: warned.warn });
    let calls = 0;
    const sink = createAuditSink(log, (r) => {
      calls += 1;
      (r as { status: number }).status = 999;
      if (calls === 1) throw new Error("sync");
      return Promise.reject(new Error("async"));
    }, warned.warn);
    sink(record());
    sink(record());
    await new Promise((resolve) => setImmediate(resolve));
    await log.close();
    expect(readFileSync(file, "utf8").trim().split("\n").map((l) => (JSON.parse(l) as AuditRecord).status)).toEqual([200, 200]);
    expect(warned.list.filter((w) => w.kind === "audit:onDecision").map((w) => w.fields?.["error"])).toEqual(["Error: sync", "Error: async"]);
  });

  it("redacts the URL, the reasons and every source's reason", () => {
    const redact = (text: string): string => text.replaceAll("hunter2", "[REDACTED:PW]");
    const built = buildAuditRecord(
      { started: performance.now(), guest: undefined, method: "GET", target: "https://a.test/hunter2", status: 403, reason: "no hunter2", source: "hooks", detail: "hunter2" },
      { trace: [{ source: "hooks", tier: "tier3", phase: "onRequest", decision: "block", reason: "saw hunter2", detail: "hunter2", status: 403, ms: 0.1 }], rule: { tier: "tier3", rule: "x", reason: "hunter2" } },
      redact,
    );
    expect(JSON.stringify(built)).not.toContain("hunter2");
    expect(built).toMatchObject({ guest: null, url: "https://a.test/[REDACTED:PW]", sources: [{ reason: "saw [REDACTED:PW]" }] });
  });
});
