import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { fileKind, readFailure } from "../regular-file.js";
import { readHarJson } from "./har-file.js";
import { isPartialBodyName, maxRecordedMs, sidecarDir } from "./har.js";

/**
 * `egressgate har check FILE`: the HAR 1.2 checks of the spec's required fields and their types
 * (our own, since har-validator is deprecated), then a list of the entries and of any string
 * that looks like a credential. Files from Chrome DevTools and mitmproxy pass as well as ours.
 */

export interface HarReport {
  readonly problems: string[];
  readonly entries: string[];
  readonly suspicious: string[];
  /** Partial bodies (`FILE.har.d/.<hex>.part`) a recording that was killed left: never part of a HAR. */
  readonly partial: string[];
  readonly summary: string;
}

type Json = Record<string, unknown>;

/** Strings that look like credentials: a raw placeholder, and the shapes of common tokens. */
const secretShapes: readonly [string, RegExp][] = [
  ["an egressgate placeholder", /EGRESSGATE_SECRET_[0-9a-f]{48}/g],
  ["a GitHub token", /\bgh[pousr]_[A-Za-z0-9]{30,}/g],
  ["a GitHub fine-grained token", /\bgithub_pat_[A-Za-z0-9_]{30,}/g],
  ["an AWS access key id", /\b(?:AKIA|ASIA)[0-9A-Z]{16}\b/g],
  ["a Slack token", /\bxox[abprs]-[A-Za-z0-9-]{10,}/g],
  ["an API key (sk-…)", /\bsk-[A-Za-z0-9_-]{20,}/g],
  ["a JWT", /\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}/g],
  ["a private key", /-----BEGIN [A-Z ]*PRIVATE KEY-----/g],
  ["a bearer token", /\bBearer [A-Za-z0-9._~+/-]{20,}=*/g],
];

export async function checkHarFile(path: string): Promise<HarReport> {
  // Looked for first: a recording killed before it wrote the HAR leaves no file to check.
  const partial = partialBodies(path);
  let har: unknown;
  try {
    har = await readHarJson(path);
  } catch (error) {
    const reason = readFailure(error);
    return { problems: [`cannot read it as JSON: ${reason}`], entries: [], suspicious: [], partial, summary: `${path}: not a HAR file` };
  }
  const problems: string[] = [];
  const entries: string[] = [];
  const suspicious: string[] = [];
  const at = new Checker(problems);
  const log = at.object(har, "log", "");
  if (log === undefined) return { problems, entries, suspicious, partial, summary: `${path}: not a HAR file` };
  at.string(log, "version", "log");
  const creator = at.object(log, "creator", "log");
  if (creator !== undefined) {
    at.string(creator, "name", "log.creator");
    at.string(creator, "version", "log.creator");
  }
  const list = at.array(log, "entries", "log") ?? [];
  list.forEach((raw, i) => {
    const where = `log.entries[${i}]`;
    const entryProblemsFrom = problems.length;
    if (!isObject(raw)) {
      problems.push(`${where}: must be an object`);
      return;
    }
    at.string(raw, "startedDateTime", where);
    if (typeof raw["startedDateTime"] === "string" && Number.isNaN(Date.parse(raw["startedDateTime"]))) problems.push(`${where}.startedDateTime: not an ISO 8601 date`);
    at.number(raw, "time", where);
    at.object(raw, "cache", where);
    const timings = at.object(raw, "timings", where);
    if (timings !== undefined) for (const key of ["send", "wait", "receive"]) at.number(timings, key, `${where}.timings`);
    const request = at.object(raw, "request", where);
    const response = at.object(raw, "response", where);
    if (request !== undefined) {
      const w = `${where}.request`;
      at.string(request, "method", w);
      const url = at.string(request, "url", w);
      if (url !== undefined && !URL.canParse(url)) problems.push(`${w}.url: not an absolute URL`);
      at.string(request, "httpVersion", w);
      at.array(request, "cookies", w);
      at.nameValues(request, "headers", w);
      at.nameValues(request, "queryString", w);
      at.number(request, "headersSize", w);
      at.number(request, "bodySize", w);
      if (request["postData"] !== undefined) {
        const post = at.object(request, "postData", w);
        if (post !== undefined) {
          at.string(post, "mimeType", `${w}.postData`);
          if (post["text"] === undefined && !Array.isArray(post["params"])) problems.push(`${w}.postData: needs text or params`);
          sidecar(post, `${w}.postData`);
        }
      }
    }
    if (response !== undefined) {
      const w = `${where}.response`;
      at.number(response, "status", w);
      at.string(response, "statusText", w, true);
      at.string(response, "httpVersion", w, true);
      at.array(response, "cookies", w);
      at.nameValues(response, "headers", w);
      at.string(response, "redirectURL", w, true);
      at.number(response, "headersSize", w);
      at.number(response, "bodySize", w);
      const content = at.object(response, "content", w);
      if (content !== undefined) {
        at.number(content, "size", `${w}.content`);
        at.string(content, "mimeType", `${w}.content`, true);
        sidecar(content, `${w}.content`);
      }
    }
    if (request !== undefined && response !== undefined) {
      const content = isObject(response["content"]) ? response["content"] : {};
      const size = typeof content["size"] === "number" ? `${content["size"]} bytes` : "?";
      const type = typeof content["mimeType"] === "string" && content["mimeType"] !== "" ? `${content["mimeType"]}, ` : "";
      const file = typeof content["_file"] === "string" ? ", sidecar" : "";
      entries.push(`${String(i).padStart(4)}  ${String(request["method"])} ${String(request["url"])} -> ${String(response["status"])} (${type}${size}${file})`);
    }
    // What the HAR checks above said already (a status that is not a number) is said once. Only
    // this entry's own problems can repeat it: they all name `where`.
    const said = new Set(problems.slice(entryProblemsFrom));
    for (const problem of replayProblems(raw, where)) if (!said.has(problem)) problems.push(problem);
    findSuspicious(raw, where, suspicious);
  });

  function sidecar(holder: Json, where: string): void {
    const file = holder["_file"];
    if (file === undefined) return;
    // A name that is not a SHA-256 is among replayProblems'.
    if (typeof file === "string" && /^[0-9a-f]{64}$/.test(file)) {
      const problem = sidecarFileProblem(path, file, where);
      if (problem !== undefined) problems.push(problem);
    }
  }

  // A field the file lacks (its problems name it) reads "?" in the summary, not "undefined".
  const shown = (value: unknown): string => (typeof value === "string" || typeof value === "number" ? String(value) : "?");
  const version = isObject(har) && isObject(har["log"]) ? shown(har["log"]["version"]) : "?";
  const made = creator !== undefined ? ` by ${shown(creator["name"])} ${shown(creator["version"])}` : "";
  return { problems, entries, suspicious, partial, summary: `${path}: HAR ${version}${made}, ${list.length} entries` };
}

/**
 * The partial bodies in the HAR's sidecar folder: what a recording killed outright (SIGKILL, out
 * of memory) left while a body streamed. Its bytes were never searched for secrets, and `git add
 * FILE.har.d` takes dotfiles (black-box finding: one held a token in clear 61,278 times).
 */
function partialBodies(harPath: string): string[] {
  const dir = sidecarDir(harPath);
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  return names.filter(isPartialBodyName).map((name) => join(dir, name));
}

/**
 * Why the sidecar file `file` (a SHA-256, already checked) of the HAR at `harPath` cannot be
 * read, if it cannot. Only stat()ed, never opened: opening a FIFO waits for a writer, and a
 * replay that did held a threadpool thread for good. A symbolic link is judged by its target.
 */
export function sidecarFileProblem(harPath: string, file: string, where: string): string | undefined {
  const full = join(sidecarDir(harPath), file);
  try {
    const stats = statSync(full);
    return stats.isFile() ? undefined : `${where}._file: ${full} is ${fileKind(stats)}, not a regular file`;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    return `${where}._file: ${full} ${code === "ENOENT" ? "is missing" : `cannot be read (${code ?? (error as Error).message})`}`;
  }
}

/** An RFC 9110 field name. */
const fieldName = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/**
 * What keeps an entry from being replayed as it stands: the type of every field the replay reads
 * (the request's method, URL, headers and body, which make its key; the response's status,
 * headers and body; `serverIPAddress`; `_egressgate.guest` and `named`, which say which guest it
 * answers), and beyond HAR's own types a status no response has, a method or response header
 * that cannot be sent, recorded chunks that are not `[bytes, ms]` pairs. `har check` lists these
 * as problems, and `--replay` refuses a file that has any: a field of the wrong type once reached
 * the replay as a JavaScript error, a 502 "internal error" at each request, or an entry silently
 * left out. Fields HAR requires that the replay
 * never reads (`cache`, `cookies`, the sizes) are `har check`'s alone. Status 0 (no response,
 * as browsers export aborted requests) and 1xx pass here: the replay leaves such entries out.
 */
export function replayProblems(entry: unknown, where: string): string[] {
  if (!isObject(entry)) return [`${where}: must be an object`];
  const problems: string[] = [];
  // JSON.parse takes any depth, JSON.stringify does not: `--record-missing` writes each entry
  // back, and one nested 100,000 levels deep failed every write of the file it extends.
  if (nestsDeeperThan(entry, maxDepth)) problems.push(`${where}: nested more than ${maxDepth} levels deep`);
  const at = new Checker(problems);
  const request = at.object(entry, "request", where);
  if (request !== undefined) {
    const w = `${where}.request`;
    const method = at.string(request, "method", w);
    // A method that is not a token no client can send: the entry would never match.
    if (method !== undefined && !fieldName.test(method)) problems.push(`${w}.method: ${JSON.stringify(method.slice(0, 64))} is not a token`);
    const url = at.string(request, "url", w);
    if (url !== undefined && !URL.canParse(url)) problems.push(`${w}.url: not an absolute URL`);
    at.nameValues(request, "headers", w, { optional: true });
    if (request["postData"] !== undefined) {
      const post = at.object(request, "postData", w);
      if (post !== undefined) {
        const p = `${w}.postData`;
        const text = at.string(post, "text", p, true);
        const encoding = at.string(post, "_encoding", p, true);
        const notBase64 = text !== undefined && encoding === "base64" ? base64Problem(text) : undefined;
        if (notBase64 !== undefined) problems.push(`${p}.text ${notBase64}`);
        // HAR lets a param leave its value out (a file field); Chrome writes form bodies as params only.
        at.nameValues(post, "params", p, { optional: true, valueOptional: true });
        sidecarName(post, p, problems);
      }
    }
  }
  const response = at.object(entry, "response", where);
  if (response !== undefined) {
    const w = `${where}.response`;
    const status = at.number(response, "status", w);
    if (status !== undefined && !(status === 0 || (Number.isInteger(status) && status >= 100 && status <= 599))) {
      problems.push(`${w}.status: must be 0 (no response) or 100-599, not ${status}`);
    }
    for (const list of ["headers", "_trailers"]) {
      const fields = at.nameValues(response, list, w, { optional: true }) ?? [];
      fields.forEach((field, i) => {
        if (field === undefined) return;
        const { name, value } = field;
        // HTTP/2 pseudo-headers (Chrome's exports) are left out of the replay.
        if (!name.startsWith(":") && !fieldName.test(name)) problems.push(`${w}.${list}[${i}]: the name ${JSON.stringify(name.slice(0, 64))} is not a token`);
        // What Node refuses to send: a control character other than tab, or one past Latin-1.
        if (/[^\t\x20-\x7e\x80-\xff]/.test(value)) {
          problems.push(`${w}.${list}[${i}]: the value of ${JSON.stringify(name.slice(0, 64))} has a control character (CR, LF, NUL, …) or one a header cannot carry`);
        }
      });
    }
    if (response["content"] !== undefined) {
      const content = at.object(response, "content", w);
      if (content !== undefined) {
        const c = `${w}.content`;
        const text = at.string(content, "text", c, true);
        const encoding = at.string(content, "encoding", c, true);
        const notBase64 = text !== undefined && encoding === "base64" ? base64Problem(text) : undefined;
        if (notBase64 !== undefined) problems.push(`${c}.text ${notBase64}`);
        at.string(content, "_encoded", c, true);
        sidecarName(content, c, problems);
      }
    }
  }
  at.string(entry, "serverIPAddress", where, true);
  // `--replay-latency recorded` waits these; HAR's -1 ("not applicable") is no wait.
  const tooLong = (ms: number, at: string): void => {
    if (ms > maxRecordedMs) problems.push(`${at}: ${ms} ms is more than ${maxRecordedMs} ms (24.8 days), the longest a replay can wait`);
  };
  if (entry["timings"] !== undefined) {
    const timings = at.object(entry, "timings", where);
    if (timings !== undefined) {
      for (const key of ["send", "wait", "receive"]) {
        if (timings[key] === undefined) continue;
        const ms = at.number(timings, key, `${where}.timings`);
        if (ms !== undefined) tooLong(ms, `${where}.timings.${key}`);
      }
    }
  }
  const own = isObject(entry["_egressgate"]) ? entry["_egressgate"] : undefined;
  // Whose entry it is decides which guest it answers (replay-source.ts): never left to a guess
  // from a value of another type.
  if (entry["_egressgate"] !== undefined && own === undefined) problems.push(`${where}._egressgate: must be an object`);
  if (own?.["guest"] !== undefined && typeof own["guest"] !== "string") problems.push(`${where}._egressgate.guest: must be a string`);
  if (own?.["named"] !== undefined && typeof own["named"] !== "boolean") problems.push(`${where}._egressgate.named: must be a boolean`);
  const chunks = own?.["chunks"];
  const pair = (c: unknown): boolean =>
    Array.isArray(c) && c.length === 2 && Number.isInteger(c[0]) && (c[0] as number) >= 0 && typeof c[1] === "number" && Number.isFinite(c[1]) && c[1] >= 0;
  if (chunks !== undefined && !(Array.isArray(chunks) && chunks.every(pair))) problems.push(`${where}._egressgate.chunks: must be a list of [bytes, ms]`);
  else if (Array.isArray(chunks)) chunks.forEach((c: [number, number], i) => tooLong(c[1], `${where}._egressgate.chunks[${i}]`));
  return problems;
}

/** Deeper than any HAR a tool writes (Chrome's go about 6 levels down), far below the stack's limit. */
const maxDepth = 1000;

/** Whether objects and arrays in `value` nest more than `limit` deep, found without recursion. */
function nestsDeeperThan(value: unknown, limit: number): boolean {
  const todo: [unknown, number][] = [[value, 0]];
  for (let next = todo.pop(); next !== undefined; next = todo.pop()) {
    const [item, depth] = next;
    if (depth > limit) return true;
    for (const child of Array.isArray(item) ? item : isObject(item) ? Object.values(item) : []) {
      if (typeof child === "object" && child !== null) todo.push([child, depth + 1]);
    }
  }
  return false;
}

/** A `_file` must be a SHA-256: the name is joined to the sidecar folder, so `../` must never pass. */
function sidecarName(holder: Json, where: string, problems: string[]): void {
  const file = holder["_file"];
  if (file !== undefined && (typeof file !== "string" || !/^[0-9a-f]{64}$/.test(file))) problems.push(`${where}._file: must be the SHA-256 of the body (64 hex digits)`);
}

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

class Checker {
  constructor(private readonly problems: string[]) {}

  private need(holder: unknown, key: string, where: string, kind: string, test: (v: unknown) => boolean, optional = false): unknown {
    const value = isObject(holder) ? holder[key] : undefined;
    if (value === undefined && optional) return undefined;
    if (!test(value)) {
      this.problems.push(`${where === "" ? key : `${where}.${key}`}: ${value === undefined ? "missing" : `must be ${kind}`}`);
      return undefined;
    }
    return value;
  }

  object(holder: unknown, key: string, where: string): Json | undefined {
    return this.need(holder, key, where, "an object", isObject) as Json | undefined;
  }

  array(holder: unknown, key: string, where: string): unknown[] | undefined {
    return this.need(holder, key, where, "an array", Array.isArray) as unknown[] | undefined;
  }

  string(holder: unknown, key: string, where: string, optional = false): string | undefined {
    // mitmproxy and Chrome leave some strings empty; the spec requires them present.
    return this.need(holder, key, where, "a string", (v) => typeof v === "string", optional) as string | undefined;
  }

  number(holder: unknown, key: string, where: string): number | undefined {
    return this.need(holder, key, where, "a number", (v) => typeof v === "number" && Number.isFinite(v)) as number | undefined;
  }

  /** A list of `{ name, value }`; what it holds, with undefined in place of each bad item. */
  nameValues(holder: unknown, key: string, where: string, options: { optional?: boolean; valueOptional?: boolean } = {}): ({ name: string; value: string } | undefined)[] | undefined {
    if (options.optional === true && isObject(holder) && holder[key] === undefined) return undefined;
    const list = this.array(holder, key, where);
    return list?.map((item, i) => {
      const value = isObject(item) ? item["value"] : undefined;
      if (isObject(item) && typeof item["name"] === "string" && (typeof value === "string" || (options.valueOptional === true && value === undefined))) {
        return { name: item["name"], value: value ?? "" };
      }
      this.problems.push(`${where}.${key}[${i}]: must be { name, value } with string values`);
      return undefined;
    });
  }
}

/**
 * Every string in the entry, bodies decoded from base64 when they are text. Walked with a list of
 * its own, not by recursion: JSON.parse takes any depth, and an extra field nested 100,000
 * levels deep overflowed the stack, so `har check` said only "Maximum call stack size exceeded".
 */
function findSuspicious(entry: Json, where: string, out: string[]): void {
  const visit = (value: unknown, path: string): void => {
    // Last in, first out: children are pushed in reverse to be visited in document order.
    const todo: [unknown, string][] = [[value, path]];
    for (let next = todo.pop(); next !== undefined; next = todo.pop()) {
      const [item, at] = next;
      if (typeof item === "string") {
        for (const [what, shape] of secretShapes) {
          for (const match of item.matchAll(shape)) {
            out.push(`${where}${at}: ${what}: ${match[0].slice(0, 10)}… (${match[0].length} characters)`);
          }
        }
      } else if (Array.isArray(item)) {
        for (let i = item.length - 1; i >= 0; i--) todo.push([item[i], `${at}[${i}]`]);
      } else if (isObject(item)) {
        const fields = Object.entries(item);
        for (let i = fields.length - 1; i >= 0; i--) todo.push([fields[i]![1], `${at}.${fields[i]![0]}`]);
      }
    }
  };
  visit(entry, "");
  const content = isObject(entry["response"]) && isObject(entry["response"]["content"]) ? entry["response"]["content"] : undefined;
  if (content?.["encoding"] === "base64" && typeof content["text"] === "string") {
    visit(Buffer.from(content["text"], "base64").toString("latin1"), ".response.content.text (decoded)");
  }
}

/**
 * Why `text` is not base64 as RFC 4648 §4 spells it, if it is not. Node's decoder skips what it
 * does not know and stops at the first `=`, so a body that is not base64 was served as garbage
 * bytes, without a word, where the file should have been refused.
 */
function base64Problem(text: string): string | undefined {
  const bad = /[^A-Za-z0-9+/=]/.exec(text);
  if (bad !== null) return `is not base64: ${JSON.stringify(bad[0])} at ${bad.index} is not in its alphabet`;
  const padding = text.indexOf("=");
  if (padding >= 0 && !(padding >= text.length - 2 && /^=+$/.test(text.slice(padding)))) return `is not base64: "=" at ${padding} is not padding at its end`;
  if (text.length % 4 !== 0) return `is not base64: its length, ${text.length}, is not a multiple of 4`;
  return undefined;
}

/**
 * The report as `har check` prints it; the exit status: 0 clean, 1 secret-looking strings or
 * partial bodies left in the sidecar folder, 2 not valid HAR 1.2.
 */
export function formatHarReport(report: HarReport): { text: string; status: number } {
  const lines = [report.summary];
  // Appended one by one: spread into push() as arguments, a list of a long recording's entries
  // (about 120,000) overflowed the stack, and `har check` of a valid file exited 2 with
  // "Maximum call stack size exceeded" and nothing else (black-box finding).
  const add = (items: readonly string[], indent = ""): void => {
    for (const item of items) lines.push(`${indent}${item}`);
  };
  if (report.problems.length > 0) {
    lines.push(`not valid HAR 1.2 (${report.problems.length} problems):`);
    add(report.problems, "  ");
  } else lines.push("valid HAR 1.2");
  if (report.entries.length > 0) {
    lines.push("entries:");
    add(report.entries);
  }
  lines.push(report.suspicious.length === 0 ? "secret-looking strings: none" : `secret-looking strings (${report.suspicious.length}):`);
  add(report.suspicious, "  ");
  if (report.partial.length > 0) {
    lines.push(
      `partial bodies an interrupted recording left (${report.partial.length}), never searched for secrets: remove them before committing (the next --record on this path does):`,
    );
    add(report.partial, "  ");
  }
  const status = report.problems.length > 0 ? 2 : report.suspicious.length > 0 || report.partial.length > 0 ? 1 : 0;
  return { text: `${lines.join("\n")}\n`, status };
}
