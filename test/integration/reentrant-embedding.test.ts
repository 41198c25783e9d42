import { fork } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { tempDir } from "../helpers/proxy.js";

/**
 * Re-entrancy of the embedding API: user code that calls back into its proxy from inside the
 * proxy's own calls to it. Rows are the points where the proxy calls user code, columns what
 * that code does there (test/fixtures/reentrant-embedder.ts runs one row in a process of its
 * own, each cell on a proxy of its own). Every cell must leave: no uncaught exception or
 * unhandled rejection, the request in flight answered with a status or cut cleanly, every
 * close() resolved and the port no longer listening, every other call resolved or refused with
 * a code, a fresh proxy that serves, and a process that exits on its own.
 */

const entry = fileURLToPath(new URL("../fixtures/reentrant-embedder.ts", import.meta.url));

const hookPoints = ["onRequest", "onResponse", "isRequestAllowed", "isIpAllowed", "handle"];
const allActions = [
  "close",
  "await close",
  "close, then throw",
  "close twice",
  "close racing reload",
  "reload racing reload",
  "reload without the guest",
  "reload without the host",
  "removeGuest",
  "removeGuest, addGuest",
  "addGuest",
  "startProxy on its port",
  "close, startProxy on its port",
  "metrics, close",
  "ask through itself",
];
/**
 * Left out of the observers' rows: "await close" (the proxy awaits none of them, so it is
 * "close"), "ask through itself" (they hold no request for the one they make to wait on), and
 * for the diagnostics channel "close, then throw": Node rethrows what a subscriber throws as an
 * uncaught exception (diagnostics_channel's contract, as undici's channels have it).
 */
const observerActions = allActions.filter((action) => action !== "await close" && action !== "ask through itself");
const optionActions = ["close", "close twice", "reload without the guest", "removeGuest", "addGuest", "startProxy on its port", "close, startProxy on its port"];

const matrix: [string, string[]][] = [
  ...hookPoints.map((point): [string, string[]] => [point, allActions]),
  ["onDecision", observerActions],
  ["logSink", observerActions],
  ["request:start", observerActions.filter((action) => action !== "close, then throw")],
  ["request:end", observerActions.filter((action) => action !== "close, then throw")],
  // What a consumer of metrics() does once it has the text.
  ["metrics", ["close", "metrics, close", "close racing reload", "removeGuest"]],
  // The getters of the options reload and addGuest read (each called once, as documented).
  ["reload's options", optionActions],
  ["addGuest's options", optionActions],
];

interface CellResult {
  readonly action: string;
  readonly fired: boolean;
  readonly guests: string[];
  readonly status: string;
  readonly outcomes: Record<string, string>;
  readonly listening: boolean;
  readonly freshStatus: string;
}

/** Runs one row in a child process; its lines, and how it ended (it must end by itself). */
async function runRow(point: string, actions: string[]): Promise<{ lines: string[]; code: number | null; stderr: string }> {
  const child = fork(entry, [point, tempDir(), ...actions], { execArgv: ["--import", "tsx"], stdio: ["ignore", "pipe", "pipe", "ipc"] });
  onTestFinished(() => void child.kill("SIGKILL"));
  let stdout = "";
  let stderr = "";
  child.stdout!.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const [code] = (await once(child, "exit")) as [number | null];
  return { lines: stdout.trim().split("\n"), code, stderr };
}

const clearOutcome = /^(resolved|returned|true|\d{3}|cut: ECONNREFUSED|(rejected|threw) (EG_CLOSED|EG_INVALID_OPTION|EADDRINUSE):)/;

describe("re-entrant calls into the proxy from the points where it calls user code", () => {
  it.each(matrix)("from %s, every re-entrant call leaves the proxy closable, the process clean and a fresh proxy serving", async (point, actions) => {
    const { lines, code, stderr } = await runRow(point, actions);
    expect({ code, last: lines.at(-1), stderr: stderr.slice(0, 2000) }).toEqual({ code: 0, last: "done", stderr: "" });
    const cells = lines.slice(0, -1).map((line) => JSON.parse(line) as CellResult);
    expect(cells.map((cell) => cell.action)).toEqual(actions);
    for (const cell of cells) {
      const where = `${point} × ${cell.action}: ${JSON.stringify(cell)}`;
      expect(cell.fired, where).toBe(true);
      // A status, or a clean cut (the drain's end, the guest's removal, a listener already closed).
      expect(cell.status, where).toMatch(/^(200|403|407|502|504)$|^cut: (ECONNRESET|ECONNREFUSED)$/);
      for (const [name, outcome] of Object.entries(cell.outcomes)) {
        expect(outcome, `${where} (${name})`).toMatch(clearOutcome);
        if (name.startsWith("close")) expect(outcome, `${where} (${name})`).toBe("resolved");
      }
      expect(cell.listening, where).toBe(false);
      expect(cell.freshStatus, where).toBe("200");
      const { outcomes } = cell;
      switch (cell.action) {
        case "close twice":
          expect(outcomes["one promise"], where).toBe("true");
          break;
        case "close racing reload":
          expect(outcomes["reload"], where).toMatch(/^rejected EG_CLOSED:/);
          break;
        case "startProxy on its port":
          expect(outcomes["startProxy"], where).toMatch(/^rejected EADDRINUSE:/);
          break;
        case "close, startProxy on its port":
          // close() stops listening at once: a new proxy can take the port while the old one drains.
          expect([outcomes["startProxy"], outcomes["second's status"]], where).toEqual(["resolved", "200"]);
          break;
        case "ask through itself":
          // The outer hook waits on the inner request, whose hook waits on the outer's: hookMs (a
          // layer's requestMs) ends both.
          expect([cell.status, outcomes["inner's status"]], where).toEqual(["504", "504"]);
          break;
      }
      if (point === "reload's options" || point === "addGuest's options") {
        const read = outcomes[point === "reload's options" ? "the reload read" : "the addGuest read"];
        if (cell.action.startsWith("close")) {
          // close() began while the options were read: the drain serves the guests it began with.
          expect([read, cell.guests], where).toEqual([point === "reload's options" ? "rejected EG_CLOSED: reload: the proxy is closing" : "threw EG_CLOSED: addGuest: the proxy is closing", ["a", "b"]]);
        } else {
          // Otherwise it applies wholly, after whatever the getter did.
          expect(read, where).toMatch(/^(resolved|returned)$/);
          expect(cell.guests, where).toContain("d");
        }
      }
    }
  }, 120_000);
});
