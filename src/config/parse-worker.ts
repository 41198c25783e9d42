import { parentPort, workerData } from "node:worker_threads";
import { parseConfigText } from "./file.js";
import { ConfigFileError } from "./option-error.js";
import type { ParseOutcome, ParseRequest } from "./parse-ahead.js";

// A reload's parse of a large config file, off the event loop (see parse-ahead.ts). Only plain
// data crosses: a ConfigFileError crosses as its issues, and a configuration that holds anything
// else (a decider's `URL`, which the structured clone turns into `{}` without an error) is
// parsed again on the loop, as without a worker.
const { text, file, env, baseDir } = workerData as ParseRequest;
let outcome: ParseOutcome;
try {
  const config = parseConfigText(text, file, env, baseDir);
  const found = notPlain(config, "config");
  outcome = found === undefined ? { config } : { failed: `not plain data at ${found}` };
} catch (error) {
  outcome = error instanceof ConfigFileError ? { issues: error.issues } : { failed: String(error) };
}
parentPort?.postMessage(outcome);

/**
 * Where `value` holds something a structured clone does not carry over as it is, if anywhere:
 * anything but primitives, arrays, plain objects, Sets and Maps of them. A `URL` crossed as `{}`,
 * so a webhook or OPA decider reloaded from a large file failed every call, and with `failOpen`
 * let every request through (review finding).
 */
function notPlain(value: unknown, at: string): string | undefined {
  if (value === null || (typeof value !== "object" && typeof value !== "function")) return undefined;
  if (typeof value === "function") return at;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const found = notPlain(value[i], `${at}[${i}]`);
      if (found !== undefined) return found;
    }
    return undefined;
  }
  if (value instanceof Set || value instanceof Map) {
    if (Object.getPrototypeOf(value) !== Set.prototype && Object.getPrototypeOf(value) !== Map.prototype) return at;
    for (const entry of value instanceof Map ? [...value.keys(), ...value.values()] : value) {
      const found = notPlain(entry, `${at}.<entry>`);
      if (found !== undefined) return found;
    }
    return undefined;
  }
  const proto = Object.getPrototypeOf(value) as unknown;
  if (proto !== Object.prototype && proto !== null) return at;
  for (const [key, inner] of Object.entries(value)) {
    const found = notPlain(inner, `${at}.${key}`);
    if (found !== undefined) return found;
  }
  return undefined;
}
