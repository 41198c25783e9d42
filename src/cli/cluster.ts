import cluster, { type Worker } from "node:cluster";
import { execArgvWithoutInspector, nodeOptionsWithoutInspector } from "./inspector-flags.js";
import { inspectorListen } from "../proxy/inspector-address.js";
import { createServer } from "node:net";
import type { CliLog } from "./cli-log.js";
import { onHandoffLost } from "./handoff-lost.js";
import type { RetiredGuestSecrets } from "../proxy/guests.js";
import type { RetiredSecretsExchange } from "../proxy/start-proxy.js";
import { maxRetired } from "../policy/secrets.js";

/**
 * `--workers N`: N processes serve one listening port through node:cluster, each with the whole
 * proxy (its own leaf cache, connection pools and tier-2 sandboxes) and the same CA, which the
 * primary creates before it forks, so no two workers race to create it. The primary serves no
 * traffic: it starts the workers, prints the one listening line, replaces a worker that dies,
 * and on SIGINT or SIGTERM asks every worker to drain and close.
 *
 * Retired secret values (rotated or removed by a reload) live in each worker's memory, and a
 * worker started later builds its stores from the files, which hold only current values: the
 * old value then went upstream, and into the log in clear, from that worker alone. So each
 * worker reports its retired values once it serves and after each reload; the primary keeps
 * each worker's latest report (one that exited, until its replacement reports), hands their union
 * to a worker before it builds its proxy and again once it listens, and passes each new report
 * on to the other workers (a worker that read a rotated file at its start, a SIGHUP pending,
 * never saw the old value). Only over the IPC channel: the environment and argv of a process
 * are readable in /proc. Nothing persists them: a full restart forgets them.
 */

/** What a worker tells the primary. */
type WorkerReport =
  | { readonly kind: "listening"; readonly url: string }
  /** At its start, before it builds its proxy: the values the others retired. */
  | { readonly kind: "retired-wanted" }
  /**
   * Its retired values, all of them: once it serves, and after each reload; with the guests' form
   * it serves since (see {@link GuestForm}).
   */
  | { readonly kind: "retired"; readonly secrets: readonly RetiredGuestSecrets[]; readonly form?: GuestForm }
  /** A connection handed to it did not arrive (see onHandoffLost): it wants replacing, and stopping once its replacement listens. */
  | { readonly kind: "handoff-lost" };
/** What the primary tells a worker. */
type PrimaryOrder = { readonly kind: "stop" } | { readonly kind: "retired"; readonly secrets: readonly RetiredGuestSecrets[]; readonly start?: ClusterStart };

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
 * What a worker given portEnv exits with when that port was taken: the primary picked it free,
 * released it, and another process bound it before the workers did. The primary then picks
 * another (a few times) where any other start failure stops it.
 */
export const portTakenExit = 3;
/** How many ports the primary picks for `--listen HOST:0` before it gives up on starting. */
const portPicks = 5;

/**
 * Set by the primary on every worker when it serves the cluster's metrics: the listener's
 * `IP:PORT`, which the workers refuse as a target like their own (they listen for no metrics
 * themselves, so they would not know it).
 */
export const metricsAddressEnv = "EGRESSGATE_CLUSTER_METRICS";

/**
 * Set by the primary on every worker when its own inspector is open (node --inspect): its
 * `IP:PORT`, which the workers refuse as a target like their own inspector (see
 * src/proxy/inspector-address.ts).
 */
export const primaryInspectorEnv = "EGRESSGATE_PRIMARY_INSPECTOR";

/**
 * What the primary started the cluster with, handed to every worker before it builds its proxy:
 * the configuration's proxy-wide options (all but `resolve`, which reloads with the guests) and
 * what a reload may never change (whether the one guest serves without credentials, how
 * placeholders derive). A reload leaves those options as they were until a restart, and so must a
 * worker that starts later: a replacement read them from the file as it was then, and served a
 * changed `listen` on a second port, or a changed `caDir` with a CA of its own that the guests did
 * not trust, beside the workers still serving the old values (black-box finding). Over the IPC
 * channel, with the retired values: in the environment, inline PEMs could pass its limit.
 */
export interface ClusterStart extends GuestForm {
  /** The proxy-wide options, `resolve` and `auth` left out (they reload with the guests); an option not given is absent. */
  readonly proxy: Readonly<Record<string, unknown>>;
  /** startProxy's `open`: one guest served without credentials. */
  readonly open: boolean;
}

/**
 * How the guests' placeholders derive and which guests there are, as the workers serve them: at
 * the start, then as the latest reload a worker applied left them. A worker started later is
 * checked against this (reloadRefusal), not against the start: reloads may change both, one step
 * at a time, and a replacement compared with the start was refused where the others served.
 */
export interface GuestForm {
  readonly placeholderDerivation: "single" | "guests" | undefined;
  readonly guestNames: readonly string[];
}

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

/** In a worker: the primary's inspector, as `IP:PORT`, if it was open when the worker started. */
export function primaryInspectorAddress(): string | undefined {
  return process.env[primaryInspectorEnv] || undefined;
}

/** In a worker: the port the primary picked for `--listen HOST:0`, if it did. */
export function siblingPort(): number | undefined {
  const port = Number(process.env[portEnv]);
  return Number.isInteger(port) && port > 0 && port < 65536 ? port : undefined;
}

/**
 * In a worker, before it builds its proxy: the values the other workers retired (its guests'
 * stores hold them before it takes a connection), and what the cluster started with. No
 * deadline: the primary answers at once, and a worker whose primary died exits.
 */
export function startFromPrimary(): Promise<{ readonly retired: readonly RetiredGuestSecrets[]; readonly start: ClusterStart | undefined }> {
  return new Promise((resolve) => {
    const onOrder = (order: PrimaryOrder): void => {
      if (order?.kind !== "retired") return;
      process.off("message", onOrder);
      resolve({ retired: order.secrets, start: order.start });
    };
    process.on("message", onOrder);
    const ask: WorkerReport = { kind: "retired-wanted" };
    process.send?.(ask);
  });
}

/** In a worker: tells the primary every value it holds as retired now (after a reload, say). */
export function reportRetired(retired: RetiredSecretsExchange, form: GuestForm): void {
  // A reload that ends after the close disconnected the channel: a send then would be an
  // 'error' on process with no listener, which ends the worker.
  if (process.connected !== true) return;
  const report: WorkerReport = { kind: "retired", secrets: retired.current(), form: { placeholderDerivation: form.placeholderDerivation, guestNames: [...form.guestNames] } };
  process.send?.(report, undefined, undefined, () => undefined);
}

/**
 * In a worker: reports the listening URL and its retired values, runs `stop` when the primary
 * says so, and takes the values other workers retire from now on. (A worker whose primary dies
 * exits at once: node:cluster does that on the IPC channel's unexpected end.)
 */
export function reportListening(url: string, stop: () => void, retired: RetiredSecretsExchange, form: GuestForm, log: CliLog): void {
  const report: WorkerReport = { kind: "listening", url };
  process.send?.(report);
  reportRetired(retired, form);
  onHandoffLost(() => {
    log("error", "a connection the primary handed to this worker did not arrive: the worker is out of file descriptors, and node:cluster hands it no more; another starts in its place, then this one drains and closes", {
      consequence: "the guest of that connection got no answer; raise the open-file limit (ulimit -n, LimitNOFILE) or lower limits.connections",
    });
    // The primary stops this worker once the one in its place listens: had it stopped now, a
    // moment with no worker listening would close the port (node:cluster closes it with its last
    // worker), and guests would be refused until the new one listened.
    const lost: WorkerReport = { kind: "handoff-lost" };
    if (process.connected === true) process.send?.(lost, undefined, undefined, () => undefined);
    else stop();
  });
  process.on("message", (order: PrimaryOrder) => {
    if (order?.kind === "stop") stop();
    else if (order?.kind === "retired") {
      try {
        const guests = retired.adopt(order.secrets);
        if (guests.length > 0) log("info", "took the secret values other workers retired", { guests });
      } catch (error) {
        // Never quoted: the list holds secret values.
        log("warn", "retired secret values from the primary were refused", { error: (error as Error).name });
      }
    }
  });
}

/** Whether a worker's report of its guests' form has the shape {@link GuestForm} says. */
function wellFormedForm(form: unknown): form is GuestForm {
  if (typeof form !== "object" || form === null) return false;
  const { placeholderDerivation, guestNames } = form as Record<string, unknown>;
  return (
    (placeholderDerivation === undefined || placeholderDerivation === "single" || placeholderDerivation === "guests") &&
    Array.isArray(guestNames) &&
    guestNames.every((name) => typeof name === "string")
  );
}

/** Whether a worker's report of retired values has the shape the primary merges. */
function wellFormed(secrets: unknown): secrets is readonly RetiredGuestSecrets[] {
  return (
    Array.isArray(secrets) &&
    secrets.every(
      (entry: Partial<RetiredGuestSecrets> | null) =>
        typeof entry?.guest === "string" &&
        Array.isArray(entry.secrets) &&
        entry.secrets.every((secret) => typeof secret?.name === "string" && Array.isArray(secret.values) && secret.values.every((value: unknown) => typeof value === "string")),
    )
  );
}

/**
 * The union of the workers' reports, per guest and secret, each secret's newest
 * {@link maxRetired} values (a store keeps no more).
 */
function mergeRetired(reports: Iterable<readonly RetiredGuestSecrets[]>): RetiredGuestSecrets[] {
  const guests = new Map<string, Map<string, Set<string>>>();
  for (const report of reports) {
    for (const { guest, secrets } of report) {
      const byName = guests.get(guest) ?? new Map<string, Set<string>>();
      guests.set(guest, byName);
      for (const { name, values } of secrets) {
        const known = byName.get(name) ?? new Set<string>();
        byName.set(name, known);
        for (const value of values) {
          // Moved to the end: seen again, it is among the newest.
          known.delete(value);
          known.add(value);
        }
      }
    }
  }
  return [...guests].map(([guest, byName]) => ({ guest, secrets: [...byName].map(([name, values]) => ({ name, values: [...values].slice(-maxRetired) })) }));
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
    /** It exited with portTakenExit: the port the primary picked was taken. */
    readonly portTaken = false,
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
  /** What every worker serves with, whatever the config file says when it starts (see ClusterStart). */
  clusterStart: ClusterStart,
  /**
   * Signals passed on to every worker (SIGUSR1: reopen the audit log; SIGHUP: reload). Whatever
   * is not passed on stays the caller's: SIGUSR1 never keeps Node's meaning (src/cli/sigusr1.ts).
   */
  forward: readonly NodeJS.Signals[] = [],
  /** Called once when the workers are told to stop: the primary's /readyz answers 503 from then on. */
  onStopping: () => void = () => undefined,
): Promise<number> {
  // The workers open no inspector (./inspector-flags.ts); `inspectPort: 0` is what node:cluster
  // hands them in its place while the primary's NODE_OPTIONS holds one: left to it, a primary
  // given `--inspect-port=…:0` gave its workers ports 1 and 2, which Node refuses to start with.
  const execArgv = execArgvWithoutInspector(process.execArgv);
  const nodeOptions = nodeOptionsWithoutInspector(process.env["NODE_OPTIONS"] ?? "");
  cluster.setupPrimary({ exec: process.argv[1]!, args: [...argv], execArgv: execArgv.kept, inspectPort: 0, silent: false });
  const inspectorDropped = [...execArgv.dropped, ...nodeOptions.dropped];
  // Said when it changes something: the primary's inspector is open, so the workers' would have been.
  if (inspectorListen() !== undefined) {
    log("warn", "--workers: the workers run without Node's inspector; the primary keeps its own", {
      options: inspectorDropped,
      reason: "each worker would open one, which runs any code sent to it, and a guest could reach it through another worker; debug request handling without --workers",
    });
  } else if (inspectorDropped.length > 0) log("debug", "--workers: the inspector's options are not passed on to the workers", { options: inspectorDropped });
  // Picked before the workers bind it: another process can take it in between, and the workers
  // then exit with portTakenExit; the start picks another (see start below).
  let port = listen.port === 0 ? await freePort(listen.host) : undefined;
  const workerEnv = (): Record<string, string> => ({ ...env, ...(port !== undefined ? { [portEnv]: String(port) } : {}) });
  if (port !== undefined) log("debug", "workers to listen on a port picked free", { port });
  const live = new Set<Worker>();
  /** Workers stopped because their start is begun again on another port: their exits are expected. */
  const restarting = new WeakSet<Worker>();
  /** Workers that have reported listening: they take a stop order; the others a SIGTERM. */
  const serving = new WeakSet<Worker>();
  /** Workers that lost a connection handed to them (see onHandoffLost): stopped once their replacement listens. */
  const retiring = new WeakSet<Worker>();
  /** Workers a SIGHUP came for while they started: a signal before their handler ended them. */
  const owedReload = new WeakSet<Worker>();
  /**
   * Each worker's latest report of its retired values. One that exited keeps its own until its
   * replacement, given them at its start, reports (and for good when it closed and is not
   * replaced): the others took its values when it reported them, but report only what they
   * retired themselves, so a value it alone had reported would be lost with it.
   */
  const retiredBy = new Map<Worker, readonly RetiredGuestSecrets[]>();
  /** The guests' form as the latest worker report gave it: what a worker started later is checked against. */
  let guestForm: GuestForm = { placeholderDerivation: clusterStart.placeholderDerivation, guestNames: clusterStart.guestNames };
  /** A send to a worker whose channel is gone is dropped (its exit is handled on its own). */
  const tell = (worker: Worker, message: PrimaryOrder): void => {
    if (worker.isConnected()) worker.send(message);
  };
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

  const fork = (first: boolean, replacing?: Worker): Promise<{ worker: Worker; url: string }> =>
    new Promise((resolve, reject) => {
      const worker = cluster.fork({
        ...workerEnv(),
        ...(nodeOptions.dropped.length > 0 ? { NODE_OPTIONS: nodeOptions.kept } : {}),
        ...(first ? { [firstWorkerEnv]: "1" } : {}),
        ...(replacing !== undefined ? { [replacementEnv]: "1" } : {}),
      });
      live.add(worker);
      // A send to a worker that just died fails with EPIPE as an `error` event on it: unlistened,
      // it would take the primary, and with it every other worker's guests. Its exit is handled below.
      worker.on("error", (error: Error) => {
        // No process at all (spawn EMFILE: the primary had no descriptor for the pipes): no exit
        // will come for it. Kept in `live`, it was never replaced, the proxy served on with a
        // worker fewer and said only "worker channel error", and a SIGTERM's drain waited for its
        // exit for ever (fd-exhaustion probe). A start that fails is tried again (see replace).
        if (worker.process.pid === undefined) {
          live.delete(worker);
          // node:cluster drops a worker from its list at its exit or disconnect, neither of which
          // comes: each retry while out of descriptors left one more entry (review finding).
          if (cluster.workers?.[worker.id] === worker) delete cluster.workers[worker.id];
          reject(new WorkerStartError(`a worker could not be started: ${error.message}`, 1));
          return;
        }
        log("warn", "worker channel error", { worker: worker.process.pid, error: error.message });
      });
      worker.on("message", (report: WorkerReport) => {
        if (report?.kind === "handoff-lost") {
          if (stopping || retiring.has(worker)) return;
          retiring.add(worker);
          // Not counted with the deaths: a worker replaced for want of descriptors is no crash
          // that a new one would repeat, and stopping the proxy for it would end every guest.
          log("warn", "a worker can be handed no more connections (it ran out of file descriptors); starting another in its place, then it drains", { worker: worker.process.pid });
          replace(worker, 0, () => tell(worker, { kind: "stop" }));
          return;
        }
        if (report?.kind === "retired-wanted") {
          tell(worker, { kind: "retired", secrets: mergeRetired(retiredBy.values()), start: { ...clusterStart, ...guestForm } });
          return;
        }
        if (report?.kind === "retired") {
          if (!wellFormed(report.secrets)) {
            log("warn", "a worker's retired secret values were malformed; ignored", { worker: worker.process.pid });
            return;
          }
          if (wellFormedForm(report.form)) guestForm = { placeholderDerivation: report.form.placeholderDerivation, guestNames: report.form.guestNames };
          const before = retiredBy.get(worker);
          retiredBy.set(worker, report.secrets);
          if (replacing !== undefined) retiredBy.delete(replacing);
          if (report.secrets.length === 0 || JSON.stringify(before) === JSON.stringify(report.secrets)) return;
          for (const other of live) if (other !== worker && serving.has(other)) tell(other, { kind: "retired", secrets: report.secrets });
          return;
        }
        if (report?.kind !== "listening") return;
        serving.add(worker);
        // A SIGHUP that came while it started: it serves now, with its handler in place.
        if (owedReload.delete(worker)) worker.process.kill("SIGHUP");
        // What others reported while it started, since it asked.
        const known = mergeRetired(retiredBy.values());
        if (known.length > 0) tell(worker, { kind: "retired", secrets: known });
        resolve({ worker, url: report.url });
      });
      worker.process.once("exit", (code, signal) => {
        live.delete(worker);
        const pid = worker.process.pid;
        if (restarting.has(worker)) {
          reject(new WorkerStartError(`a worker was stopped to start again on another port (${how(code, signal)})`, 1));
          return;
        }
        if (stopping) {
          // Draining ends in a clean exit; a worker stopped before it served ends by the signal.
          const expected = code === 0 || ((signal === "SIGTERM" || signal === "SIGINT") && !serving.has(worker));
          if (!expected) {
            log("error", "worker failed while closing", { worker: pid, exit: how(code, signal) });
            exitCode = Math.max(exitCode, 1);
          }
          return;
        }
        if (retiring.has(worker)) {
          log(code === 0 ? "info" : "warn", "a replaced worker closed", { worker: pid, exit: how(code, signal) });
          return;
        }
        if (!serving.has(worker)) {
          reject(new WorkerStartError(`a worker exited while starting (${how(code, signal)})`, code === 2 ? 2 : 1, code === portTakenExit));
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
        // Monotonic: a wall clock stepped back kept every exit in "the last minute" for as long.
        const now = performance.now();
        restarts = [...restarts.filter((t) => now - t < 60_000), now];
        if (restarts.length >= maxRestartsPerMinute) {
          log("error", "worker exited, too often to replace; stopping", { worker: pid, exit: how(code, signal), exitsInLastMinute: restarts.length });
          void stopAll(1);
          return;
        }
        log("warn", "worker exited; starting another", { worker: pid, exit: how(code, signal) });
        replace(worker, 0);
      });
    });

  /**
   * Starts a worker in place of `pid`. A replacement reads the configuration as it is now: one
   * that fails to start (a config file broken since the last reload, say) is tried again later,
   * 5 s then up to a minute apart, while the other workers go on serving; with none left, the
   * primary stops. (It stopped them all: a bad file on disk took down a cluster serving fine.)
   */
  const replace = (dead: Worker, attempt: number, onServing: () => void = () => undefined): void => {
    const pid = dead.process.pid;
    fork(false, dead).then(
      (next) => {
        log("info", "worker replaced", { worker: next.worker.process.pid, replaces: pid });
        onServing();
      },
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
          if (!stopping) replace(dead, attempt + 1, onServing);
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
      // A worker still starting gets its SIGHUP once it serves: it may have read the file before
      // the change, and a signal before its first module ran (early-hup.ts) ended it ("a worker
      // exited while starting (SIGHUP)": the whole cluster stopped). Other signals wait for its handlers.
      for (const worker of live) {
        if (serving.has(worker)) worker.process.kill(signal);
        else if (signal === "SIGHUP") owedReload.add(worker);
      }
    });
  }

  /**
   * Starts the workers. When the port the primary picked was taken before they bound it (they
   * all fail alike: node:cluster binds once for all of them), the ones still starting are
   * stopped and the start begins again on another port, up to portPicks picks.
   */
  const start = (pick: number): void => {
    // Not awaited: a signal during start-up stops the workers, whose start then never settles.
    Promise.all(Array.from({ length: count }, (_, i) => fork(i === 0))).then(
      (started) => {
        if (stopping) return;
        print(`egressgate listening on ${started[0]!.url}`);
        log("info", "workers listening", { workers: count });
      },
      async (error: unknown) => {
        if (stopping) return;
        if (error instanceof WorkerStartError && error.portTaken && port !== undefined && pick < portPicks) {
          log("warn", "the port picked for the workers was taken before they bound it; picking another", { port, pick });
          const others = [...live];
          for (const worker of others) {
            restarting.add(worker);
            worker.process.kill("SIGTERM");
          }
          await Promise.all(others.map(onceExit));
          if (stopping) return;
          try {
            port = await freePort(listen.host);
          } catch (pickError) {
            if (stopping) return;
            log("error", "the workers could not start", { error: (pickError as Error).message });
            void stopAll(1);
            return;
          }
          if (stopping) return;
          log("debug", "workers to listen on a port picked free", { port });
          start(pick + 1);
          return;
        }
        log("error", "the workers could not start", { error: (error as Error).message });
        void stopAll(error instanceof WorkerStartError ? error.code : 1);
      },
    );
  };
  start(1);
  return done;
}
