import variant from "@jitl/quickjs-wasmfile-release-sync";
import { newQuickJSWASMModuleFromVariant } from "quickjs-emscripten-core";
const mod = await newQuickJSWASMModuleFromVariant(variant);
const rt = mod.newRuntime();
rt.setInterruptHandler(() => performance.now() > 1e15);
const ctx = rt.newContext();
const fn = ctx.evalCode(`(function(a,b,c,d,e,f,g){ return 2 })`).unwrap();
const fn2 = ctx.evalCode(`(function(a){ const p = a.split("\\0"); return 2 })`).unwrap();
const fn3 = ctx.evalCode(`(function(a){ const o = Object.create(globalThis); const f = function(){ function onRequest(){}; return {onRequest: typeof onRequest === "function" ? onRequest : undefined, x: typeof x === "function" ? x : undefined} }; return f.call(o,o).onRequest() })`).unwrap();
const fn4 = ctx.evalCode(`(function(){ class A { #a; #b; #c; constructor(){ this.#a = 1; this.#b = 2; this.#c = 3 } }; return function(){ new A(); new A(); return 2 } })()`).unwrap();
const N = 20000;
function t(label: string, f: () => void) { const t0 = performance.now(); for (let i = 0; i < N; i++) f(); console.log(label, (((performance.now() - t0) * 1000) / N).toFixed(2)); }
for (let r = 0; r < 2; r++) {
t("7 args", () => { const a = [ctx.newNumber(2), ctx.newNumber(1234), ctx.newString("GET"), ctx.newString("https://a.test/x?y=1"), ctx.newString("accept\0*/*\0user-agent\0curl"), ctx.false, ctx.undefined]; const r = ctx.callFunction(fn, ctx.undefined, ...a).unwrap(); ctx.getNumber(r); r.dispose(); for (const h of a) h.dispose(); });
t("1 arg split", () => { const a = ctx.newString("2\x001234\0GET\0https://a.test/x?y=1\0accept\0*/*\0user-agent\0curl"); const r = ctx.callFunction(fn2, ctx.undefined, a).unwrap(); ctx.getNumber(r); r.dispose(); a.dispose(); });
t("no args", () => { const r = ctx.callFunction(fn, ctx.undefined).unwrap(); ctx.typeof(r); r.dispose(); });
t("factory", () => { const r = ctx.callFunction(fn3, ctx.undefined).unwrap(); r.dispose(); });
t("private class x2", () => { const r = ctx.callFunction(fn4, ctx.undefined).unwrap(); r.dispose(); });
}
