import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { configOverrides, optionFlags } from "../../src/config/flags.js";
import { configFileSchema, schemaPaths } from "../../src/config/schema.js";

const docs = readFileSync(fileURLToPath(new URL("../../docs/config.md", import.meta.url)), "utf8");

/** The table row that documents `key` (its first cell is the key in backquotes). */
function rowOf(key: string): string | undefined {
  return docs.split("\n").find((line) => line.startsWith(`| \`${key}\` |`));
}

/** A schema path as the docs spell it: a guest's keys without `guests.*.`, a secret's as secrets.NAME. */
function documentedKey(path: string): string {
  return path.replace(/^guests\.\*\./, "").replace(/^secrets\.\*/, "secrets.NAME");
}

// The lists named 9 flags; the recording's and replay's override the file too (black-box finding).
describe("the flags that may go with --config", () => {
  const readme = readFileSync(fileURLToPath(new URL("../../README.md", import.meta.url)), "utf8");
  const section = docs.slice(docs.indexOf("## Flags with `--config`"), docs.indexOf("## Keys"));
  const row = readme.split("\n").find((line) => line.startsWith("| `--config FILE` |"))!;
  it.each([...configOverrides.map((path) => optionFlags[path]), "--log-format"])("%s is named in docs/config.md and in the README's --config row", (flag) => {
    expect(section).toContain(`\`${flag}\``);
    expect(row).toContain(`\`${flag}\``);
  });
});

describe("docs/config.md", () => {
  const keys = [...new Set(schemaPaths(configFileSchema).map((p) => documentedKey(p.path)))].filter((key) => !key.includes("*") && key !== "secrets.NAME");

  it("has a row for every key of the config file", () => {
    expect(keys.length).toBeGreaterThan(30);
    for (const key of keys) expect([key, rowOf(key) !== undefined]).toEqual([key, true]);
  });

  it("gives each key the default the schema has, in its row", () => {
    for (const { path, node } of schemaPaths(configFileSchema)) {
      if (!("default" in node) || node.default === undefined) continue;
      const row = rowOf(documentedKey(path));
      expect([path, row]).toEqual([path, expect.stringContaining(`\`${String(node.default)}\``)]);
    }
  });

  it("names each key's flag in its row", () => {
    for (const [path, flag] of Object.entries(optionFlags)) {
      expect([path, rowOf(path)]).toEqual([path, expect.stringContaining(flag)]);
    }
  });
});
