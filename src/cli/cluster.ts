import cluster, { type Worker } from "node:cluster";
import { createServer } from "node:net";
import type { CliLog } from "./cli-log.js";

/**
 * `--workers N`: N processes serve one listening port through node:cluster, each with the whole
 * proxy (its own leaf cache, connection pools and tier-2 sandboxes) and the same CA, which the
 * primary creates before it forks, so no two workers race to create it. The primary serves no
 * traffic: it starts the workers, prints the one listening line, replaces a worker that dies,
 * and on SIGINT or SIGTERM asks every worker to drain and close.
 */

/** What a worker tells the primary. */
type WorkerReport = { readonly kind: "listening"; readonly url: string };
/** What the primary tells a worker. */
type PrimaryOrder = { readonly kind: "stop" };

/**
 * Set by the primary on the first worker it starts: that one writes `--guest-env-file`. A
 * replacement never rewrites it (the placeholders and port it would write are the same), so a
 * guest reading the file never catches it half-written.
 */
const firstWorkerEnv = "EGRESSGATE_FIRST_WORKER";
/**
 * Set by the primary on every worker for `--listen HOST:0`: the port it picked. Workers that
 * each listened on port 0 would share one only while one of them held it, and a replacement
 * started after they all died would get a port of its own.
 */
const portEnv = "EGRESSGATE_WORKER_PORT";

/**
 * Set by the primary on every worker when it serves the cluster's metrics: the listener's
 * `IP:PORT`, which the workers refuse as a target like their own (they listen for no metrics
 * themselves, so they would not know it).
 */
export const metricsAddressEnv = "EGRESSGATE_CLUSTER_METRICS";

/** Workers that may die within a minute before the primary gives up and stops them all. */
const maxRestartsPerMinute = 5;

export function isClusterWorker(): boolean {
  return cluster.isWorker;
}

/** In a worker: whether it is the one that writes the guest environment file. */
export function isFirstWorker(): boolean {
  return process.env[firstWorkerEnv] === "1";
}

/**
 * Set by the primary on a worker that replaces one that died: it refuses a config file that is
 * empty, as a reload does (at the first start an empty file is the default configuration; here
 * it would be a truncate half-way through a save, and this worker alone would serve deny-all).
 */
const replacementEnv = "EGRESSGATE_REPLACEMENT";

/** In a worker: whether it replaces one that died (see replacementEnv). */
export function isReplacement(): boolean {
  return process.env[replacementEnv] === "1";
}

/** In a worker: the primary's metrics listener, as `IP:PORT`, if it serves one. */
export function primaryMetricsAddress(): string | undefined {
  return process.env[metricsAddressEnv] || undefined;
}

/** In a worker: the port the primary picked for `--listen HOST:0`, if it did. */
export function siblingPort(): number | undefined {
  const port = Number(process.env[portEnv]);
  return Number.isInteger(port) && port > 0 && port < 65536 ? port : undefined;
}

/**
 * In a worker: reports the listening URL, and runs `stop` when the primary says so. (A worker
 * whose primary dies exits at once: node:cluster does that on the IPC channel's unexpected end.)
 */
export function reportListening(url: string, stop: () => void): void {
  const report: WorkerReport = { kind: "listening", url };
  process.send?.(report);
  process.on("message", (order: PrimaryOrder) => {
    if (order?.kind === "stop") stop();
  });
}

function onceExit(worker: Worker): Promise<void> {
  return new Promise((resolve) => {
    if (worker.process.exitCode !== null || worker.process.signalCode !== null) resolve();
    else worker.process.once("exit", () => resolve());
  });
}

/** A port free on `host` now: the kernel's pick for port 0, released again. */
function freePort(host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, host, () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address !== null ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

/** A worker that exited before it listened; `code` is what the primary exits with (2 for bad flags). */
class WorkerStartError extends Error {
  constructor(
    message: string,
    readonly code: number,
  ) {
    super(message);
  }
}

/**
 * Runs the primary until its workers have closed. Resolves with the exit code: 0 after a signal
 * (or once every worker closed cleanly), 2 when a worker refused its flags at start, 1 when the
 * workers could not start, kept dying, or failed while draining.
 */
export async function runPrimary(
  argv: readonly string[],
  count: number,
  listen: { host: string; port: number },
  env: Readonly<Record<string, string>>,
  print: (line: string) => void,
  /** The primary's own lines (workers that exit, start or fail), in the CLI's --log-format. */
  log: CliLog,
  /** Signals passed on to every worker (SIGUSR1: reopen the audit log; SIGHUP: reload). */
  forward: readonly NodeJS.Signals[] = [],
  /** Called once when the workers are told to stop: the primary's /readyz answers 503 from then on. */
  onStopping: () => void = () => undefined,
): Promise<number> {
  cluster.setupPrimary({ exec: process.argv[1]!, args: [...argv], silent: false });
  // Taken before the workers bind it: a start-up race with another process ends in EADDRINUSE,
  // which stops the start with the worker's own message.
  const port = listen.port === 0 ? await freePort(listen.host) : undefined;
  const workerEnv = { ...env, ...(port !== undefined ? { [portEnv]: String(port) } : {}) };
  const live = new Set<Worker>();
  /** Workers that have reported listening: they take a stop order; the others a SIGTERM. */
  const serving = new WeakSet<Worker>();
  let stopping = false;
  let exitCode = 0;
  let restarts: number[] = [];
  /** Replacements to try again (see replace). */
  const retries = new Set<NodeJS.Timeout>();
  let finish: (code: number) => void = () => undefined;
  const done = new Promise<number>((resolve) => (finish = resolve));

  const stopAll = async (code: number): Promise<void> => {
    if (stopping) return;
    stopping = true;
    exitCode = code;
    for (const retry of retries) clearTimeout(retry);
    onStopping();
    const order: PrimaryOrder = { kind: "stop" };
    for (const worker of live) {
      // A worker still starting has no handler for the order yet; a signal stops it either way.
      if (serving.has(worker) && worker.isConnected()) worker.send(order);
      else worker.process.kill("SIGTERM");
    }
    await Promise.all([...live].map(onceExit));
    finish(exitCode);
  };

  const how = (code: number | null, signal: NodeJS.Signals | null): string => signal ?? `code ${code}`;

  const fork = (first: boolean, replacing = false): Promise<{ worker: Worker; url: string }> =>
    new Promise((resolve, reject) => {
      const worker = cluster.fork({ ...workerEnv, ...(first ? { [firstWorkerEnv]: "1" } : {}), ...(replacing ? { [replacementEnv]: "1" } : {}) });
      live.add(worker);
      // A send to a worker that just died fails with EPIPE as an `error` event on it: unlistened,
      // it would take the primary, and with it every other worker's guests. Its exit is handled below.
      worker.on("error", (error: Error) => log("warn", "worker channel error", { worker: worker.process.pid, error: error.message }));
      worker.on("message", (report: WorkerReport) => {
        if (report?.kind !== "listening") return;
        serving.add(worker);
        resolve({ worker, url: report.url });
      });
      worker.process.once("exit", (code, signal) => {
        live.delete(worker);
        const pid = worker.process.pid;
        if (stopping) {
          // Draining ends in a clean exit; a worker stopped before it served ends by the signal.
          const expected = code === 0 || ((signal === "SIGTERM" || signal === "SIGINT") && !serving.has(worker));
          if (!expected) {
            log("error", "worker failed while closing", { worker: pid, exit: how(code, signal) });
            exitCode = Math.max(exitCode, 1);
          }
          return;
        }
        if (!serving.has(worker)) {
          reject(new WorkerStartError(`a worker exited while starting (${how(code, signal)})`, code === 2 ? 2 : 1));
          return;
        }
        if (code === 0) {
          // Closed on purpose (a SIGTERM of its own, say): not replaced. The last one ends the primary.
          log("info", "worker closed", { worker: pid });
          if (live.size === 0) void stopAll(0);
          return;
        }
        // A worker died while serving: its connections are gone, the others go on. Replace it,
        // unless workers keep dying, which a new one would only repeat.
        const now = Date.now();
        restarts = [...restarts.filter((t) => now - t < 60_000), now];
        if (restarts.length >= maxRestartsPerMinute) {
          log("error", "worker exited, too often to replace; stopping", { worker: pid, exit: how(code, signal), exitsInLastMinute: restarts.length });
          void stopAll(1);
          return;
        }
        log("warn", "worker exited; starting another", { worker: pid, exit: how(code, signal) });
        replace(pid, 0);
      });
    });

  /**
   * Starts a worker in place of `pid`. A replacement reads the configuration as it is now: one
   * that fails to start (a config file broken since the last reload, say) is tried again later,
   * 5 s then up to a minute apart, while the other workers go on serving; with none left, the
   * primary stops. (It stopped them all: a bad file on disk took down a cluster serving fine.)
   */
  const replace = (pid: number | undefined, attempt: number): void => {
    fork(false, true).then(
      (next) => log("info", "worker replaced", { worker: next.worker.process.pid, replaces: pid }),
      (error: unknown) => {
        if (stopping) return;
        // Not 2 even if the new worker refused its flags: those were fine at start (a policy
        // file edited since, say); the exit code says the proxy failed.
        if (live.size === 0) {
          log("error", "no worker could be started and none is left; stopping", { error: (error as Error).message });
          void stopAll(1);
          return;
        }
        const seconds = Math.min(60, 5 * 2 ** attempt);
        log("warn", "a replacement worker could not start; trying again", { error: (error as Error).message, serving: live.size, workers: count, retryInS: seconds });
        const retry = setTimeout(() => {
          retries.delete(retry);
          if (!stopping) replace(pid, attempt + 1);
        }, seconds * 1000);
        retries.add(retry);
      },
    );
  };

  let signals = 0;
  const onSignal = (signal: NodeJS.Signals): void => {
    signals++;
    if (signals > 1) {
      // A second signal: stop waiting for the drain.
      for (const worker of live) worker.process.kill("SIGKILL");
      process.exit(130);
    }
    log("info", "closing", { signal, workers: live.size });
    void stopAll(0);
  };
  process.on("SIGINT", onSignal);
  process.on("SIGTERM", onSignal);
  for (const signal of forward) {
    process.on(signal, () => {
      // A worker still starting keeps a SIGHUP and reloads once it serves (early-hup.ts): it may
      // have read the file before the change. Other signals wait for its handlers.
      for (const worker of live) if (serving.has(worker) || signal === "SIGHUP") worker.process.kill(signal);
    });
  }

  // Not awaited: a signal during start-up stops the workers, whose start then never settles.
  Promise.all(Array.from({ length: count }, (_, i) => fork(i === 0))).then(
    (started) => {
      if (stopping) return;
      print(`egressgate listening on ${started[0]!.url}`);
      log("info", "workers listening", { workers: count });
    },
    (error: unknown) => {
      if (stopping) return;
      log("error", "the workers could not start", { error: (error as Error).message });
      void stopAll(error instanceof WorkerStartError ? error.code : 1);
    },
  );
  return done;
}
