import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

/** A compiled WebAssembly.Module: @types/node declares the WebAssembly types but not the value. */
export type CompiledWasm = object;

const wasm = (globalThis as unknown as { WebAssembly: { Module: new (bytes: Uint8Array) => CompiledWasm } }).WebAssembly;

/** The QuickJS build's WASM file (the package's `./wasm` export). */
export function quickJSWasmPath(): string {
  return createRequire(import.meta.url).resolve("@jitl/quickjs-wasmfile-release-sync/wasm");
}

let compiled: CompiledWasm | undefined;

/**
 * QuickJS's WASM compiled once for the whole process, for each policy worker to instantiate with
 * a heap of its own (WorkerInit.quickjs). V8 shares a module's code between the threads it is sent
 * to, the functions it compiled lazily and tiered up as calls ran included; a worker that compiled
 * its own paid all of that again, about 400 ms of CPU of the 600 ms a worker took to start
 * (measured: docs/testing.md, "Suite duration"). The compile itself is lazy and takes a few tens
 * of milliseconds, once. Undefined when the file cannot be read or compiled now (the process out
 * of descriptors, say): the worker then compiles its own, as before, and the next spawn tries again.
 */
export function sharedQuickJS(): CompiledWasm | undefined {
  if (compiled !== undefined) return compiled;
  try {
    compiled = new wasm.Module(readFileSync(quickJSWasmPath()));
  } catch {
    return undefined;
  }
  return compiled;
}
