import { realpathSync, statSync } from "node:fs";
import { stat } from "node:fs/promises";
import { readRegularFile } from "../regular-file.js";
import path from "node:path";
import { TraceMap, traceSegment } from "@jridgewell/trace-mapping";
import { build, stop, type Message, type Plugin } from "esbuild";
import type { PolicyKind } from "./protocol.js";

export interface BundleInput {
  readonly kind: PolicyKind;
  /** Where the policy lives: its folder bounds what may be imported. */
  readonly filename: string;
  readonly source: string;
  /** In-memory modules next to the policy, by relative path (`"hosts.ts"`, `"lib/deny.json"`). */
  readonly modules: Readonly<Record<string, string>>;
  /** Read imports from disk (a policy file) or only from `modules` (a policy given as source). */
  readonly fromDisk: boolean;
}


const virtualNamespace = "egressgate-policy";
const extensions = ["", ".ts", ".mts", ".js", ".mjs", ".json", "/index.ts", "/index.js", "/index.mjs"];

/**
 * The most text a policy may have, its imports included. A policy is code run on every request,
 * kilobytes as written; 4 MiB loads in seconds, while 30 MB missed the load deadline and 50 MB
 * ran the proxy out of memory as it loaded (black-box finding).
 */
export const maxPolicyChars = 4 * 1024 * 1024;

export function tooBig(size: number): string {
  return `the policy is ${(size / 1024 / 1024).toFixed(1)} MiB with its imports; a policy may be at most ${maxPolicyChars / 1024 / 1024} MiB`;
}

/** A failure with file, line and message, ready for the operator. */
export class PolicyLoadError extends Error {
  /** Stable, as every egressgate error's: a tier-2 policy that does not load. */
  readonly code = "EG_POLICY_LOAD";

  constructor(message: string) {
    super(message);
    this.name = "PolicyLoadError";
  }
}

/**
 * A source map comment, as esbuild reads one: `//# sourceMappingURL=` (or `//@`, `/*#`, `/*@`)
 * at the very start of a comment, and its URL.
 */
const sourceMapComment = /\/[/*][#@] sourceMappingURL=(\S*)/g;

/** A URL's scheme (`data`, `https`, `file`), if it has one. */
const urlScheme = /^([a-zA-Z][a-zA-Z0-9+.-]*):/;

/**
 * Why `contents` (a policy's file) cannot be bundled as it is, if it links a source map file.
 * esbuild reads the file such a comment names itself, past the import rules and with no limit:
 * a relative or absolute path, or a `file:` URL, from any folder. Named `/dev/zero`, the bundler
 * grew by about 500 MB a second until the machine ran out of memory; a FIFO held the load until
 * its deadline. A map written inline (`data:`) is taken as before, and esbuild reads no other
 * scheme (`https:`).
 */
function sourceMapLink(contents: string, file: string): string | undefined {
  for (const found of contents.matchAll(sourceMapComment)) {
    const url = found[1]!;
    const scheme = urlScheme.exec(url)?.[1]?.toLowerCase();
    if (scheme !== undefined && scheme !== "file") continue;
    const line = contents.slice(0, found.index).split("\n").length;
    return `${file}:${line}: a linked source map ("sourceMappingURL=${url.slice(0, 80)}") is refused: the bundler would read the file it names, from any folder and without a limit; remove the comment, or put the map inline as a data: URL`;
  }
  return undefined;
}

function inside(root: string, file: string): boolean {
  const rel = path.relative(root, file);
  return rel === "" || (!rel.startsWith("..") && !path.isAbsolute(rel));
}

/**
 * The import rules of DESIGN §2: relative imports that stay inside the policy's folder, and
 * nothing else. Bare specifiers (`lodash`, `node:fs`), absolute paths, URLs, `require()`, and
 * `import()` are refused with an error naming the import; so is a symlink that leads outside.
 */
function guard(input: BundleInput, root: string): Plugin {
  // Resolved on first use: a policy given as text may name a folder that does not exist.
  let realRoot: string | undefined;
  const entry = path.resolve(input.filename);
  let loaded = input.source.length;
  return {
    name: "egressgate-policy-imports",
    setup(b) {
      b.onResolve({ filter: /.*/ }, (args) => {
        if (args.kind === "entry-point") return { path: entry, namespace: virtualNamespace };
        const spec = args.path;
        if (args.kind !== "import-statement") {
          return { errors: [{ text: `${args.kind === "dynamic-import" ? "import()" : "require()"} of "${spec}" is refused: policies are bundled once, with static relative imports only` }] };
        }
        if (!spec.startsWith("./") && !spec.startsWith("../")) {
          return { errors: [{ text: `import "${spec}" is refused: a policy may import only relative files inside its folder (${root})` }] };
        }
        const target = path.resolve(path.dirname(args.importer), spec);
        if (!inside(root, target)) {
          return { errors: [{ text: `import "${spec}" is refused: it resolves outside the policy's folder (${root})` }] };
        }
        for (const ext of extensions) {
          const candidate = target + ext;
          if (input.fromDisk) {
            let isFile: boolean;
            try {
              isFile = statSync(candidate).isFile();
            } catch {
              continue;
            }
            if (!isFile) continue;
            realRoot ??= realpathSync(root);
            if (!inside(realRoot, realpathSync(candidate))) {
              return { errors: [{ text: `import "${spec}" is refused: it is a link to a file outside the policy's folder` }] };
            }
            return { path: candidate, namespace: virtualNamespace };
          }
          if (Object.hasOwn(input.modules, path.relative(root, candidate).split(path.sep).join("/"))) {
            return { path: candidate, namespace: virtualNamespace };
          }
        }
        return { errors: [{ text: `import "${spec}" was not found next to the policy` }] };
      });
      b.onLoad({ filter: /.*/, namespace: virtualNamespace }, async (args) => {
        const rel = path.relative(root, args.path).split(path.sep).join("/");
        if (args.path !== entry && input.fromDisk) {
          // Imports read from disk count against the same limit as the entry's own text.
          loaded += (await stat(args.path)).size;
          if (loaded > maxPolicyChars) return { errors: [{ text: tooBig(loaded) }] };
        }
        const contents =
          args.path === entry
            ? input.source
            : input.fromDisk
              ? (await readRegularFile(args.path, maxPolicyChars)).toString("utf8")
              : input.modules[rel]!;
        const linked = sourceMapLink(contents, args.path);
        if (linked !== undefined) return { errors: [{ text: linked }] };
        return { contents, loader: loaderFor(args.path, args.path === entry ? input.kind : undefined), resolveDir: path.dirname(args.path) };
      });
    },
  };
}

function loaderFor(file: string, kind: PolicyKind | undefined): "ts" | "js" | "json" {
  if (kind === "typescript") return "ts";
  if (kind !== undefined) return "js";
  if (file.endsWith(".json")) return "json";
  return file.endsWith(".ts") || file.endsWith(".mts") ? "ts" : "js";
}

function describe(message: Message): string {
  const at = message.location;
  if (at === null) return message.text;
  const file = at.file.startsWith(`${virtualNamespace}:`) ? at.file.slice(virtualNamespace.length + 1) : at.file;
  const text = message.text.startsWith("Top-level await is not available")
    ? "top-level await is not supported in a policy: its top level runs again, and synchronously, for every call (await inside the hook instead)"
    : message.text;
  return `${file}:${at.line}:${at.column + 1}: ${text}`;
}

/**
 * A `#!` line is allowed only at the very start of a script or module, and the bundler keeps a
 * policy's at the start of its output: inside the factory's function it was a syntax error
 * ("invalid first character of private name"). Made a comment, so lines and columns stay.
 */
export function hashbangAsComment(code: string): string {
  return code.startsWith("#!") ? `//${code.slice(2)}` : code;
}

/**
 * esbuild's bundled ESM ends with `export { local as exported, name };`. That statement becomes
 * an object literal for the factory to return (`exported: local, name: name`).
 */
function splitExports(code: string): { body: string; exported: string } {
  const match = /\nexport\s*\{([^}]*)\};?\s*$/.exec(`\n${code}`);
  if (match === null) return { body: code, exported: "" };
  const entries = match[1]!
    .split(",")
    .map((entry) => entry.trim())
    .filter((entry) => entry !== "")
    .map((entry) => {
      const [local, exported = local] = entry.split(/\s+as\s+/);
      return `${exported}: ${local}`;
    });
  return { body: code.slice(0, match.index), exported: entries.join(", ") };
}

/** A bundled policy: the factory's source, and a source map to name positions in the policy's own files. */
export interface BundledPolicy {
  readonly code: string;
  readonly map: string | undefined;
}

/**
 * Maps a position in the factory (1-based line, as QuickJS reports it) to the policy's own file
 * and line. The factory has one line of wrapper before the bundle.
 */
export function locate(map: string | undefined, line: number, column: number): { file: string; line: number; column: number } | undefined {
  if (map === undefined || line < 2) return undefined;
  const traced = new TraceMap(map);
  // traceSegment rather than originalPositionFor: the latter resolves `sources` as URLs, and these
  // are file paths behind esbuild's namespace prefix, to be reported exactly as esbuild gave them.
  const segment = traceSegment(traced, line - 2, Math.max(0, column - 1));
  if (segment === null || segment.length === 1) return undefined;
  const source = traced.sources[segment[1]] ?? "";
  const file = source.startsWith(`${virtualNamespace}:`) ? source.slice(virtualNamespace.length + 1) : source;
  return { file, line: segment[2] + 1, column: segment[3] + 1 };
}

/**
 * Bundles a module or TypeScript policy and its relative imports into one script whose value
 * is a factory: calling it runs the policy's top level again and returns its exports. Every
 * call of a phase starts from such a fresh run (DESIGN §2).
 */
export async function bundlePolicy(input: BundleInput): Promise<BundledPolicy> {
  const root = path.dirname(path.resolve(input.filename));
  try {
    const result = await build({
      entryPoints: [path.resolve(input.filename)],
      bundle: true,
      write: false,
      // ESM output ends with one `export { … }` statement, which becomes the factory's return
      // value; an IIFE would rebuild getter-based export objects on every call.
      format: "esm",
      platform: "neutral",
      target: "es2022",
      // The factory is a plain function, run again for every call: a top-level `await` cannot be
      // in it, and QuickJS's "expecting ';'" at the await said nothing of why.
      supported: { "top-level-await": false },
      mainFields: [],
      conditions: [],
      charset: "utf8",
      logLevel: "silent",
      sourcemap: "external",
      sourceRoot: "",
      outfile: path.join(root, "policy.bundle.js"),
      plugins: [guard(input, root)],
    });
    const files = result.outputFiles ?? [];
    const code = files.find((f) => f.path.endsWith(".js"))?.text ?? "";
    const map = files.find((f) => f.path.endsWith(".map"))?.text;
    const { body, exported } = splitExports(hashbangAsComment(code));
    // ES modules are strict, and the wrapper keeps them so.
    return { code: `(function (globalThis) { "use strict";\n${body}\nreturn { ${exported} };\n})`, map };
  } catch (error) {
    const failure = error as { errors?: Message[] };
    if (Array.isArray(failure.errors) && failure.errors.length > 0) {
      throw new PolicyLoadError(failure.errors.map(describe).join("\n"));
    }
    throw new PolicyLoadError(`${input.filename}: ${(error as Error).message}`);
  }
}

/**
 * Whether a policy given as text is an ES module: esbuild parses it (nothing is bundled) and
 * says whether it met `import`, `export`, `import.meta` or a top-level `await`. A line scan
 * took a script with a comment or string line starting "export" for a module that exports
 * nothing, and `import x from "./a.js"; export …` on one line, or `export{x}`, for a script.
 * Text that does not parse fails here with esbuild's file, line and message. `filename` must
 * not end in `.mjs` or `.mts`: esbuild takes such a file for a module whatever it holds.
 */
export async function hasModuleSyntax(source: string, filename: string): Promise<boolean> {
  try {
    const result = await build({
      stdin: { contents: source, loader: "js", sourcefile: filename },
      write: false,
      bundle: false,
      metafile: true,
      platform: "neutral",
      logLevel: "silent",
    });
    return Object.values(result.metafile.inputs).some((input) => input.format === "esm");
  } catch (error) {
    const failure = error as { errors?: Message[] };
    if (Array.isArray(failure.errors) && failure.errors.length > 0) {
      throw new PolicyLoadError(failure.errors.map(describe).join("\n"));
    }
    throw new PolicyLoadError(`${filename}: ${(error as Error).message}`);
  }
}

/**
 * Stops esbuild's service process. A worker thread that bundled the policy calls it once it has
 * the code: the service would otherwise stay a child of the proxy for its whole life (about
 * 12 MiB of RSS) with nothing more to bundle. A later bundle starts a new one.
 */
export function stopBundler(): Promise<void> {
  return stop();
}
