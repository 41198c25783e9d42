/**
 * `--pin`: the proxies under test on a core of their own, everything else (this process, the load
 * generator, the upstreams, socat relays, openssl s_server) on the others.
 *
 * Unpinned, three busy processes share the cores and the scheduler decides who waits: a row whose
 * proxy leaves a core half idle and a row whose proxy saturates one can end with the same req/s,
 * because the load generator and the upstream took the rest. Pinned, req/s is what the proxy's
 * core can serve, as long as the other cores keep up (the JSON keeps the load generator's and
 * the upstream's CPU % of every window).
 *
 * Every proxy goes to the same core: a row that compares process counts (egressgate-w2) or loads
 * two proxies at once (the side scenario) then measures that one core, and a decider webhook,
 * a process of the bench's, stays on the load cores.
 *
 * Affinity is inherited: this process pins every one of its threads first, so each child it
 * starts afterwards is on the load cores, and then each proxy's whole process tree (cluster
 * workers included) moves to the last core. Linux only, through util-linux's `taskset`.
 */
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";

export interface PinPlan {
  /** The cores of the proxies under test (`taskset -c` syntax). */
  readonly proxyCpus: string;
  /** Everyone else's. */
  readonly loadCpus: string;
}

/** The CPU ids of a `Cpus_allowed_list` (`0-3,8,10-11`), in order. */
export function parseCpuList(list: string): number[] {
  const ids: number[] = [];
  for (const part of list.split(",")) {
    const [from, to] = part.split("-").map(Number);
    if (from === undefined || !Number.isInteger(from)) continue;
    for (let id = from; id <= (to ?? from); id++) ids.push(id);
  }
  return ids;
}

/** The CPUs this process may run on (a cpuset or an outer taskset may leave out some ids). */
function ownCpus(): number[] {
  return parseCpuList(allowedCpus(process.pid) ?? "");
}

/** Why `--pin` cannot be used here, or undefined when it can. */
export function pinUnavailable(cpus: readonly number[] = process.platform === "linux" ? ownCpus() : []): string | undefined {
  if (process.platform !== "linux") return "--pin needs Linux (taskset)";
  if (cpus.length < 2) return `--pin needs at least 2 CPUs, this process may use ${cpus.length}`;
  try {
    execFileSync("taskset", ["-p", String(process.pid)], { stdio: "ignore" });
  } catch {
    return "--pin needs taskset (util-linux)";
  }
  return undefined;
}

/** The last of the CPUs this process may use for the proxies, the others for everything else. */
export function pinPlan(cpus: readonly number[] = ownCpus()): PinPlan {
  return { proxyCpus: String(cpus[cpus.length - 1]), loadCpus: cpus.slice(0, -1).join(",") };
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

/**
 * Every thread of every process in `pid`'s tree onto `cpus`. taskset fails when a thread ends
 * while it walks them: a process still there is tried once more, one gone is skipped, and only
 * `pid` itself failing twice is an error.
 */
export function pinTree(pid: number, cpus: string): void {
  for (const p of processTree(pid)) {
    for (let attempt = 1; ; attempt++) {
      try {
        execFileSync("taskset", ["-a", "-p", "-c", cpus, String(p)], { stdio: ["ignore", "ignore", "pipe"] });
        break;
      } catch (error) {
        if (!existsSync(`/proc/${p}`)) break;
        if (attempt < 2) continue;
        if (p !== pid) break;
        const stderr = (error as { stderr?: Buffer }).stderr?.toString().trim();
        throw new Error(`taskset could not pin pid ${p} to CPU ${cpus}${stderr ? `: ${stderr}` : ""}`, { cause: error });
      }
    }
  }
}

/** The CPUs a process may run on, as the kernel reports them (`Cpus_allowed_list`). */
export function allowedCpus(pid: number): string | undefined {
  try {
    return /^Cpus_allowed_list:\s*(\S+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1];
  } catch {
    return undefined;
  }
}
