import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

/** What `new Worker()` takes to run a module: its file, or source to evaluate (`eval: true`). */
export interface WorkerEntry {
  readonly entry: string | URL;
  readonly eval: boolean;
}

/**
 * How to run the module `name` (no extension) next to `base`, the caller's `import.meta.url`,
 * on a worker thread. From dist it is the built `.js`. From the TypeScript sources (tests, tsx)
 * the worker needs tsx's loader registered inside itself: `--import` in a worker's execArgv does
 * not reach its module loader on Node 20. So the entry is then a bootstrap that registers it and
 * imports the `.ts`.
 */
export function workerEntry(base: string, name: string): WorkerEntry {
  if (!base.endsWith(".ts")) return { entry: new URL(`./${name}.js`, base), eval: false };
  const tsxRoot = path.dirname(createRequire(base).resolve("tsx/package.json"));
  const api = pathToFileURL(path.join(tsxRoot, "dist/esm/api/index.mjs")).href;
  const module = new URL(`./${name}.ts`, base).href;
  return { entry: `import(${JSON.stringify(api)}).then((tsx) => { tsx.register(); return import(${JSON.stringify(module)}); });`, eval: true };
}
