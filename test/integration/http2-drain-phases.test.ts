import { fork } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { tempDir } from "../helpers/proxy.js";

/**
 * close() while an HTTP/2 guest's stream is in each phase of its exchange, to an HTTP/1.1 and an
 * HTTP/2 upstream (test/fixtures/h2-drain-phases.ts, in a process of its own, which must exit by
 * itself), and on a connection with nothing under way. The guest gets GOAWAY(NO_ERROR) at once;
 * a stream that goes on finishes whole within the drain, and one that nothing lets go on is cut
 * at the drain's end, logged with the drain's reason; close() resolves either way.
 */

const entry = fileURLToPath(new URL("../fixtures/h2-drain-phases.ts", import.meta.url));

/** What the guest gets of a stream that goes on once it has the GOAWAY. */
const whole: Record<string, { body: string; trailers?: Record<string, string> }> = {
  // Answered before close(): the connection idle, which must get its GOAWAY all the same.
  idle: { body: "ok" },
  "head read": { body: "part2" },
  "hook running": { body: "ok" },
  "upstream head awaited": { body: "late" },
  "body both ways": { body: "part1,part2" },
  "trailers pending": { body: "body", trailers: { "x-sum": "42" } },
};

interface PhaseResult {
  readonly upstream: "h1" | "h2";
  readonly ending: "resumes" | "holds";
  readonly phase: string;
  readonly goaway: string | undefined;
  readonly status: string | undefined;
  readonly body: string;
  readonly trailers: Record<string, string> | undefined;
  /** How the guest's stream closed: its rstCode's name (NO_ERROR: ended whole, or reset with it). */
  readonly closed: string;
  readonly close: string;
  readonly line: { status: number; reason: string; error?: string } | undefined;
}

describe("close() while an HTTP/2 guest's stream is under way", () => {
  it("in every phase, the guest gets GOAWAY; the stream finishes whole, or the drain's end cuts it with its reason; the process exits", async () => {
    const phases = Object.keys(whole);
    const child = fork(entry, [tempDir(), ...phases], { execArgv: ["--import", "tsx"], stdio: ["ignore", "pipe", "pipe", "ipc"] });
    onTestFinished(() => void child.kill("SIGKILL"));
    let stdout = "";
    let stderr = "";
    child.stdout!.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    const [code] = (await once(child, "exit")) as [number | null];
    const lines = stdout.trim().split("\n");
    expect({ code, last: lines.at(-1), stderr: stderr.slice(0, 2000) }).toEqual({ code: 0, last: "done", stderr: "" });
    const results = lines.slice(0, -1).map((line) => JSON.parse(line) as PhaseResult);
    expect(results.map(({ upstream, ending, phase }) => `${upstream} ${ending} ${phase}`)).toEqual(
      ["h1", "h2"].flatMap((upstream) => ["resumes", "holds"].flatMap((ending) => phases.map((phase) => `${upstream} ${ending} ${phase}`))),
    );
    const drainCut = "the proxy closed the connection at the end of its drain (timeouts.drainMs, 300 ms)";
    for (const result of results) {
      const where = JSON.stringify(result);
      expect([result.goaway, result.close], where).toEqual(["NO_ERROR", "resolved"]);
      if (result.ending === "resumes" || result.phase === "idle") {
        // Whole, and closed without a reset: a drain's end at the last stream's close reset a
        // Node guest's complete response (CANCEL).
        expect({ status: result.status, body: result.body, trailers: result.trailers, closed: result.closed }, where).toEqual({ status: "200", ...whole[result.phase], closed: "NO_ERROR" });
        expect(result.line, where).toMatchObject({ status: 200 });
        expect(result.line?.error, where).toBeUndefined();
      } else {
        expect(result.closed, where).toBe("CANCEL");
        // Cut before its head (499) or after it: either way logged as the drain's end.
        if (result.line?.status === 499) expect(result.line.reason, where).toBe(drainCut);
        else expect(result.line?.error, where).toMatch(new RegExp(`^${drainCut.replace(/[()]/g, "\\$&")} before the response was complete`));
      }
    }
  }, 120_000);
});
