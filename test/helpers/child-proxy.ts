import { fork, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";

export interface ChildProxyOptions {
  readonly allowedHosts: string[];
  readonly policyFile?: string;
  readonly policyTimeoutMs?: number;
  readonly hooksModule?: string;
  readonly proxy: Record<string, unknown>;
}

export interface ChildProxy {
  readonly url: string;
  readonly port: number;
  readonly caCertPem: string;
  readonly pid: number;
  /** Still running: no exit, no signal. */
  alive(): boolean;
  /** What the child wrote to stderr (an uncaught error's stack, say). */
  stderr(): string;
  rss(): Promise<number>;
  /** Open file descriptors of the proxy's process. */
  fds(): Promise<number>;
  stop(): Promise<void>;
}

const entry = fileURLToPath(new URL("../fixtures/proxy-child.ts", import.meta.url));

/** Starts test/fixtures/proxy-child.ts under tsx; the caller stops it (`stop()`). */
export async function startChildProxy(options: ChildProxyOptions): Promise<ChildProxy> {
  const child: ChildProcess = fork(entry, [JSON.stringify(options)], { execArgv: ["--import", "tsx"], stdio: ["ignore", "ignore", "pipe", "ipc"] });
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const [ready] = (await Promise.race([
    once(child, "message"),
    once(child, "exit").then(([code]) => {
      throw new Error(`the proxy child exited with ${String(code)} while starting: ${stderr}`);
    }),
  ])) as [{ url: string; port: number; caCertPem: string }];
  const ask = async <T>(question: string, key: string): Promise<T> => {
    child.send(question);
    for (;;) {
      const [reply] = (await once(child, "message")) as [Record<string, T>];
      if (key in reply) return reply[key]!;
    }
  };
  return {
    ...ready,
    pid: child.pid!,
    alive: () => child.exitCode === null && child.signalCode === null,
    stderr: () => stderr,
    rss: () => ask<number>("rss", "rss"),
    fds: () => ask<number>("fds", "fds"),
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = once(child, "exit");
      child.kill("SIGKILL");
      await exited;
    },
  };
}
