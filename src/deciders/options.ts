import { validateHeaderName, validateHeaderValue } from "node:http";
import { shownValue, unknownKeyReason, type OptionIssueKind, type Segment } from "../option-error.js";
import { splitCommand } from "./split-command.js";

/**
 * The options of an external decider (DESIGN §2 "Hook sources and chains"): a command, a
 * webhook or OPA's Data API, as one entry of a hook chain. The same checks serve
 * `createHttpHooks({ hooks: [...] })`, the config file's `hooks` list and the CLI's
 * `--hook-command`/`--hook-url`/`--hook-opa`, so the three spellings cannot drift apart.
 */

/** Which phases a decider is asked about: requests (before secrets are substituted), responses, or both. */
export type DeciderPhase = "request" | "response";

/** What every kind of decider takes. */
export interface CommonDeciderOptions {
  /** Default `["request"]`; add `"response"` to be asked about responses too. */
  readonly phases?: readonly DeciderPhase[];
  /** Milliseconds for an answer (default 5000); later means 502, unless `failOpen`. */
  readonly timeoutMs?: number;
  /** A decider that fails (crash, timeout, malformed answer) allows instead of answering 502. Default false. */
  readonly failOpen?: boolean;
  /** Send the body too (`request.body` / `response.body` in the document). Default false. */
  readonly includeBody?: boolean;
  /** The most of a body the document carries (default 65536); the rest is cut and marked `truncated`. */
  readonly maxBodyBytes?: number;
  /**
   * Keep allow and block answers this long, per (phase, guest, method, scheme, host, port,
   * path). Default 0 (off); never with `includeBody`.
   */
  readonly cacheMs?: number;
}

/** A command that gets the document on stdin: exit 0 allows (or answers in JSON on stdout), exit 2 blocks. */
export interface CommandDeciderOptions extends CommonDeciderOptions {
  /** argv (`["./check.sh", "--strict"]`), or one string split like a shell would split words (no expansion). */
  readonly command: string | readonly string[];
  /** Names of the proxy's environment variables the command gets, besides PATH. */
  readonly env?: readonly string[];
  /** Run the command through `/bin/sh -c`. Default false. */
  readonly shell?: boolean;
  /** Processes at once (default 4). */
  readonly concurrency?: number;
  /** Calls that may wait for a process (default 64); beyond, 503. */
  readonly queue?: number;
}

/** What webhooks and OPA share: an HTTP endpoint, with headers that may name listed environment variables. */
export interface HttpDeciderOptions extends CommonDeciderOptions {
  /** Request headers, such as `{ authorization: "Bearer ${HOOK_TOKEN}" }`. */
  readonly headers?: Readonly<Record<string, string>>;
  /** The environment variables `headers` and the URL may reference as `${NAME}`; nothing else is read. */
  readonly allowEnv?: readonly string[];
}

/**
 * A URL that gets the document as a JSON POST: a 2xx with JSON decides, 422 blocks. `${NAME}`
 * in it is filled in as in `headers`, for names in `allowEnv` only.
 */
export interface WebhookDeciderOptions extends HttpDeciderOptions {
  readonly webhook: string;
}

/** OPA's Data API (`http://127.0.0.1:8181/v1/data/egress`): POSTed `{ "input": document }`. `${NAME}` as in a webhook's URL. */
export interface OpaDeciderOptions extends HttpDeciderOptions {
  readonly opa: string;
}

export type DeciderOptions = CommandDeciderOptions | WebhookDeciderOptions | OpaDeciderOptions;

/** The defaults of every decider option, in one place (the config's defaults table points here). */
export const deciderDefaults = Object.freeze({
  phases: Object.freeze(["request"] as DeciderPhase[]),
  timeoutMs: 5_000,
  failOpen: false,
  includeBody: false,
  maxBodyBytes: 64 * 1024,
  cacheMs: 0,
  /** Entries a decision cache holds at most; the oldest go first. */
  cacheEntries: 10_000,
  concurrency: 4,
  queue: 64,
  shell: false,
});

interface ResolvedCommon {
  readonly phases: ReadonlySet<DeciderPhase>;
  readonly timeoutMs: number;
  readonly failOpen: boolean;
  readonly includeBody: boolean;
  readonly maxBodyBytes: number;
  readonly cacheMs: number;
  /** For the decision log and messages: `command:./check.sh`, `webhook:http://…`, `opa:http://…`. */
  readonly label: string;
}

export interface ResolvedCommandDecider extends ResolvedCommon {
  readonly kind: "command";
  readonly argv: readonly string[];
  readonly shell: boolean;
  /** The whole environment the process gets: PATH and the listed variables that are set. */
  readonly env: Readonly<Record<string, string>>;
  readonly concurrency: number;
  readonly queue: number;
}

export interface ResolvedHttpDecider extends ResolvedCommon {
  readonly kind: "webhook" | "opa";
  /** With `${NAME}` references already replaced. */
  readonly url: URL;
  /**
   * The URL as configured, when it holds `${NAME}` references: what check-config shows (the
   * filled-in URL may hold a credential a variable gave it).
   */
  readonly written?: string;
  /** With `${NAME}` references already replaced. */
  readonly headers: Readonly<Record<string, string>>;
}

export type ResolvedDecider = ResolvedCommandDecider | ResolvedHttpDecider;

/** Reports one problem at `segments` below the entry. */
export type DeciderReport = (reason: string, segments?: readonly Segment[], kind?: OptionIssueKind) => void;

/** The keys that say which kind an entry is. */
export const deciderKinds = ["command", "webhook", "opa"] as const;

const commonKeys = ["phases", "timeoutMs", "failOpen", "includeBody", "maxBodyBytes", "cacheMs"];
const keysOf: Record<(typeof deciderKinds)[number], readonly string[]> = {
  command: ["command", ...commonKeys, "env", "shell", "concurrency", "queue"],
  webhook: ["webhook", ...commonKeys, "headers", "allowEnv"],
  opa: ["opa", ...commonKeys, "headers", "allowEnv"],
};

const envName = /^[A-Za-z_][A-Za-z0-9_]*$/;
const envReference = /\$\{([^}]*)\}/g;

/** Whether a chain entry is a decider: an object with `command`, `webhook` or `opa`. */
export function isDeciderEntry(entry: unknown): entry is DeciderOptions {
  if (typeof entry !== "object" || entry === null || Array.isArray(entry)) return false;
  return deciderKinds.some((kind) => (entry as Record<string, unknown>)[kind] !== undefined);
}

function shown(value: unknown): string {
  const text = shownValue(value);
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

/**
 * Checks one decider entry, reporting every problem with its path below the entry, and returns
 * it resolved (defaults in, `${NAME}` references replaced from `env`), or undefined when it has
 * problems. `env` is the proxy's environment: only PATH, the command's `env` names and a
 * webhook's `allowEnv` names are read from it.
 */
export function resolveDecider(entry: unknown, env: NodeJS.ProcessEnv, report: DeciderReport): ResolvedDecider | undefined {
  let problems = 0;
  const fail: DeciderReport = (reason, segments, kind) => {
    problems++;
    report(reason, segments, kind);
  };
  if (typeof entry !== "object" || entry === null || Array.isArray(entry)) {
    fail(`must be an object with command, webhook or opa (got ${shown(entry)})`);
    return undefined;
  }
  const record = entry as Record<string, unknown>;
  const kinds = deciderKinds.filter((kind) => record[kind] !== undefined);
  if (kinds.length !== 1) {
    fail(kinds.length === 0 ? "must have one of command, webhook or opa" : `has ${kinds.join(" and ")}: one entry is one decider`);
    return undefined;
  }
  const kind = kinds[0]!;
  const known = keysOf[kind];
  for (const key of Object.keys(record)) {
    if (!known.includes(key) && record[key] !== undefined) fail(unknownKeyReason(key, known), [key], "unknown");
  }
  const integer = (key: string, min: number, max: number, fallback: number): number => {
    const value = record[key];
    if (value === undefined) return fallback;
    if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
      fail(`must be an integer from ${min} to ${max} (got ${shown(value)})`, [key], typeof value === "number" && Number.isInteger(value) ? "range" : "invalid");
      return fallback;
    }
    return value;
  };
  const flag = (key: string, fallback: boolean): boolean => {
    const value = record[key];
    if (value === undefined) return fallback;
    if (typeof value !== "boolean") {
      fail(`must be true or false (got ${shown(value)})`, [key]);
      return fallback;
    }
    return value;
  };
  const names = (key: string): string[] => {
    const value = record[key];
    if (value === undefined) return [];
    if (!Array.isArray(value)) {
      fail(`must be a list of environment variable names (got ${shown(value)})`, [key]);
      return [];
    }
    return value.flatMap((name: unknown, i) => {
      if (typeof name !== "string" || !envName.test(name)) {
        fail(`must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*) (got ${shown(name)})`, [key, i]);
        return [];
      }
      return [name];
    });
  };

  const phases = new Set<DeciderPhase>(deciderDefaults.phases);
  if (record["phases"] !== undefined) {
    const value = record["phases"];
    phases.clear();
    if (!Array.isArray(value) || value.length === 0 || value.some((p) => p !== "request" && p !== "response")) {
      fail(`must be a non-empty list of "request" and "response" (got ${shown(value)})`, ["phases"]);
    } else for (const phase of value as DeciderPhase[]) phases.add(phase);
  }
  const includeBody = flag("includeBody", deciderDefaults.includeBody);
  const cacheMs = integer("cacheMs", 0, 24 * 3600_000, deciderDefaults.cacheMs);
  // A body is part of what is decided, and not part of the cache key: the two cannot go together.
  if (includeBody && cacheMs > 0) fail("cannot be combined with includeBody: a cached answer would ignore the body", ["cacheMs"]);
  const common = {
    phases,
    timeoutMs: integer("timeoutMs", 1, 600_000, deciderDefaults.timeoutMs),
    failOpen: flag("failOpen", deciderDefaults.failOpen),
    includeBody,
    maxBodyBytes: integer("maxBodyBytes", 0, 64 * 1024 * 1024, deciderDefaults.maxBodyBytes),
    cacheMs,
  };

  if (kind === "command") {
    const shell = flag("shell", deciderDefaults.shell);
    const argv = shell ? shellScript(record["command"], fail) : commandArgv(record["command"], fail);
    const concurrency = integer("concurrency", 1, 1024, deciderDefaults.concurrency);
    const queue = integer("queue", 0, 100_000, deciderDefaults.queue);
    const childEnv: Record<string, string> = {};
    if (env["PATH"] !== undefined) childEnv["PATH"] = env["PATH"];
    for (const name of names("env")) if (env[name] !== undefined) childEnv[name] = env[name];
    if (problems > 0 || argv === undefined) return undefined;
    const name = shell ? `sh -c ${argv[0]!.length > 60 ? `${argv[0]!.slice(0, 57)}...` : argv[0]!}` : argv[0]!;
    return { kind, ...common, label: `command:${name}`, argv, shell, env: Object.freeze(childEnv), concurrency, queue };
  }

  const allowEnv = new Set(names("allowEnv"));
  const written = record[kind];
  // `${NAME}` in the URL is filled in as in headers: taken as text, it went out percent-encoded
  // (`/$%7BHOOK_PATH%7D`) and every call failed (black-box finding).
  const references = typeof written === "string" && /\$\{[^}]*\}/.test(written);
  const filled = references ? fillReferences(written, allowEnv, env, (reason) => fail(reason, [kind])) : written;
  const url = filled === undefined ? undefined : endpoint(filled, fail, [kind], references);
  const headers = httpHeaders(record["headers"], allowEnv, env, fail);
  if (problems > 0 || url === undefined) return undefined;
  // The label names the endpoint without its query, which may hold a token; with references,
  // as written, never what a variable put in it.
  const label = references ? `${kind}:${(written as string).replace(/[?#].*$/s, "")}` : `${kind}:${url.origin}${url.pathname}`;
  return { kind, ...common, label, url, ...(references ? { written: written as string } : {}), headers };
}

/** With `shell: true` the command is one script for `/bin/sh -c`, kept as written (its quotes are the shell's). */
function shellScript(value: unknown, fail: DeciderReport): string[] | undefined {
  const script = Array.isArray(value) && value.length === 1 ? (value[0] as unknown) : value;
  if (typeof script !== "string" || script.trim() === "" || script.includes("\0")) {
    fail(`must be one shell script (a string) with shell: true (got ${shown(value)})`, ["command"]);
    return undefined;
  }
  return [script];
}

function commandArgv(value: unknown, fail: DeciderReport): string[] | undefined {
  if (typeof value === "string") {
    const words = splitCommand(value);
    if ("error" in words) {
      fail(`${words.error} (got ${shown(value)})`, ["command"]);
      return undefined;
    }
    if (words.argv.length === 0) {
      fail("must name a program", ["command"]);
      return undefined;
    }
    return words.argv;
  }
  if (!Array.isArray(value) || value.length === 0 || value.some((word) => typeof word !== "string") || value[0] === "") {
    fail(`must be a list of strings, program first (got ${shown(value)})`, ["command"]);
    return undefined;
  }
  if (value.some((word: string) => word.includes("\0"))) {
    fail("must not contain NUL", ["command"]);
    return undefined;
  }
  return [...(value as string[])];
}

/** @param filled the value has had `${NAME}` references filled in: it is not quoted, a variable may have put a credential in it. */
function endpoint(value: unknown, fail: DeciderReport, at: readonly Segment[], filled = false): URL | undefined {
  const notUrl = filled ? "must be an http:// or https:// URL once its references are filled in (not shown: a variable's value is in it)" : `must be an http:// or https:// URL (got ${shown(value)})`;
  let url: URL;
  try {
    if (typeof value !== "string") throw new TypeError("not a string");
    url = new URL(value);
  } catch {
    fail(notUrl, at);
    return undefined;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    fail(notUrl, at);
    return undefined;
  }
  // Never quoted: userinfo is a credential. Headers (with allowEnv) carry credentials instead.
  if (url.username !== "" || url.password !== "") {
    fail("must not carry credentials in the URL: give them in headers (with allowEnv)", at);
    return undefined;
  }
  url.hash = "";
  return url;
}

function httpHeaders(value: unknown, allowEnv: ReadonlySet<string>, env: NodeJS.ProcessEnv, fail: DeciderReport): Record<string, string> {
  if (value === undefined) return {};
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    fail(`must be an object of header names to values (got ${shown(value)})`, ["headers"]);
    return {};
  }
  const out: Record<string, string> = {};
  for (const [name, raw] of Object.entries(value as Record<string, unknown>)) {
    try {
      validateHeaderName(name);
    } catch {
      fail("is not a valid header name", ["headers", name]);
      continue;
    }
    if (reservedHeaders.has(name.toLowerCase())) {
      fail("is set by the proxy", ["headers", name]);
      continue;
    }
    if (typeof raw !== "string") {
      fail(`must be a string (got ${shown(raw)})`, ["headers", name]);
      continue;
    }
    // The value is not quoted in messages: once its references are filled in, it is a credential.
    const filled = fillReferences(raw, allowEnv, env, (reason) => fail(reason, ["headers", name]));
    if (filled === undefined) continue;
    try {
      validateHeaderValue(name, filled);
    } catch {
      fail("is not a valid header value (CR, LF or NUL, perhaps from a variable)", ["headers", name]);
      continue;
    }
    out[name.toLowerCase()] = filled;
  }
  return out;
}

/**
 * `text` with each `${NAME}` replaced by the variable's value from `env`, for names in
 * `allowEnv` only; undefined (the first problem given to `fail`) when one is not listed or not set.
 */
function fillReferences(text: string, allowEnv: ReadonlySet<string>, env: NodeJS.ProcessEnv, fail: (reason: string) => void): string | undefined {
  let bad = false;
  const filled = text.replace(envReference, (_match, ref: string) => {
    if (bad) return "";
    if (!allowEnv.has(ref)) {
      bad = true;
      fail(`references \${${ref}}, which allowEnv does not list; only variables listed there are read`);
      return "";
    }
    // Own variables only: `${toString}` found a function on the prototype.
    const set = Object.hasOwn(env, ref) ? env[ref] : undefined;
    if (set === undefined) {
      bad = true;
      fail(`references $${ref}, which is not set`);
      return "";
    }
    return set;
  });
  return bad ? undefined : filled;
}

/** Framing and routing of the decider's own request belong to the proxy. */
const reservedHeaders = new Set(["host", "content-length", "transfer-encoding", "connection", "content-type"]);
