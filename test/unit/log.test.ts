import { describe, expect, it } from "vitest";
import { createLogger } from "../../src/log.js";

// What a hook throws reaches the log as a field: a value JSON cannot write must not make the log
// call throw (in an error path, that throw was an unhandled rejection), nor lose the line's other fields.
describe("a log field that cannot be serialised", () => {
  const hostile = new Proxy(
    {},
    {
      get: () => {
        throw new Error("trap");
      },
    },
  );
  it.each([
    ["a Proxy whose traps throw", hostile],
    ["a BigInt", 10n],
    ["an Error whose message getter throws", Object.defineProperty(new Error("x"), "message", { get: () => { throw new Error("getter"); } })],
  ])("%s is marked, and the line keeps its other fields", (_what, value) => {
    const lines: string[] = [];
    const log = createLogger("info", (line) => lines.push(line));
    expect(() => log.error("internal error", { id: 7, guest: "g", error: value })).not.toThrow();
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0]!)).toMatchObject({ level: "error", msg: "internal error", id: 7, guest: "g", error: "(not serialisable)" });
  });
});
