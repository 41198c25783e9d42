import { realpathSync, statSync } from "node:fs";
import path from "node:path";
import { build, type Message, type Plugin } from "esbuild";
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

/** The global the bundle assigns its exports to, inside the factory that wraps it. */
export const exportsName = "__egressgatePolicy";

const virtualNamespace = "egressgate-policy";
const extensions = ["", ".ts", ".mts", ".js", ".mjs", ".json", "/index.ts", "/index.js", "/index.mjs"];

/** A failure with file, line and message, ready for the operator. */
export class PolicyLoadError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "PolicyLoadError";
  }
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
  const realRoot = input.fromDisk ? realpathSync(root) : root;
  const entry = path.resolve(input.filename);
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
            let isFile = false;
            try {
              isFile = statSync(candidate).isFile();
            } catch {
              continue;
            }
            if (!isFile) continue;
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
        const contents =
          args.path === entry
            ? input.source
            : input.fromDisk
              ? await import("node:fs/promises").then((fs) => fs.readFile(args.path, "utf8"))
              : input.modules[rel]!;
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
  return at === null ? message.text : `${at.file}:${at.line}:${at.column + 1}: ${message.text}`;
}

/**
 * Bundles a module or TypeScript policy and its relative imports into one script whose value
 * is a factory: calling it runs the policy's top level again and returns its exports. Every
 * call of a phase starts from such a fresh run (DESIGN §2).
 */
export async function bundlePolicy(input: BundleInput): Promise<string> {
  const root = path.dirname(path.resolve(input.filename));
  try {
    const result = await build({
      entryPoints: [path.resolve(input.filename)],
      bundle: true,
      write: false,
      format: "iife",
      globalName: exportsName,
      platform: "neutral",
      target: "es2022",
      mainFields: [],
      conditions: [],
      charset: "utf8",
      logLevel: "silent",
      plugins: [guard(input, root)],
    });
    const code = result.outputFiles?.[0]?.text ?? "";
    return `(function (globalThis) {\n${code}\nreturn ${exportsName};\n})`;
  } catch (error) {
    const failure = error as { errors?: Message[] };
    if (Array.isArray(failure.errors) && failure.errors.length > 0) {
      throw new PolicyLoadError(failure.errors.map(describe).join("\n"));
    }
    throw new PolicyLoadError(`${input.filename}: ${(error as Error).message}`);
  }
}
