import { spawn } from "node:child_process";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { onTestFinished } from "vitest";
import { descendantPids } from "./processes.js";
import { tempDir } from "./proxy.js";

const root = fileURLToPath(new URL("../../", import.meta.url));
const bin = join(root, "dist", "cli", "bin.js");

export interface Cli {
  readonly pid: number;
  stdout(): string;
  stderr(): string;
  /** Resolves once `check` holds for the output so far; rejects if the process ends or 60 s pass first. */
  until(what: string, check: () => boolean): Promise<void>;
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * The built CLI, with `nodeOptions` as NODE_OPTIONS (its workers inherit them) and `nodeArgs`
 * before the script (`node --inspect bin.js …`); it and every process it started are killed when
 * the test ends. `openFiles` starts it under that open-file limit, soft and hard (`prlimit`,
 * which then runs Node in its own place: `pid` is the proxy's).
 */
export function startCli(args: readonly string[], nodeOptions?: string, nodeArgs: readonly string[] = [], openFiles?: number): Cli {
  const env: NodeJS.ProcessEnv = { ...process.env, XDG_CONFIG_HOME: tempDir("egressgate-xdg-") };
  if (nodeOptions !== undefined) env["NODE_OPTIONS"] = nodeOptions;
  for (const name of ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy", "NO_PROXY", "no_proxy"]) delete env[name];
  const argv = [...nodeArgs, bin, ...args];
  const child =
    openFiles === undefined
      ? spawn(process.execPath, argv, { cwd: root, env, stdio: ["ignore", "pipe", "pipe"] })
      : spawn("prlimit", [`--nofile=${openFiles}:${openFiles}`, process.execPath, ...argv], { cwd: root, env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  let err = "";
  const waiters = new Set<() => void>();
  const wake = (): void => {
    for (const waiter of waiters) waiter();
  };
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => ((out += chunk), wake()));
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => ((err += chunk), wake()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once("close", (code, signal) => (resolve({ code, signal }), wake())));
  onTestFinished(async () => {
    for (const pid of [...descendantPids(child.pid!), child.pid!]) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // Gone already.
      }
    }
    await exited;
  });
  return {
    pid: child.pid!,
    stdout: () => out,
    stderr: () => err,
    exited,
    until: (what, check) =>
      new Promise((resolve, reject) => {
        const timer = setTimeout(() => done(new Error(`no ${what} within 60 s\nstdout: ${out}\nstderr: ${err}`)), 60_000);
        const done = (error?: Error): void => {
          clearTimeout(timer);
          waiters.delete(waiter);
          if (error === undefined) resolve();
          else reject(error);
        };
        const waiter = (): void => {
          if (check()) done();
          else if (child.exitCode !== null || child.signalCode !== null) done(new Error(`egressgate exited before ${what}\nstdout: ${out}\nstderr: ${err}`));
        };
        waiters.add(waiter);
        waiter();
      }),
  };
}

/** The JSON lines of `text` whose msg is `msg`. */
export function linesOf(text: string, msg: string): Record<string, unknown>[] {
  return text
    .split("\n")
    .filter((line) => line.startsWith("{"))
    .map((line) => JSON.parse(line) as Record<string, unknown>)
    .filter((line) => line["msg"] === msg);
}

