import { parentPort, workerData } from "node:worker_threads";
import { parseConfigText } from "./file.js";
import { ConfigFileError } from "./option-error.js";
import type { ParseOutcome, ParseRequest } from "./parse-ahead.js";

// A reload's parse of a large config file, off the event loop (see parse-ahead.ts). The
// configuration is plain data, so it crosses as it is; a ConfigFileError crosses as its issues.
const { text, file, env, baseDir } = workerData as ParseRequest;
let outcome: ParseOutcome;
try {
  outcome = { config: parseConfigText(text, file, env, baseDir) };
} catch (error) {
  outcome = error instanceof ConfigFileError ? { issues: error.issues } : { failed: String(error) };
}
parentPort?.postMessage(outcome);
