import { readdirSync, readFileSync } from "node:fs";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { listenForTest } from "./upstream.js";

/** The decider fixtures' folder. */
export const fixtures = fileURLToPath(new URL("../fixtures/deciders/", import.meta.url));
export const shellDecider = join(fixtures, "decide.sh");
export const pythonDecider = join(fixtures, "decide.py");
export const gateDecider = join(fixtures, "gate.py");

/** Every document a command fixture appended to its log file (one JSON line each). */
export function loggedDocuments(file: string): Record<string, unknown>[] {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch {
    return [];
  }
  return text
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

export interface DecisionServer {
  readonly url: string;
  readonly port: number;
  /** Every document (the body of every POST) received, parsed, and its raw text. */
  readonly received: Record<string, unknown>[];
  readonly raw: string[];
  /** Requests that arrived and have not been answered (held by `hold`). */
  readonly held: () => number;
  /** Answers every held request (and every later one) at once. */
  release(): void;
}

type Answer = (body: Record<string, unknown>, req: IncomingMessage, res: ServerResponse) => void;

/**
 * A decision endpoint on 127.0.0.1:0 that records every POST body and answers it with `answer`;
 * a body that `hold` picks is left unanswered until `release()` (or the test's end).
 */
export async function startDecisionServer(answer: Answer, hold: (body: Record<string, unknown>) => boolean = () => false): Promise<DecisionServer> {
  const received: Record<string, unknown>[] = [];
  const raw: string[] = [];
  const holding: (() => void)[] = [];
  let released = false;
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      raw.push(text);
      let body: Record<string, unknown> = {};
      try {
        body = JSON.parse(text) as Record<string, unknown>;
      } catch {
        // recorded raw; answered as an empty document
      }
      received.push(body);
      const respond = (): void => answer(body, req, res);
      if (!released && hold(body)) holding.push(respond);
      else respond();
    });
  });
  const port = await listenForTest(server);
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    received,
    raw,
    held: () => holding.length,
    release() {
      released = true;
      for (const respond of holding.splice(0)) respond();
    },
  };
}

/** The query's `case` of a decider document (request phase or response phase alike). */
export function caseOf(document: Record<string, unknown>): string {
  const request = (document["input"] ?? document) as { request?: { url_parsed?: { query?: string } } };
  return new URLSearchParams(request.request?.url_parsed?.query ?? "").get("case") ?? "allow";
}

export function json(res: ServerResponse, status: number, value: unknown): void {
  const text = JSON.stringify(value);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

export function text(res: ServerResponse, status: number, body: string): void {
  res.writeHead(status, { "content-type": "text/plain", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

/** Waits until `condition` holds, checking on each turn of the event loop (a trigger, not a sleep). */
export async function until(condition: () => boolean, what: string, turns = 20_000): Promise<void> {
  for (let i = 0; i < turns; i++) {
    if (condition()) return;
    await new Promise((resolve) => setImmediate(resolve));
    if (i > 1000) await new Promise((resolve) => setTimeout(resolve, 1));
  }
  throw new Error(`gave up waiting until ${what}`);
}

/** Processes on this machine whose argv is exactly `argv` (a decider's, by a marker argument no other process uses). */
export function processesWith(argv: readonly string[]): number {
  const wanted = `${argv.join("\u0000")}\u0000`;
  let count = 0;
  for (const pid of readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, "utf8") === wanted) count += 1;
    } catch {
      // gone meanwhile
    }
  }
  return count;
}
