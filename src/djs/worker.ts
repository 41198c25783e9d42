import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { parentPort, receiveMessageOnPort, workerData, type MessagePort } from "node:worker_threads";
import { bundlePolicy, hashbangAsComment, hasModuleSyntax, PolicyLoadError, stopBundler } from "./bundle.js";
import { phaseProblem } from "./phase-check.js";
import { claimOf, claimRunning, type CallMessage, type CallReply, type InitReply, type PolicyKind, type WorkerInit } from "./protocol.js";
import { decodeCalls, encodeReplies, type WireBatch } from "./wire.js";
import { Sandbox } from "./sandbox.js";
import { useCompiledQuickJS } from "./wasm-instance.js";

/**
 * A tier-2 worker thread: it owns one QuickJS sandbox and runs calls one at a time, in the
 * order they arrive. Running here, not on the proxy's event loop, means a stuck native builtin
 * or a deep stack can be stopped by terminating the thread, and TLS and streaming go on.
 */
const init = workerData as WorkerInit & { initPort: MessagePort };
const heartbeat = new Float64Array(init.heartbeat);
const port = parentPort!;
useCompiledQuickJS(init.quickjs);

/** The kind and file name the policy loaded as (a `detect` source's are decided in load()). */
let kind: PolicyKind = init.policy.kind;
let filename = init.policy.filename;

async function load(): Promise<{ sandbox: Sandbox; code: string; map: string | undefined }> {
  const { policy } = init;
  const { code, map } = "code" in policy ? policy : await compile(policy);
  const sandbox = await Sandbox.create(kind, filename, code, map, init.limits);
  // A policy that defines no phase would decide nothing: an emptied file, a misspelt hook, a
  // hook on globalThis or in a default export would each let everything through in silence.
  const problem = phaseProblem(filename, kind, sandbox.loaded, !("code" in policy) && policy.source.trim() === "");
  if (problem !== undefined) throw new PolicyLoadError(problem);
  return { sandbox, code, map };
}

async function compile(policy: Exclude<WorkerInit["policy"], { code: string }>): Promise<{ code: string; map: string | undefined }> {
  try {
    // Parsed under the script's name: esbuild takes a `.mjs` name (the module's) for a module.
    if (policy.detect !== undefined && !(await hasModuleSyntax(policy.source, policy.detect.scriptFilename))) {
      kind = "script";
      filename = policy.detect.scriptFilename;
    }
    if (kind === "script") return { code: hashbangAsComment(policy.source), map: undefined };
    return await bundlePolicy({ kind, filename, source: policy.source, modules: policy.modules, fromDisk: policy.fromDisk });
  } finally {
    await stopBundler();
  }
}

function signalReady(reply: InitReply): void {
  init.initPort.postMessage({ init: reply });
  const flag = new Int32Array(init.ready);
  Atomics.store(flag, 0, 1);
  Atomics.notify(flag, 0);
}

let sandbox: Sandbox;
let code: string;
let map: string | undefined;
try {
  ({ sandbox, code, map } = await load());
  signalReady({ ok: true, kind, filename, code, map, phases: sandbox.phases });
} catch (error) {
  const message = error instanceof PolicyLoadError ? error.message : `${filename}: ${(error as Error).message}`;
  signalReady({ ok: false, message });
  process.exit(0);
}

const wake = new Int32Array(init.wake);
const claims = new Int32Array(init.claims);

/** The next batch of calls on the port, if one is there. */
function take(): CallMessage[] | undefined {
  const received = receiveMessageOnPort(port) as { message: WireBatch } | undefined;
  return received === undefined ? undefined : decodeCalls(received.message);
}

/** Whether calls ran since this thread last collected its garbage, and how long it idles first. */
let ranSinceCollection = false;
const idleCollectMs = 1_000;

/**
 * Sleeps until the host posts a batch. The host bumps the counter after posting, and notifies
 * only while the flag says this thread sleeps; the port is looked at again after the flag is
 * set, so a batch posted in between is not slept through.
 */
function sleep(): CallMessage[] {
  for (;;) {
    Atomics.store(wake, 1, 1);
    const posted = Atomics.load(wake, 0);
    const batch = take();
    // A thread that sleeps here never reaches V8's idle-time collection: after a second with no
    // call it collects its own garbage, once (the soak saw each worker hold about 16 MiB of it).
    if (batch === undefined && Atomics.wait(wake, 0, posted, ranSinceCollection ? idleCollectMs : undefined) === "timed-out") {
      ranSinceCollection = false;
      gc?.();
    }
    Atomics.store(wake, 1, 0);
    if (batch !== undefined) return batch;
    const next = take();
    if (next !== undefined) return next;
  }
}

/**
 * Runs calls as they come, one at a time, in order. The replies to one batch of calls go back as
 * one message, or sooner, every 2 ms, so ready answers do not wait long behind slow calls.
 *
 * This thread goes back to its event loop only while it waits for a new sandbox: nothing here
 * needs it (console lines travel in the replies), and a wake-up through `Atomics.wait` is
 * cheaper than one through libuv.
 */
async function serve(): Promise<never> {
  let replies: CallReply[] = [];
  const flush = (): void => {
    if (replies.length === 0) return;
    const transfer = replies.flatMap((r) => (r.bytes !== undefined ? [r.bytes.buffer as ArrayBuffer] : []));
    port.postMessage(encodeReplies(replies), transfer);
    replies = [];
  };
  const queue: CallMessage[] = [];
  let batchStarted = performance.now();
  for (;;) {
    if (queue.length === 0) {
      flush();
      queue.push(...(take() ?? sleep()));
      batchStarted = performance.now();
    }
    const message = queue.shift()!;
    // Taken from the host as it runs: a call the host dropped meanwhile (its request ended, or it
    // waited past timeouts.hookMs) is passed by, never run; a gone guest's calls held every other
    // guest of the policy, one time limit each (black-box finding).
    const claim = claimOf(message.id);
    let replace = false;
    if (Atomics.compareExchange(claims, message.cell, claim, claimRunning) !== claim) {
      replies.push({ id: message.id, outcome: { t: "dropped" } });
    } else {
      // Which call runs, and since when: if the watchdog stops this thread, the host fails
      // exactly this call and sends the others to the new worker.
      heartbeat[1] = message.id;
      heartbeat[0] = performance.timeOrigin + performance.now();
      const ran = sandbox.call(message);
      heartbeat[0] = 0;
      ranSinceCollection = true;
      replies.push(ran.reply);
      replace = ran.replace;
    }
    if (performance.now() - batchStarted > 2) {
      flush();
      batchStarted = performance.now();
    }
    if (replace) {
      // A call that hit a limit leaves nothing behind: a fresh WASM instance. Its answer goes
      // out first, so the wait for the new instance delays no settled call.
      flush();
      sandbox = await renewed();
    }
  }
}

/**
 * A fresh sandbox for the same code. The code loaded before, so a failure here means the machine
 * is out of something: the thread exits, and the host starts a new worker for the calls queued.
 */
async function renewed(): Promise<Sandbox> {
  // Nothing may still reach the old sandbox while the collector looks for it.
  sandbox = undefined as unknown as Sandbox;
  await collectGarbage();
  try {
    return await Sandbox.create(kind, filename, code, map, init.limits);
  } catch {
    process.exit(1);
  }
}

/**
 * This thread's own garbage collector, which `gc()` on the main thread never reaches. A sandbox
 * dropped after a memory limit leaves a WebAssembly.Memory of up to the whole heap limit behind,
 * and a thread that sleeps in Atomics.wait allocates too little for V8 to collect it on its own:
 * after a few renewals the process held one old heap per renewal. The flag is process-wide, so
 * it is on only for the moment it takes to get the function, under a lock all workers share, and
 * left alone when the embedder turned it on (this thread's context then has `gc` already).
 */
/** How long a worker waits for another's hold on the gc flag before it takes the lock over. */
const gcFlagLockWaitMs = 2_000;

const gc = ((): (() => void) | undefined => {
  const own = (globalThis as { gc?: () => void }).gc;
  if (typeof own === "function") return own;
  const lock = new Int32Array(init.gcFlagLock);
  // A worker stopped while it held the lock (terminate() runs no `finally`: a policy closed, or a
  // worker replaced, as it started) never gives it back, and every worker started after it, in
  // any engine of the process, waited here for good: its policy never loaded and each request
  // under it hung (CI finding, on a loaded machine). The lock is taken over past a bound; the
  // worst a live holder slower than that risks is a worker without its own `gc`.
  const deadline = performance.now() + gcFlagLockWaitMs;
  while (Atomics.compareExchange(lock, 0, 0, 1) !== 0) {
    if (performance.now() > deadline) break;
    Atomics.wait(lock, 0, 1, 10);
  }
  try {
    setFlagsFromString("--expose-gc");
    return runInNewContext("gc") as () => void;
  } catch {
    return undefined;
  } finally {
    setFlagsFromString("--no-expose-gc");
    Atomics.store(lock, 0, 0);
    Atomics.notify(lock, 0);
  }
})();

/** V8 frees a WASM memory's pages one collection after it finds it dead, past a turn of the event loop. */
async function collectGarbage(): Promise<void> {
  if (gc === undefined) return;
  gc();
  await new Promise((resolve) => setImmediate(resolve));
  gc();
}

void serve();
