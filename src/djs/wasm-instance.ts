import { readFileSync } from "node:fs";
import releaseSync from "@jitl/quickjs-wasmfile-release-sync";
import { newQuickJSWASMModuleFromVariant, newVariant, type QuickJSContext, type QuickJSRuntime, type QuickJSSyncVariant } from "quickjs-emscripten-core";
import { PolicyLoadError } from "./bundle.js";
import type { DjsLimits } from "./protocol.js";
import { quickJSWasmPath } from "./quickjs-module.js";

// The bellard build, synchronous (no asyncify): about twice as fast as quickjs-ng here (DESIGN §7).
const variant = releaseSync as unknown as QuickJSSyncVariant;

/** The WebAssembly global: @types/node declares its types but not the value. */
export type WasmMemory = { readonly buffer: ArrayBuffer };
type WasmModule = object;
type WasmInstance = object;
type WasmImports = Record<string, Record<string, unknown>>;
const wasm = (
  globalThis as unknown as {
    WebAssembly: {
      Memory: new (d: { initial: number; maximum: number }) => WasmMemory;
      compile(bytes: Uint8Array): Promise<WasmModule>;
      instantiate(module: WasmModule, imports: WasmImports): Promise<WasmInstance>;
    };
  }
).WebAssembly;

/**
 * QuickJS's WASM, compiled once per thread, or once for the process by the host (see
 * {@link useCompiledQuickJS}): each sandbox instantiates it with a heap of its own.
 */
let compiledQuickJS: Promise<WasmModule> | undefined;

/** Takes the module the host compiled for every worker (WorkerInit.quickjs) rather than compile one for this thread. */
export function useCompiledQuickJS(module: WasmModule | undefined): void {
  if (module !== undefined) compiledQuickJS = Promise.resolve(module);
}

/**
 * emscripten's heap-growth function among the module's imports: the one function every failed
 * allocation goes through (it answers false when the heap cannot grow, past the WASM memory's
 * maximum or past 2 GiB). Known by its source, in this pinned build.
 */
function findHeapResize(imports: WasmImports): { table: Record<string, unknown>; key: string } | undefined {
  for (const table of Object.values(imports)) {
    for (const [key, value] of Object.entries(table)) {
      if (typeof value !== "function") continue;
      const source = Function.prototype.toString.call(value);
      if (source.includes("2147483648") && source.includes(".grow(")) return { table, key };
    }
  }
  return undefined;
}

/** What the emscripten build starts with (its stack, the runtime, the prelude); the policy's limit comes on top. */
const baseHeapBytes = 16 * 1024 * 1024;

/**
 * The deepest 4 KiB of QuickJS's stack (it grows down, so just above its lower limit), which the
 * sandbox keeps painted and watches. A call whose stack reached into it has hit the stack limit,
 * whether or not the policy caught the "stack overflow" error QuickJS threw: the check happens
 * after the call, outside anything the policy can touch. QuickJS refuses a frame that would
 * cross the limit before writing it, so a function whose frame is larger than the band (thousands
 * of locals) can overflow without reaching into it; such an overflow, caught, goes unseen.
 */
const stackBandBytes = 4096;
const bandPaint = 0xa5;

/**
 * Where the runtime keeps its lower stack limit: the address of that field in WASM memory.
 * QuickJS's JSRuntime holds `stack_size`, `stack_top` and `stack_limit` side by side (32-bit
 * words in this build), with `stack_limit = stack_top - stack_size`; the three are looked for
 * in the runtime's first 512 bytes, and a build where they are not found does not load.
 */
function stackLimitField(words: Uint32Array, runtimePointer: number, stackBytes: number): number | undefined {
  const first = runtimePointer >>> 2;
  for (let i = first; i < first + 128; i++) {
    if (words[i] === stackBytes && words[i + 1]! - words[i + 2]! === stackBytes && words[i + 2]! > 0) return (i + 2) * 4;
  }
  return undefined;
}

/**
 * One QuickJS runtime and context on a WASM instance of their own, with the heap capped and
 * watched and the deepest band of the stack painted and watched: what tells, after a call,
 * whether the call hit the memory or the stack limit, whatever the policy caught.
 */
export class QuickJSInstance {
  /** What the band holds while untouched. */
  private readonly bandReference = Buffer.alloc(stackBandBytes, bandPaint);

  private constructor(
    readonly runtime: QuickJSRuntime,
    readonly ctx: QuickJSContext,
    /** The policy's WASM memory: its heap and stack. */
    readonly memory: WasmMemory,
    /** The most the memory may grow to. */
    private readonly maxHeapBytes: number,
    /** `refused` is set when the heap could not grow for an allocation: that allocation failed. */
    private readonly heap: { refused: boolean },
    /** Where the band starts. */
    private readonly bandAt: number,
  ) {}

  static async create(filename: string, limits: DjsLimits): Promise<QuickJSInstance> {
    // The WASM memory's maximum is the cap. QuickJS's own limit is left off: it cannot ask
    // emscripten's malloc for block sizes, so it counts allocations rather than bytes, and it
    // refuses one allocation larger than the limit without a trace. Every allocation goes to the
    // heap instead, and a growth the heap refuses is seen (`heap.refused`).
    const pages = Math.ceil((baseHeapBytes + limits.memoryBytes) / 65536);
    const wasmMemory = new wasm.Memory({ initial: baseHeapBytes / 65536, maximum: pages });
    compiledQuickJS ??= wasm.compile(readFileSync(quickJSWasmPath()));
    const quickjs = await compiledQuickJS;
    const heap = { refused: false, watched: false };
    // emscripten's loader has no way to fail from this hook: a failed instantiation ends the
    // wait below instead of leaving it pending.
    let instantiationFailed!: (error: unknown) => void;
    const failed = new Promise<never>((_resolve, reject) => {
      instantiationFailed = reject;
    });
    const instantiateWasm = (imports: WasmImports, onSuccess: (instance: WasmInstance) => void): object => {
      const resize = findHeapResize(imports);
      if (resize !== undefined) {
        const original = resize.table[resize.key] as (bytes: number) => boolean;
        resize.table[resize.key] = (bytes: number): boolean => {
          const grown = original(bytes);
          if (!grown) heap.refused = true;
          return grown;
        };
        heap.watched = true;
      }
      wasm.instantiate(quickjs, imports).then(onSuccess, instantiationFailed);
      return {};
    };
    const module = await Promise.race([newQuickJSWASMModuleFromVariant(newVariant(variant, { wasmMemory, emscriptenModule: { instantiateWasm } as never })), failed]);
    if (!heap.watched) {
      throw new PolicyLoadError(`${filename}: not loaded: the installed QuickJS build does not show how its heap grows, so the sandbox cannot see a refused allocation (a build problem, not the policy's)`);
    }
    const runtime = module.newRuntime();
    runtime.setMaxStackSize(limits.stackBytes);
    const ctx = runtime.newContext();
    // quickjs-emscripten keeps the runtime's pointer to itself (a protected field, version pinned).
    const runtimePointer = (runtime as unknown as { rt: { value: number } }).rt.value;
    const limitAt = stackLimitField(new Uint32Array(wasmMemory.buffer), runtimePointer, limits.stackBytes);
    if (limitAt === undefined) {
      throw new PolicyLoadError(`${filename}: not loaded: the installed QuickJS build does not show where its stack limit is, so the sandbox cannot watch its stack (a build problem, not the policy's)`);
    }
    const instance = new QuickJSInstance(runtime, ctx, wasmMemory, pages * 65536, heap, new Uint32Array(wasmMemory.buffer, limitAt, 1)[0]!);
    instance.paintStackBand();
    return instance;
  }

  /**
   * Whether the call hit the memory limit. A heap grown to its cap stays that size, so the next
   * call could not allocate either. A single allocation larger than what is left fails without
   * growing the heap, and the policy may have caught QuickJS's "out of memory": the refused
   * growth is what tells.
   */
  get memoryExhausted(): boolean {
    return this.heap.refused || this.memory.buffer.byteLength + 1024 * 1024 > this.maxHeapBytes;
  }

  /** Paints the band: when the sandbox is made, and again after a call that reached into it. */
  paintStackBand(): void {
    Buffer.from(this.memory.buffer, this.bandAt, stackBandBytes).fill(bandPaint);
  }

  /** Whether a call's stack reached into the band since it was painted. */
  stackBandTouched(): boolean {
    return !Buffer.from(this.memory.buffer, this.bandAt, stackBandBytes).equals(this.bandReference);
  }
}
