/**
 * `--pin`: the proxies under test on a core of their own, everything else (this process, the load
 * generator, the upstreams, socat relays, openssl s_server) on the others.
 *
 * Unpinned, three busy processes share the cores and the scheduler decides who waits: a row whose
 * proxy leaves a core half idle and a row whose proxy saturates one can end with the same req/s,
 * because the load generator and the upstream took the rest. Pinned, req/s is what the proxy's
 * core can serve, as long as the other cores keep up (the bench prints their CPU %).
 *
 * Affinity is inherited: this process pins every one of its threads first, so each child it
 * starts afterwards is on the load cores, and then each proxy's whole process tree (cluster
 * workers included) moves to the last core. Linux only, through util-linux's `taskset`.
 */
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { availableParallelism } from "node:os";

export interface PinPlan {
  /** The cores of the proxies under test (`taskset -c` syntax). */
  readonly proxyCpus: string;
  /** Everyone else's. */
  readonly loadCpus: string;
}

/** Why `--pin` cannot be used here, or undefined when it can. */
export function pinUnavailable(cores = availableParallelism()): string | undefined {
  if (process.platform !== "linux") return "--pin needs Linux (taskset)";
  if (cores < 2) return `--pin needs at least 2 cores, this machine has ${cores}`;
  try {
    execFileSync("taskset", ["-p", String(process.pid)], { stdio: "ignore" });
  } catch {
    return "--pin needs taskset (util-linux)";
  }
  return undefined;
}

/** The last core for the proxies, the rest for everything else. */
export function pinPlan(cores = availableParallelism()): PinPlan {
  return { proxyCpus: String(cores - 1), loadCpus: cores === 2 ? "0" : `0-${cores - 2}` };
}

/** `pid` and its descendants, from /proc (a process that has gone is skipped). */
export function processTree(pid: number): number[] {
  const parents = new Map<number, number[]>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, "utf8");
    } catch {
      continue;
    }
    // The command name (field 2) is in parentheses and may contain spaces; the ppid follows it.
    const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
    const list = parents.get(ppid) ?? [];
    list.push(Number(entry));
    parents.set(ppid, list);
  }
  const tree: number[] = [];
  const walk = (p: number): void => {
    tree.push(p);
    for (const child of parents.get(p) ?? []) walk(child);
  };
  walk(pid);
  return tree;
}

/** Every thread of every process in `pid`'s tree onto `cpus`. */
export function pinTree(pid: number, cpus: string): void {
  for (const p of processTree(pid)) execFileSync("taskset", ["-a", "-p", "-c", cpus, String(p)], { stdio: "ignore" });
}

/** The CPUs a process may run on, as the kernel reports them (`Cpus_allowed_list`). */
export function allowedCpus(pid: number): string | undefined {
  try {
    return /^Cpus_allowed_list:\s*(\S+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1];
  } catch {
    return undefined;
  }
}
