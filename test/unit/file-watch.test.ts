import { execFileSync } from "node:child_process";
import { mkdirSync, renameSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { loadConfigFile } from "../../src/config/file.js";
import { watchedFiles, watchFiles } from "../../src/config/file-watch.js";
import { watchConfiguration } from "../../src/cli/watch.js";
import { tempDir } from "../helpers/proxy.js";

/**
 * watchFiles with a record of what it reported and warned; `next()` resolves at the next report
 * (ask for it before the change that should cause it). Closed when the test ends.
 */
function recorded(files: readonly string[], retryMs?: number): { calls: string[][]; warned: string[]; next: () => Promise<void>; after: (change: () => void) => Promise<void> } {
  const calls: string[][] = [];
  const warned: string[] = [];
  let notify: () => void = () => undefined;
  const watch = watchFiles(files, {
    debounceMs: 20,
    ...(retryMs !== undefined ? { retryMs } : {}),
    warn: (msg) => warned.push(msg),
    onChange: (changed) => (calls.push([...changed]), notify()),
  });
  onTestFinished(() => watch.close());
  const next = (): Promise<void> => new Promise((resolve) => (notify = resolve));
  // The change, then the report it causes.
  const after = async (change: () => void): Promise<void> => {
    const reported = next();
    change();
    await reported;
  };
  return { calls, warned, next, after };
}

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

  // After each reload, --watch read the config file again for the files it names, on the event
  // loop and outside the reload's window: a 1.4 MB file held every guest 2.7 s after a reload
  // whose own parse had been on a worker thread (0.3 s with SIGHUP).
  it("after a reload, a large config file is read again for the files it names while the event loop turns", async () => {
    const dir = tempDir();
    const first = join(dir, "first");
    const second = join(dir, "second");
    writeFileSync(first, "first-value-0123456789");
    writeFileSync(second, "second-value-0123456789");
    const file = join(dir, "egressgate.yaml");
    const resolve = Array.from({ length: 3_000 }, (_, i) => `  h${i}.test: [127.0.0.5]\n`).join("");
    const text = (secret: string): string => `watch: true\nsecrets:\n  TOKEN: { hosts: [a.test], value: "file:${secret}" }\nresolve:\n${resolve}`;
    writeFileSync(file, text(first));
    const seen: string[] = [];
    const watching = watchConfiguration(
      loadConfigFile(file, {}),
      {},
      async () => {
        // The reload is done: the list is read again after this, and must not be before the loop turns.
        setImmediate(() => seen.push(watching.files.includes(second) ? "read again before the event loop turned" : "the event loop turned"));
      },
      () => undefined,
    );
    onTestFinished(() => watching.close());
    expect(watching.files).toEqual([file, first].sort());
    writeFileSync(file, text(second));
    await vi.waitFor(() => expect(watching.files).toEqual([file, second].sort()), { timeout: 20_000, interval: 20 });
    expect(seen).toEqual(["the event loop turned"]);
  });

  it("reports a file replaced by rename and one written in place, and not a sibling written next to them", async () => {
    const dir = tempDir();
    const watched = join(dir, "watched.yaml");
    writeFileSync(watched, "one\n");
    const { calls, next } = recorded([watched]);

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

  // Read to be digested, a FIFO held the event loop (every guest) until something wrote to it.
  it("reports a file replaced by a FIFO without reading it, and the file put back", async () => {
    const dir = tempDir();
    const watched = join(dir, "secret.txt");
    writeFileSync(watched, "one\n");
    const { calls, after } = recorded([watched]);
    await after(() => {
      rmSync(watched);
      execFileSync("mkfifo", [watched]);
    });
    await after(() => {
      rmSync(watched);
      writeFileSync(watched, "one\n");
    });
    expect(calls).toEqual([[watched], [watched]]);
  });

  it("reports a change while a sibling file (an audit log, say) is written without pause", async () => {
    const dir = tempDir();
    const watched = join(dir, "watched.yaml");
    writeFileSync(watched, "one\n");
    let notify: (changed: readonly string[]) => void = () => undefined;
    const reported = new Promise<readonly string[]>((resolve) => (notify = resolve));
    const watch = watchFiles([watched], { debounceMs: 300, warn: () => undefined, onChange: (changed) => notify(changed) });
    onTestFinished(() => watch.close());
    let n = 0;
    const writer = setInterval(() => writeFileSync(join(dir, "audit.log"), `${n++}\n`, { flag: "a" }), 5);
    onTestFinished(() => clearInterval(writer));
    writeFileSync(watched, "two\n");
    // Before the fix the sibling's events pushed the look back for as long as they came.
    expect(await reported).toEqual([watched]);
  });

  it("watches a folder again after it is deleted and made anew, and reports the file in it", async () => {
    const dir = tempDir();
    const folder = join(dir, "config");
    mkdirSync(folder);
    const watched = join(folder, "egressgate.yaml");
    writeFileSync(watched, "one\n");
    const { calls, warned, next } = recorded([watched], 20);
    // Gone: the look finds the file missing (a change: the reload then fails and the old
    // configuration keeps serving, as the CLI does it).
    let reported = next();
    rmSync(folder, { recursive: true });
    await reported;
    expect(calls).toEqual([[watched]]);
    // Back, with new content: the old watch was on the deleted folder's inode, and is blind.
    reported = next();
    mkdirSync(folder);
    writeFileSync(watched, "two\n");
    await reported;
    expect(calls).toEqual([[watched], [watched]]);
    expect(warned).toContain("cannot watch a folder; retrying");
  });

  it("follows a symlink into another folder: an edit of its target is reported under the link's path, and so is the link pointed elsewhere", async () => {
    const dir = tempDir();
    for (const folder of ["config", "policies-v1", "policies-v2"]) mkdirSync(join(dir, folder));
    writeFileSync(join(dir, "policies-v1", "policy.js"), "one\n");
    writeFileSync(join(dir, "policies-v2", "policy.js"), "two\n");
    const link = join(dir, "config", "policy.js");
    symlinkSync(join(dir, "policies-v1", "policy.js"), link);
    const { calls, warned, after } = recorded([link]);

    // Written in place in the target's folder: nothing happens in the link's.
    await after(() => writeFileSync(join(dir, "policies-v1", "policy.js"), "one, edited\n"));
    expect(calls).toEqual([[link]]);
    // The link replaced by one to the other folder (ln -sfn's rename): reported, then followed there.
    await after(() => {
      symlinkSync(join(dir, "policies-v2", "policy.js"), `${link}.new`);
      renameSync(`${link}.new`, link);
    });
    expect(calls).toEqual([[link], [link]]);
    await after(() => writeFileSync(join(dir, "policies-v2", "policy.js"), "two, edited\n"));
    expect(calls).toEqual([[link], [link], [link]]);
    expect(warned).toEqual([]);
  });

  it("reports kubectl's ConfigMap swap (a ..data link renamed over) once, without warning about the folder it let go", async () => {
    const dir = tempDir();
    const version = (name: string, content: string): void => {
      mkdirSync(join(dir, name));
      writeFileSync(join(dir, name, "egressgate.yaml"), content);
    };
    version("..2026_12_02_01", "one\n");
    symlinkSync("..2026_12_02_01", join(dir, "..data"));
    const watched = join(dir, "egressgate.yaml");
    symlinkSync("..data/egressgate.yaml", watched);
    const { calls, warned, next } = recorded([watched], 20);
    const reported = next();
    // kubectl's order: the new version, a new ..data link renamed over the old, the old version removed.
    version("..2026_12_02_02", "two\n");
    symlinkSync("..2026_12_02_02", join(dir, "..data_tmp"));
    renameSync(join(dir, "..data_tmp"), join(dir, "..data"));
    rmSync(join(dir, "..2026_12_02_01"), { recursive: true });
    await reported;
    expect(calls).toEqual([[watched]]);
    // Past a retry period: the removed version's folder was let go, not retried with a warning.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(warned).toEqual([]);
    expect(calls).toEqual([[watched]]);
  });

  it("follows a symlinked folder swapped to another release, and a dangling link whose target appears", async () => {
    const dir = tempDir();
    for (const folder of ["releases", "releases/41", "releases/42", "secrets"]) mkdirSync(join(dir, folder));
    writeFileSync(join(dir, "releases", "41", "policy.js"), "41\n");
    writeFileSync(join(dir, "releases", "42", "policy.js"), "42\n");
    symlinkSync(join(dir, "releases", "41"), join(dir, "current"));
    const policy = join(dir, "current", "policy.js");
    // A secret whose link points at a file not written yet.
    const secret = join(dir, "token");
    symlinkSync(join(dir, "secrets", "token"), secret);
    const { calls, warned, after } = recorded([policy, secret]);

    // The folder link swapped (a deploy's `ln -sfn releases/42 current`): nothing is written in
    // either release folder, only the link's parent sees the rename.
    await after(() => {
      symlinkSync(join(dir, "releases", "42"), join(dir, "current.new"));
      renameSync(join(dir, "current.new"), join(dir, "current"));
    });
    expect(calls).toEqual([[policy]]);
    await after(() => writeFileSync(join(dir, "releases", "42", "policy.js"), "42, edited\n"));
    expect(calls).toEqual([[policy], [policy]]);
    // The dangling link's target written: an event in its folder, which nothing else names.
    await after(() => writeFileSync(join(dir, "secrets", "token"), "t0ken\n"));
    expect(calls).toEqual([[policy], [policy], [secret]]);
    expect(warned).toEqual([]);
  });
});
