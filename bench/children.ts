/**
 * The bench's child processes: every one is tracked, and every way out of the bench (a normal
 * exit, an error, SIGINT or SIGTERM) ends them. Children also end on their own when the bench
 * dies without cleaning up (SIGKILL): forked ones when their IPC channel closes, the others when
 * their stdin pipe reaches end-of-file (a preload for node, an addon thread for mitmdump, a shell
 * wrapper for openssl).
 *
 * Also here: transpiling a bench script for plain node, and /proc readings (CPU time, RSS).
 */
import { execFileSync, fork, spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

export const root = fileURLToPath(new URL("..", import.meta.url));

const children = new Map<ChildProcess, string>();
let workDir: string | undefined;
let stopping = false;

export function isStopping(): boolean {
  return stopping;
}

/** The temp dir removed at cleanup. */
export function setWorkDir(dir: string): void {
  workDir = dir;
}

export function track(child: ChildProcess, name: string): ChildProcess {
  children.set(child, name);
  child.once("exit", () => children.delete(child));
  child.on("error", (error) => process.stderr.write(`bench: ${name}: ${error.message}\n`));
  return child;
}

export function hasExited(child: ChildProcess): boolean {
  return child.exitCode !== null || child.signalCode !== null;
}

export function waitExit(child: ChildProcess, ms: number): Promise<boolean> {
  if (hasExited(child)) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

/** SIGTERM, then SIGKILL if it has not gone within `ms`. */
export async function stopChild(child: ChildProcess, ms = 5_000): Promise<boolean> {
  if (hasExited(child)) return true;
  child.kill("SIGTERM");
  if (await waitExit(child, ms)) return true;
  child.kill("SIGKILL");
  return waitExit(child, 2_000);
}

/** Stops everything still running (SIGTERM, SIGKILL after 5 s), then removes the temp dir. */
export async function cleanup(): Promise<void> {
  stopping = true;
  await Promise.all([...children.keys()].map((child) => stopChild(child)));
  if (workDir !== undefined) rmSync(workDir, { recursive: true, force: true });
  workDir = undefined;
}

/** Installs the exit and signal handlers; call once, before starting any child. */
export function installCleanup(): void {
  process.on("exit", () => {
    for (const child of children.keys()) child.kill("SIGKILL");
    if (workDir !== undefined) rmSync(workDir, { recursive: true, force: true });
  });
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
    process.on(signal, () => {
      if (stopping) return;
      process.stderr.write(`\nbench: ${signal}, stopping children\n`);
      void cleanup().finally(() => process.exit(130));
    });
  }
}

/** Sends `message` (if any) and waits for the child's next message of `kind`. */
export function ask<T extends { kind: string }>(child: ChildProcess, kind: T["kind"], message: object | undefined, ms: number): Promise<T> {
  const name = children.get(child) ?? "child";
  return new Promise((resolve, reject) => {
    const done = (): void => {
      clearTimeout(timer);
      child.off("message", onMessage);
      child.off("exit", onExit);
    };
    const timer = setTimeout(() => {
      done();
      reject(new Error(`${name}: no "${kind}" reply within ${ms} ms`));
    }, ms);
    const onMessage = (reply: { kind?: string }): void => {
      if (reply.kind !== kind) return;
      done();
      resolve(reply as T);
    };
    const onExit = (code: number | null, signal: string | null): void => {
      done();
      reject(new Error(`${name} exited (${code ?? signal}) while the bench waited for "${kind}"`));
    };
    child.on("message", onMessage);
    child.on("exit", onExit);
    if (message !== undefined) child.send(message);
  });
}

/** A bench/*.ts helper under tsx, with an IPC channel (upstream, relay, load generator). */
export function forkTs(file: string, name: string): ChildProcess {
  return track(
    fork(fileURLToPath(new URL(file, import.meta.url)), [], {
      execArgv: ["--import", "tsx"],
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    }),
    name,
  );
}

// A child without an IPC channel outlives a SIGKILLed parent. This preload turns the end of its
// stdin pipe (the parent's death) into SIGTERM. The unref must follow resume()'s own ref, hence
// setImmediate; and the code is URI-encoded because a bare `?` would start the URL's query.
export const exitWithParent = `data:text/javascript,${encodeURIComponent(
  'process.stdin.on("end",()=>process.kill(process.pid,"SIGTERM"));process.stdin.on("error",()=>{});process.stdin.resume();setImmediate(()=>process.stdin.unref?.());',
)}`;

const stderrLines = new Map<ChildProcess, string[]>();

/**
 * Why `child` crashed, from its stderr: the first line that names an error, with the lines after
 * it up to its first stack frame (an assertion's expression sits in between), if any.
 */
export function stderrError(child: ChildProcess): string | undefined {
  const lines = stderrLines.get(child) ?? [];
  const at = lines.findIndex((line) => /\b\w*Error\b/.test(line));
  if (at < 0) return undefined;
  const parts: string[] = [];
  for (const line of lines.slice(at, at + 8).map((l) => l.trim())) {
    if (line === "") continue;
    parts.push(line);
    if (line.startsWith("at ")) break;
  }
  return parts.join(" ").replace(new RegExp(`file://${root}|${root}`, "g"), "");
}

/** Passes a child's stderr through, prefixed, up to `limit` lines; then says how much it dropped. */
function forwardStderr(child: ChildProcess, name: string, limit = 20): void {
  let lines = 0;
  let partial = "";
  const kept: string[] = [];
  stderrLines.set(child, kept);
  child.stderr?.on("data", (chunk: Buffer) => {
    const text = partial + chunk.toString();
    const parts = text.split("\n");
    partial = parts.pop() ?? "";
    for (const line of parts) {
      // Shutdown messages ("SIGTERM, closing") after the tables say nothing about the run.
      if (stopping) return;
      lines += 1;
      if (kept.length < 200) kept.push(line);
      if (lines <= limit) process.stderr.write(`  [${name}] ${line}\n`);
      else if (lines === limit + 1) process.stderr.write(`  [${name}] (further stderr not shown)\n`);
    }
  });
}

/**
 * Spawns a proxy or server child with stdin, stdout and stderr piped, and waits for `pattern` on
 * its stdout (or stderr); its first capture group is the answer (a URL or a port). stdout keeps
 * being drained afterwards, so a chatty child never blocks on a full pipe.
 */
export async function spawnListening(
  name: string,
  command: string,
  args: readonly string[],
  pattern: RegExp,
  options: { readonly cwd?: string; readonly timeoutMs?: number } = {},
): Promise<{ child: ChildProcess; match: string }> {
  const child = track(spawn(command, args, { stdio: ["pipe", "pipe", "pipe"], cwd: options.cwd ?? root }), name);
  const timeoutMs = options.timeoutMs ?? 30_000;
  const match = await new Promise<string>((resolve, reject) => {
    let seen = "";
    let found = false;
    const timer = setTimeout(() => reject(new Error(`${name} did not report its address within ${timeoutMs / 1000} s; output: ${seen.slice(-500)}`)), timeoutMs);
    const onData = (chunk: Buffer): void => {
      if (found) return;
      seen += chunk.toString();
      const m = pattern.exec(seen);
      if (m?.[1] !== undefined) {
        found = true;
        clearTimeout(timer);
        seen = "";
        resolve(m[1]);
      }
    };
    child.stdout?.on("data", onData);
    child.stderr?.on("data", onData);
    child.once("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code ?? signal}) before listening; output: ${seen.slice(-500)}`));
    });
  });
  forwardStderr(child, name);
  return { child, match };
}

/**
 * A node proxy child (egressgate, a peer) run with plain node: no tsx, whose loader would add
 * about 35 MiB of RSS and turn on source maps. Waits for its `listening on http://…` line.
 */
export async function startNodeProxy(
  name: string,
  script: string,
  args: readonly string[],
  options: { readonly preload?: readonly string[]; readonly profileDir?: string | undefined } = {},
): Promise<{ child: ChildProcess; url: string }> {
  const nodeArgs = [
    ...(options.profileDir !== undefined ? ["--cpu-prof", "--cpu-prof-dir", options.profileDir] : []),
    "--import",
    exitWithParent,
    ...(options.preload ?? []).flatMap((file) => ["--import", pathToFileURL(file).href]),
    script,
    ...args,
  ];
  const { child, match } = await spawnListening(name, process.execPath, nodeArgs, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
  return { child, url: match };
}

/**
 * A bench TypeScript file as plain JavaScript in `dir`, for `node` without tsx. The packages it
 * imports resolve through `dir/node_modules` symlinks: `egressgate` to this package (so through
 * package.json to dist/), anything else to this package's node_modules. (rmSync removes the
 * symlinks, never what they point to.)
 */
export async function transpile(dir: string, file: string, packages: readonly string[] = []): Promise<string> {
  const ts = (await import("typescript")).default;
  const output = ts.transpileModule(readFileSync(file, "utf8"), {
    fileName: file,
    reportDiagnostics: true,
    compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2023, sourceMap: false },
  });
  if ((output.diagnostics ?? []).length > 0) {
    throw new Error(`${file}: ${ts.flattenDiagnosticMessageText(output.diagnostics![0]!.messageText, "\n")}`);
  }
  mkdirSync(join(dir, "node_modules"), { recursive: true });
  for (const name of packages) {
    const link = join(dir, "node_modules", name);
    try {
      symlinkSync(name === "egressgate" ? root : join(root, "node_modules", name), link, "dir");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    }
  }
  const out = join(dir, basename(file).replace(/\.ts$/, ".mjs"));
  writeFileSync(out, output.outputText);
  return out;
}

// ---------------------------------------------------------------------------------------------
// /proc readings for a child: CPU ticks and peak RSS (VmHWM, resettable through clear_refs).

let clockTicks = 100;
try {
  clockTicks = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
} catch {
  // getconf is missing on some minimal images; 100 is Linux's USER_HZ nearly everywhere.
}

/**
 * A process and its descendants: a proxy may serve from child processes (egressgate
 * `--workers N` forks cluster workers), and what it costs is the sum over all of them.
 */
function processTree(pid: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(entry)]);
    } catch {
      // The process ended between the listing and the read.
    }
  }
  const out: number[] = [];
  const stack = [pid];
  while (stack.length > 0) {
    const next = stack.pop()!;
    out.push(next);
    stack.push(...(children.get(next) ?? []));
  }
  return out;
}

/**
 * The whole machine's busy CPU time in seconds, every core summed, from /proc/stat's `cpu` line:
 * user, nice, system, irq, softirq and steal (idle and iowait left out). Around a window it tells
 * whether the machine was saturated, which the processes' own times do not (the kernel's network
 * work runs partly in softirq, charged to no process of the bench).
 */
export function machineBusySeconds(): number | undefined {
  try {
    const line = readFileSync("/proc/stat", "utf8").split("\n", 1)[0] ?? "";
    const fields = line.trim().split(/\s+/).slice(1).map(Number);
    if (fields.length < 8 || fields.some((n) => !Number.isFinite(n))) return undefined;
    const [user, nice, system, , , irq, softirq, steal] = fields as [number, number, number, number, number, number, number, number];
    return (user + nice + system + irq + softirq + steal) / clockTicks;
  } catch {
    return undefined;
  }
}

/**
 * CPU time of a process and its descendants, all their threads, in seconds: utime + stime, plus
 * cutime + cstime, where a descendant that exited and was reaped leaves its time with its parent
 * (a cluster worker that died in a window still counts).
 */
export function cpuSeconds(pid: number | undefined): number | undefined {
  if (pid === undefined) return undefined;
  let total: number | undefined;
  for (const member of processTree(pid)) {
    try {
      const stat = readFileSync(`/proc/${member}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      const ticks = Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14]);
      total = (total ?? 0) + ticks / clockTicks;
    } catch {
      // Gone meanwhile: a descendant that exited no longer counts, the process itself is undefined.
    }
  }
  return total;
}

/**
 * utime + stime of a process's main thread alone, in seconds: a Node proxy's event loop, without
 * its worker threads (tier-2 sandboxes) or V8's and libuv's helper threads. Undefined for a
 * process with children (egressgate `--workers N`): its main thread serves no traffic.
 */
export function mainThreadCpuSeconds(pid: number | undefined): number | undefined {
  if (pid === undefined || processTree(pid).length > 1) return undefined;
  try {
    const stat = readFileSync(`/proc/${pid}/task/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(fields[11]) + Number(fields[12])) / clockTicks;
  } catch {
    return undefined;
  }
}

/**
 * A `kB` line of /proc/PID/status, summed over the process and its descendants: VmHWM is the
 * peak RSS, VmRSS the current one. (For a process tree the summed peaks may not coincide.)
 */
export function statusKb(pid: number | undefined, field: "VmHWM" | "VmRSS"): number | undefined {
  if (pid === undefined) return undefined;
  let total: number | undefined;
  for (const member of processTree(pid)) {
    try {
      const match = new RegExp(`${field}:\\s+(\\d+) kB`).exec(readFileSync(`/proc/${member}/status`, "utf8"));
      if (match?.[1] !== undefined) total = (total ?? 0) + Number(match[1]);
    } catch {
      // Gone meanwhile.
    }
  }
  return total;
}

/** Resets VmHWM to the current RSS (Linux ≥ 4.0), so each window gets its own peak. */
export function resetPeak(pid: number | undefined): boolean {
  if (pid === undefined) return true;
  let reset = true;
  for (const member of processTree(pid)) {
    try {
      writeFileSync(`/proc/${member}/clear_refs`, "5");
    } catch {
      // A member that exited meanwhile has no peak to reset; only the root failing counts.
      if (member === pid) reset = false;
    }
  }
  return reset;
}
