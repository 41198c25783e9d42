import { mkdirSync, renameSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it, onTestFinished } from "vitest";
import { loadConfigFile } from "../../src/config/file.js";
import { watchedFiles, watchFiles } from "../../src/config/file-watch.js";
import { tempDir } from "../helpers/proxy.js";

describe("--watch's files", () => {
  it("lists the config file, every guest's policies and hooks scripts, and file: secrets, but not env: ones", () => {
    const dir = tempDir();
    mkdirSync(join(dir, "secrets"));
    for (const file of ["a.js", "b.js", "c.js", "secrets/gh"]) writeFileSync(join(dir, file), file.endsWith(".js") ? "function isRequestAllowed() { return true; }\n" : "value\n");
    const config = join(dir, "egressgate.yaml");
    writeFileSync(
      config,
      [
        "guests:",
        "  one: { allowHosts: [a.test], hooksScript: [a.js, b.js], secrets: { GH: { hosts: [a.test], value: file:secrets/gh }, ENV: { hosts: [a.test], value: env:FROM_ENV } } }",
        "  two: { allowHosts: [b.test], hooks: [{ script: c.js }] }",
        "",
      ].join("\n"),
    );
    expect(watchedFiles(loadConfigFile(config, { FROM_ENV: "x" }))).toEqual([join(dir, "a.js"), join(dir, "b.js"), join(dir, "c.js"), config, join(dir, "secrets/gh")].sort());
  });

  it("reports a file replaced by rename and one written in place, and not a sibling written next to them", async () => {
    const dir = tempDir();
    const watched = join(dir, "watched.yaml");
    writeFileSync(watched, "one\n");
    const calls: string[][] = [];
    let notify: () => void = () => undefined;
    const watch = watchFiles([watched], { debounceMs: 20, warn: () => undefined, onChange: (changed) => (calls.push([...changed]), notify()) });
    onTestFinished(() => watch.close());
    const next = (): Promise<void> => new Promise((resolve) => (notify = resolve));

    // A sibling's write alone is looked at, found to change nothing watched, and reported nowhere;
    // the rename that follows is what the first report is about.
    writeFileSync(join(dir, "other.txt"), "x");
    let reported = next();
    writeFileSync(`${watched}.tmp`, "two\n");
    renameSync(`${watched}.tmp`, watched);
    await reported;
    expect(calls).toEqual([[watched]]);

    reported = next();
    writeFileSync(watched, "three\n");
    await reported;
    expect(calls).toEqual([[watched], [watched]]);
  });
});
