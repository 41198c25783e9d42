import { execFileSync } from "node:child_process";
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { createLogger } from "../../src/log.js";
import type { RecordedEntry } from "../../src/record/har.js";
import { Recording } from "../../src/record/recording.js";
import { tempDir } from "../helpers/proxy.js";

/** A minimal entry: what the file holds is checked, not its HAR fields. */
function entry(seq: number): RecordedEntry {
  return { _egressgate: { seq }, request: { url: `https://api.test/${seq}` }, response: { status: 200 } } as unknown as RecordedEntry;
}

describe("Recording", () => {
  // The CLI flushes on SIGTERM and the close flushes after the drain; an embedder may flush at
  // any time, a close included. Each write once raced the others for one temporary file.
  it.each([
    ["a flush and a close at once", async (r: Recording) => Promise.all([r.flush(), r.close()])],
    ["a flush while closing, and one after", async (r: Recording) => {
      const closing = r.close();
      await Promise.all([r.flush(), closing]);
      await r.flush();
    }],
    ["three flushes, then a close", async (r: Recording) => {
      await Promise.all([r.flush(), r.flush(), r.flush()]);
      await r.close();
    }],
  ])("%s: the file holds every entry, the journal is gone, and nothing failed", async (_name, run) => {
    const dir = tempDir();
    const path = join(dir, "run.har");
    const lines: string[] = [];
    const recording = await Recording.open(path, createLogger("debug", (line) => lines.push(line)));
    recording.append(entry(recording.nextSeq()));
    recording.append(entry(recording.nextSeq()));
    await run(recording);
    expect(lines.join("\n")).not.toContain("EG_RECORD_FAILED");
    expect(existsSync(`${path}.journal`)).toBe(false);
    const har = JSON.parse(readFileSync(path, "utf8")) as { log: { entries: RecordedEntry[] } };
    expect(har.log.entries.map((e) => e._egressgate?.seq)).toEqual([1, 2]);
  });
});

// `--record PATH` renamed its temporary file over whatever PATH was: a device node or a FIFO was
// replaced by a regular file (black-box finding). What is already there must be a regular file
// (the sidecar folder a directory), or the recording does not start and nothing is touched.
describe("Recording.open refuses a path it would replace or write through", () => {
  const fifo = (path: string): void => {
    execFileSync("mkfifo", [path]);
  };
  it.each([
    ["the HAR path is a FIFO", (p: string) => fifo(p), "", /run\.har: it is a FIFO, not a regular file/],
    ["the HAR path is a directory", (p: string) => mkdirSync(p), "", /run\.har: it is a directory, not a regular file/],
    ["the HAR path is a symbolic link to a regular file", (p: string) => (writeFileSync(`${p}.real`, "{}"), symlinkSync(`${p}.real`, p)), "", /run\.har: it is a symbolic link/],
    ["the HAR path is a symbolic link to a FIFO", (p: string) => (fifo(`${p}.real`), symlinkSync(`${p}.real`, p)), "", /run\.har: it is a symbolic link/],
    ["the sidecar folder is a FIFO", (p: string) => fifo(p), ".d", /run\.har\.d is a FIFO, not a directory/],
    ["the sidecar folder is a regular file", (p: string) => writeFileSync(p, "x"), ".d", /run\.har\.d is a regular file, not a directory/],
    ["the journal is a FIFO", (p: string) => fifo(p), ".journal", /run\.har\.journal is a FIFO, not a regular file/],
    ["the sidecar folder is a symbolic link to nothing", (p: string) => symlinkSync(`${p}.gone`, p), ".d", /run\.har\.d is a symbolic link to nothing/],
    ["the journal is a symbolic link", (p: string) => (writeFileSync(`${p}.real`, "keep"), symlinkSync(`${p}.real`, p)), ".journal", /run\.har\.journal is a symbolic link/],
  ])("when %s, it is refused and left as it was", async (_name, make, suffix, message) => {
    const dir = tempDir();
    const path = join(dir, "run.har");
    const target = `${path}${suffix}`;
    make(target);
    const before = lstatSync(target);
    await expect(Recording.open(path, createLogger("error", () => undefined))).rejects.toThrow(message);
    const after = lstatSync(target);
    expect([after.ino, after.mode]).toEqual([before.ino, before.mode]);
    if (suffix !== ".d") expect(existsSync(`${path}.d`)).toBe(false);
    if (_name === "the journal is a symbolic link") expect(readFileSync(`${target}.real`, "utf8")).toBe("keep");
  });

  it("an existing regular file, and a symbolic link to a directory for the sidecar folder, are used", async () => {
    const dir = tempDir();
    const path = join(dir, "run.har");
    writeFileSync(path, "old");
    mkdirSync(join(dir, "bodies"));
    symlinkSync(join(dir, "bodies"), `${path}.d`);
    const recording = await Recording.open(path, createLogger("error", () => undefined));
    recording.append(entry(recording.nextSeq()));
    await recording.close();
    expect((JSON.parse(readFileSync(path, "utf8")) as { log: { entries: unknown[] } }).log.entries).toHaveLength(1);
  });
});

// Node's recursive mkdir retries for ever where mkdir fails with ENOENT under a parent that
// exists: `--record /proc/x.har` held the start at 100% CPU (black-box finding).
describe("Recording.open makes the sidecar folder one level at a time", () => {
  it("a path under /proc is refused at once, naming the folder it could not make", async () => {
    await expect(Recording.open("/proc/x.har", createLogger("error", () => undefined))).rejects.toThrow(/cannot record to \/proc\/x\.har: cannot make the folder \/proc\/x\.har\.d \(ENOENT\)/);
  }, 2_000);

  it("missing folders above the HAR are made; a regular file in the way is named", async () => {
    const dir = tempDir();
    const path = join(dir, "runs", "today", "run.har");
    const recording = await Recording.open(path, createLogger("error", () => undefined));
    recording.append(entry(recording.nextSeq()));
    await recording.close();
    expect(lstatSync(`${path}.d`).isDirectory()).toBe(true);
    expect((JSON.parse(readFileSync(path, "utf8")) as { log: { entries: unknown[] } }).log.entries).toHaveLength(1);
    writeFileSync(join(dir, "file"), "x");
    await expect(Recording.open(join(dir, "file", "run.har"), createLogger("error", () => undefined))).rejects.toThrow(/run\.har: it cannot be made: something above it is not a directory/);
  });
});

describe("Recording, when the process exits during a write", () => {
  // The CLI's second SIGTERM exits at once (130); a write under way left FILE.PID.tmp behind.
  it("leaves no temporary file, and keeps the journal for the next run", () => {
    const dir = tempDir();
    const path = join(dir, "run.har");
    const fixture = join(import.meta.dirname, "..", "fixtures", "recording-exit.ts");
    let status: number | null;
    try {
      execFileSync(process.execPath, ["--import", "tsx", fixture, path], { stdio: "pipe", timeout: 30_000 });
      status = 0;
    } catch (error) {
      status = (error as { status: number | null }).status;
    }
    expect(status).toBe(130);
    expect(readdirSync(dir).filter((name) => name.endsWith(".tmp"))).toEqual([]);
    expect(existsSync(`${path}.journal`)).toBe(true);
  });
  // The second SIGTERM's exit left a body's partial sidecar file, its bytes not yet searched for
  // secrets, in the folder that gets committed (black-box finding).
  it("leaves no partial body of a capture under way", () => {
    const dir = tempDir();
    const fixture = join(import.meta.dirname, "..", "fixtures", "body-capture-exit.ts");
    let status: number | null;
    try {
      execFileSync(process.execPath, ["--import", "tsx", fixture, dir], { stdio: "pipe", timeout: 30_000 });
      status = 0;
    } catch (error) {
      status = (error as { status: number | null }).status;
    }
    expect(status).toBe(130);
    expect(readdirSync(dir)).toEqual([]);
  });
});

describe("Recording.open", () => {
  // A SIGKILL runs no exit listener: what it left is removed as the next recording opens.
  it("removes the partial bodies an earlier run left in the sidecar folder, and nothing else there", async () => {
    const dir = tempDir();
    const path = join(dir, "run.har");
    mkdirSync(`${path}.d`);
    writeFileSync(join(`${path}.d`, ".0123456789abcdef.part"), "raw bytes");
    writeFileSync(join(`${path}.d`, "a".repeat(64)), "a finished body");
    const lines: string[] = [];
    const recording = await Recording.open(path, createLogger("debug", (line) => lines.push(line)));
    await recording.close();
    expect(readdirSync(`${path}.d`)).toEqual(["a".repeat(64)]);
    expect(lines.map((line) => JSON.parse(line) as Record<string, unknown>).filter((line) => line["code"] === "EG_RECORD_PARTIAL_REMOVED")).toEqual([
      expect.objectContaining({ level: "warn", files: [".0123456789abcdef.part"] }),
    ]);
  });
});
