import { readFileSync } from "node:fs";
import type { QuickJSContext, QuickJSHandle, QuickJSRuntime } from "quickjs-emscripten-core";
import { locate, PolicyLoadError } from "./bundle.js";
import { HeapValues } from "./heap-values.js";
import { newHostFunctions } from "./host-functions.js";
import { phaseNames, type CallMessage, type CallReply, type DjsLimits, type Outcome, type PhaseName, type PolicyKind } from "./protocol.js";
import { RawCall, ScratchMemoryError, type CallArgument } from "./raw-call.js";
import { QuickJSInstance } from "./wasm-instance.js";
import { nearPhase, type LoadedNames } from "./phase-check.js";
import { withFields } from "../objects.js";

const preludeSource = readFileSync(new URL("./sandbox/prelude.js", import.meta.url), "utf8");

const scriptExports = `\n;return { ${phaseNames.map((n) => `${n}: typeof ${n} === "function" ? ${n} : undefined`).join(", ")} };`;

/**
 * A script's top level once more, answering the values of its phase names and of the names in
 * its text that look like phase names, whatever they hold (`typeof` tells a top-level binding
 * from a name that is only a property or a nested local), for load() to report what it found.
 */
function scriptInspection(code: string): string {
  const candidates = new Set<string>();
  for (const word of code.match(/[A-Za-z_$][\w$]*/g) ?? []) {
    if (candidates.size >= 50) break;
    if (nearPhase(word) !== undefined) candidates.add(word);
  }
  const names = [...phaseNames, ...candidates];
  return `\n;return { ${names.map((n) => `${n}: typeof ${n} === "undefined" ? undefined : ${n}`).join(", ")} };`;
}

/** How much of an error's name, message and stack a failure outside the prelude reports. */
const failureTextChars = 8192;

function bounded(text: string, what: string): string {
  return text.length <= failureTextChars ? text : `(${what} of ${text.length} characters, not shown)`;
}

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
  /** What the policy's top level defined, for phase-check.ts to judge. */
  loaded: LoadedNames = { phases: [], found: [] };
  private readonly runtime: QuickJSRuntime;
  private readonly ctx: QuickJSContext;
  private readonly rawCall: RawCall;
  private readonly values: HeapValues;

  private constructor(
    /** The WASM instance: the heap and stack watches. */
    private readonly instance: QuickJSInstance,
    private readonly limits: DjsLimits,
    private readonly kind: PolicyKind,
    private readonly filename: string,
    private readonly map: string | undefined,
  ) {
    this.runtime = instance.runtime;
    this.ctx = instance.ctx;
    this.values = new HeapValues(instance.ctx, instance.memory);
    this.rawCall = new RawCall(instance.ctx, instance.memory, this.values);
  }

  static async create(kind: PolicyKind, filename: string, code: string, map: string | undefined, limits: DjsLimits): Promise<Sandbox> {
    const instance = await QuickJSInstance.create(filename, limits);
    const { runtime } = instance;
    const sandbox = new Sandbox(instance, limits, kind, filename, map);
    runtime.setInterruptHandler(() => {
      if (performance.now() < sandbox.deadline) return false;
      sandbox.interrupted = true;
      return true;
    });
    sandbox.install(kind, filename, code);
    if (instance.stackBandTouched()) {
      throw new PolicyLoadError(`${filename}: the stack limit was hit while loading`);
    }
    return sandbox;
  }

  private unwrap(result: ReturnType<QuickJSContext["evalCode"]>, what: string, wrapped = true): QuickJSHandle {
    if (result.error === undefined) return result.value;
    return this.loadFailed(result.error, what, wrapped);
  }

  /** Throws the PolicyLoadError for `errorHandle`, thrown by what `what` ran (and disposes of it). */
  private loadFailed(errorHandle: QuickJSHandle, what: string, wrapped = true): never {
    const error = this.ctx.dump(errorHandle) as { name?: string; message?: string; stack?: string } | undefined;
    errorHandle.dispose();
    // A heap left full may have had no room for the error's own object: QuickJS then dumps it as
    // "" (a chain of promises at some memory limits), and the load failed as "p.mjs: Error: ".
    // A full heap is the memory limit, as after a call (black-box finding).
    // Only for an error with no message of its own: a heap grown near its cap stays so, and a
    // policy's own error thrown after a large (but legal) top level must keep its words.
    const lost = (error?.message ?? "") === "" && (error?.name ?? "Error") === "Error";
    const limit = limitOf(error, this.interrupted) ?? (lost && this.instance.memoryExhausted ? "memory" : undefined);
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
    const host = newHostFunctions(ctx, this.values, () => this.instance.memoryExhausted);
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
    const inspection = kind === "script" ? this.inspectionFactory(code, filename) : undefined;
    const load = ctx.getProp(this.api, "load");
    this.deadline = performance.now() + this.limits.timeoutMs * 10;
    const loaded = ctx.callFunction(load, this.api, factory, ...(inspection === undefined ? [] : [inspection]));
    // What the top level queued (a promise's `then`) runs now, within the top level's own bounds
    // (time and heap): left queued, it ran in the first call, as that call's code, and a top
    // level that queued an endless chain of jobs loaded, then failed every call on a limit (502).
    const queued = loaded.error === undefined && this.runtime.hasPendingJob() ? this.runtime.executePendingJobs() : undefined;
    this.deadline = Infinity;
    load.dispose();
    factory.dispose();
    inspection?.dispose();
    if (queued?.error !== undefined) {
      if (loaded.error === undefined) loaded.value.dispose();
      this.loadFailed(queued.error, filename);
    }
    // A chain of promises each waiting on the next ends when the heap has no room for another:
    // no error, but a heap every call would find full (the memory limit, each time).
    if (queued !== undefined && (this.interrupted || this.instance.memoryExhausted)) {
      if (loaded.error === undefined) loaded.value.dispose();
      throw new PolicyLoadError(`${filename}: the ${this.interrupted ? "time" : "memory"} limit was hit while loading`);
    }
    const answer = this.unwrap(loaded, filename);
    this.loaded = JSON.parse(ctx.getString(answer)) as LoadedNames;
    this.phases = this.loaded.phases;
    answer.dispose();
  }

  /** A script's {@link scriptInspection} factory; none if it will not compile (the names it tried are not identifiers there). */
  private inspectionFactory(code: string, filename: string): QuickJSHandle | undefined {
    const result = this.ctx.evalCode(`new Function("globalThis", ${JSON.stringify(code + scriptInspection(code))})`, filename);
    if (result.error === undefined) return result.value;
    result.error.dispose();
    return undefined;
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
      if (this.instance.memoryExhausted) return { reply: { id: message.id, outcome: { t: "limit", what: "memory" } }, replace: true };
      // A stack overflow is a limit even when the policy caught QuickJS's error and went on.
      // QuickJS unwinds from it cleanly, so the sandbox stays: a guest whose body nests deep
      // enough to overflow a policy's `request.json()` costs one 502, not a new sandbox.
      if (this.instance.stackBandTouched()) {
        this.instance.paintStackBand();
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
      // call's arguments: nothing in it can be trusted. A trap with the heap full is the memory
      // limit, as a call that ended with it full is.
      const what = this.instance.memoryExhausted || error instanceof ScratchMemoryError ? "memory" : error instanceof RangeError ? "stack" : "sandbox";
      return { reply: { id: message.id, outcome: { t: "limit", what } }, replace: true };
    } finally {
      this.deadline = Infinity;
    }
  }

  private run(message: CallMessage, args: readonly CallArgument[]): { reply: CallReply; replace: boolean } {
    const { ctx, runtime } = this;
    {
      const started = this.rawCall.call(this.callFn, this.api, args);
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
        outcome = withFields(outcome, { stack: this.position(outcome.stack) ?? "" });
      }
      let bytes: Uint8Array | undefined;
      if ((outcome.t === "request" || outcome.t === "response" || (outcome.t === "effect" && outcome.k === "next")) && outcome.body !== null && "b" in outcome.body) {
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
    if (m.phase === "handle") {
      // The journal as JSON, whether the proxy holds the request's bytes, then next()'s loaded bodies by index.
      const journal = m.journal === undefined || m.journal.length === 0 ? undefined : JSON.stringify(m.journal);
      return [...head, journal, m.replayable === true, ...(m.nextBodies ?? [])];
    }
    const r = m.response;
    if (r === undefined) return head;
    return [...head, r.status, r.statusText, r.headers, r.url, r.hasBody, m.responseBody];
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
    // What failed outside the prelude's own catch is not held to the return cap: bounded here,
    // whole or not at all (a cut could keep part of a secret's value that redaction, later, no
    // longer recognises).
    const stack = bounded(String(e?.stack ?? ""), "a stack");
    const outcome: Outcome = {
      t: "throw",
      name: bounded(String(e?.name ?? "Error"), "a name"),
      message: bounded(String(e?.message ?? error), "a message"),
      stack: this.position(stack) ?? stack,
    };
    // The sandbox's own code failed (not the policy's, which is caught inside): start afresh.
    return { reply: { id, outcome }, replace: true };
  }
}
