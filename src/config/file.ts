import path from "node:path";
import { isMap, isPair, isScalar, isSeq, LineCounter, parseDocument, type Document, type Node } from "yaml";
import { resolveDocument, type ProxyConfig } from "./document.js";
import { ConfigFileError, makeIssue, type OptionIssue, type Segment } from "./option-error.js";
import { maxTextFileBytes, readFailure, readRegularFileSync } from "../regular-file.js";

/**
 * The config file: YAML 1.2 (so JSON too, as it is), checked whole before anything starts.
 * Every problem is reported at once, each with its option path and line.
 */

/**
 * The text of the config file in use. A FIFO, a device or a file past
 * {@link maxTextFileBytes} (4 MiB) is refused before it is read (see regular-file.ts).
 */
export function readConfigText(file: string): string {
  try {
    return readRegularFileSync(path.resolve(file), maxTextFileBytes).toString("utf8");
  } catch (error) {
    throw new ConfigFileError(file, [makeIssue([], `cannot read the config file: ${readFailure(error)}`)], { cause: error });
  }
}

/** Reads, parses, checks and resolves `file`; throws ConfigFileError listing every problem. */
export function loadConfigFile(file: string, env: NodeJS.ProcessEnv = process.env): ProxyConfig {
  const text = readConfigText(file);
  return parseConfigText(text, file, env, path.dirname(path.resolve(file)));
}

/** While a reload runs (see {@link reuseParses}): the configurations parsed, by file, folder, environment and text. */
let reused: Map<string, { readonly env: NodeJS.ProcessEnv; readonly config: ProxyConfig }> | undefined;

/**
 * From now until the returned function is called, a file whose text (and folder, and
 * environment object) is the same as one already parsed gives the same configuration without
 * being parsed again: a reload parses its files once to find its policies and again to build,
 * and a large file costs seconds of parsing, each holding every guest. `file:` secrets are read
 * once for both; the window is one reload, so a later reload reads them again.
 */
export function reuseParses(): () => void {
  reused = new Map();
  return () => {
    reused = undefined;
  };
}

/** As {@link loadConfigFile}, for text already read; relative paths are taken from `baseDir`. */
export function parseConfigText(text: string, file: string, env: NodeJS.ProcessEnv, baseDir: string): ProxyConfig {
  if (reused === undefined) return parseAnew(text, file, env, baseDir);
  const key = `${file}\0${baseDir}\0${text}`;
  const found = reused.get(key);
  if (found !== undefined && found.env === env) return found.config;
  const config = parseAnew(text, file, env, baseDir);
  reused.set(key, { env, config });
  return config;
}

function parseAnew(text: string, file: string, env: NodeJS.ProcessEnv, baseDir: string): ProxyConfig {
  const deep = tooDeep(text);
  if (deep !== undefined) {
    throw new ConfigFileError(file, [{ ...makeIssue([], `nested deeper than ${maxNesting} levels`), line: text.slice(0, deep).split("\n").length }]);
  }
  const lines = new LineCounter();
  // Core schema: YAML 1.2, where `yes`/`no`/`on` are strings, not booleans, and `<<` is a plain key.
  const doc = parseDocument(text, { lineCounter: lines, schema: "core", uniqueKeys: true, prettyErrors: false });
  if (doc.errors.length > 0) {
    throw new ConfigFileError(
      file,
      doc.errors.map((error) => ({ ...makeIssue([], `not valid YAML: ${firstLine(error.message)}`), line: lines.linePos(error.pos[0]).line })),
    );
  }
  let value: unknown;
  try {
    // An alias bomb (a billion laughs) would otherwise expand without bound.
    value = doc.toJS({ maxAliasCount: 100 });
  } catch (error) {
    throw new ConfigFileError(file, [makeIssue([], `cannot be read as data: ${(error as Error).message}`)], { cause: error });
  }
  if (value !== null && value !== undefined && (typeof value !== "object" || Array.isArray(value))) {
    throw new ConfigFileError(file, [{ ...makeIssue([], `must hold a mapping of options (key: value), not ${Array.isArray(value) ? "a list" : "a single value"}`), line: 1 }]);
  }
  // An empty file (or one of comments only) is an empty configuration.
  const { config, issues } = resolveDocument(value ?? {}, { baseDir, env, source: file });
  if (config === undefined) throw new ConfigFileError(file, issues.map((issue) => withLine(issue, doc, lines)));
  return config;
}

/**
 * Far deeper than any configuration needs (about six levels), and still cheap to parse (about
 * 60 ms at this depth, where 100,000 levels took 3 to 6 s and then overflowed the stack).
 */
const maxNesting = 1_000;

/**
 * The offset where `[` and `{` nest deeper than {@link maxNesting}. A reload (SIGHUP, --watch)
 * would hold every guest while the YAML parser worked through deep flow nesting. Brackets in
 * quoted strings and comments count too: a scan that skipped them could be led to skip the rest
 * of the file, and no real configuration holds a thousand unclosed brackets. Block nesting needs
 * an indent per level, so deep block nesting needs a file too large to matter here.
 */
function tooDeep(text: string): number | undefined {
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x5b || c === 0x7b) {
      if (++depth > maxNesting) return i;
    } else if ((c === 0x5d || c === 0x7d) && depth > 0) depth--;
  }
  return undefined;
}

function firstLine(message: string): string {
  return message.split("\n")[0]!.trim();
}

/** The issue with the line of the option it names: the key for an unknown key, else the value. */
function withLine(issue: OptionIssue, doc: Document, lines: LineCounter): OptionIssue {
  const offset = offsetOf(doc.contents, issue.segments, issue.kind === "unknown");
  return offset === undefined ? issue : { ...issue, line: lines.linePos(offset).line };
}

/**
 * Walks the YAML nodes along `segments`. A path that ends early (a required key that is
 * missing) gives the deepest node found: the map the key belongs in.
 */
function offsetOf(root: unknown, segments: readonly Segment[], wantKey: boolean): number | undefined {
  let node = root as Node | null | undefined;
  let offset = node?.range?.[0];
  for (const [i, segment] of segments.entries()) {
    const last = i === segments.length - 1;
    if (isMap(node)) {
      const pair = node.items.find((item) => isPair(item) && isScalar(item.key) && String(item.key.value) === String(segment));
      if (pair === undefined) return offset;
      const key = pair.key as Node;
      const value = pair.value as Node | null;
      if (last && (wantKey || value === null)) return key.range?.[0] ?? offset;
      node = value;
      offset = value?.range?.[0] ?? key.range?.[0] ?? offset;
    } else if (isSeq(node) && typeof segment === "number") {
      const item = node.items[segment] as Node | undefined;
      if (item === undefined) return offset;
      node = item;
      offset = item.range?.[0] ?? offset;
    } else {
      return offset;
    }
  }
  return offset;
}
