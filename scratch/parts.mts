import { readFileSync } from "node:fs";
import variant from "@jitl/quickjs-wasmfile-release-sync";
import { newQuickJSWASMModuleFromVariant } from "quickjs-emscripten-core";
const mod = await newQuickJSWASMModuleFromVariant(variant);
const rt = mod.newRuntime(); 
const withInterrupt = process.argv[2] === "i";
if (withInterrupt) rt.setInterruptHandler(() => performance.now() > 1e15);
const ctx = rt.newContext();
const host = ctx.newObject();
const fnp = ctx.newFunction("parseUrl", (a) => ctx.newString(JSON.stringify({ href: ctx.getString(a), search: "", hostname: "a.test" })));
ctx.setProp(host, "parseUrl", fnp);
const install = ctx.evalCode(readFileSync("src/djs/sandbox/prelude.js", "utf8")).unwrap();
const api = ctx.callFunction(install, ctx.undefined, host).unwrap();
ctx.setProp(ctx.global, "__api", api);
const freeze = process.argv[3] === "f";
function time(label: string, src: string) {
  const fn = ctx.evalCode(`(function(){ ${src} })`).unwrap();
  const N = 20000;
  const t0 = performance.now();
  for (let i = 0; i < N; i++) ctx.callFunction(fn, ctx.undefined).unwrap().dispose();
  console.log(label, (((performance.now() - t0) * 1000) / N).toFixed(2), "us");
}
time("empty", "");
time("headers.fromFlat", `const H = globalThis.Headers; H; `);
time("new Headers obj", `new Headers({accept: "*/*", "user-agent": "curl"})`);
time("new Request", `new Request("https://a.test/x", {method: "GET", headers: {accept: "*/*"}})`);
time("new URL", `new URL("https://a.test/x")`);
time("JSON rt", `JSON.stringify(JSON.parse('{"phase":"onRequest","now":1234,"request":{"method":"GET","url":"https://a.test/x?y=1","headers":["accept","*/*","user-agent","curl"],"hasBody":false}}'))`);
time("ownKeys global", `Reflect.ownKeys(globalThis).length`);
time("promise", `Promise.resolve(1).then(() => 1)`);
if (freeze) { const f = ctx.getProp(api, "freeze"); ctx.callFunction(f, api).unwrap(); console.log("frozen"); }
time("empty", "");
time("new Headers obj", `new Headers({accept: "*/*", "user-agent": "curl"})`);
time("new Request", `new Request("https://a.test/x", {method: "GET", headers: {accept: "*/*"}})`);
time("JSON rt", `JSON.stringify(JSON.parse('{"phase":"onRequest","now":1234,"request":{"method":"GET","url":"https://a.test/x?y=1","headers":["accept","*/*","user-agent","curl"],"hasBody":false}}'))`);
time("ownKeys global", `Reflect.ownKeys(globalThis).length`);
