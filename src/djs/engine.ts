import { MessageChannel, receiveMessageOnPort, Worker, type MessagePort } from "node:worker_threads";
import { PolicyLoadError } from "./bundle.js";
import { decodeReplies, encodeCalls, type WireReplies } from "./wire.js";
import { claimDropped, claimOf, type CallFields, type CallMessage, type CallReply, type DjsLimits, type InitReply, type PhaseName, type PolicySource, type WorkerInit } from "./protocol.js";
import { withFields } from "../objects.js";
import { workerEntry } from "../worker-entry.js";
import { descriptorShortage, descriptorsShort } from "../descriptors.js";
import { sharedQuickJS } from "./quickjs-module.js";

/** The outcome's `what` when a call is refused because `limits.maxCalls` are in flight. */
export const busyLimit = "maxCalls";

/** The policy worker: built JS from dist, the TypeScript through tsx from the sources (see workerEntry). */
const policyWorker = workerEntry(import.meta.url, "worker");

/** New workers that may fail to load in a row before the policy stops serving. */
const maxLoadFailures = 3;
/** Workers that may stop under a call, with no call known to be running, before that call fails. */
const maxBlindMoves = 2;
/** How long the first worker may take to bundle and load a policy before createDjsHooks gives up. */
const loadTimeoutMs = 30_000;
/**
 * Descriptors a first worker may hold at once while it loads: its event loop's (4), its modules,
 * which Node's loader reads several at a time, and esbuild's pipes (6) while it bundles. Twelve
 * were enough in the fd-exhaustion probe and eleven were not: twice that, for a margin.
 */
const startDescriptors = 24;

/** A first worker's load, settled: the worker with the policy loaded, or why it did not load (the worker stopped). */
type Loaded = { readonly spawned: Spawned; readonly reply: Extract<InitReply, { ok: true }> } | { readonly error: PolicyLoadError };

/**
 * Loads done ahead (DjsEngine.preload), by policy and limits, until a load() takes them: one per
 * load to come (two guests with the same policy each get an engine, and a worker, of their own).
 */
const preloaded = new Map<string, Loaded[]>();
/** While DjsEngine.collectLoads runs: the loads asked for. */
let collecting: { policy: PolicySource; limits: DjsLimits }[] | undefined;

/** Atomics.waitAsync (ES2024, in V8 since Node 16), typed here: the project's lib is ES2023. */
interface AtomicsWaitAsync {
  waitAsync(array: Int32Array, index: number, value: number, timeoutMs: number): { async: false; value: "not-equal" | "timed-out" } | { async: true; value: Promise<"ok" | "timed-out"> };
}

function preloadKey(policy: PolicySource, limits: DjsLimits): string {
  return JSON.stringify([policy, limits]);
}

/**
 * What a first worker's wait for its load came to (`waited`: Atomics' answer, or `exited` when the
 * worker stopped first).
 */
function settleLoad(started: Spawned, filename: string, waited: "ok" | "not-equal" | "timed-out" | "exited"): Loaded {
  const received = receiveMessageOnPort(started.initPort) as { message: { init: InitReply } } | undefined;
  started.initPort.close();
  if (received === undefined && (waited === "exited" || started.failure.error !== undefined)) {
    // A worker that could not start its event loop (EMFILE) or bundle (esbuild's pipes) stopped at
    // once: it was reported as a load that took 30 s (fd-exhaustion probe).
    void started.worker.terminate();
    const reason = started.failure.error?.message ?? "it exited";
    const shortage = descriptorShortage();
    return { error: new PolicyLoadError(`${filename}: the policy's worker thread stopped before the policy loaded: ${reason}${shortage !== undefined ? ` (the process is out of file descriptors, ${shortage})` : ""}`) };
  }
  if (waited === "timed-out" || received === undefined) {
    void started.worker.terminate();
    return { error: new PolicyLoadError(`${filename}: the policy did not load within ${loadTimeoutMs} ms`) };
  }
  const reply = received.message.init;
  if (!reply.ok) {
    void started.worker.terminate();
    return { error: new PolicyLoadError(reply.message) };
  }
  // Loaded, then gone before this wait ended: its exit listener is off by now, so nothing would
  // replace it, and every call would wait out its time limit (review finding). The same error as
  // a worker that stopped while loading.
  if (waited === "exited") {
    return { error: new PolicyLoadError(`${filename}: the policy's worker thread stopped as the policy loaded: ${started.failure.error?.message ?? "it exited"}`) };
  }
  return { spawned: started, reply };
}

/**
 * What ends a call's wait: the request's GuestGone, as the pipeline's hooks see it (the engine
 * sits below the pipeline).
 */
export interface CallSignal {
  readonly aborted: boolean;
  once(event: "abort", listener: () => void): unknown;
  off(event: "abort", listener: () => void): unknown;
}

/** What {@link DjsEngine.call} is told of the request the call is for. */
export interface CallOptions {
  /** The call's request: once it ends, a call still waiting for a worker is dropped, never run. */
  readonly signal?: CallSignal | undefined;
  /** How long the call may wait for a worker (`timeouts.hookMs`): then it is dropped, never run. */
  readonly waitMs?: number | undefined;
}

interface Pending {
  /** A call moved to another worker gets a new id, and so a new claim (see {@link claimOf}). */
  message: CallMessage;
  readonly resolve: (reply: CallReply) => void;
  /** Set once the call has its answer: from its worker, a failure, or its drop. */
  answered: boolean;
  /** Drops the call at `waitMs`. */
  timer?: NodeJS.Timeout | undefined;
  /** Drops the call when its request ends. */
  readonly signal?: CallSignal | undefined;
  onAbort?: (() => void) | undefined;
  /**
   * How many times a worker stopped while this call may have been what stopped it (no call was
   * known to be running); past {@link maxBlindMoves} it fails rather than take worker after
   * worker down with it. A call a stopped worker had not started, or had finished, moves free.
   */
  moves: number;
}

/** One worker thread and the calls posted to it, which it runs in order. */
interface Slot {
  readonly worker: Worker;
  readonly heartbeat: Float64Array;
  readonly wake: Int32Array;
  /** Posted calls by id, in posting order. */
  readonly pending: Map<number, Pending>;
  /** Calls waiting for the worker to finish loading. */
  readonly queued: Pending[];
  /** Calls posted in this turn of the event loop, sent together as one message. */
  outbox: CallMessage[];
  loaded: boolean;
  /** Set once the worker is being replaced: nothing more is posted to it. */
  retired: boolean;
  /** Whether the worker holds the process: only while it has calls to answer (see {@link holdWhileBusy}). */
  held: boolean;
  /** Lets the process go a moment after the last call (see {@link holdWhileBusy}); made on first use. */
  release?: NodeJS.Timeout;
}

interface Spawned {
  readonly worker: Worker;
  readonly heartbeat: Float64Array;
  readonly wake: Int32Array;
  readonly ready: SharedArrayBuffer;
  readonly initPort: MessagePort;
  /** The engine's claim cells (WorkerInit.claims): the first worker's are the engine's. */
  readonly claims: SharedArrayBuffer;
  /** The worker's first `error` (one that failed to start, or threw while loading), once it has come. */
  readonly failure: { error?: Error };
}

/**
 * One for the whole process: V8's flags are process-wide, whichever engine spawned the worker.
 * Exported for tests, which hold it as a worker stopped inside it leaves it.
 */
export const gcFlagLock = new SharedArrayBuffer(4);

/** One claim cell per call that may be in flight (limits.maxCalls). */
function newClaims(limits: DjsLimits): SharedArrayBuffer {
  return new SharedArrayBuffer(4 * limits.maxCalls);
}

function spawn(policy: PolicySource, limits: DjsLimits, claims: SharedArrayBuffer): Spawned {
  const heartbeat = new SharedArrayBuffer(16);
  const ready = new SharedArrayBuffer(4);
  const wake = new SharedArrayBuffer(8);
  const channel = new MessageChannel();
  const init: WorkerInit & { initPort: MessagePort } = { policy, limits, heartbeat, ready, wake, gcFlagLock, claims, quickjs: sharedQuickJS(), initPort: channel.port2 };
  const worker = new Worker(policyWorker.entry, {
    eval: policyWorker.eval,
    // Not the embedding process's flags and preloads: they are not the sandbox's business (a
    // preload that watches stdin, say, would see a worker's empty stdin and act on it).
    execArgv: [],
    workerData: init,
    transferList: [channel.port2],
    // QuickJS recursion runs on this thread's stack: 8 MiB leaves room under a 1 MiB QuickJS limit.
    resourceLimits: { stackSizeMb: 8, maxOldGenerationSizeMb: 64 },
  });
  // Idle workers must not keep the embedding process alive (attach() says it again, after its
  // 'message' listener: see holdWhileBusy).
  worker.unref();
  // From its first moment: a worker that dies while loading (or after load() gave up on it)
  // raises `error` on this thread, and an unlistened one would end the embedding process.
  // Its `exit` is what replaces it.
  const failure: { error?: Error } = {};
  worker.on("error", (error: Error) => (failure.error ??= error));
  return { worker, heartbeat: new Float64Array(heartbeat), wake: new Int32Array(wake), ready, initPort: channel.port1, claims, failure };
}

/**
 * A worker holds the embedding process only while it has calls to answer: an idle one must not
 * keep the process alive (README), and a call under way must not see the process end under it
 * (an embedder awaiting it, with nothing else to do, is owed its answer, as by a socket). Node 20
 * refs a Worker's port again when its first 'message' listener is added, after unref(), so this
 * runs once the listeners are on, and again as calls come and go. A retired worker is left to
 * terminate(), which refs it until it has stopped.
 */
function holdWhileBusy(slot: Slot): void {
  if (slot.retired) return;
  if (slot.pending.size + slot.queued.length > 0) {
    if (slot.held) return;
    slot.held = true;
    slot.worker.ref();
    return;
  }
  if (!slot.held) return;
  // Let go a moment later, not at once: calls one after another ref'd and unref'd the worker
  // each time, a quarter more per call (bench/djs-calls.ts, one at a time: 166 → 229 µs). An
  // idle worker holds the process at most this long after its last call.
  if (slot.release === undefined) slot.release = setTimeout(() => releaseIfIdle(slot), releaseDelayMs).unref();
  else slot.release.refresh();
}

const releaseDelayMs = 1000;

function releaseIfIdle(slot: Slot): void {
  if (slot.retired || !slot.held || slot.pending.size + slot.queued.length > 0) return;
  slot.held = false;
  slot.worker.unref();
}

/**
 * The host side of tier 2: a small pool of worker threads, each with the policy loaded in its
 * own QuickJS sandbox. Calls are pipelined (posted without waiting for the previous answer) to
 * the worker with the fewest calls in flight. A watchdog terminates a worker whose call outlives
 * the time limit (a long native builtin that the interrupt handler cannot stop) and starts a new
 * one; that call fails with a limit outcome, and the calls queued behind it move on, free.
 *
 * A call posted is not yet a call run: one whose request ends, or that waits past its `waitMs`,
 * before its worker takes it is dropped (a "dropped" outcome at once), and its worker passes it
 * by. Each call's claim cell, shared with the workers, settles which came first.
 */
export class DjsEngine {
  readonly phases: ReadonlySet<PhaseName>;
  private readonly slots: Slot[] = [];
  private nextId = 1;
  private inFlight = 0;
  private readonly claims: Int32Array;
  /** Claim cells free again, and the first never used: a call in flight holds one. */
  private readonly freeCells: number[] = [];
  private unusedCell = 0;
  private watchdog: NodeJS.Timeout | undefined;
  private closed = false;
  /** New workers that failed to load in a row: past a few, the policy stops serving (502). */
  private loadFailures = 0;

  readonly filename: string;

  /** `policy` is the bundled code every further worker loads; `first` has loaded it already. */
  private constructor(
    private readonly policy: Extract<PolicySource, { code: string }>,
    phases: readonly PhaseName[],
    readonly limits: DjsLimits,
    first: Spawned,
    poolSize: number,
  ) {
    this.filename = policy.filename;
    this.phases = new Set(phases);
    this.claims = new Int32Array(first.claims);
    this.slots.push(this.attach(first, true));
    for (let i = 1; i < poolSize; i++) this.slots.push(this.attach(spawn(this.policy, limits, first.claims), false));
  }

  /**
   * Runs `build` (which creates policies) without loading any: each load() it makes is only
   * noted, and answered with an engine that has no worker and defines no phase. Returns the
   * policies it would have loaded, for {@link preload}; what `build` made must be thrown away.
   */
  static collectLoads(build: () => void): { policy: PolicySource; limits: DjsLimits }[] {
    const collected: { policy: PolicySource; limits: DjsLimits }[] = [];
    const outer = collecting;
    collecting = collected;
    try {
      build();
    } finally {
      collecting = outer;
    }
    return collected;
  }

  /**
   * Loads a policy in a first worker without blocking the event loop, and keeps the outcome (the
   * loaded worker, or the load's error) for the load() that next asks for the same policy with
   * the same limits. A reload does this first, so a policy that takes long to load (or never
   * does) holds no guest meanwhile.
   */
  static async preload(policy: PolicySource, limits: DjsLimits): Promise<void> {
    const key = preloadKey(policy, limits);
    const started = spawn(policy, limits, newClaims(limits));
    const wait = (Atomics as unknown as AtomicsWaitAsync).waitAsync(new Int32Array(started.ready), 0, 0, loadTimeoutMs);
    // A worker that dies while loading (out of memory bundling, say) never says it is ready.
    let exited: (() => void) | undefined;
    const gone = new Promise<"exited">((resolve) => started.worker.once("exit", (exited = () => resolve("exited"))));
    const waited = wait.async ? await Promise.race([wait.value, gone]) : wait.value;
    started.worker.off("exit", exited!);
    const loaded = settleLoad(started, policy.filename, waited);
    const list = preloaded.get(key);
    if (list === undefined) preloaded.set(key, [loaded]);
    else list.push(loaded);
  }

  /** @internal Preloads waiting for their load(), for tests and diagnostics. */
  static get preloadedCount(): number {
    let n = 0;
    for (const list of preloaded.values()) n += list.length;
    return n;
  }

  /**
   * @internal Calls in flight, for tests and diagnostics: waiting or running, and dropped ones
   * until their worker has passed them by.
   */
  get callsInFlight(): number {
    return this.inFlight;
  }

  /** Stops the workers of preloads no load() took (the files changed in between, or the reload failed). */
  static discardPreloaded(): void {
    for (const list of preloaded.values()) for (const entry of list) if ("spawned" in entry) void entry.spawned.worker.terminate();
    preloaded.clear();
  }

  /**
   * Loads the policy in a first worker and waits for it synchronously, so a policy that does not
   * bundle, parse or run its top level fails right here, with file, line and message. A load
   * done ahead by {@link preload} is taken instead of waiting.
   */
  static load(policy: PolicySource, limits: DjsLimits, poolSize: number): DjsEngine {
    if (collecting !== undefined) {
      collecting.push({ policy, limits });
      return Object.assign(Object.create(DjsEngine.prototype) as DjsEngine, { phases: new Set(), filename: policy.filename, limits, slots: [], closed: true });
    }
    const key = preloadKey(policy, limits);
    const list = preloaded.get(key);
    const ahead = list?.shift();
    if (list?.length === 0) preloaded.delete(key);
    if (ahead !== undefined) {
      if ("error" in ahead) throw ahead.error;
      return new DjsEngine({ kind: ahead.reply.kind, filename: ahead.reply.filename, code: ahead.reply.code, map: ahead.reply.map }, ahead.reply.phases, limits, ahead.spawned, poolSize);
    }
    // The wait below holds the event loop, and a worker that cannot start never ends it: without
    // the descriptors it loads with, every guest waited the whole loadTimeoutMs, 30 s, for a load
    // that had failed at once (fd-exhaustion probe).
    const shortage = descriptorsShort(startDescriptors);
    if (shortage !== undefined) {
      throw new PolicyLoadError(`${policy.filename}: cannot start the policy's worker thread: the process is out of file descriptors (${shortage})`);
    }
    const started = spawn(policy, limits, newClaims(limits));
    const waited = Atomics.wait(new Int32Array(started.ready), 0, 0, loadTimeoutMs);
    const loaded = settleLoad(started, policy.filename, waited);
    if ("error" in loaded) throw loaded.error;
    return new DjsEngine({ kind: loaded.reply.kind, filename: loaded.reply.filename, code: loaded.reply.code, map: loaded.reply.map }, loaded.reply.phases, limits, started, poolSize);
  }

  private attach(spawned: Spawned, loaded: boolean): Slot {
    const slot: Slot = { worker: spawned.worker, heartbeat: spawned.heartbeat, wake: spawned.wake, pending: new Map(), queued: [], outbox: [], loaded, retired: false, held: true };
    if (!loaded) {
      spawned.initPort.once("message", (message: { init: InitReply }) => {
        spawned.initPort.close();
        if (!message.init.ok) {
          // The same code loaded before; failing now means the machine is out of something.
          // Past a few failures in a row, stop trying: calls fail closed rather than spin.
          this.loadFailures++;
          this.replace(slot, `the policy failed to load in a new worker: ${message.init.message}`);
          return;
        }
        this.loadFailures = 0;
        slot.loaded = true;
        for (const call of slot.queued.splice(0)) this.post(slot, call);
      });
      spawned.initPort.unref();
    } else {
      spawned.initPort.close();
    }
    spawned.worker.on("message", (wire: WireReplies) => {
      for (const reply of decodeReplies(wire)) {
        const call = slot.pending.get(reply.id);
        if (call === undefined) continue;
        slot.pending.delete(reply.id);
        this.settled(call);
        this.answer(call, reply);
      }
      holdWhileBusy(slot);
    });
    spawned.worker.on("exit", () => {
      if (!slot.retired) this.replace(slot, "the sandbox worker stopped");
    });
    holdWhileBusy(slot);
    return slot;
  }

  private post(slot: Slot, call: Pending): void {
    if (!slot.loaded) {
      slot.queued.push(call);
      holdWhileBusy(slot);
      return;
    }
    slot.pending.set(call.message.id, call);
    holdWhileBusy(slot);
    // One message per worker per turn of the event loop: a message costs the proxy's thread
    // more than a no-op call costs the worker. Waiting for the end of the turn costs little, even
    // when idle. Bodies are copied, not transferred: a call may have to move to another worker.
    slot.outbox.push(call.message);
    if (slot.outbox.length === 1) {
      setImmediate(() => {
        const batch = slot.outbox;
        slot.outbox = [];
        if (slot.retired || batch.length === 0) return;
        slot.worker.postMessage(encodeCalls(batch));
        // The worker takes the batch off its port itself; a sleeping one needs waking.
        Atomics.add(slot.wake, 0, 1);
        if (Atomics.load(slot.wake, 1) === 1) Atomics.notify(slot.wake, 0);
      });
    }
  }

  /** Answers a call, once: what comes after its first answer (a dropped call's pass by its worker) only settles it. */
  private answer(call: Pending, reply: CallReply): void {
    if (call.answered) return;
    call.answered = true;
    if (call.timer !== undefined) clearTimeout(call.timer);
    if (call.onAbort !== undefined) call.signal!.off("abort", call.onAbort);
    call.resolve(reply);
  }

  /**
   * Drops a call that no worker has taken yet: it is answered at once, and its worker passes it
   * by. It stays in flight (limits.maxCalls) until then: its message is on the worker's queue. A
   * call a worker has taken runs on, to its own time limit.
   */
  private drop(call: Pending, why: "ended" | "waited"): void {
    if (call.answered) return;
    const claim = claimOf(call.message.id);
    if (Atomics.compareExchange(this.claims, call.message.cell, claim, claimDropped) !== claim) return;
    this.answer(call, { id: call.message.id, outcome: { t: "dropped", why } });
  }

  /** A call leaves the flight: its worker answered or passed it by, or it failed. */
  private settled(call: Pending): void {
    this.freeCells.push(call.message.cell);
    this.inFlight--;
    if (this.inFlight === 0 && this.watchdog !== undefined) {
      clearInterval(this.watchdog);
      this.watchdog = undefined;
    }
  }

  /**
   * Runs one call of a phase. It never rejects: every failure is an outcome (a limit, a throw),
   * for the caller to turn into the guest's answer.
   */
  call(fields: CallFields, options: CallOptions = {}): Promise<CallReply> {
    const id = this.nextId++;
    if (this.closed) return Promise.resolve({ id, outcome: { t: "limit", what: "closed policy" } });
    if (this.inFlight >= this.limits.maxCalls) return Promise.resolve({ id, outcome: { t: "limit", what: busyLimit } });
    const { signal, waitMs } = options;
    if (signal?.aborted === true) return Promise.resolve({ id, outcome: { t: "dropped", why: "ended" } });
    return new Promise<CallReply>((resolve) => {
      this.inFlight++;
      const cell = this.freeCells.pop() ?? this.unusedCell++;
      const message: CallMessage = withFields(fields, { id, cell });
      Atomics.store(this.claims, cell, claimOf(id));
      const call: Pending = { message, resolve, moves: 0, answered: false, signal };
      // A call made behind a gone guest's waited for each of them to reach its time limit, with
      // no bound but limits.maxCalls × limits.timeoutMs (hours at 60 s), and a call whose request
      // had ended still ran (black-box finding).
      if (waitMs !== undefined) call.timer = setTimeout(() => this.drop(call, "waited"), waitMs).unref();
      if (signal !== undefined) signal.once("abort", (call.onAbort = () => this.drop(call, "ended")));
      this.watchdog ??= setInterval(() => this.watch(), Math.max(5, Math.min(50, this.limits.timeoutMs / 2))).unref();
      this.post(this.pick(), call);
    });
  }

  /**
   * The worker with the fewest calls in flight, so a slow call delays as few others as it can.
   * (Filling one worker's message first saved a little of the proxy's CPU, but put a batch of
   * slow calls behind each other on one worker.)
   */
  private pick(): Slot {
    let best = this.slots[0]!;
    for (const slot of this.slots) {
      if (slot.pending.size + slot.queued.length < best.pending.size + best.queued.length) best = slot;
    }
    return best;
  }

  /** Terminates a worker stuck past the time limit (plus grace for the interrupt handler). */
  private watch(): void {
    const now = performance.timeOrigin + performance.now();
    const grace = Math.max(50, this.limits.timeoutMs / 2);
    for (const slot of [...this.slots]) {
      // The id first: the worker writes it before the start, so a start this old was written
      // after the id read here, by the same call.
      const id = slot.heartbeat[1]!;
      const started = slot.heartbeat[0]!;
      if (started > 0 && now - started > this.limits.timeoutMs + grace) this.replace(slot, "time", id);
    }
  }

  /**
   * Retires a worker: its running call fails with `reason`, and the calls it had not answered
   * go on, to whichever worker {@link pick} chooses (the new one in its place, or another).
   * `runningId` is the call the watchdog found stuck; a worker that stopped by itself is read
   * here (it can no longer move on).
   */
  private replace(slot: Slot, reason: string, runningId = slot.heartbeat[0]! > 0 ? slot.heartbeat[1]! : undefined): void {
    if (slot.retired) return;
    slot.retired = true;
    void slot.worker.terminate();
    const index = this.slots.indexOf(slot);
    const posted = [...slot.pending.values()];
    const waiting = [...slot.queued];
    slot.pending.clear();
    slot.queued.length = 0;
    slot.outbox = [];
    if (this.closed || this.loadFailures >= maxLoadFailures) {
      const what = this.closed ? "closed policy" : "policy whose workers no longer start";
      this.closed = true;
      for (const call of [...posted, ...waiting]) {
        this.settled(call);
        this.answer(call, { id: call.message.id, outcome: { t: "limit", what } });
      }
      // The other workers go too: nothing new reaches them once the policy is closed.
      for (const other of this.slots) if (!other.retired) this.replace(other, what);
      return;
    }
    this.slots[index] = this.attach(spawn(this.policy, this.limits, this.claims.buffer as SharedArrayBuffer), false);
    // Only the call the worker was running fails: it may be what stopped it. The worker ran its
    // calls one at a time in posting order, so those posted before it had finished (their
    // answers were lost with the worker) and those after it, like the ones waiting for it to
    // load, had not started; they all run again from a fresh state, and no stop counts against
    // them. Counted against every call, three watchdog kills in a row failed a cheap call that
    // had waited behind them, as "time" (black-box finding). With no call known to be running
    // (the worker stopped between calls), any posted call may be the cause: those are counted,
    // so one that takes every worker down with it ends.
    const blind = !posted.some((call) => call.message.id === runningId);
    for (const call of posted) {
      if (call.answered) {
        // Dropped: its answer went, and there is nothing to run.
        this.settled(call);
        continue;
      }
      if (blind) call.moves++;
      if (call.message.id === runningId || call.moves > maxBlindMoves) {
        this.settled(call);
        this.answer(call, { id: call.message.id, outcome: { t: "limit", what: reason } });
      } else {
        this.move(call);
      }
    }
    for (const call of waiting) {
      if (call.answered) this.settled(call);
      else this.move(call);
    }
  }

  /**
   * Posts a call again, on whichever worker {@link pick} chooses, under a new id and so a new
   * claim: the stopped worker may not have stopped yet, and must pass its copy by.
   */
  private move(call: Pending): void {
    const id = this.nextId++;
    call.message = withFields(call.message, { id });
    Atomics.store(this.claims, call.message.cell, claimOf(id));
    this.post(this.pick(), call);
  }

  /** Stops every worker. Calls still in flight fail closed. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const slots = [...this.slots];
    for (const slot of slots) this.replace(slot, "closed policy");
    await Promise.all(slots.map((slot) => slot.worker.terminate()));
  }
}
