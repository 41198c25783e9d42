import { spawn, type ChildProcess } from "node:child_process";
import { availableParallelism } from "node:os";
import { afterEach, describe, expect, it } from "vitest";
import { allowedCpus, pinPlan, pinTree, pinUnavailable, processTree } from "../../bench/pin.js";

const usable = pinUnavailable() === undefined;

describe("bench --pin", () => {
  let group: ChildProcess | undefined;
  afterEach(() => {
    // The shell and its sleep share a process group of their own: end both.
    if (group?.pid !== undefined && group.exitCode === null) process.kill(-group.pid, "SIGKILL");
    group = undefined;
  });

  it("gives the proxies the last core and everything else the ones before it", () => {
    expect(pinPlan(2)).toEqual({ proxyCpus: "1", loadCpus: "0" });
    expect(pinPlan(4)).toEqual({ proxyCpus: "3", loadCpus: "0-2" });
    expect(pinUnavailable(1)).toMatch(/at least 2 cores/);
  });

  it.skipIf(!usable)("moves a process and its children, every thread, onto the cores named", async () => {
    group = spawn("sh", ["-c", "sleep 30 & echo started; wait"], { detached: true, stdio: ["ignore", "pipe", "ignore"] });
    await new Promise<void>((resolve) => group!.stdout!.once("data", () => resolve()));
    const pid = group.pid!;
    const tree = processTree(pid);
    expect(tree[0]).toBe(pid);
    expect(tree.length).toBe(2);
    const last = String(availableParallelism() - 1);
    for (const cpus of ["0", last]) {
      pinTree(pid, cpus);
      for (const p of tree) expect(allowedCpus(p), `pid ${p}`).toBe(cpus);
    }
    // Unrelated processes are left alone.
    expect(allowedCpus(process.pid)).not.toBe(last);
  });
});
