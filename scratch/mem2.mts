import { readFileSync } from "node:fs";
import variant from "@jitl/quickjs-wasmfile-release-sync";
import { newQuickJSWASMModuleFromVariant } from "quickjs-emscripten-core";
for (const freeze of [false, true]) {
  const mod = await newQuickJSWASMModuleFromVariant(variant);
  const rt = mod.newRuntime(); rt.setMemoryLimit(8 << 20); rt.setMaxStackSize(256 << 10);
  let deadline = performance.now() + 3000;
  rt.setInterruptHandler(() => performance.now() > deadline);
  const ctx = rt.newContext();
  const host = ctx.newObject();
  const install = ctx.evalCode(readFileSync("src/djs/sandbox/prelude.js", "utf8")).unwrap();
  const api = ctx.callFunction(install, ctx.undefined, host).unwrap();
  if (freeze) { const f = ctx.getProp(api, "freeze"); ctx.callFunction(f, api).unwrap(); }
  const t0 = performance.now();
  const r = ctx.evalCode(`let n = 0; try { const a = []; for (;;) { a.push("x".repeat(1 << 16) + a.length); n++; } } catch (e) { "caught " + e + " after " + n }`);
  console.log(freeze, r.error ? ctx.dump(r.error) : ctx.dump(r.value), performance.now() - t0);
}
