import { statSync } from "node:fs";
import { readRegularFileSync } from "../regular-file.js";
import { availableParallelism } from "node:os";
import path from "node:path";
import { homePath } from "../home-path.js";
import { DjsEngine } from "./engine.js";
import type { DjsLimits, PhaseName, PolicyKind } from "./protocol.js";
import { maxPolicyChars, PolicyLoadError, tooBig } from "./bundle.js";
import { makeIssue, optionError, shownValue, unknownKeyReason, type OptionError, type OptionIssueKind, type OptionRangeError, type Segment } from "../option-error.js";

export { PolicyLoadError } from "./bundle.js";

/** Options for {@link createDjsHooks}. */
export interface DjsHooksOptions {
  /** `script` defines global functions; `module` and `typescript` export them. Default: from the file extension, else `module` if the text has ES module syntax, else `script`. */
  readonly kind?: PolicyKind;
  /** The policy's file name, for errors and logs; its folder bounds relative imports. Without `modules` it is a path (a leading `~/` is $HOME, `~user/…` refused); with them, a label kept as written. */
  readonly filename?: string;
  /** The policy's source text. */
  readonly source: string;
  /**
   * Files the policy may import, by path relative to it (`{ "hosts.ts": "…", "deny.json": "…" }`).
   * Without `modules`, imports are read from disk next to `filename`.
   */
  readonly modules?: Readonly<Record<string, string>>;
  readonly limits?: Partial<DjsLimits>;
  /** Worker threads that run the policy. Default: 2 (1 on a single core). */
  readonly workers?: number;
}

export const defaultDjsLimits: DjsLimits = Object.freeze({
  timeoutMs: 100,
  memoryBytes: 32 * 1024 * 1024,
  stackBytes: 256 * 1024,
  returnBytes: 16 * 1024 * 1024,
  maxCalls: 512,
});

const limitRanges: Record<keyof DjsLimits, [number, number]> = {
  timeoutMs: [1, 60_000],
  memoryBytes: [1024 * 1024, 1024 * 1024 * 1024],
  stackBytes: [16 * 1024, 1024 * 1024],
  returnBytes: [1024, 1024 * 1024 * 1024],
  maxCalls: [1, 1_000_000],
};
const knownOptions = new Set(["kind", "filename", "source", "modules", "limits", "workers"]);

/**
 * A loaded tier-2 policy. Pass it to `createHttpHooks` as `djsHooks`; it runs before any tier-3
 * hook in every phase (DESIGN §3).
 */
export class DjsHooks {
  /** @internal */
  readonly engine: DjsEngine;
  readonly filename: string;
  /** The phases the policy defines; only these are registered. */
  readonly phases: readonly PhaseName[];

  /** @internal Use {@link createDjsHooks}. */
  constructor(engine: DjsEngine) {
    this.engine = engine;
    this.filename = engine.filename;
    this.phases = Object.freeze([...engine.phases]);
    Object.freeze(this);
  }

  /** Stops the policy's worker threads. Calls after this fail closed (502). */
  close(): Promise<void> {
    return this.engine.close();
  }
}

/**
 * The kind a file name tells. Otherwise it is not known until the first worker has parsed the
 * source: a module if it has ES module syntax, else a script of global functions (protocol.ts's
 * `detect`).
 */
function kindOf(filename: string | undefined): PolicyKind | undefined {
  if (filename === undefined) return undefined;
  if (/\.(ts|mts)$/.test(filename)) return "typescript";
  if (filename.endsWith(".mjs")) return "module";
  if (filename.endsWith(".js") || filename.endsWith(".cjs")) return "script";
  return undefined;
}

/** An option error of createDjsHooks: code EG_INVALID_OPTION and the option's path, as createHttpHooks's. */
function invalid(path: readonly Segment[], reason: string, kind: OptionIssueKind = "invalid"): OptionError | OptionRangeError {
  return optionError(makeIssue(path, reason, kind), { prefix: "createDjsHooks: " });
}

function resolveLimits(limits: unknown): DjsLimits {
  if (limits === undefined) return defaultDjsLimits;
  if (typeof limits !== "object" || limits === null) throw invalid(["limits"], "must be an object");
  const out: Record<string, number> = { ...defaultDjsLimits };
  for (const [key, value] of Object.entries(limits)) {
    const range = limitRanges[key as keyof DjsLimits];
    if (range === undefined) throw invalid(["limits", key], unknownKeyReason(key, Object.keys(limitRanges)), "unknown");
    if (value === undefined) continue;
    if (typeof value !== "number" || !Number.isInteger(value) || value < range[0] || value > range[1]) {
      throw invalid(["limits", key], `must be an integer from ${range[0]} to ${range[1]} (got ${shownValue(value)})`, "range");
    }
    out[key] = value;
  }
  return Object.freeze(out) as unknown as DjsLimits;
}

/**
 * Loads a tier-2 policy into QuickJS sandboxes on worker threads. The policy is bundled and
 * compiled once, here: a syntax error, a refused or missing import, or a top-level throw
 * throws a `PolicyLoadError` naming the file, line and message; so does a policy that defines
 * no phase, or a name that looks meant as a phase but would never be called (src/djs/phase-check.ts).
 *
 * Every call starts from the compiled state: module variables and globals a call changes are
 * gone in the next one, builtins are frozen, and `Date.now()` is the clock at the call's start.
 *
 * @example
 * ```ts
 * const { httpHooks } = createHttpHooks({
 *   allowedHosts: ["api.github.com"],
 *   ...createDjsHooks(`export function isRequestAllowed(r) { return r.method === "GET"; }`),
 * });
 * ```
 */
export function createDjsHooks(sourceOrOptions: string | DjsHooksOptions): { djsHooks: DjsHooks } {
  const options: DjsHooksOptions = typeof sourceOrOptions === "string" ? { source: sourceOrOptions } : sourceOrOptions;
  if (typeof options !== "object" || options === null) throw invalid([], "must be the policy's source text or an options object");
  for (const key of Object.keys(options)) {
    if (!knownOptions.has(key)) throw invalid([key], unknownKeyReason(key, [...knownOptions]), "unknown");
  }
  if (typeof options.source !== "string") throw invalid(["source"], "must be the policy's text");
  if (options.kind !== undefined && !["script", "module", "typescript"].includes(options.kind)) {
    throw invalid(["kind"], `must be "script", "module" or "typescript" (got ${shownValue(options.kind)})`);
  }
  if (options.filename !== undefined && (typeof options.filename !== "string" || options.filename === "")) {
    throw invalid(["filename"], "must be a non-empty string");
  }
  const modules = options.modules;
  if (modules !== undefined) {
    if (typeof modules !== "object" || modules === null || Array.isArray(modules)) {
      throw invalid(["modules"], 'must be an object of { "relative/path.ts": source }');
    }
    for (const [name, text] of Object.entries(modules)) {
      if (typeof text !== "string") throw invalid(["modules", name], "must be source text");
    }
  }
  // Without `modules`, its folder is where imports are read from: a path, `~/policies/p.ts` as
  // startProxy's paths have it. With them nothing is read from disk, and it is a label (for
  // errors, and the kind by its extension) kept as written: `~draft.mjs` is a name, no user's
  // home (review finding).
  const file = options.filename === undefined || modules !== undefined ? options.filename : homePath(options.filename, process.env, (reason) => {
    throw invalid(["filename"], reason);
  });
  const size = options.source.length + Object.values(modules ?? {}).reduce((n, text) => n + text.length, 0);
  if (size > maxPolicyChars) throw new PolicyLoadError(`${options.filename ?? "the policy"}: ${tooBig(size)}`);
  const workers = options.workers ?? Math.min(2, availableParallelism());
  if (!Number.isInteger(workers) || workers < 1 || workers > 64) {
    throw invalid(["workers"], `must be an integer from 1 to 64 (got ${shownValue(options.workers)})`, "range");
  }
  const known = options.kind ?? kindOf(file);
  const kind = known ?? "module";
  const named = (extension: string): string => path.resolve(file ?? `policy.${extension}`);
  const filename = named(kind === "typescript" ? "ts" : kind === "module" ? "mjs" : "js");
  const engine = DjsEngine.load(
    {
      kind,
      filename,
      source: options.source,
      modules: Object.freeze({ ...(modules ?? {}) }),
      // A policy named by a file imports its neighbours from disk; given as text, only `modules`.
      fromDisk: modules === undefined && file !== undefined,
      ...(known === undefined ? { detect: { scriptFilename: named("js") } } : {}),
    },
    resolveLimits(options.limits),
    workers,
  );
  return { djsHooks: new DjsHooks(engine) };
}

/**
 * The options the CLI builds for `--hooks-script FILE`: the file's text, its kind from the
 * extension (`.js` script, `.mjs` module, `.ts`/`.mts` TypeScript), and imports read next to it.
 * A leading `~/` is $HOME, as in startProxy's paths and the config file; `~user/…` is refused.
 *
 * @example
 * ```ts
 * const { httpHooks } = createHttpHooks({ allowedHosts: ["*"], ...createDjsHooks(djsHooksOptionsFromFile("policy.ts")) });
 * ```
 */
export function djsHooksOptionsFromFile(file: string): DjsHooksOptions {
  const filename = path.resolve(
    homePath(file, process.env, (reason) => {
      throw new PolicyLoadError(`cannot read the policy ${file}: it ${reason}`);
    }),
  );
  let source: string;
  try {
    // Measured before it is read: a file of 50 MB ran the proxy out of memory as it loaded.
    const { size } = statSync(filename);
    if (size > maxPolicyChars) throw new PolicyLoadError(`${filename}: ${tooBig(size)}`);
    // Read as a regular file only: a FIFO put in its place (a stat says 0 bytes) would hold the
    // start, or a reload with every guest, until written to.
    source = readRegularFileSync(filename, maxPolicyChars).toString("utf8");
  } catch (error) {
    if (error instanceof PolicyLoadError) throw error;
    throw new PolicyLoadError(`cannot read the policy ${filename}: ${(error as Error).message}`);
  }
  if (!/\.(js|mjs|ts|mts)$/.test(filename)) {
    throw new PolicyLoadError(`${filename}: a policy file must end in .js (script), .mjs (module), or .ts/.mts (TypeScript)`);
  }
  return { filename, source, kind: kindOf(filename)! };
}
