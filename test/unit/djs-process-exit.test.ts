import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it } from "vitest";
import { tempDir } from "../helpers/proxy.js";

const fixture = join(import.meta.dirname, "..", "fixtures", "djs-exit.ts");

/** Runs the fixture in a process of its own; its exit code (3: still alive long after "done") and what it printed. */
async function run(...args: string[]): Promise<{ code: number | null; lines: string[] }> {
  try {
    const { stdout } = await promisify(execFile)(process.execPath, ["--import", "tsx", fixture, ...args], { timeout: 120_000 });
    return { code: 0, lines: stdout.trim().split("\n") };
  } catch (error) {
    const failed = error as { code: number | null; stdout?: string; stderr?: string };
    return { code: typeof failed.code === "number" ? failed.code : null, lines: `${failed.stdout ?? ""}${failed.stderr ?? ""}`.trim().split("\n") };
  }
}

// README: "Idle workers never keep the process alive." They did: a 'message' listener added to a
// Worker after its unref() refs its port again (Node 20), so an embedder that never called
// djsHooks.close() (a proxy closed, the policy left to the process's end) never exited. A call
// under way must still hold the process: its answer is what the embedder waits for.
describe("a tier-2 policy and the embedding process's exit", () => {
  it.each([
    ["after a call, without djsHooks.close(), the process exits on its own", ["idle"], [{ t: "code", v: 1 }]],
    ["after a proxy with the policy served a request and closed, without djsHooks.close(), the process exits on its own", ["proxy"], ["200 upstream"]],
    ["a call under way that nothing else waits for holds the process until it is answered, then the process exits", ["in-flight"], [{ t: "code", v: 1 }]],
    ["after the watchdog replaced a stuck worker, the new worker does not hold the process either", ["replaced"], [{ t: "limit", what: "time" }, { t: "code", v: 1 }]],
  ])("%s", { timeout: 150_000 }, async (_name, args, outcomes) => {
    const caArgs = args[0] === "proxy" ? [tempDir()] : [];
    const { code, lines } = await run(...args, ...caArgs);
    expect({ code, lines }).toEqual({ code: 0, lines: [...outcomes.map((outcome) => JSON.stringify(outcome)), "done"] });
  });
});
