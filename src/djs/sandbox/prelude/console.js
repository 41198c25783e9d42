// @ts-check
// console: lines go to the proxy's log, with the policy's file name. They travel back with the
// call's outcome (entry.js).

/** @typedef {"info" | "debug" | "warn" | "error"} LogLevel */
/** @type {[LogLevel, string][]} */
export let logs = [];
/** A call's lines are its own. */
export function clearLogs() {
  if (logs.length > 0) logs = [];
}
const maxLogLines = 100;
const maxLogChars = 8192;
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
    if (logs.length >= maxLogLines) return;
    logs.push([level, args.map(show).join(" ").slice(0, maxLogChars)]);
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

