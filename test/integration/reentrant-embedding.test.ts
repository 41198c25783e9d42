import { fork } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { tempDir } from "../helpers/proxy.js";

/**
 * Re-entrancy of the embedding API: user code that calls back into its proxy from inside the
 * proxy's own calls to it. Rows are the points where the proxy calls user code, columns what
 * that code does there (test/fixtures/reentrant-embedder.ts runs one row in a process of its
 * own, each cell on a proxy of its own), and each cell runs twice: guest `a` asking with one
 * absolute-form HTTP/1.1 request to an HTTP/1.1 upstream, and with three concurrent streams on
 * one HTTP/2 connection (CONNECT, ALPN h2) to an HTTP/2-only upstream. Every cell must leave: no
 * uncaught exception or unhandled rejection, every request in flight answered with a status or
 * cut cleanly (an HTTP/2 stream reset, never one whose head had come), every close() resolved
 * and the port no longer listening, every other call resolved or refused with a code, a proxy
 * that was not closed serving what the calls made of it, a fresh proxy that serves, and a
 * process that exits on its own.
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

/** How guest `a` asks (the fixture's vias), and how many requests each way makes at once. */
const vias = { h1: 1, "h2 streams": 3 } as const;

interface CellResult {
  readonly via: keyof typeof vias;
  readonly action: string;
  readonly fired: boolean;
  readonly guests: string[];
  /** One per request guest `a` made at once. */
  readonly statuses: string[];
  readonly outcomes: Record<string, string>;
  /** What guests `a`, `c` and `d` got when asked again, the statuses of each way joined by ", " (only a proxy the action left open). */
  readonly after: Record<string, string>;
  readonly listening: boolean;
  readonly freshStatus: string;
}

/**
 * What each guest asked again gets from a proxy the action left open: its new behaviour. A
 * reload or addGuest inside a getter applies wholly after what the getter did (`d` is served).
 */
function expectedAfter(point: string, action: string): Record<string, string> {
  if (action.includes("close")) return {};
  const after: Record<string, string> = { a: "200" };
  if (point === "reload's options") return { a: "200", d: "200" };
  if (action === "reload without the guest" || action === "removeGuest") after["a"] = "407";
  if (action === "reload without the host") after["a"] = "403";
  if (action === "reload racing reload") Object.assign(after, { a: "403", c: "200" });
  if (action === "addGuest") after["c"] = "200";
  if (point === "addGuest's options") after["d"] = "200";
  return after;
}

/** Runs one row in a child process; its lines, and how it ended (it must end by itself). */
async function runRow(point: string, actions: string[]): Promise<{ lines: string[]; code: number | null; stderr: string }> {
  const child = fork(entry, [point, tempDir(), Object.keys(vias).join(","), ...actions], { execArgv: ["--import", "tsx"], stdio: ["ignore", "pipe", "pipe", "ipc"] });
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
    expect(cells.map((cell) => `${cell.via}: ${cell.action}`)).toEqual(Object.keys(vias).flatMap((via) => actions.map((action) => `${via}: ${action}`)));
    for (const cell of cells) {
      const where = `${point} × ${cell.action} (${cell.via}): ${JSON.stringify(cell)}`;
      const ofEach = (status: string): string => Array<string>(vias[cell.via]).fill(status).join(", ");
      expect(cell.fired, where).toBe(true);
      expect(cell.statuses, where).toHaveLength(vias[cell.via]);
      for (const status of cell.statuses) {
        // A status, or a clean cut (the drain's end, the guest's removal, a listener already
        // closed); for a stream, a reset before its head: REFUSED_STREAM for one past the
        // GOAWAY of close(), which a client may send again, or CANCEL for a removed guest's
        // tunnel or the drain's end.
        expect(status, where).toMatch(/^(200|403|407|502|504)$|^cut: (ECONNRESET|ECONNREFUSED)$|^reset (REFUSED_STREAM|CANCEL)$/);
        // close() lets every request it took finish: only the drain's end (an awaited close()
        // waits for its own request) or a removal cuts one.
        if (cell.action.includes("close") && cell.action !== "await close") expect(status, where).not.toMatch(/^(reset CANCEL|cut: ECONNRESET)$/);
      }
      for (const [name, outcome] of Object.entries(cell.outcomes)) {
        expect(outcome, `${where} (${name})`).toMatch(clearOutcome);
        if (name.startsWith("close")) expect(outcome, `${where} (${name})`).toBe("resolved");
      }
      expect(cell.after, where).toEqual(Object.fromEntries(Object.entries(expectedAfter(point, cell.action)).map(([name, status]) => [name, ofEach(status)])));
      expect(cell.listening, where).toBe(false);
      expect(cell.freshStatus, where).toBe(ofEach("200"));
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
          expect([outcomes["startProxy"], outcomes["second's status"]], where).toEqual(["resolved", ofEach("200")]);
          break;
        case "ask through itself":
          // The outer hook waits on the inner request, whose hook waits on the outer's: hookMs (a
          // layer's requestMs) ends both (and the other streams, which wait on the outer's lock).
          expect([cell.statuses.join(", "), outcomes["inner's status"]], where).toEqual([ofEach("504"), ofEach("504")]);
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
