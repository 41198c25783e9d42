import variant from "@jitl/quickjs-wasmfile-release-sync";
import { newQuickJSWASMModuleFromVariant } from "quickjs-emscripten-core";
const mod = await newQuickJSWASMModuleFromVariant(variant);
const rt = mod.newRuntime(); rt.setMaxStackSize(256 << 10); rt.setMemoryLimit(8 << 20);
const ctx = rt.newContext();
const r = ctx.evalCode(`
let hits = [];
const info = [typeof Error.prepareStackTrace, typeof Error.captureStackTrace, typeof Error.stackTraceLimit, typeof Error.isError];
Error.prepareStackTrace = (e, frames) => { hits.push(e.message); return "x"; };
try { const f = (n) => f(n + 1) + 1; f(0); } catch (e) { hits.push("caught " + e.message); }
try { const a = []; for (;;) a.push("x".repeat(1 << 16) + a.length); } catch (e) { hits.push("caught " + e.message); }
JSON.stringify({ info, hits });
`);
console.log(r.error ? ctx.dump(r.error) : ctx.dump(r.value));
