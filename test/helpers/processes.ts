import { readdirSync, readFileSync } from "node:fs";

/** The live child processes of `pid` (zombies excluded), from /proc. */
export function childPids(pid: number): number[] {
  const out: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      const [state, ppid] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(ppid) === pid && state !== "Z") out.push(Number(entry));
    } catch {
      // Gone between the listing and the read.
    }
  }
  return out;
}

/** Every live descendant of `pid`, children before their own children. */
export function descendantPids(pid: number): number[] {
  const out: number[] = [];
  for (let queue = childPids(pid); queue.length > 0; ) {
    const next = queue.shift()!;
    out.push(next);
    queue.push(...childPids(next));
  }
  return out;
}
