import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";
import { build } from "esbuild";

/**
 * The sandbox's prelude is written as ES modules by concern (`sandbox/prelude/*.js`, each
 * checked by `tsc -p src/djs/sandbox/prelude/tsconfig.json`) and evaluated inside QuickJS as one
 * script, `sandbox/prelude.js`. That script is generated here and committed, rather than bundled
 * when a sandbox starts, because:
 * - every worker thread reads it when it loads `sandbox.ts`, from `src/` under vitest and tsx and
 *   from `dist/` when installed: a plain file works the same from both, and needs no esbuild
 *   service in each worker (the policy bundler stops its own for the 12 MiB it keeps);
 * - `dist/` then needs only the one file, not the modules;
 * - what the sandbox runs can be read and diffed as it is.
 * `npm run build` regenerates it; test/unit/djs-prelude.test.ts fails while it is stale.
 */
export const preludeFile = fileURLToPath(new URL("./sandbox/prelude.js", import.meta.url));
const entry = fileURLToPath(new URL("./sandbox/prelude/entry.js", import.meta.url));
/** The package's root: the bundle names each module by its path from here. */
const root = fileURLToPath(new URL("../../", import.meta.url));

const header = `// Generated from src/djs/sandbox/prelude/*.js by src/djs/build-prelude.ts (npm run build:prelude): edit
// those modules, not this file. test/unit/djs-prelude.test.ts fails while the two differ.
//
// The tier-2 sandbox's own API, evaluated once inside each QuickJS context (never in Node). Its
// value is a function of \`host\`, the few functions the worker provides; calling it installs the
// web classes a policy may use and returns the functions the worker calls (entry.js).
`;

/** The prelude's modules as the one script the sandbox evaluates. */
export async function bundlePrelude(): Promise<string> {
  const result = await build({
    entryPoints: [entry],
    absWorkingDir: root,
    bundle: true,
    write: false,
    // ESM output ends with one `export { install };`, which becomes the wrapper's return. An
    // IIFE with a global name would need esbuild's export helpers, and a global binding.
    format: "esm",
    platform: "neutral",
    // QuickJS runs the modules' syntax as written (private fields, static blocks, `??=`).
    target: "esnext",
    charset: "utf8",
    legalComments: "none",
    // Bundling turns a class that names itself (`new URL(…)` inside URL) into `var URL = class
    // _URL`, and `URL.name` would read "_URL". keepNames gives every class and function the name
    // it has in its module, as the policy sees them in a browser or Node.
    keepNames: true,
    logLevel: "silent",
  });
  const code = result.outputFiles[0]?.text ?? "";
  const tail = /\nexport\s*\{\s*install\s*\};\s*$/.exec(code);
  if (tail === null) throw new Error("the prelude's bundle does not end by exporting install: has entry.js changed its export?");
  // Strict, as the modules were; everything in the wrapper is local to it, so no module-level
  // name of the prelude becomes a global of the realm.
  return `${header}(function installSandbox(host) {\n"use strict";\n${code.slice(0, tail.index)}\nreturn install(host);\n})\n`;
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const bundled = await bundlePrelude();
  const before = (() => {
    try {
      return readFileSync(preludeFile, "utf8");
    } catch {
      return undefined;
    }
  })();
  if (bundled !== before) writeFileSync(preludeFile, bundled);
}
