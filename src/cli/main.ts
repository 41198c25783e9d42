// First: run as dist/cli/main.js too, the process takes SIGUSR1 before anything else loads.
import "./sigusr1.js";
import { earlyHup, onEarlyHup } from "./early-hup.js";
import { randomBytes } from "node:crypto";
import { defaultCaDir, loadOrCreateCa } from "../tls/ca-store.js";
import { launchProxy } from "../proxy/start-proxy.js";
import { resolveProxyOptions, type ProxyOptions } from "../proxy/options.js";
import { parseCli, placeholderKeyEnv, UsageError, type CliCommand } from "./args.js";
import {
  isClusterWorker,
  isFirstWorker,
  isReplacement,
  metricsAddressEnv,
  primaryInspectorAddress,
  primaryInspectorEnv,
  primaryMetricsAddress,
  reportListening,
  reportRetired,
  startFromPrimary,
  runPrimary,
  siblingPort,
  portTakenExit,
  type ClusterStart,
} from "./cluster.js";
import { isDeepStrictEqual } from "node:util";
import { isIP } from "node:net";
import { serveClusterMetrics } from "../metrics/cluster-metrics.js";
import { createLogger } from "../log.js";
import { cliSink, createCliLog } from "./cli-log.js";
import { watchConfiguration } from "./watch.js";
import { runCheck } from "./check.js";
import { checkConfig, checkHar, failureText, printCa, printEnv } from "./commands.js";
import { DjsEngine } from "../djs/engine.js";
import { readConfigText, reuseParses } from "../config/file.js";
import { parseAhead } from "../config/parse-ahead.js";
import { inspectorListen } from "../proxy/inspector-address.js";
import { reloadRefusal } from "../config/build.js";
import { makeIssue, OptionError } from "../option-error.js";
import { isOptionError } from "../config/option-error.js";
import { defaults } from "../config/defaults.js";

/** `flags`, or the config file in use, once known: how an option error from startProxy is worded. */
let source: string | undefined;

/** Commands that serve nothing: the default command (serve) is any other first word. */
const offlineCommands = new Set(["ca", "env", "har", "check", "check-config", "--help", "-h", "--version"]);

async function main(argv: readonly string[]): Promise<number> {
  // A reader that goes away (`egressgate … | head`, a log shipper restarting) fails each later
  // write with EPIPE, as an `error` event that, unlistened, would end the proxy for every guest.
  // Those lines are lost; serving goes on.
  for (const stream of [process.stdout, process.stderr]) stream.on("error", () => undefined);
  // Placeholders and guest tokens derive from this key. One made here lasts as long as the
  // process, so a reload (SIGHUP) gives unchanged names the same placeholders and tokens.
  if (!offlineCommands.has(argv[0] ?? "") && (process.env[placeholderKeyEnv] ?? "") === "") process.env[placeholderKeyEnv] = randomBytes(32).toString("hex");
  if (offlineCommands.has(argv[0] ?? "")) process.off("SIGHUP", onEarlyHup);
  const command = parseCli(argv);
  if (command.kind === "help") return 0;
  if (command.kind === "ca") return printed(() => printCa(command.caDir));
  if (command.kind === "env") return printed(() => printEnv(command, process.env));
  if (command.kind === "har-check") return checkHar(command.file);
  if (command.kind === "check") {
    source = command.source;
    try {
      return await runCheck(command.check, (text) => process.stdout.write(text));
    } finally {
      await command.built.close();
    }
  }
  if (command.kind === "check-config") {
    source = command.file;
    return checkConfig(command.file, process.env);
  }
  source = command.source;
  const worker = isClusterWorker();
  // At a first start an empty file is the default configuration; a replacement beside workers
  // on the real one would serve it alone (a truncate half-way through a save).
  if (worker && isReplacement()) refuseBlankConfig(source);
  // Ctrl-C reaches every process of the group. In a cluster the primary orders the drain, so a
  // worker ignores SIGINT from its very start: one that closed on its own would look to the
  // primary like one that chose to stop, and one still starting would die of it.
  if (worker) process.on("SIGINT", () => undefined);
  const built = command.built;
  /** The configuration serving now: a reload replaces it. */
  let current = built;
  /** Replaced configurations whose policies may still serve requests in flight. */
  const retired = new Set<typeof built>();
  redactFatal = (text) => current.redact(text);
  const options: ProxyOptions = command.options;
  try {
    if (command.workers > 1 && !worker) {
      // The configuration is valid and its policies load (parseCli loaded them); startProxy's
      // own checks run here too, so a bad option exits 2 before any worker starts. The workers
      // load their own policies (a --config file, each worker reading it again). The CA is made
      // here, once, so that no two workers race to create it.
      const { listen, metricsListen, auditLog, open } = resolveProxyOptions(options);
      await built.close();
      await loadOrCreateCa(options.caDir ?? defaultCaDir());
      // One placeholder key for all workers, so a guest's placeholders work whichever one serves it.
      const env: Record<string, string> = { [placeholderKeyEnv]: process.env[placeholderKeyEnv] ?? randomBytes(32).toString("hex") };
      // The proxy-wide options every worker serves with, the ones started later too (see cluster.ts).
      const { resolve: _resolve, auth: _auth, ...proxyWide } = command.config.proxy;
      const start: ClusterStart = { proxy: proxyWide, open, placeholderDerivation: built.placeholderDerivation, guestNames: built.guestNames };
      // The primary serves the sum over its workers; the workers listen for no metrics themselves.
      let serving = false;
      const say = createCliLog({ logLevel: command.config.proxy.logLevel, logFormat: command.logFormat });
      const metrics =
        metricsListen === undefined
          ? undefined
          : await serveClusterMetrics(metricsListen, createLogger(command.config.proxy.logLevel ?? "info", cliSink(command.logFormat, undefined)), () => serving).catch((error: unknown) => {
              // Worded as one process words it: a bare "listen EADDRINUSE" named neither the flag nor the key.
              const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
              throw new OptionError(makeIssue(["metricsListen"], `cannot listen on ${metricsListen.host}:${metricsListen.port} (${code})`), { cause: error });
            });
      if (metrics !== undefined) {
        say("info", "metrics listening", { url: metrics.url });
        env[metricsAddressEnv] = hostPort(metrics.host, metrics.port);
      }
      // The primary's inspector (node --inspect) runs code in the process that holds every
      // secret: the workers refuse it as a target, as each refuses its own (they would not know it).
      const inspector = inspectorListen();
      if (inspector !== undefined) env[primaryInspectorEnv] = hostPort(inspector.host, inspector.port);
      if (auditLog === undefined) process.on("SIGUSR1", () => say("info", noAuditLog));
      // --watch: only the primary watches; a change is a SIGHUP to itself, which it passes to every
      // worker (early-hup.ts's listener, kept in the primary, stands until runPrimary forwards it).
      const watching = command.config.watch === true ? watchConfiguration(command.config, process.env, async () => void process.kill(process.pid, "SIGHUP"), say) : undefined;
      try {
        // SIGUSR1 reopens each worker's audit log; without one the primary says so, once.
        return await runPrimary(argv, command.workers, listen, env, (line) => {
          serving = true;
          process.stdout.write(`${line}\n`);
        }, say, start, ["SIGHUP", ...(auditLog !== undefined ? (["SIGUSR1"] as const) : [])], () => (serving = false)).catch((error: unknown) => {
          // The primary looks up a free port on the listen host itself (--listen HOST:0).
          throw listenFailure(error, listen);
        });
      } finally {
        watching?.close();
        await metrics?.close();
      }
    }
    // In a cluster, only the first worker writes the guest environment file, every worker's log
    // lines name it, and for `--listen HOST:0` every worker listens on the port the primary picked.
    const port = worker ? siblingPort() : undefined;
    // Values the other workers retired at reloads (this one's files hold only the current ones),
    // and the proxy-wide options the cluster started with, which a worker serves whatever the file says now.
    const fromPrimary = worker ? await startFromPrimary() : undefined;
    const started = fromPrimary?.start === undefined ? { options, differs: [] } : asClusterStarted(command, fromPrimary.start);
    // A person at a terminal reads one line per request; a pipe or a file gets the JSON lines.
    const sink = cliSink(command.logFormat, worker ? process.pid : undefined);
    const say = createCliLog({ logLevel: started.options.logLevel, logFormat: command.logFormat, workerPid: worker ? process.pid : undefined });
    if (started.differs.length > 0) {
      say("warn", "the config file changes settings that apply only at a restart: this worker serves them as the cluster started with them", { settings: started.differs });
    }
    // The primary's metrics listener and inspector are this deployment's addresses: refused as targets.
    const primaryAddresses = worker ? [primaryMetricsAddress(), primaryInspectorAddress()].filter((address) => address !== undefined) : [];
    // The options as this process runs them, at the start and at each reload alike (a reload
    // given the file's own compared metricsListen and guestEnvFile with a worker's, and warned
    // on every SIGHUP that they needed a restart).
    const forThisProcess = (given: ProxyOptions): ProxyOptions => {
      // A worker counts, and the primary serves the sum (see serveClusterMetrics); only the first
      // worker writes the guest environment file.
      const { guestEnvFile, metricsListen, ...rest } = given;
      return {
        ...(worker ? rest : given),
        ...(worker && isFirstWorker() && guestEnvFile !== undefined ? { guestEnvFile } : {}),
        ...(worker && metricsListen !== undefined ? { metrics: true } : {}),
        ...(primaryAddresses.length > 0 ? { ownAddresses: [...(given.ownAddresses ?? []), ...primaryAddresses] } : {}),
        ...(port !== undefined ? { listen: { ...given.listen, port } } : {}),
        ...(sink !== undefined ? { logSink: sink } : {}),
      };
    };
    const launching = forThisProcess(started.options);
    // A start can wait for long: for the reader of a FIFO given as --guest-env-file or
    // --audit-log. SIGTERM (or Ctrl-C) meanwhile ended the process by the signal's default
    // action, with no word after the "waits for one to open it" warning. Now it is said, and the
    // process exits 0, as a signal while serving ends it: the stop asked for is what happened.
    // The start has not handed back the proxy a drain would close, so a guest the listener took
    // meanwhile is cut. A worker's signals are its primary's.
    const stopStarting = (signal: NodeJS.Signals): void => {
      say("info", "a signal came while the proxy was starting: stopping before it serves", { signal });
      process.exit(0);
    };
    const startSignals: NodeJS.Signals[] = worker ? [] : ["SIGTERM", "SIGINT"];
    for (const signal of startSignals) process.on(signal, stopStarting);
    const { proxy, retiredSecrets } = await launchProxy(launching, fromPrimary?.retired ?? [])
      .catch((error: unknown) => {
        throw listenFailure(error, launching.listen);
      })
      .finally(() => {
        for (const signal of startSignals) process.off(signal, stopStarting);
      });
    // With an audit log the proxy reopens it (and says so); without, SIGUSR1 is only logged.
    if (started.options.auditLog === undefined) process.on("SIGUSR1", () => say("info", noAuditLog));
    await new Promise<void>((resolve) => {
      let closing = false;
      let watching: { close(): void } | undefined;
      const close = (): void => {
        if (closing) return;
        closing = true;
        watching?.close();
        void proxy.close().then(async () => {
          await Promise.all([current, ...retired].map((config) => config.close()));
          // A worker's IPC channel would keep it alive after the drain.
          if (worker) process.disconnect?.();
          resolve();
        });
      };
      let signalled = false;
      const stop = (signal: NodeJS.Signals): void => {
        if (signalled) process.exit(130); // a second signal: stop waiting for the drain
        signalled = true;
        if (!worker) say("info", "closing", { signal });
        // What is recorded so far is on disk before the drain, which a second signal may cut short.
        if (signal === "SIGTERM") void proxy.flushRecording();
        close();
      };
      if (!worker) process.on("SIGINT", stop);
      process.on("SIGTERM", stop);
      // SIGHUP: read the flags' files (--config, --hooks-script, file: secrets) again and swap the
      // configuration whole; anything that fails leaves the old one serving, with the reason logged.
      let reloading = Promise.resolve();
      /** A reload that failed for want of file descriptors, to be tried again (see the catch below). */
      let retry: { timer: NodeJS.Timeout | undefined; attempt: number } = { timer: undefined, attempt: 0 };
      const reload = async (): Promise<void> => {
        clearTimeout(retry.timer);
        // A reload queued before SIGTERM does not apply during the drain.
        if (closing) return;
        let next: ReturnType<typeof parseCli>;
        let replacedIdle: Promise<void>;
        say("info", "reloading the configuration");
        // The dry run that finds the policies and the parse that builds read each file once.
        const stopReusing = reuseParses();
        try {
          // An emptied file is the default configuration (deny-all) at start, and a truncate
          // half-way through an edit on a reload: refused, as a broken file is.
          refuseBlankConfig(source);
          // A large config file is parsed and checked on a worker thread first: the parses
          // below take its outcome, and the event loop serves the guests meanwhile.
          if (source !== undefined && source !== "flags") await parseAhead(source, process.env);
          // Every policy loads ahead, off the event loop: parsing below then takes each loaded
          // worker (or its error) at once. Loaded in parseCli itself, a policy that takes long to
          // load (a loop at its top level: up to 30 s) held every guest meanwhile.
          await preloadPolicies(argv);
          // SIGTERM while the policies loaded (up to 30 s): the drain has begun.
          if (closing) return;
          next = parseCli(argv);
          if (next.kind !== "serve") return;
          const refused = reloadRefusal(current, next.built);
          if (refused !== undefined) {
            await next.built.close();
            throw new TypeError(refused);
          }
          ({ idle: replacedIdle } = await proxy.reload(forThisProcess(next.options)).catch(async (error: unknown) => {
            if (next.kind === "serve") await next.built.close();
            throw error;
          }));
        } catch (error) {
          const text = redactFatal(failureText(error, source));
          // Out of file descriptors (EMFILE, ENFILE, in whatever read, thread or process failed):
          // nothing is wrong with the files, and nothing would read them again (--watch only at
          // the next change), so the proxy served the replaced configuration until someone
          // noticed (fd-exhaustion probe). Tried again, 5 s and then up to a minute apart,
          // until a reload applies, fails for another reason, or another is asked for.
          if (/\bE[MN]FILE\b/.test(text) && !closing) {
            const seconds = Math.min(60, 5 * 2 ** retry.attempt);
            const timer = setTimeout(() => (reloading = reloading.then(reload)), seconds * 1000).unref();
            retry = { attempt: retry.attempt + 1, timer };
            say("error", "reload failed; the old configuration keeps serving", { error: text, retryInS: seconds });
            return;
          }
          retry.attempt = 0;
          say("error", "reload failed; the old configuration keeps serving", { error: text });
          return;
        } finally {
          stopReusing();
          DjsEngine.discardPreloaded();
        }
        // A close that rejects (a policy's worker that would not stop) must not be an unhandled
        // rejection, which ends the process and every guest's connections with it.
        const closeReplaced = (config: typeof built): void =>
          void config.close().catch((error: unknown) => say("warn", "closing a replaced configuration failed", { error: redactFatal((error as Error)?.message ?? String(error)) }));
        retry.attempt = 0;
        const old = current;
        current = next.built;
        retired.add(old);
        // Requests in flight may still call the old policies: they close once the last request
        // that began under them has left its pipeline (or with the proxy, whichever comes first).
        // At a fixed 60 s, a layer still sleeping (up to requestMs, 300 s) or an onResponse after
        // a slow upstream failed 502 "closed policy".
        void replacedIdle.then(() => {
          if (!retired.delete(old)) return;
          closeReplaced(old);
          say("info", "a replaced configuration closed: no request begun under it is left");
        });
        // Each set of policies holds its workers (about 24 MiB): without a bound, frequent reloads
        // (a --watch on a file rewritten often, a supervisor's SIGHUPs) held one per reload until
        // its requests ended, 1 GiB after 40 in 16 s. Past the bound the oldest closes now; a request still
        // calling its policies or deciders then fails (502), or, past a failOpen decider, goes on
        // as that decider's failure allows.
        for (const oldest of retired) {
          if (retired.size <= maxRetiredConfigurations) break;
          retired.delete(oldest);
          closeReplaced(oldest);
          say("info", "a replaced configuration closed early: more were loaded than are kept", { kept: maxRetiredConfigurations });
        }
        // The values this reload rotated out, for the other workers and the next replacement.
        if (worker && !closing) reportRetired(retiredSecrets, current);
      };
      process.on("SIGHUP", () => {
        if (closing) return;
        reloading = reloading.then(reload);
      });
      process.off("SIGHUP", onEarlyHup);
      if (earlyHup()) {
        say("info", "a SIGHUP came while the proxy started: reloading now");
        reloading = reloading.then(reload);
      }
      // --watch: the same reload when a file changes. In a cluster the primary watches, not the workers.
      if (command.config.watch === true && !worker) {
        watching = watchConfiguration(command.config, process.env, () => (closing ? Promise.resolve() : (reloading = reloading.then(reload))), say);
      }
      if (worker) reportListening(proxy.url, close, retiredSecrets, current, say);
      else process.stdout.write(`egressgate listening on ${proxy.url}\n`);
    });
  } catch (error) {
    // The policies' worker threads would otherwise keep a failed start alive.
    await built.close();
    throw error;
  }
  return 0;
}

/**
 * A cluster worker's options: its guests as the file gives them now, the proxy-wide options as
 * the cluster started with them (a reload keeps those until a restart, and a worker started
 * later must too), and `differs`, the options the file changes since. What a reload refuses
 * (one guest without credentials, or not; the placeholders' derivation) stops this worker's start.
 */
function asClusterStarted(command: Extract<CliCommand, { kind: "serve" }>, start: ClusterStart): { options: ProxyOptions; differs: string[] } {
  const refused = reloadRefusal(start, command.built);
  if (refused !== undefined) throw new TypeError(`a worker started after the config file changed: ${refused.replace(/^reload: /, "")}`);
  // `resolve` and `auth` reload with the guests, in one process as in a cluster: the file's own.
  const { resolve: _resolve, auth: _auth, ...fileWide } = command.config.proxy as Record<string, unknown>;
  const options: Record<string, unknown> = { ...command.options };
  for (const key of Object.keys(fileWide)) delete options[key];
  Object.assign(options, start.proxy);
  if ((options["guests"] === undefined && options["auth"] !== true) !== start.open) {
    throw new TypeError(
      "a worker started after the config file changed: the cluster serves one guest without credentials, or with them, until a restart (as a reload leaves it); restart the proxy to change it",
    );
  }
  // Compared as the primary passed them: as JSON.
  const asData = (value: unknown): unknown => (value === undefined ? undefined : JSON.parse(JSON.stringify(value)));
  const differs = [...new Set([...Object.keys(fileWide), ...Object.keys(start.proxy)])].filter((key) => !isDeepStrictEqual(asData(fileWide[key]), start.proxy[key])).sort();
  return { options: options as ProxyOptions, differs };
}

/**
 * Loads, off the event loop, every policy that parsing `argv` would load (see
 * DjsEngine.preload). A configuration that does not parse is left for parseCli to report.
 */
async function preloadPolicies(argv: readonly string[]): Promise<void> {
  const policies = DjsEngine.collectLoads(() => {
    try {
      const dry = parseCli(argv);
      // Nothing in a dry build holds a worker or a file: it is only dropped.
      if (dry.kind === "serve") void dry.built.close().catch(() => undefined);
    } catch {
      // Reported by the real parse.
    }
  });
  // Settled, every one: the reload discards what is left once it is done, and a preload still
  // under way then would leave its worker behind.
  const settled = await Promise.allSettled(policies.map(({ policy, limits }) => DjsEngine.preload(policy, limits)));
  for (const outcome of settled) if (outcome.status === "rejected") throw outcome.reason;
}

/**
 * The listener's own failure, which Node words without the flag or the key: `getaddrinfo
 * ENOTFOUND HOST` for a host that does not resolve said nothing of --listen. Worded as the
 * metrics listener's is (`--listen: cannot listen on HOST:PORT (ENOTFOUND: ...)`, or the file and
 * its key), its code kept: the exit status (1) and a worker's port-taken exit read it.
 */
function listenFailure(error: unknown, given: ProxyOptions["listen"]): unknown {
  const failure = error as NodeJS.ErrnoException | undefined;
  if (isOptionError(error) || typeof failure?.code !== "string" || !["listen", "bind", "getaddrinfo"].includes(failure.syscall ?? "")) return error;
  const host = given?.host ?? defaults.listen.host;
  const port = given?.port ?? defaults.listen.port;
  const why = failure.syscall === "getaddrinfo" ? `${failure.code}: the host name does not resolve` : failure.code;
  const text = failureText(new OptionError(makeIssue(["listen"], `cannot listen on ${hostPort(host, port)} (${why})`)), source);
  return Object.assign(new Error(text, { cause: error }), { code: failure.code });
}

/** What SIGUSR1 (logrotate's postrotate) is logged as without --audit-log: sigusr1.ts took it from Node. */
const noAuditLog = "SIGUSR1: no audit log to reopen";

/** `HOST:PORT`, an IPv6 host in brackets. */
function hostPort(host: string, port: number): string {
  return isIP(host) === 6 ? `[${host}]:${port}` : `${host}:${port}`;
}

/**
 * For a command whose output is what it is run for (`egressgate env > guest.env`,
 * `egressgate ca > ca.pem`): stdout that cannot be written (a full disk, a closed pipe) fails it,
 * exit 1. The `error` listener main() puts on stdout kept the serving proxy alive, and made these
 * exit 0 with nothing or part of it written, which a script took as done.
 */
async function printed(run: () => Promise<number>): Promise<number> {
  let failure: NodeJS.ErrnoException | undefined;
  const failed = (error: NodeJS.ErrnoException): void => void (failure ??= error);
  process.stdout.on("error", failed);
  try {
    const code = await run();
    // Its callback runs once everything written before it has been taken, or has failed.
    await new Promise<void>((resolve) => process.stdout.write("", () => resolve()));
    if (failure === undefined) return code;
    // A reader that went away (`| head`) is no surprise to report: the exit status says it.
    if (failure.code !== "EPIPE") process.stderr.write(`egressgate: cannot write the output to stdout (${failure.code ?? failure.message})\n`);
    return code === 0 ? 1 : code;
  } finally {
    process.stdout.off("error", failed);
  }
}

/** Replaced configurations kept loaded, for requests still under way, after a reload. */
const maxRetiredConfigurations = 3;

/**
 * The last line of defence: an error nothing caught means the process's state is unknown, and
 * every guest depends on it. One JSON line with the stack (what a log pipeline can parse), then
 * a non-zero exit, so a supervisor (systemd's Restart=on-failure, or the --workers primary)
 * starts a clean one instead of leaving a half-broken proxy serving.
 */
let redactFatal: (text: string) => string = (text) => text;

function dieLoudly(kind: string, error: unknown): void {
  const err = error instanceof Error ? error : new Error(String(error));
  // The message and stack can quote a request (a URL, a header): redacted like every log line.
  const line = { time: new Date().toISOString(), level: "fatal", msg: kind, pid: process.pid, error: redactFatal(err.message), stack: redactFatal(err.stack ?? "") };
  try {
    process.stderr.write(`${JSON.stringify(line)}\n`);
  } finally {
    process.exit(70); // EX_SOFTWARE
  }
}
process.on("uncaughtException", (error) => dieLoudly("uncaught exception", error));
process.on("unhandledRejection", (reason) => dieLoudly("unhandled rejection", reason));

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    // Bad usage, a bad option or config file, a policy or a CA that does not load: the input's fault, exit 2.
    const code = (error as { code?: unknown })?.code;
    // A port someone else holds is the machine's state, not the input's: exit 1 for the metrics
    // listener as for the listener (an option error names it, and it said exit 2).
    const portTaken = (error as { cause?: { code?: unknown } })?.cause?.code === "EADDRINUSE";
    const input = !portTaken && (error instanceof UsageError || error instanceof TypeError || error instanceof RangeError || code === "EG_POLICY_LOAD" || code === "EG_CA");
    // A worker's port its primary picked, taken since: the primary picks another.
    process.exitCode = code === "EADDRINUSE" && isClusterWorker() && siblingPort() !== undefined ? portTakenExit : input ? 2 : 1;
    const text = failureText(error, source);
    // With --log-format json every line on stderr is one JSON object, this last one too (a
    // --workers replacement's, or an audit log that cannot be opened, came out as plain text).
    if (explicitJson(process.argv.slice(2))) {
      const line = { ...(isClusterWorker() ? { worker: process.pid } : {}), time: new Date().toISOString(), level: "error", msg: "egressgate could not start", error: text, exit: process.exitCode };
      process.stderr.write(`${JSON.stringify(line)}\n`);
      return;
    }
    // The hint is for a command line that was wrong, not for a file or a policy that was.
    process.stderr.write(`egressgate: ${text}\n${error instanceof UsageError ? 'Run "egressgate --help" for usage.\n' : ""}`);
  },
).finally(() => {
  // A cluster worker that failed to start would stay alive on its IPC channel: the primary is
  // waiting for it to listen or to exit.
  if (isClusterWorker() && process.exitCode !== 0 && process.exitCode !== undefined) process.exit(process.exitCode);
});

/** Whether the command line asks for `--log-format json` (read from argv: the parse may be what failed). */
function explicitJson(argv: readonly string[]): boolean {
  const at = argv.lastIndexOf("--log-format");
  const inline = argv.filter((arg) => arg.startsWith("--log-format=")).at(-1);
  return inline !== undefined ? inline === "--log-format=json" : at >= 0 && argv[at + 1] === "json";
}

/**
 * Throws when the config file in use holds nothing but blank lines and comments; flags, or a
 * file that cannot be read (the parse reports that), pass.
 */
function refuseBlankConfig(file: string | undefined): void {
  if (file === undefined || file === "flags") return;
  let text: string;
  try {
    // Not a plain read: a FIFO put in the file's place would hold the reload, and every guest, until written to.
    text = readConfigText(file);
  } catch {
    return;
  }
  if (text.split("\n").every((line) => /^\s*(#.*)?$/.test(line))) throw new Error(`${file} is empty (or comments only); write {} for the default configuration`);
}
