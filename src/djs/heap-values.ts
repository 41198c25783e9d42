import type { QuickJSContext, QuickJSHandle } from "quickjs-emscripten-core";
import type { WasmMemory } from "./wasm-instance.js";

/** What `HeapValues` uses of quickjs-emscripten's context beyond its public API (version pinned). */
interface RawContext {
  readonly ctx: { readonly value: number };
  readonly module: { _malloc(bytes: number): number; _free(pointer: number): void };
  readonly ffi: {
    QTS_NewString(ctx: number, string: number): number;
    QTS_NewArrayBuffer(ctx: number, buffer: number, length: number): number;
  };
  readonly memory: { heapValueHandle(pointer: number): QuickJSHandle };
}

const encoder = new TextEncoder();

/**
 * QuickJS strings and ArrayBuffers made from the worker's data with the allocation checked.
 * quickjs-emscripten's `newString` and `newArrayBuffer` copy into what `_malloc` answered without
 * looking at it: with the policy's heap full (a `new URL()` or `TextEncoder` result larger than
 * what is left), that is address 0, and the copy overwrote the sandbox's memory from its start
 * (its static data, its C stack, the heap) before QuickJS read it back. The call still failed
 * closed (the refused growth makes it a memory limit, and the sandbox is replaced), but the WASM
 * trapped, quickjs-emscripten wrote "[C to host error: returning null] RuntimeError: memory
 * access out of bounds" and a stack to the process's stderr, and the limit was reported as
 * "sandbox" (black-box finding). Here a heap with no room answers undefined, and the growth the
 * heap refused (QuickJSInstance.memoryExhausted) makes the call a memory limit.
 */
export class HeapValues {
  private readonly raw: RawContext;

  constructor(
    ctx: QuickJSContext,
    private readonly memory: WasmMemory,
  ) {
    this.raw = ctx as unknown as RawContext;
  }

  /** `text` (which holds no NUL: it crosses as a C string) as a QuickJS string, or undefined when the heap has no room for its bytes. */
  string(text: string): QuickJSHandle | undefined {
    const { raw } = this;
    const bytes = Buffer.byteLength(text, "utf8") + 1;
    const at = raw.module._malloc(bytes);
    if (at === 0) return undefined;
    try {
      // The memory's buffer as it is after the allocation, which may have grown it.
      const view = new Uint8Array(this.memory.buffer, at, bytes);
      view[encoder.encodeInto(text, view).written] = 0;
      return this.handle(raw.ffi.QTS_NewString(raw.ctx.value, at));
    } finally {
      raw.module._free(at);
    }
  }

  /** A copy of `bytes` as a QuickJS ArrayBuffer, or undefined when the heap has no room for it. */
  arrayBuffer(bytes: Uint8Array): QuickJSHandle | undefined {
    const { raw } = this;
    const at = raw.module._malloc(Math.max(1, bytes.byteLength));
    if (at === 0) return undefined;
    new Uint8Array(this.memory.buffer, at, bytes.byteLength).set(bytes);
    // The ArrayBuffer owns the copy from here, and frees it.
    return this.handle(raw.ffi.QTS_NewArrayBuffer(raw.ctx.value, at, bytes.byteLength));
  }

  /** quickjs-emscripten's value for a JSValue pointer; 0 when even that pointer found no room. */
  private handle(pointer: number): QuickJSHandle | undefined {
    return pointer === 0 ? undefined : this.raw.memory.heapValueHandle(pointer);
  }
}
