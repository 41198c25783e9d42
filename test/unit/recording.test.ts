import { existsSync, readFileSync } from "node:fs";
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
