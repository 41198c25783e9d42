import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it, onTestFinished } from "vitest";
import { tempDir } from "../helpers/proxy.js";

import type * as AheadModule from "../../src/config/parse-ahead.js";
import type * as FilesModule from "../../src/config/file.js";

type Ahead = typeof AheadModule;
type Files = typeof FilesModule;

// A SIGHUP's config file was parsed and checked on the event loop: 40,000 `resolve` entries
// held every guest 1 to 3 s. A large file is now parsed on a worker thread first, and the
// reload's parses (the dry run, the build) take its outcome. The worker starts differently from
// the sources (through tsx) and from dist (the built .js), so both are run.
const builds: Record<string, () => Promise<{ ahead: Ahead; files: Files }>> = {
  "the sources": async () => ({ ahead: await import("../../src/config/parse-ahead.js"), files: await import("../../src/config/file.js") }),
  dist: async () => ({
    ahead: (await import(new URL("../../dist/config/parse-ahead.js", import.meta.url).href)) as Ahead,
    files: (await import(new URL("../../dist/config/file.js", import.meta.url).href)) as Files,
  }),
};

/** A config file of `entries` resolve entries and a secret read from `secretFile`. */
function largeConfig(dir: string, name: string, secretFile: string, entries: number): string {
  const file = join(dir, name);
  const resolve = Array.from({ length: entries }, (_, i) => `  h${i}.test: [127.0.0.5]\n`).join("");
  writeFileSync(file, `secrets:\n  TOKEN: { hosts: [a.test], value: "file:${secretFile}" }\nresolve:\n${resolve}`);
  return file;
}

function errorOf(load: () => unknown): Error {
  try {
    load();
  } catch (error) {
    return error as Error;
  }
  throw new Error("loaded without an error");
}

describe("parseAhead", () => {
  it.each(Object.keys(builds))("from %s: a reload's large config file is parsed on a worker thread while the event loop turns, and the reload's parses take its configuration or its error", async (build) => {
    const { ahead, files } = await builds[build]!();
    const dir = tempDir();
    const env = {};
    const secret = join(dir, "token");
    writeFileSync(secret, "first-value-0123456789");
    const large = largeConfig(dir, "large.yaml", secret, 3_000);
    const missing = join(dir, "later");
    const broken = largeConfig(dir, "broken.yaml", missing, 3_000);
    const small = largeConfig(dir, "small.yaml", secret, 10);
    const onLoop = errorOf(() => files.loadConfigFile(broken, env));
    expect(onLoop.name).toBe("ConfigFileError");
    onTestFinished(files.reuseParses());

    const order: string[] = [];
    setImmediate(() => order.push("the event loop turned"));
    await Promise.all([ahead.parseAhead(large, env), ahead.parseAhead(broken, env), ahead.parseAhead(small, env)]);
    order.push("parsed");
    expect(order).toEqual(["the event loop turned", "parsed"]);

    // What the worker read is what the reload's parses take: a parse now would read the new value.
    writeFileSync(secret, "second-value-0123456789");
    writeFileSync(missing, "there-now-0123456789");
    const taken = files.loadConfigFile(large, env);
    expect(taken.guests["default"]?.secrets?.["TOKEN"]?.value).toBe("first-value-0123456789");
    expect(Object.keys(taken.proxy.resolve ?? {})).toHaveLength(3_000);
    expect(files.loadConfigFile(large, env)).toBe(taken);
    // Its error too, as the parse on the loop words it, line and all.
    const error = errorOf(() => files.loadConfigFile(broken, env));
    expect([error.name, error.message]).toEqual([onLoop.name, onLoop.message]);
    expect(onLoop.message).toContain(`${broken}:2: secrets.TOKEN.value`);
    // A small file is left to the loop: a few milliseconds, sooner than a thread starts.
    expect(files.loadConfigFile(small, env).guests["default"]?.secrets?.["TOKEN"]?.value).toBe("second-value-0123456789");
  });

  it.each(Object.keys(builds))("from %s: a large file whose configuration holds more than plain data (a webhook decider's URL) is parsed on the loop, and its decider keeps its URL", async (build) => {
    const { ahead, files } = await builds[build]!();
    const dir = tempDir();
    const env = {};
    const file = join(dir, "deciders.yaml");
    const resolve = Array.from({ length: 3_000 }, (_, i) => `  h${i}.test: [127.0.0.5]\n`).join("");
    writeFileSync(file, `allowHosts: [a.test]\nhooks:\n  - { webhook: "http://127.0.0.1:9/decide", failOpen: true }\nresolve:\n${resolve}`);
    onTestFinished(files.reuseParses());
    await ahead.parseAhead(file, env);
    // The structured clone made the URL `{}` without an error: the decider then failed every
    // call, and with failOpen let every request through.
    const hooks = files.loadConfigFile(file, env).guests["default"]?.hooks as readonly { readonly decider?: { readonly url?: unknown } }[] | undefined;
    const url = hooks?.[0]?.decider?.url;
    expect(url).toBeInstanceOf(URL);
    expect((url as URL).href).toBe("http://127.0.0.1:9/decide");
  });
});
