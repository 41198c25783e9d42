import { runInNewContext } from "node:vm";
import { describe, expect, it, onTestFinished } from "vitest";
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

// One process serves every guest: a log line it cannot write (a sink that throws or rejects, a
// stderr whose reader went away) is dropped, never fatal (black-box finding: the first request
// after `egressgate … 2>&1 | head -c1` ended the proxy).
describe("a sink that fails", () => {
  it.each([
    ["throws", (): void => {
      throw new Error("sink down");
    }],
    ["returns a rejected promise", ((): Promise<void> => Promise.reject(new Error("sink down"))) as unknown as (line: string) => void],
    // An async sink written in another realm: Jest runs an embedder's tests in a vm context, so
    // its promises are not this realm's Promise. Only `instanceof Promise` was caught, and the
    // rejection ended the process (black-box finding).
    ["returns a rejected promise of another realm", runInNewContext("(async () => { throw new Error('sink down'); })") as (line: string) => void],
    ["returns a thenable that rejects", ((): unknown => ({ then: (_resolve: unknown, reject: (error: Error) => void): void => reject(new Error("sink down")) })) as (line: string) => void],
  ])("a sink that %s loses its line, and the logger goes on", async (_what, failing) => {
    const unhandled: unknown[] = [];
    const listener = (reason: unknown): void => void unhandled.push(reason);
    process.on("unhandledRejection", listener);
    onTestFinished(() => void process.off("unhandledRejection", listener));
    let calls = 0;
    const log = createLogger("info", (line) => {
      calls += 1;
      return (failing as (line: string) => unknown)(line) as void;
    });
    expect(() => log.info("request", { status: 200 })).not.toThrow();
    expect(() => log.error("internal error")).not.toThrow();
    // A rejection nobody awaits would fail this test run as unhandled.
    await new Promise((resolve) => setImmediate(resolve));
    expect(calls).toBe(2);
    expect(unhandled).toEqual([]);
  });
});
