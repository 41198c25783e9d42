import { readFileSync } from "node:fs";
import variant from "@jitl/quickjs-wasmfile-release-sync";
import { newQuickJSWASMModuleFromVariant } from "quickjs-emscripten-core";
for (const prelude of [false, true]) {
  const mod = await newQuickJSWASMModuleFromVariant(variant);
  const rt = mod.newRuntime(); rt.setMemoryLimit(8 << 20);
  const ctx = rt.newContext();
  if (prelude) { const install = ctx.evalCode(readFileSync("src/djs/sandbox/prelude.js", "utf8")).unwrap(); ctx.callFunction(install, ctx.undefined, ctx.newObject()).unwrap(); }
  const t0 = performance.now();
  const r = ctx.evalCode(`let n = 0; const a = []; try { for (let i = 0; i < 2000; i++) { a.push("x".repeat(1 << 16) + a.length); n++; } "no oom " + n } catch (e) { "caught " + e + " after " + n }`);
  console.log(prelude, r.error ? ctx.dump(r.error) : ctx.dump(r.value), performance.now() - t0);
  console.log(rt.dumpMemoryUsage().split("\n").filter((l) => /malloc|memory used|string/.test(l)).join(" | "));
}
