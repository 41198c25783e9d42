import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import releaseSync from "@jitl/quickjs-wasmfile-release-sync";
import { newQuickJSWASMModuleFromVariant, newVariant, type QuickJSSyncVariant, type QuickJSContext, type QuickJSHandle, type QuickJSRuntime } from "quickjs-emscripten-core";
import { locate, PolicyLoadError } from "./bundle.js";
import { phaseNames, type CallMessage, type CallReply, type DjsLimits, type Outcome, type PhaseName, type PolicyKind } from "./protocol.js";

// The bellard build, synchronous (no asyncify): about twice as fast as quickjs-ng here (DESIGN §7).
const variant = releaseSync as unknown as QuickJSSyncVariant;
const preludeSource = readFileSync(new URL("./sandbox/prelude.js", import.meta.url), "utf8");

const scriptExports = `\n;return { ${phaseNames.map((n) => `${n}: typeof ${n} === "function" ? ${n} : undefined`).join(", ")} };`;

/** What `new URL()` inside the sandbox gets back: the parts Node's WHATWG parser produced, LF-joined. */
function urlParts(url: URL): string {
  return [url.href, url.origin, url.protocol, url.username, url.password, url.host, url.hostname, url.port, url.pathname, url.search, url.hash].join("\n");
}
/** The WebAssembly global: @types/node declares its types but not the value. */
type WasmMemory = { readonly buffer: ArrayBuffer };
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

/** QuickJS's WASM, compiled once per thread: each sandbox instantiates it with a heap of its own. */
let compiledQuickJS: Promise<WasmModule> | undefined;

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
const settableParts = new Set(["href", "protocol", "username", "password", "host", "hostname", "port", "pathname", "search", "hash"]);

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

/** One argument of the prelude's `call`: a body travels as bytes, absent ones as undefined. */
type CallArgument = string | number | boolean | Uint8Array | undefined;

/** What `callEntry` uses of quickjs-emscripten's context beyond its public API. */
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

/** The buffer `callEntry` keeps for a call's argument list and strings; a larger head gets one of its own size for that call. */
const scratchBytes = 16 * 1024;

/** How much of an error's name, message and stack a failure outside the prelude reports. */
const failureTextChars = 8192;

/** The heap could not give `callEntry` its buffer. */
class ScratchMemoryError extends Error {}

/** The limit a QuickJS error stands for, if it is one: limits end the call, whatever the policy did. */
function limitOf(error: unknown, interrupted: boolean): string | undefined {
  if (interrupted) return "time";
  if (error === undefined || error === null) return "memory";
  const message = String((error as { message?: unknown }).message ?? error);
  if (/out of memory/i.test(message)) return "memory";
  if (/stack overflow/i.test(message)) return "stack";
  return undefined;
}

/**
 * One QuickJS runtime and context holding a loaded, frozen policy. Calls run one at a time.
 * After a call that hit a limit, or broke the sandbox's own code, the owner replaces the whole
 * sandbox (a fresh WASM instance), so nothing of that call survives.
 */
export class Sandbox {
  private deadline = Infinity;
  private interrupted = false;
  private api!: QuickJSHandle;
  private callFn!: QuickJSHandle;
  private finishFn!: QuickJSHandle;
  private takeBytesFn!: QuickJSHandle;
  phases: PhaseName[] = [];
  /** The policy's WASM memory (its heap and stack), and the most it may grow to. */
  private wasmMemory!: WasmMemory;
  private maxHeapBytes = Infinity;
  /** What the band holds while untouched, and where it starts. */
  private readonly bandReference = Buffer.alloc(stackBandBytes, bandPaint);
  private bandAt = 0;
  /** Where `callEntry` puts a call's argument list and strings in WASM memory. */
  private scratch = { at: 0, bytes: 0 };

  /** `refused` is set when the heap could not grow for an allocation: that allocation failed. */
  private heap = { refused: false };

  /**
   * Whether the call hit the memory limit. A heap grown to its cap stays that size, so the next
   * call could not allocate either. A single allocation larger than what is left fails without
   * growing the heap, and the policy may have caught QuickJS's "out of memory": the refused
   * growth is what tells.
   */
  private get memoryExhausted(): boolean {
    return this.heap.refused || this.wasmMemory.buffer.byteLength + 1024 * 1024 > this.maxHeapBytes;
  }

  private constructor(
    private readonly runtime: QuickJSRuntime,
    private readonly ctx: QuickJSContext,
    private readonly limits: DjsLimits,
    private readonly kind: PolicyKind,
    private readonly filename: string,
    private readonly map: string | undefined,
  ) {}

  static async create(kind: PolicyKind, filename: string, code: string, map: string | undefined, limits: DjsLimits): Promise<Sandbox> {
    // The WASM memory's maximum is the cap. QuickJS's own limit is left off: it cannot ask
    // emscripten's malloc for block sizes, so it counts allocations rather than bytes, and it
    // refuses one allocation larger than the limit without a trace. Every allocation goes to the
    // heap instead, and a growth the heap refuses is seen (`heap.refused`).
    const pages = Math.ceil((baseHeapBytes + limits.memoryBytes) / 65536);
    const wasmMemory = new wasm.Memory({ initial: baseHeapBytes / 65536, maximum: pages });
    compiledQuickJS ??= wasm.compile(readFileSync(fileURLToPath(import.meta.resolve("@jitl/quickjs-wasmfile-release-sync/wasm"))));
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
    const sandbox = new Sandbox(runtime, ctx, limits, kind, filename, map);
    sandbox.heap = heap;
    sandbox.wasmMemory = wasmMemory;
    sandbox.maxHeapBytes = pages * 65536;
    // quickjs-emscripten keeps the runtime's pointer to itself (a protected field, version pinned).
    const runtimePointer = (runtime as unknown as { rt: { value: number } }).rt.value;
    const limitAt = stackLimitField(new Uint32Array(wasmMemory.buffer), runtimePointer, limits.stackBytes);
    if (limitAt === undefined) {
      throw new PolicyLoadError(`${filename}: not loaded: the installed QuickJS build does not show where its stack limit is, so the sandbox cannot watch its stack (a build problem, not the policy's)`);
    }
    sandbox.bandAt = new Uint32Array(wasmMemory.buffer, limitAt, 1)[0]!;
    sandbox.paintStackBand();
    runtime.setInterruptHandler(() => {
      if (performance.now() < sandbox.deadline) return false;
      sandbox.interrupted = true;
      return true;
    });
    sandbox.install(kind, filename, code);
    if (sandbox.stackBandTouched()) {
      throw new PolicyLoadError(`${filename}: the stack limit was hit while loading`);
    }
    return sandbox;
  }

  private unwrap(result: ReturnType<QuickJSContext["evalCode"]>, what: string, wrapped = true): QuickJSHandle {
    if (result.error === undefined) return result.value;
    const error = this.ctx.dump(result.error) as { name?: string; message?: string; stack?: string } | undefined;
    result.error.dispose();
    const limit = limitOf(error, this.interrupted);
    if (limit !== undefined) throw new PolicyLoadError(`${what}: the ${limit} limit was hit while loading`);
    const position = what === this.filename ? this.position(error?.stack ?? "", wrapped) : undefined;
    throw new PolicyLoadError(`${position ?? what}: ${error?.name ?? "Error"}: ${error?.message ?? String(error)}`);
  }

  /**
   * `file:line:column` in the policy's own source for the first frame of a QuickJS stack: through
   * the source map for a bundle, or past the Function wrapper's two lines for a script.
   */
  position(stack: string, wrapped = true): string | undefined {
    const escaped = this.filename.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    const where = new RegExp(`${escaped}:(\\d+)(?::(\\d+))?`).exec(stack) ?? /\(<input>:(\d+)(?::(\d+))?\)/.exec(stack);
    if (where === null) return undefined;
    const line = Number(where[1]);
    const column = Number(where[2] ?? 1);
    if (this.kind === "script") return `${this.filename}:${wrapped ? Math.max(1, line - 2) : line}:${column}`;
    const found = locate(this.map, line, column);
    return found === undefined ? `${this.filename}:${line}:${column}` : `${found.file}:${found.line}:${found.column}`;
  }

  private install(kind: PolicyKind, filename: string, code: string): void {
    const { ctx } = this;
    const host = ctx.newObject();
    const parseUrl = ctx.newFunction("parseUrl", (inputH, baseH, partH, valueH, jsonH) => {
      let input = ctx.getString(inputH);
      let base = ctx.typeof(baseH) === "string" ? ctx.getString(baseH) : undefined;
      let part = partH !== undefined && ctx.typeof(partH) === "string" ? ctx.getString(partH) : undefined;
      let value = valueH !== undefined && ctx.typeof(valueH) === "string" ? ctx.getString(valueH) : undefined;
      // The prelude's own flag (a boolean no URL string can be) for arguments sent as JSON.
      if (jsonH !== undefined && ctx.dump(jsonH) === true) {
        const args = JSON.parse(input) as [string, string | null, string | null, string | null];
        input = args[0];
        base = args[1] ?? undefined;
        part = args[2] ?? undefined;
        value = args[3] ?? undefined;
      }
      let url: URL;
      try {
        url = base === undefined ? new URL(input) : new URL(input, base);
        if (part !== undefined) {
          if (!settableParts.has(part)) return ctx.undefined;
          (url as unknown as Record<string, string>)[part] = value ?? "";
        }
      } catch {
        return ctx.undefined;
      }
      return ctx.newString(urlParts(url));
    });
    const utf8Encode = ctx.newFunction("utf8Encode", (textH, jsonH) => {
      const raw = ctx.getString(textH);
      const text = ctx.dump(jsonH) === true ? (JSON.parse(raw) as string) : raw;
      const bytes = Buffer.from(text, "utf8");
      return ctx.newArrayBuffer(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
    });
    const utf8Decode = ctx.newFunction("utf8Decode", (bufferH, fatalH, bomH) => {
      const view = ctx.getArrayBuffer(bufferH);
      let text: string;
      try {
        const decoder = new TextDecoder("utf-8", { fatal: ctx.dump(fatalH) === true, ignoreBOM: ctx.dump(bomH) === true });
        text = decoder.decode(view.value);
      } catch {
        return ctx.undefined;
      } finally {
        view.dispose();
      }
      if (!text.includes("\0")) return ctx.newString(text);
      // A C string would end at the NUL: hand the text over as JSON instead.
      const wrapped = ctx.newObject();
      const json = ctx.newString(JSON.stringify(text));
      ctx.setProp(wrapped, "json", json);
      json.dispose();
      return wrapped;
    });
    for (const [name, fn] of [["parseUrl", parseUrl], ["utf8Encode", utf8Encode], ["utf8Decode", utf8Decode]] as const) {
      ctx.setProp(host, name, fn);
      fn.dispose();
    }
    const installFn = this.unwrap(ctx.evalCode(preludeSource, "egressgate:prelude.js"), "prelude");
    const api = ctx.callFunction(installFn, ctx.undefined, host);
    installFn.dispose();
    host.dispose();
    this.api = this.unwrap(api, "prelude");
    this.callFn = ctx.getProp(this.api, "call");
    this.finishFn = ctx.getProp(this.api, "finish");
    this.takeBytesFn = ctx.getProp(this.api, "takeBytes");
    this.invoke("freeze", "prelude");

    // A script's top level becomes a function body (the Function constructor cannot be closed
    // early by the source), so its declarations are fresh on every call, like a module's. Its
    // parameter shadows `globalThis` with the per-call scope.
    if (kind === "script") {
      // Compiled alone first, so a syntax error names the script's own line and column.
      this.unwrap(ctx.evalCode(code, filename, { compileOnly: true }), filename, false).dispose();
    }
    const factorySource = kind === "script" ? `new Function("globalThis", ${JSON.stringify(code + scriptExports)})` : code;
    const factory = this.unwrap(ctx.evalCode(factorySource, filename), filename);
    const load = ctx.getProp(this.api, "load");
    this.deadline = performance.now() + this.limits.timeoutMs * 10;
    const loaded = ctx.callFunction(load, this.api, factory);
    this.deadline = Infinity;
    load.dispose();
    factory.dispose();
    const phases = this.unwrap(loaded, filename);
    this.phases = JSON.parse(ctx.getString(phases)) as PhaseName[];
    phases.dispose();
  }

  private invoke(name: string, what: string): void {
    const fn = this.ctx.getProp(this.api, name);
    const result = this.ctx.callFunction(fn, this.api);
    fn.dispose();
    this.unwrap(result, what).dispose();
  }

  /** Runs one call to completion. `replace` is true when this sandbox must not be used again. */
  call(message: CallMessage): { reply: CallReply; replace: boolean } {
    this.interrupted = false;
    const deadline = performance.now() + this.limits.timeoutMs;
    this.deadline = deadline;
    try {
      const result = this.run(message, this.arguments(message));
      // Whatever the policy made of it (a RangeError from a builtin, or an "out of memory" it
      // caught), a call that used up the heap has hit the memory limit: the limit answers, and
      // the sandbox goes. Checked first: a sandbox kept after a stack hit must have its heap.
      if (this.memoryExhausted) return { reply: { id: message.id, outcome: { t: "limit", what: "memory" } }, replace: true };
      // A stack overflow is a limit even when the policy caught QuickJS's error and went on.
      // QuickJS unwinds from it cleanly, so the sandbox stays: a guest whose body nests deep
      // enough to overflow a policy's `request.json()` costs one 502, not a new sandbox.
      if (this.stackBandTouched()) {
        this.paintStackBand();
        return { reply: { id: message.id, outcome: { t: "limit", what: "stack" } }, replace: result.replace };
      }
      // An interrupt inside an async function becomes a rejection the policy can catch, and a
      // long builtin can finish past the deadline before any interrupt check: either way the
      // call ran out of time, and its answer is not used.
      if (this.interrupted || performance.now() > deadline) {
        return { reply: { id: message.id, outcome: { t: "limit", what: "time" } }, replace: true };
      }
      return result;
    } catch (error) {
      // The WASM itself failed (a trap, or the host's own stack), or its heap had no room for the
      // call's arguments: nothing in it can be trusted.
      const what = error instanceof RangeError ? "stack" : error instanceof ScratchMemoryError ? "memory" : "sandbox";
      return { reply: { id: message.id, outcome: { t: "limit", what } }, replace: true };
    } finally {
      this.deadline = Infinity;
    }
  }

  /** Paints the band: when the sandbox is made, and again after a call that reached into it. */
  private paintStackBand(): void {
    Buffer.from(this.wasmMemory.buffer, this.bandAt, stackBandBytes).fill(bandPaint);
  }

  /** Whether a call's stack reached into the band since it was painted. */
  private stackBandTouched(): boolean {
    return !Buffer.from(this.wasmMemory.buffer, this.bandAt, stackBandBytes).equals(this.bandReference);
  }

  private run(message: CallMessage, args: readonly CallArgument[]): { reply: CallReply; replace: boolean } {
    const { ctx, runtime } = this;
    {
      const started = this.callEntry(args);
      if (started.error !== undefined) return this.failed(message.id, started.error);
      // The prelude answers a number (an outcome's code, or -1 while the phase's promise is
      // pending) or JSON, whose `{` reads as NaN: one FFI call tells them apart.
      let result = started.value;
      let code = ctx.getNumber(result);
      if (code === -1) {
        result.dispose();
        const jobs = runtime.executePendingJobs();
        if (jobs.error !== undefined) return this.failed(message.id, jobs.error);
        const finished = ctx.callFunction(this.finishFn, this.api);
        if (finished.error !== undefined) return this.failed(message.id, finished.error);
        result = finished.value;
        code = ctx.getNumber(result);
      } else if (runtime.hasPendingJob()) {
        // A call that answered at once may have left work queued (a promise it did not return).
        // That work runs now, inside this call's limits: left queued, it would run in a later
        // call, as code of this one.
        const jobs = runtime.executePendingJobs();
        if (jobs.error !== undefined) {
          result.dispose();
          return this.failed(message.id, jobs.error);
        }
      }
      if (!Number.isNaN(code)) {
        result.dispose();
        return { reply: { id: message.id, outcome: { t: "code", v: code } }, replace: false };
      }
      const json = ctx.getString(result);
      result.dispose();
      let outcome = JSON.parse(json) as Outcome;
      if (outcome.t === "throw") {
        // An exhausted stack or heap that escaped the policy reaches the prelude's catch as an
        // InternalError: it is the limit, not the policy, that answers.
        const limit = outcome.name === "InternalError" ? limitOf(outcome, false) : undefined;
        if (limit !== undefined) return { reply: { id: message.id, outcome: { t: "limit", what: limit } }, replace: limit !== "stack" };
        outcome = { ...outcome, stack: this.position(outcome.stack) ?? "" };
      }
      let bytes: Uint8Array | undefined;
      if ((outcome.t === "request" || outcome.t === "response") && outcome.body !== null && "b" in outcome.body) {
        const taken = ctx.callFunction(this.takeBytesFn, this.api);
        if (taken.error !== undefined) return this.failed(message.id, taken.error);
        const view = ctx.getArrayBuffer(taken.value);
        bytes = new Uint8Array(view.value);
        view.dispose();
        taken.value.dispose();
      }
      if (json.length + (bytes?.byteLength ?? 0) > this.limits.returnBytes) {
        return { reply: { id: message.id, outcome: { t: "limit", what: "return size" } }, replace: true };
      }
      return { reply: { id: message.id, outcome, ...(bytes !== undefined ? { bytes } : {}) }, replace: false };
    }
  }

  /** The call's fields, in the order the prelude's `call` takes them. */
  private arguments(m: CallMessage): CallArgument[] {
    const phase = phaseNames.indexOf(m.phase);
    if (m.info !== undefined) {
      const i = m.info;
      return [phase, m.now, m.seed, i.hostname, i.ip, i.family, i.port, i.protocol];
    }
    const head: CallArgument[] = [phase, m.now, m.seed, m.method, m.url, m.headers, m.hasBody, m.requestBody];
    const r = m.response;
    if (r === undefined) return head;
    return [...head, r.status, r.statusText, r.headers, r.url, r.hasBody, m.responseBody];
  }

  /**
   * Calls the prelude's `call` with these arguments. This is the one hot path that goes past
   * quickjs-emscripten's handles (whose version is pinned): the strings are encoded in one go
   * into a buffer the sandbox keeps in WASM memory, each becomes a QuickJS value with one FFI
   * call, and the values are freed right after. Through `newString`, each string cost a
   * `malloc`, a character-by-character copy in JavaScript and a `free` (about 1.2 µs for a URL).
   */
  private callEntry(args: readonly CallArgument[]): { value: QuickJSHandle; error?: undefined } | { error: QuickJSHandle; value?: undefined } {
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
    const heap = new Uint8Array(this.wasmMemory.buffer, this.scratch.at, this.scratch.bytes);
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
        const buffer = ctx.newArrayBuffer(a.buffer.slice(a.byteOffset, a.byteOffset + a.byteLength) as ArrayBuffer);
        buffers.push(buffer);
        pointer = buffer.value as unknown as number;
      }
      pointers.push(pointer);
    }
    new Int32Array(this.wasmMemory.buffer, this.scratch.at, args.length).set(pointers);
    const result = raw.ffi.QTS_Call(context, this.callFn.value as unknown as number, this.api.value as unknown as number, args.length, this.scratch.at);
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

  private failed(id: number, errorHandle: QuickJSHandle): { reply: CallReply; replace: boolean } {
    let error: unknown;
    try {
      error = this.ctx.dump(errorHandle);
    } catch {
      error = undefined;
    }
    errorHandle.dispose();
    const limit = limitOf(error, this.interrupted);
    if (limit !== undefined) return { reply: { id, outcome: { t: "limit", what: limit } }, replace: true };
    const e = error as { name?: unknown; message?: unknown; stack?: unknown } | undefined;
    // What failed outside the prelude's own catch is not held to the return cap: cut it here.
    const stack = String(e?.stack ?? "").slice(0, failureTextChars);
    const outcome: Outcome = {
      t: "throw",
      name: String(e?.name ?? "Error").slice(0, failureTextChars),
      message: String(e?.message ?? error).slice(0, failureTextChars),
      stack: this.position(stack) ?? stack,
    };
    // The sandbox's own code failed (not the policy's, which is caught inside): start afresh.
    return { reply: { id, outcome }, replace: true };
  }
}
