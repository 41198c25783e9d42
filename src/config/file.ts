import path from "node:path";
import { isCollection, isMap, isPair, isScalar, isSeq, LineCounter, parseDocument, visit, type Document, type Node, type Pair, type Scalar, type YAMLMap } from "yaml";
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

/** While a reload runs (see {@link reuseParses}): each parse's outcome, by file, folder, environment and text. */
let reused: Map<string, { readonly env: NodeJS.ProcessEnv; readonly outcome: ProxyConfig | ConfigFileError }> | undefined;

/**
 * From now until the returned function is called, a file whose text (and folder, and
 * environment object) is the same as one already parsed gives the same configuration, or the
 * same error, without being parsed again: a reload parses its files once to find its policies
 * and again to build, and a large file costs seconds of parsing, each holding every guest.
 * `file:` secrets are read once for both; the window is one reload, so a later reload reads
 * them again.
 */
export function reuseParses(): () => void {
  reused = new Map();
  return () => {
    reused = undefined;
  };
}

/** Whether a reload's window ({@link reuseParses}) is open: an outcome kept now is taken by the parses in it. */
export function reusingParses(): boolean {
  return reused !== undefined;
}

/**
 * Within a reload's window: `outcome` is what parsing `text` gives, found elsewhere (on a worker
 * thread: see parse-ahead.ts), for the parses in the window to take.
 */
export function keepParsed(text: string, file: string, env: NodeJS.ProcessEnv, baseDir: string, outcome: ProxyConfig | ConfigFileError): void {
  reused?.set(parseKey(text, file, baseDir), { env, outcome });
}

/** As {@link loadConfigFile}, for text already read; relative paths are taken from `baseDir`. */
export function parseConfigText(text: string, file: string, env: NodeJS.ProcessEnv, baseDir: string): ProxyConfig {
  if (reused === undefined) return parseAnew(text, file, env, baseDir);
  const key = parseKey(text, file, baseDir);
  let found = reused.get(key);
  if (found === undefined || found.env !== env) {
    let outcome: ProxyConfig | ConfigFileError;
    try {
      outcome = parseAnew(text, file, env, baseDir);
    } catch (error) {
      if (!(error instanceof ConfigFileError)) throw error;
      outcome = error;
    }
    found = { env, outcome };
    reused.set(key, found);
  }
  if (found.outcome instanceof ConfigFileError) throw found.outcome;
  return found.outcome;
}

function parseKey(text: string, file: string, baseDir: string): string {
  return `${file}\0${baseDir}\0${text}`;
}

function parseAnew(text: string, file: string, env: NodeJS.ProcessEnv, baseDir: string): ProxyConfig {
  const deep = tooDeep(text);
  if (deep !== undefined) {
    throw new ConfigFileError(file, [{ ...makeIssue([], `nested deeper than ${maxNesting} levels`), line: text.slice(0, deep).split("\n").length }]);
  }
  const lines = new LineCounter();
  // Core schema: YAML 1.2, where `yes`/`no`/`on` are strings, not booleans, and `<<` is a plain key.
  // Duplicate keys are found by duplicateKeys, not by the library: its check compares each key
  // with every key before it, so 40,000 resolve entries took 11 s to parse (see duplicateKeys).
  const doc = parseDocument(text, { lineCounter: lines, schema: "core", uniqueKeys: false, prettyErrors: false });
  const problems: { offset: number; issue: OptionIssue }[] = doc.errors.map((error) => ({ offset: error.pos[0], issue: makeIssue([], `not valid YAML: ${firstLine(error.message)}`) }));
  for (const repeat of duplicateKeys(doc)) {
    const first = lines.linePos(repeat.first);
    const again = lines.linePos(repeat.offset);
    // A JSON file is often one line: the columns tell the two apart there.
    const where = first.line === again.line ? `line ${first.line}, column ${first.col}; this one at column ${again.col}` : `line ${first.line}`;
    problems.push({ offset: repeat.offset, issue: makeIssue(repeat.segments, `is given twice in one mapping (first at ${where}): a key may appear once, as the second would replace the first without a word`) });
  }
  if (problems.length > 0) {
    problems.sort((a, b) => a.offset - b.offset);
    throw new ConfigFileError(
      file,
      problems.map((problem) => ({ ...problem.issue, line: lines.linePos(problem.offset).line })),
    );
  }
  const complexKey = collectionKey(doc);
  if (complexKey !== undefined) {
    throw new ConfigFileError(file, [{ ...makeIssue([], "has a list or mapping as a key; every key here is a name"), line: lines.linePos(complexKey).line }]);
  }
  keysAsWritten(doc);
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
  if (config === undefined) throw new ConfigFileError(file, withLines(issues, doc, lines));
  return config;
}

/**
 * Far deeper than any configuration needs (about six levels), and still cheap to parse (about
 * 60 ms at 1,000 flow levels, where 100,000 took 3 to 6 s and then overflowed the stack). Block
 * nesting overflows the parser's stack sooner (about 880 levels of maps, 920 of compact
 * sequences), so the limit stays well below both.
 */
const maxNesting = 500;

/**
 * The offset where the file nests deeper than {@link maxNesting}, counted before the YAML parser
 * runs: a reload (SIGHUP, --watch) would hold every guest while it worked through deep nesting.
 * Flow nesting is counted by `[` and `{`. Brackets in quoted strings and comments count too: a
 * scan that skipped them could be led to skip the rest of the file, and no real configuration
 * holds a thousand unclosed brackets. Block nesting is counted per line: the block nodes still
 * open at a line are those indented less than it (a stack of indents), and each `- `, `? ` or
 * `: ` that begins a line opens one more at its column: a compact sequence (`- - - x`) nests
 * one level per two characters with no indent and no bracket; a million levels on one line held
 * every guest 18 s. The count can run high (a block scalar indented ever deeper counts each
 * indent), never low.
 */
function tooDeep(text: string): number | undefined {
  let flow = 0;
  /** The columns of the block nodes open at the line being read. */
  const block: number[] = [];
  let lineStart = true;
  for (let i = 0; i < text.length; i++) {
    if (lineStart) {
      lineStart = false;
      let at = i;
      while (text.charCodeAt(at) === 0x20) at++;
      const first = text.charCodeAt(at);
      // Blank and comment lines open and close nothing.
      if (at < text.length && first !== 0x0a && first !== 0x0d && first !== 0x23) {
        while (block.length > 0 && block[block.length - 1]! >= at - i) block.pop();
        for (;;) {
          block.push(at - i);
          if (block.length + flow > maxNesting) return at;
          if (!isIndicator(text, at)) break;
          at++;
          while (text.charCodeAt(at) === 0x20) at++;
        }
        i = at;
      }
    }
    const c = text.charCodeAt(i);
    if (c === 0x0a) lineStart = true;
    else if (c === 0x5b || c === 0x7b) {
      if (++flow + block.length > maxNesting) return i;
    } else if ((c === 0x5d || c === 0x7d) && flow > 0) flow--;
  }
  return undefined;
}

/** `-`, `?` or `:` followed by a space or the line's end: a block entry, key or value begins. */
function isIndicator(text: string, at: number): boolean {
  const c = text.charCodeAt(at);
  if (c !== 0x2d && c !== 0x3f && c !== 0x3a) return false;
  const next = text.charCodeAt(at + 1);
  return next === 0x20 || next === 0x0a || next === 0x0d || Number.isNaN(next);
}

/**
 * The offset of the first key that is a list or a mapping (`? - a`, `{[a]: b}`). No option has
 * one, and turning keys nested in keys into text costs the YAML library time that grows as a
 * power of their depth: 300 levels of `? ` took 22 s, holding every guest during a reload.
 */
function collectionKey(doc: Document): number | undefined {
  let found: number | undefined;
  visit(doc, {
    Pair(_key, pair) {
      if (!isCollection(pair.key)) return undefined;
      found = pair.key.range?.[0] ?? 0;
      return visit.BREAK;
    },
  });
  return found;
}

/**
 * Every key given a second time in its mapping: its option path, the offset of the repeat and
 * that of the first. Keys are compared as the names they are read as (see keysAsWritten): `12`
 * and `012` are two guests, `12`, `"12"` and `'12'` one name given twice. One map of names per
 * mapping keeps this linear: the library's own check (`uniqueKeys`) compares each key with every
 * key before it, and a file of 40,000 resolve entries (1 MB) held every guest 14 s during a
 * SIGHUP, one of 150,000 (3.9 MB, under the 4 MiB cap) over a minute. The path is worked out
 * only for a repeat, from the nodes above it.
 */
function duplicateKeys(doc: Document): { offset: number; first: number; segments: Segment[] }[] {
  const found: { offset: number; first: number; segments: Segment[] }[] = [];
  // Each list's positions, indexed once: a search per repeat made a list of 270,000 mappings
  // each with a repeated key quadratic (19 s where the library's own check took 8.5).
  const positions = new Map<unknown, Map<unknown, number>>();
  visit(doc, {
    Map(_key, map, ancestors) {
      const names = new Map<string, number>();
      for (const pair of map.items) {
        // Any other key (a list, a mapping, an alias) is a different node from every other one,
        // as the library's check had it; lists and mappings as keys are refused after (collectionKey).
        if (!isScalar(pair.key)) continue;
        const name = keyName(pair.key);
        const offset = pair.key.range?.[0] ?? map.range?.[0] ?? 0;
        const first = names.get(name);
        if (first !== undefined) found.push({ offset, first, segments: [...segmentsOf([...ancestors, map], positions), name] });
        else names.set(name, offset);
      }
      return undefined;
    },
  });
  return found;
}

/** The option path of the last node of `nodes` (the document, then each node down to it): a key for each pair, an index for each list. */
function segmentsOf(nodes: readonly unknown[], positions: Map<unknown, Map<unknown, number>>): Segment[] {
  const segments: Segment[] = [];
  for (const [i, node] of nodes.entries()) {
    if (isPair(node)) segments.push(isScalar(node.key) ? keyName(node.key) : "?");
    else if (isSeq(node) && i + 1 < nodes.length) {
      let at = positions.get(node);
      if (at === undefined) positions.set(node, (at = new Map(node.items.map((item, index) => [item, index]))));
      segments.push(at.get(nodes[i + 1]) ?? -1);
    }
  }
  return segments;
}

/**
 * Every key of the file is a name (an option's, a guest's, a secret's, a host's), never a
 * number: a plain key the core schema reads as another type is taken as written. Read as YAML
 * has it, the guest `0012` was served as "12" (and `007` as "7", `1.0` as "1", `0o17` as "15"),
 * check-config showed "12" without a word, and the credentials `egressgate env --guest 0012`
 * printed got 407.
 */
function keysAsWritten(doc: Document): void {
  visit(doc, {
    Pair(_key, pair) {
      if (isScalar(pair.key) && typeof pair.key.value !== "string") pair.key.value = keyName(pair.key);
    },
  });
}

/** The name a key scalar stands for: its text as written, whatever type YAML reads it as. */
function keyName(key: Scalar): string {
  if (typeof key.value === "string") return key.value;
  return key.source ?? String(key.value);
}

function firstLine(message: string): string {
  return message.split("\n")[0]!.trim();
}

/**
 * @internal Each issue with the line of the option it names: the key for an unknown key, else
 * the value. Exported for tests.
 */
export function withLines(issues: readonly OptionIssue[], doc: Document, lines: LineCounter): OptionIssue[] {
  // Each mapping's pairs by key, made once for all the issues (see pairNamed).
  const byName = new WeakMap<YAMLMap, Map<string, Pair>>();
  return issues.map((issue) => withLine(issue, doc, lines, byName));
}

function withLine(issue: OptionIssue, doc: Document, lines: LineCounter, byName: WeakMap<YAMLMap, Map<string, Pair>>): OptionIssue {
  const offset = offsetOf(doc.contents, issue.segments, issue.kind === "unknown", byName);
  return offset === undefined ? issue : { ...issue, line: lines.linePos(offset).line };
}

/**
 * The first pair of `map` whose key is `name`. Looked up by name rather than by a walk of the
 * mapping's pairs for each issue: a file of 150,000 unknown keys (1.7 MB) is 150,000 issues in
 * one mapping, and the walks took minutes (64,000 keys: 227 s), past the reload's parse thread's
 * deadline, and then on the event loop, holding every guest.
 */
function pairNamed(map: YAMLMap, name: string, byName: WeakMap<YAMLMap, Map<string, Pair>>): Pair | undefined {
  let pairs = byName.get(map);
  if (pairs === undefined) {
    pairs = new Map();
    for (const item of map.items) {
      if (!isPair(item) || !isScalar(item.key)) continue;
      const key = String(item.key.value);
      if (!pairs.has(key)) pairs.set(key, item);
    }
    byName.set(map, pairs);
  }
  return pairs.get(name);
}

/**
 * Walks the YAML nodes along `segments`. A path that ends early (a required key that is
 * missing) gives the deepest node found: the map the key belongs in.
 */
function offsetOf(root: unknown, segments: readonly Segment[], wantKey: boolean, byName: WeakMap<YAMLMap, Map<string, Pair>>): number | undefined {
  let node = root as Node | null | undefined;
  let offset = node?.range?.[0];
  for (const [i, segment] of segments.entries()) {
    const last = i === segments.length - 1;
    if (isMap(node)) {
      const pair = pairNamed(node, String(segment), byName);
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
