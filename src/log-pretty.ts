import type { LogSink } from "./log.js";

/**
 * `--log-format pretty`: one compact, coloured line per log line, for a person at a terminal.
 * It reads the JSON line the logger built (after redaction), so it shows exactly what the JSON
 * form would have, and the JSON form stays byte for byte what it was.
 *
 * A decision ("request") becomes `12:00:00.123 default GET https://api.github.com/user 200 84.2ms`,
 * and a refusal adds its reason and rule. Anything else is `time LEVEL msg key=value…`.
 */
export function createPrettySink(write: (text: string) => void, options: { readonly color?: boolean; readonly prefix?: string } = {}): LogSink {
  const color = options.color ?? true;
  const paint = (code: string, text: string): string => (color ? `\u001b[${code}m${text}\u001b[0m` : text);
  const prefix = options.prefix ?? "";
  return (line) => {
    let entry: Record<string, unknown>;
    try {
      entry = JSON.parse(line) as Record<string, unknown>;
    } catch {
      write(`${prefix}${shown(line.endsWith("\n") ? line.slice(0, -1) : line)}\n`);
      return;
    }
    write(`${prefix}${prettyLine(entry, paint)}\n`);
  };
}

type Paint = (code: string, text: string) => string;

const shortEscapes: Record<string, string> = { "\n": "\\n", "\r": "\\r", "\t": "\\t" };
/** Control characters (C0, DEL, C1, and the two line separators): a guest's or a policy's text must not move the cursor, colour the terminal or start a line. */
// eslint-disable-next-line no-control-regex
const controls = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g;

/**
 * `text` with its control characters escaped as JSON writes them (`\n`, `\u001b`): JSON escapes
 * them itself, but the pretty line printed the parsed strings raw, so a reason or a console line
 * quoting a guest's CR LF and ANSI escapes forged a coloured request line of its own.
 */
function shown(text: string): string {
  return text.replace(controls, (c) => shortEscapes[c] ?? `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

/** A field's value as text, escaped. */
function text(value: unknown): string {
  return shown(typeof value === "string" ? value : String(value ?? ""));
}

const levelColors: Record<string, string> = { debug: "90", info: "36", warn: "33", error: "31", fatal: "31;1" };

function clock(time: unknown): string {
  return typeof time === "string" && time.length >= 23 ? time.slice(11, 23) : String(time ?? "");
}

function statusColor(status: number): string {
  if (status >= 500) return "31";
  if (status >= 400) return "33";
  if (status >= 300) return "36";
  return "32";
}

export function prettyLine(entry: Record<string, unknown>, paint: Paint = (_code, text) => text): string {
  const { time, level, msg, ...rest } = entry;
  if (msg === "request") {
    const { guest, method, target, status, ms, reason, rule, source, code } = rest;
    const numeric = typeof status === "number" ? status : 0;
    const parts = [
      paint("90", text(clock(time))),
      paint("35", text(guest ?? "-")),
      paint("1", text(method)),
      text(target),
      paint(statusColor(numeric), text(status)),
      `${text(ms)}ms`,
    ];
    if (numeric >= 400) {
      if (reason !== undefined) parts.push(paint("33", `— ${text(reason)}`));
      const by = [rule ?? code, source].filter((value) => value !== undefined).map(text);
      if (by.length > 0) parts.push(paint("90", `[${by.join(" ")}]`));
    }
    return parts.join(" ");
  }
  const fields = Object.entries(rest).map(([key, value]) => `${shown(key)}=${typeof value === "string" ? shown(value) : shown(JSON.stringify(value) ?? String(value))}`);
  const lvl = String(level ?? "");
  return [paint("90", text(clock(time))), paint(levelColors[lvl] ?? "0", text(lvl.toUpperCase().padEnd(5))), text(msg), ...fields].join(" ");
}
