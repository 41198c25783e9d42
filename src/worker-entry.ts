import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

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
 *
 * With {@link builtWorkersEnv} set to 1 (vitest.config.ts does, and test/global-setup.ts has
 * built dist from the current sources first), the sources' workers run their built `.js` from
 * dist instead: registering tsx cost each worker about 300 ms of CPU, more than the rest of its
 * start (docs/testing.md, "Suite duration").
 */
export function workerEntry(base: string, name: string): WorkerEntry {
  if (!base.endsWith(".ts")) return { entry: new URL(`./${name}.js`, base), eval: false };
  const built = process.env[builtWorkersEnv] === "1" ? builtSibling(fileURLToPath(new URL(`./${name}.ts`, base))) : undefined;
  if (built !== undefined) return { entry: pathToFileURL(built), eval: false };
  const tsxRoot = path.dirname(createRequire(base).resolve("tsx/package.json"));
  const api = pathToFileURL(path.join(tsxRoot, "dist/esm/api/index.mjs")).href;
  const module = new URL(`./${name}.ts`, base).href;
  return { entry: `import(${JSON.stringify(api)}).then((tsx) => { tsx.register(); return import(${JSON.stringify(module)}); });`, eval: true };
}

/** The variable that has workers of the TypeScript sources run from dist (see {@link workerEntry}). */
export const builtWorkersEnv = "EGRESSGATE_BUILT_WORKERS";

/** `…/src/a/b.ts` as built, `…/dist/a/b.js` (tsconfig.build.json), if that file is there. */
function builtSibling(source: string): string | undefined {
  const marker = `${path.sep}src${path.sep}`;
  const at = source.lastIndexOf(marker);
  if (at === -1) return undefined;
  const built = `${source.slice(0, at)}${path.sep}dist${path.sep}${source.slice(at + marker.length).replace(/\.ts$/, ".js")}`;
  return existsSync(built) ? built : undefined;
}
