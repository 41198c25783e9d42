import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { createLogger } from "../../src/log.js";
import { readHarJson } from "../../src/record/har-file.js";
import type { RecordedEntry } from "../../src/record/har.js";
import { Recording } from "../../src/record/recording.js";
import { tempDir } from "../helpers/proxy.js";

// A HAR larger than V8's longest string (about 512 MiB) failed `har check` and `--replay` with
// ERR_STRING_TOO_LONG, which said nothing of why (black-box finding). The limit is a parameter
// here, so a small file stands for a large one.
describe("readHarJson past the longest JSON text", () => {
  const entry = (seq: number): RecordedEntry =>
    ({ _egressgate: { seq }, request: { url: `https://api.test/${seq}`, note: "a,\\n}" }, response: { status: 200, content: { text: "x".repeat(200) } } }) as unknown as RecordedEntry;

  it("reads a recording an entry a line, as it reads it whole", async () => {
    const path = join(tempDir(), "run.har");
    const recording = await Recording.open(path, createLogger("error", () => undefined));
    for (let i = 0; i < 5; i++) recording.append(entry(recording.nextSeq()));
    await recording.close();
    const whole = await readHarJson(path);
    expect((whole as { log: { entries: unknown[] } }).log.entries).toHaveLength(5);
    expect(await readHarJson(path, 400)).toEqual(whole);
  });

  it("refuses a larger file laid out otherwise, naming the limit; a broken entry line is named", async () => {
    const dir = tempDir();
    const pretty = join(dir, "pretty.har");
    writeFileSync(pretty, JSON.stringify({ log: { version: "1.2", entries: [entry(1), entry(2)] } }, null, 2));
    await expect(readHarJson(pretty, 400)).rejects.toThrow(/: more than 400 bytes, the longest text Node can parse as one JSON document, and not laid out an entry a line as egressgate records it/);
    const broken = join(dir, "broken.har");
    writeFileSync(broken, `{"log":{"version":"1.2","entries":[\n${JSON.stringify(entry(1))},\n{"request":\n]}}\n`);
    await expect(readHarJson(broken, 350)).rejects.toThrow(/entry 1, on line 3: /);
  });
});
