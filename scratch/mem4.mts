import variant from "@jitl/quickjs-wasmfile-release-sync";
import { newQuickJSWASMModuleFromVariant } from "quickjs-emscripten-core";
const mod = await newQuickJSWASMModuleFromVariant(variant);
const rt = mod.newRuntime(); rt.setMemoryLimit(8 << 20);
const ctx = rt.newContext();
const t0 = performance.now();
const r = ctx.evalCode(`let n = 0; const a = []; try { for (let i = 0; i < 20; i++) { a.push(new Uint8Array(1 << 20)); n++; } "no oom " + n } catch (e) { "caught " + e + " after " + n }`);
console.log(r.error ? ctx.dump(r.error) : ctx.dump(r.value), performance.now() - t0);
