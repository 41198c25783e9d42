import { spawn, type ChildProcess } from "node:child_process";
import { answerText, MalformedAnswer, parseAnswerText, reasonText, maxReasonBytes, type Verdict } from "./answer.js";
import type { DeciderPhase, ResolvedCommandDecider } from "./options.js";
import { DeciderBusy, DeciderFailure, DeciderCancelled, type CallSignal } from "./failure.js";

/** The most of a command's stdout that is read as its answer; more is a failure. */
const maxAnswerBytes = 1024 * 1024;
/** Exit status 2 blocks, as in the agent frameworks' command hooks. */
const blockExitCode = 2;

const ignore = (): void => undefined;

/** Why a call fails when its decider is closed while it runs or waits. */
const closedReason = "was cut: the decider was closed (the proxy closing, or a reload retiring it)";

/**
 * Runs a command per decision: the document on stdin, the exit code and stdout as the answer.
 * At most `concurrency` processes run at once, `queue` calls wait in order, and beyond that a
 * call is refused at once (DeciderBusy, 503). The process gets PATH and the listed variables only
 * (never the proxy's whole environment, which holds secret values), no shell unless configured,
 * and an argv fixed by the configuration: nothing from the request reaches it but stdin.
 */
export class CommandRunner {
  private running = 0;
  /** Calls waiting for a slot: `true` hands one over, `false` (close()) does not. */
  private readonly waiting: ((slot: boolean) => void)[] = [];
  /** The processes running now, each with what ends it: close() ends them all. */
  private readonly live = new Set<() => void>();

  constructor(private readonly options: ResolvedCommandDecider) {}

  /** Processes running now, and calls waiting for one (for tests and diagnostics). */
  get load(): { readonly running: number; readonly queued: number } {
    return { running: this.running, queued: this.waiting.length };
  }

  async ask(input: string, phase: DeciderPhase, signal?: CallSignal): Promise<Verdict> {
    if (signal?.aborted === true) throw new DeciderCancelled();
    if (this.running >= this.options.concurrency) {
      if (this.waiting.length >= this.options.queue) {
        throw new DeciderBusy(`${this.options.concurrency} processes are running and ${this.waiting.length} calls are queued (concurrency, queue)`);
      }
      // A call whose guest leaves while it waits gives up its place: guests that hung up held the
      // queue, each later ran a process to its timeout, and live requests got 503 meanwhile.
      let leave: (() => void) | undefined;
      const slot = await new Promise<boolean>((resolve) => {
        this.waiting.push(resolve);
        leave = (): void => {
          const at = this.waiting.indexOf(resolve);
          if (at >= 0) this.waiting.splice(at, 1);
          resolve(false);
        };
        signal?.once("abort", leave);
      });
      if (leave !== undefined) signal?.off("abort", leave);
      if (!slot) throw hasLeft(signal) ? new DeciderCancelled() : new DeciderFailure(closedReason);
    } else this.running++;
    // A slot is ours now (handed over by release(), or taken above). It is given back once the
    // process has exited, not when its answer is in: a killed process still counts until it is gone.
    const { verdict, gone } = this.run(input, phase, signal);
    void gone.then(() => this.release());
    return verdict;
  }

  /**
   * Ends what is under way: every process still running is killed (its call fails), and calls
   * waiting for a slot fail. The proxy closing, or a reload retiring this decider, calls it: a
   * decider's timeoutMs (up to 10 minutes) otherwise held the process open long after the drain
   * had cut its requests. Later calls run as before.
   */
  close(): void {
    for (const end of [...this.live]) end();
    for (const next of this.waiting.splice(0)) next(false);
  }

  private release(): void {
    const next = this.waiting.shift();
    if (next !== undefined) next(true);
    else this.running--;
  }

  private run(input: string, phase: DeciderPhase, signal: CallSignal | undefined): { verdict: Promise<Verdict>; gone: Promise<void> } {
    let markGone!: () => void;
    const gone = new Promise<void>((resolve) => (markGone = resolve));
    const verdict = new Promise<Verdict>((resolve, reject) => this.spawnOne(input, phase, resolve, reject, markGone, signal));
    return { verdict, gone };
  }

  private spawnOne(input: string, phase: DeciderPhase, resolve: (verdict: Verdict) => void, reject: (error: unknown) => void, markGone: () => void, signal: CallSignal | undefined): void {
    const { argv, shell, env, timeoutMs } = this.options;
    // The guest left as its slot was handed over: no process for it.
    if (hasLeft(signal)) {
      markGone();
      reject(new DeciderCancelled());
      return;
    }
    let child: ChildProcess;
    try {
      // detached: the process leads a group of its own, so a timeout can kill what it started too.
      child = shell
        ? spawn("/bin/sh", ["-c", argv[0]!], { env, stdio: ["pipe", "pipe", "pipe"], detached: true })
        : spawn(argv[0]!, argv.slice(1), { env, stdio: ["pipe", "pipe", "pipe"], detached: true });
    } catch (error) {
      markGone();
      reject(new DeciderFailure(`could not start: ${(error as Error).message}`));
      return;
    }
    let settled = false;
    let exited = false;
    /** Ends the call when the guest leaves (set below, once there is a process to kill). */
    let left: () => void = () => undefined;
    const stdout: Buffer[] = [];
    let stdoutBytes = 0;
    const stderr: Buffer[] = [];
    let stderrBytes = 0;
    const finish = (outcome: () => Verdict): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.off("abort", left);
      try {
        resolve(outcome());
      } catch (error) {
        reject(error);
      }
    };
    const fail = (reason: string, kind: "time" | "invalid" | "throw" = "throw"): void => {
      finish(() => {
        throw new DeciderFailure(reason, kind);
      });
    };
    // The whole process group: a shell's children would otherwise keep the pipes open. Once the
    // command has exited its group's id may be free for reuse: only the exit itself kills then.
    const kill = (): void => {
      if (exited || child.pid === undefined) return;
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {
        try {
          child.kill("SIGKILL");
        } catch {
          // Already gone.
        }
      }
    };
    const timer = setTimeout(() => {
      kill();
      fail(`did not answer within ${timeoutMs} ms (timeoutMs); the process was killed`, "time");
    }, timeoutMs);
    const end = (): void => {
      kill();
      fail(closedReason);
    };
    this.live.add(end);
    // The guest left: its process is killed (its slot comes back at its exit), as at a timeout.
    left = (): void => {
      kill();
      finish(() => {
        throw new DeciderCancelled();
      });
    };
    signal?.once("abort", left);
    // Every stream gets an error listener: a command that exits without reading its stdin
    // makes the write fail with EPIPE, and an unlistened error would end the proxy.
    child.stdin?.on("error", ignore);
    child.stdout?.on("error", ignore);
    child.stderr?.on("error", ignore);
    child.on("error", (error: NodeJS.ErrnoException) => {
      // spawn failures (ENOENT, EACCES) come here, with no exit to wait for.
      this.live.delete(end);
      exited = true;
      markGone();
      fail(`could not start: ${error.code ?? error.message}`);
    });
    child.stdout?.on("data", (chunk: Buffer) => {
      stdoutBytes += chunk.length;
      if (stdoutBytes > maxAnswerBytes) {
        kill();
        fail(`wrote more than ${maxAnswerBytes} bytes to stdout`, "invalid");
        return;
      }
      stdout.push(chunk);
    });
    child.stderr?.on("data", (chunk: Buffer) => {
      if (stderrBytes >= maxReasonBytes) return;
      stderr.push(chunk);
      stderrBytes += chunk.length;
    });
    child.on("exit", () => {
      // A decider runs once per request: anything it leaves behind would pile up, one per
      // request, and one holding stdout open would hold the answer until the timeout. Killed
      // here, as the exit is reported, while the group's id cannot yet belong to anyone else
      // (a leftover still holds it, or nothing does and the kill finds no one).
      kill();
      exited = true;
      markGone();
    });
    child.on("close", (code, signal) => {
      exited = true;
      this.live.delete(end);
      markGone();
      if (signal !== null) return fail(`was killed by ${signal}`);
      const errText = (): string => reasonText(Buffer.concat(stderr).toString("utf8"));
      if (code === 0) {
        finish(() => {
          try {
            return parseAnswerText(answerText(Buffer.concat(stdout)), phase);
          } catch (error) {
            if (error instanceof MalformedAnswer) throw new DeciderFailure(`exit 0 with a malformed answer on stdout: ${error.message}`, "invalid");
            throw error;
          }
        });
        return;
      }
      if (code === blockExitCode) return finish(() => ({ decision: "block", status: 403, reason: errText() }));
      const detail = errText();
      fail(`exited with status ${code}${detail === "" ? "" : `: ${detail}`}`);
    });
    child.stdin?.end(input);
  }
}

/** Whether the call's guest has left (read afresh: a wait may have passed since the last look). */
function hasLeft(signal: CallSignal | undefined): boolean {
  return signal?.aborted === true;
}
