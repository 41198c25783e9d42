import { describe, expect, it } from "vitest";
import { bundlePolicy, locate } from "../../src/djs/bundle.js";

describe("positions in a bundled policy map back to the policy's own files", () => {
  it("a position in each bundled file names that file, its line and column", async () => {
    const lib = `export const one = 1;\n\nexport function check(host: string): boolean {\n  return host.endsWith(".test");\n}\n`;
    const source = `import { check, one } from "./lib/check.ts";\n// a comment\nexport function isRequestAllowed(request: Request): boolean {\n  return one === 1 && check(new URL(request.url).hostname);\n}\n`;
    const { code, map } = await bundlePolicy({ kind: "typescript", filename: "/srv/p.ts", source, modules: { "lib/check.ts": lib }, fromDisk: false });
    const lines = code.split("\n");
    const at = (needle: string) => {
      const index = lines.findIndex((line) => line.includes(needle));
      expect(index, needle).toBeGreaterThanOrEqual(0);
      // 1-based, as QuickJS reports them.
      return locate(map, index + 1, lines[index]!.indexOf(needle) + 1);
    };
    expect(at("host.endsWith")).toEqual({ file: "/srv/lib/check.ts", line: 4, column: 10 });
    expect(at("one === 1")).toEqual({ file: "/srv/p.ts", line: 4, column: 10 });
  });

  it("a position outside the bundle, or with no source map, maps to nothing", async () => {
    const { map } = await bundlePolicy({ kind: "module", filename: "/srv/p.mjs", source: `export const a = 1;\n`, modules: {}, fromDisk: false });
    expect(locate(map, 1, 1)).toBeUndefined();
    expect(locate(map, 10_000, 1)).toBeUndefined();
    expect(locate(undefined, 2, 1)).toBeUndefined();
  });
});
