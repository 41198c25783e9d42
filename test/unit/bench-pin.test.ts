import { spawn, type ChildProcess } from "node:child_process";
import { readdirSync } from "node:fs";
import { afterEach, describe, expect, it } from "vitest";
import { allowedCpus, parseCpuList, pinPlan, pinTree, pinUnavailable, processTree } from "../../bench/pin.js";

const usable = pinUnavailable() === undefined;

/** Every thread's allowed CPUs, for each process of `pids`. */
function threadCpus(pids: readonly number[]): string[] {
  return pids.flatMap((pid) => readdirSync(`/proc/${pid}/task`).map((tid) => allowedCpus(Number(tid)) ?? `thread ${tid} gone`));
}

describe("bench --pin", () => {
  let group: ChildProcess | undefined;
  afterEach(() => {
    // The node process and its child share a process group of their own: end both.
    if (group?.pid !== undefined && group.exitCode === null) process.kill(-group.pid, "SIGKILL");
    group = undefined;
  });

  it("gives the proxies the last CPU this process may use and everything else the ones before it", () => {
    expect(parseCpuList("0-3,8,10-11")).toEqual([0, 1, 2, 3, 8, 10, 11]);
    expect(parseCpuList("5")).toEqual([5]);
    expect(pinPlan([0, 1])).toEqual({ proxyCpus: "1", loadCpus: "0" });
    // A cpuset of 2-3 (a container, or an outer taskset): the ids are those, not 0 and 1.
    expect(pinPlan([2, 3])).toEqual({ proxyCpus: "3", loadCpus: "2" });
    expect(pinPlan([0, 1, 2, 3])).toEqual({ proxyCpus: "3", loadCpus: "0,1,2" });
  });

  it.skipIf(process.platform !== "linux")("refuses one CPU", () => {
    expect(pinUnavailable([0])).toMatch(/at least 2 CPUs/);
  });

  it.skipIf(!usable)("moves a process and its children, every thread of each, onto the CPUs named", async () => {
    // A node process with a worker thread (and V8's own threads), and a child of its own.
    const script = `const { Worker } = require("node:worker_threads"); new Worker("setInterval(() => {}, 1000)", { eval: true }).on("online", () => { require("node:child_process").spawn("sleep", ["30"], { stdio: "ignore" }); setTimeout(() => console.log("started"), 100); }); setInterval(() => {}, 1000);`;
    group = spawn(process.execPath, ["-e", script], { detached: true, stdio: ["ignore", "pipe", "ignore"] });
    await new Promise<void>((resolve) => group!.stdout!.once("data", () => resolve()));
    const pid = group.pid!;
    const tree = processTree(pid);
    expect(tree[0]).toBe(pid);
    expect(tree.length).toBe(2);
    expect(readdirSync(`/proc/${pid}/task`).length).toBeGreaterThan(2);
    const plan = pinPlan(parseCpuList(allowedCpus(process.pid)!));
    for (const cpus of [plan.loadCpus.split(",")[0]!, plan.proxyCpus]) {
      pinTree(pid, cpus);
      for (const allowed of threadCpus(tree)) expect(allowed).toBe(cpus);
    }
    // Unrelated processes are left alone.
    expect(allowedCpus(process.pid)).not.toBe(plan.proxyCpus);
  });
});
