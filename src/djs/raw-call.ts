import type { QuickJSContext, QuickJSHandle } from "quickjs-emscripten-core";
import type { HeapValues } from "./heap-values.js";
import type { WasmMemory } from "./wasm-instance.js";

/** One argument of the prelude's `call`: a body travels as bytes, absent ones as undefined. */
export type CallArgument = string | number | boolean | Uint8Array | undefined;

/** What `RawCall` uses of quickjs-emscripten's context beyond its public API. */
interface RawContext {
  readonly ctx: { readonly value: number };
  readonly module: { _malloc(bytes: number): number; _free(pointer: number): void };
  readonly ffi: {
    QTS_NewString(ctx: number, string: number): number;
    QTS_NewFloat64(ctx: number, value: number): number;
    QTS_Call(ctx: number, fn: number, self: number, argc: number, argv: number): number;
    QTS_ResolveException(ctx: number, value: number): number;
    QTS_FreeValuePointer(ctx: number, value: number): void;
  };
  readonly memory: { heapValueHandle(pointer: number): QuickJSHandle };
}

const encoder = new TextEncoder();

/** The buffer `RawCall` keeps for a call's argument list and strings; a larger head gets one of its own size for that call. */
const scratchBytes = 16 * 1024;

/** The heap could not give `RawCall` its buffer, or room for a body. */
export class ScratchMemoryError extends Error {}

/** How the sandbox calls into QuickJS for each phase call, with the buffer it keeps for it. */
export class RawCall {
  /** Where a call's argument list and strings go in WASM memory. */
  private scratch = { at: 0, bytes: 0 };

  constructor(
    private readonly ctx: QuickJSContext,
    private readonly memory: WasmMemory,
    /** How a body becomes an ArrayBuffer, with its allocation checked (quickjs-emscripten's is not). */
    private readonly values: HeapValues,
  ) {}

  /**
   * Calls `fn` (the prelude's `call`) on `self` with these arguments. This is the one hot path
   * that goes past quickjs-emscripten's handles (whose version is pinned): the strings are
   * encoded in one go into a buffer the sandbox keeps in WASM memory, each becomes a QuickJS
   * value with one FFI call, and the values are freed right after. Through `newString`, each
   * string cost a `malloc`, a character-by-character copy in JavaScript and a `free` (about
   * 1.2 µs for a URL).
   */
  call(fn: QuickJSHandle, self: QuickJSHandle, args: readonly CallArgument[]): { value: QuickJSHandle; error?: undefined } | { error: QuickJSHandle; value?: undefined } {
    const { ctx } = this;
    const raw = ctx as unknown as RawContext;
    const context = raw.ctx.value;
    let room = 4 * args.length;
    for (const a of args) if (typeof a === "string") room += 3 * a.length + 1;
    if (room > this.scratch.bytes) {
      if (this.scratch.at !== 0) raw.module._free(this.scratch.at);
      this.scratch = { at: 0, bytes: 0 };
      const bytes = Math.max(room, scratchBytes);
      const at = raw.module._malloc(bytes);
      // A heap the policy filled cannot give it: that is the memory limit, not a write to address 0.
      if (at === 0) throw new ScratchMemoryError();
      this.scratch = { at, bytes };
    }
    // Strings first, while no FFI call can grow (and so replace) the memory's buffer.
    const heap = new Uint8Array(this.memory.buffer, this.scratch.at, this.scratch.bytes);
    const places: number[] = [];
    let at = 4 * args.length;
    for (const a of args) {
      if (typeof a !== "string") continue;
      places.push(this.scratch.at + at);
      at += encoder.encodeInto(a, heap.subarray(at)).written;
      heap[at++] = 0;
    }
    const pointers: number[] = [];
    const made: number[] = [];
    const buffers: QuickJSHandle[] = [];
    let place = 0;
    for (const a of args) {
      let pointer: number;
      if (typeof a === "string") made.push((pointer = raw.ffi.QTS_NewString(context, places[place++]!)));
      else if (typeof a === "number") made.push((pointer = raw.ffi.QTS_NewFloat64(context, a)));
      else if (typeof a === "boolean") pointer = (a ? ctx.true : ctx.false).value as unknown as number;
      else if (a === undefined) pointer = ctx.undefined.value as unknown as number;
      else {
        const buffer = this.values.arrayBuffer(a);
        if (buffer === undefined) {
          // The body does not fit in the heap the policy left: the memory limit.
          for (const pointer of made) raw.ffi.QTS_FreeValuePointer(context, pointer);
          for (const held of buffers) held.dispose();
          throw new ScratchMemoryError();
        }
        buffers.push(buffer);
        pointer = buffer.value as unknown as number;
      }
      pointers.push(pointer);
    }
    new Int32Array(this.memory.buffer, this.scratch.at, args.length).set(pointers);
    const result = raw.ffi.QTS_Call(context, fn.value as unknown as number, self.value as unknown as number, args.length, this.scratch.at);
    for (const pointer of made) raw.ffi.QTS_FreeValuePointer(context, pointer);
    for (const buffer of buffers) buffer.dispose();
    // A buffer grown for an unusually large head goes back to the policy's heap.
    if (this.scratch.bytes > scratchBytes) {
      raw.module._free(this.scratch.at);
      this.scratch = { at: 0, bytes: 0 };
    }
    const error = raw.ffi.QTS_ResolveException(context, result);
    if (error === 0) return { value: raw.memory.heapValueHandle(result) };
    raw.ffi.QTS_FreeValuePointer(context, result);
    return { error: raw.memory.heapValueHandle(error) };
  }
}
