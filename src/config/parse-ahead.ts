import path from "node:path";
import { Worker } from "node:worker_threads";
import type { ProxyConfig } from "./document.js";
import { keepParsed, parseConfigText, readConfigText, reusingParses } from "./file.js";
import { ConfigFileError, type OptionIssue } from "./option-error.js";
import { workerEntry } from "../worker-entry.js";

/**
 * A file under this size parses on the event loop in milliseconds, sooner than a thread starts
 * (about 40,000 `resolve` entries are a megabyte, and a second of parsing).
 */
const aheadBytes = 64 * 1024;

const parseWorker = workerEntry(import.meta.url, "parse-worker");

/** The longest a parse on the thread may take: the 4 MiB file cap parses in a few seconds. */
const parseDeadlineMs = 60_000;

/** What the worker is given: what {@link parseConfigText} takes. */
export interface ParseRequest {
  readonly text: string;
  readonly file: string;
  readonly env: NodeJS.ProcessEnv;
  readonly baseDir: string;
}

/** What the worker answers: the configuration, the issues of the ConfigFileError, or another failure. */
export type ParseOutcome = { readonly config: ProxyConfig } | { readonly issues: readonly OptionIssue[] } | { readonly failed: string };

/**
 * During a reload (within the window of reuseParses, file.ts): parses the config file on a worker
 * thread, for the reload's own parses (the dry run that finds its policies, then the build) to
 * take the outcome at once. Parsing and checking a large file on the event loop held every
 * guest (40,000 `resolve` entries: 1 to 3 s, most of it the YAML library's parse); building the
 * configuration from it still runs on the loop. Anything that goes wrong here (a file that
 * cannot be read, a thread that cannot start or dies) leaves the parse to the reload, on the
 * loop, which reports it as before.
 */
export async function parseAhead(file: string, env: NodeJS.ProcessEnv): Promise<void> {
  if (!reusingParses()) return;
  let text: string;
  try {
    text = readConfigText(file);
  } catch {
    return;
  }
  if (text.length < aheadBytes) return;
  const baseDir = path.dirname(path.resolve(file));
  const outcome = await parseOnThread({ text, file, env: { ...env }, baseDir });
  if (outcome === undefined || "failed" in outcome) return;
  keepParsed(text, file, env, baseDir, "config" in outcome ? outcome.config : new ConfigFileError(file, outcome.issues));
}

/**
 * As {@link loadConfigFile}, with a large file parsed and checked on a worker thread, as a reload
 * parses it (and on the event loop if the thread fails): for `--watch`, which reads the file
 * again after each reload to learn which files to watch. Outside a reload's window, that parse
 * ran on the loop: a 1.4 MB file held every guest 2.7 s after each reload `--watch` made, where
 * the reload's own parses held them 0.3 s.
 */
export async function loadConfigFileOffLoop(file: string, env: NodeJS.ProcessEnv): Promise<ProxyConfig> {
  const text = readConfigText(file);
  const baseDir = path.dirname(path.resolve(file));
  if (text.length >= aheadBytes) {
    const outcome = await parseOnThread({ text, file, env: { ...env }, baseDir });
    if (outcome !== undefined && "config" in outcome) return outcome.config;
    if (outcome !== undefined && "issues" in outcome) throw new ConfigFileError(file, outcome.issues);
  }
  return parseConfigText(text, file, env, baseDir);
}

function parseOnThread(request: ParseRequest): Promise<ParseOutcome | undefined> {
  return new Promise((resolve) => {
    let worker: Worker;
    try {
      // Not the process's flags and preloads (a loader, a --cpu-prof): the parse needs none.
      worker = new Worker(parseWorker.entry, { eval: parseWorker.eval, execArgv: [], workerData: request });
    } catch {
      resolve(undefined);
      return;
    }
    // A reload still parsing does not hold the process open at its end.
    worker.unref();
    // A parse that never answers must not hold the reload (and every SIGHUP queued behind it) for
    // good: past the deadline the thread is ended, and the reload parses on the loop.
    const deadline = setTimeout(() => {
      resolve(undefined);
      void worker.terminate();
    }, parseDeadlineMs);
    deadline.unref();
    worker.once("message", (outcome: ParseOutcome) => {
      clearTimeout(deadline);
      resolve(outcome);
      void worker.terminate();
    });
    // Listened for: an unlistened error would end the proxy. The reload parses on the loop then.
    worker.on("error", () => resolve(undefined));
    worker.once("exit", () => {
      clearTimeout(deadline);
      resolve(undefined);
    });
  });
}
