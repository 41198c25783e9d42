import { readFileSync } from "node:fs";
import variant from "@jitl/quickjs-wasmfile-release-sync";
import { newQuickJSWASMModuleFromVariant } from "quickjs-emscripten-core";
const mod = await newQuickJSWASMModuleFromVariant(variant);
const rt = mod.newRuntime();
if (process.argv[2] === "i") rt.setInterruptHandler(() => performance.now() > 1e15);
const ctx = rt.newContext();
const host = ctx.newObject();
const fnp = ctx.newFunction("parseUrl", (a) => ctx.newString(JSON.stringify({ href: ctx.getString(a), search: "", hostname: "a.test" })));
ctx.setProp(host, "parseUrl", fnp);
const install = ctx.evalCode(readFileSync("src/djs/sandbox/prelude.js", "utf8")).unwrap();
const api = ctx.callFunction(install, ctx.undefined, host).unwrap();
function time(label: string, src: string) {
  const fn = ctx.evalCode(`(function(){ ${src} })`).unwrap();
  const N = 20000;
  for (let i = 0; i < 2000; i++) ctx.callFunction(fn, ctx.undefined).unwrap().dispose();
  const t0 = performance.now();
  for (let i = 0; i < N; i++) ctx.callFunction(fn, ctx.undefined).unwrap().dispose();
  console.log(label, (((performance.now() - t0) * 1000) / N).toFixed(2), "us");
}
const tests: [string, string][] = [
  ["empty", ""],
  ["Object.create(globalThis)", "Object.create(globalThis)"],
  ["freeze obj", "Object.freeze({a:1,b:2,c:3,d:4,e:5})"],
  ["split", `"accept\\0*/*\\0user-agent\\0curl".split("\\0")`],
  ["new Headers()", "new Headers()"],
  ["new Response()", "new Response()"],
  ["new URL", `new URL("https://a.test/x")`],
  ["loop 100", "let x = 0; for (let i = 0; i < 100; i++) x += i; return x"],
];
for (const [l, s] of tests) time(l, s);
const f = ctx.getProp(api, "freeze"); ctx.callFunction(f, api).unwrap(); console.log("--- frozen");
for (const [l, s] of tests) time(l, s);
