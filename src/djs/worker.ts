import { parentPort, workerData, type MessagePort } from "node:worker_threads";
import { bundlePolicy, PolicyLoadError } from "./bundle.js";
import type { CallMessage, CallReply, InitReply, WorkerInit } from "./protocol.js";
import { decodeCalls, encodeReplies, type WireBatch } from "./wire.js";
import { Sandbox } from "./sandbox.js";

/**
 * A tier-2 worker thread: it owns one QuickJS sandbox and runs calls one at a time, in the
 * order they arrive. Running here, not on the proxy's event loop, means a stuck native builtin
 * or a deep stack can be stopped by terminating the thread, and TLS and streaming go on.
 */
const init = workerData as WorkerInit & { initPort: MessagePort };
const heartbeat = new Float64Array(init.heartbeat);
const port = parentPort!;

async function load(): Promise<{ sandbox: Sandbox; code: string; map: string | undefined }> {
  const { policy } = init;
  const { code, map } =
    "code" in policy
      ? policy
      : policy.kind === "script"
        ? { code: policy.source, map: undefined }
        : await bundlePolicy({
            kind: policy.kind,
            filename: policy.filename,
            source: policy.source,
            modules: policy.modules,
            fromDisk: policy.fromDisk,
          });
  return { sandbox: await Sandbox.create(policy.kind, policy.filename, code, map, init.limits), code, map };
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
  signalReady({ ok: true, code, map, phases: sandbox.phases });
} catch (error) {
  const message = error instanceof PolicyLoadError ? error.message : `${init.policy.filename}: ${(error as Error).message}`;
  signalReady({ ok: false, message });
  process.exit(0);
}

const queue: CallMessage[] = [];
let running = false;

/** Runs every queued call; the replies of one batch go back as one message. */
async function drain(): Promise<void> {
  if (running) return;
  running = true;
  let replies: CallReply[] = [];
  const flush = (): void => {
    if (replies.length === 0) return;
    const transfer = replies.flatMap((r) => (r.bytes !== undefined ? [r.bytes.buffer as ArrayBuffer] : []));
    port.postMessage(encodeReplies(replies), transfer);
    replies = [];
  };
  let batchStarted = performance.now();
  while (queue.length > 0) {
    const message = queue.shift()!;
    // Which call runs, and since when: if the watchdog stops this thread, the host fails
    // exactly this call and sends the others to the new worker.
    heartbeat[1] = message.id;
    heartbeat[0] = performance.timeOrigin + performance.now();
    const { reply, replace } = sandbox.call(message);
    heartbeat[0] = 0;
    replies.push(reply);
    // Answers that are ready do not wait long behind slow calls later in the batch.
    if (performance.now() - batchStarted > 2) {
      flush();
      batchStarted = performance.now();
    }
    if (replace) {
      // A call that hit a limit leaves nothing behind: a fresh WASM instance. Its answer goes
      // out first, so the wait for the new instance delays no settled call.
      flush();
      sandbox = await Sandbox.create(init.policy.kind, init.policy.filename, code, map, init.limits);
    }
  }
  flush();
  running = false;
}

port.on("message", (batch: WireBatch) => {
  for (const message of decodeCalls(batch)) queue.push(message);
  void drain();
});
