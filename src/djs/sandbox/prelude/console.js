// @ts-check
// console: lines go to the proxy's log, with the policy's file name. They travel back with the
// call's outcome (entry.js).

/** @typedef {"info" | "debug" | "warn" | "error"} LogLevel */
/** @type {[LogLevel, string][]} */
export let logs = [];
/** A call's lines are its own. */
export function clearLogs() {
  if (logs.length > 0) logs = [];
  callChars = 0;
}
const maxLogLines = 100;
/**
 * Far more than the log keeps (8192): the proxy redacts a line before it cuts it, so that a
 * secret's value the cut goes through is redacted whole (consoleSandboxChars in djs-phases.ts).
 */
const maxLineChars = 65536;
/** All of one call's lines together. */
const maxCallChars = 1048576;
let callChars = 0;
/** @param {unknown} value */
function show(value) {
  if (typeof value === "string") return value;
  if (value instanceof Error) return `${value.name}: ${value.message}`;
  try {
    const json = JSON.stringify(value);
    return json === undefined ? String(value) : json;
  } catch {
    return String(value);
  }
}
/** @param {LogLevel} level */
function logger(level) {
  return (/** @type {unknown[]} */ ...args) => {
    if (logs.length >= maxLogLines || callChars >= maxCallChars) return;
    const line = args.map(show).join(" ").slice(0, maxLineChars);
    callChars += line.length;
    logs.push([level, line]);
  };
}
export const console = {
  log: logger("info"),
  info: logger("info"),
  debug: logger("debug"),
  warn: logger("warn"),
  error: logger("error"),
  trace: logger("debug"),
};

