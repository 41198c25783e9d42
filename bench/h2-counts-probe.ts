/**
 * Preloaded into the proxy child by bench/h2-counts.ts: on SIGUSR2 it reads a command from the
 * JSON file named by H2COUNTS_CTL and answers into the file the command names. Commands start or
 * stop V8's sampling heap profiler (objects collected since counted too, so its total is what was
 * allocated, not what survived) and V8's CPU profiler, over exactly the measured window.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { Session } from "node:inspector/promises";

interface Command {
  readonly out: string;
  readonly heap?: "start" | "stop";
  readonly cpu?: "start" | "stop";
  readonly cpuOut?: string;
}

interface HeapNode {
  readonly callFrame: { readonly functionName: string; readonly url: string; readonly lineNumber: number };
  readonly selfSize: number;
  readonly children: readonly HeapNode[];
}

const ctl = process.env["H2COUNTS_CTL"];
if (ctl !== undefined) {
  const session = new Session();
  session.connect();
  const run = async (): Promise<void> => {
    const command = JSON.parse(readFileSync(ctl, "utf8")) as Command;
    const answer: Record<string, unknown> = {};
    if (command.heap === "start") {
      // H2COUNTS_HEAP_SURVIVORS=1: only what outlived the young generation (what scavenges copy
      // and promote, and mark-compacts then collect), objects a scavenge freed left out.
      const survivors = process.env["H2COUNTS_HEAP_SURVIVORS"] === "1";
      await session.post("HeapProfiler.startSampling", { samplingInterval: Number(process.env["H2COUNTS_HEAP_INTERVAL"] ?? 1024), includeObjectsCollectedByMajorGC: true, includeObjectsCollectedByMinorGC: !survivors });
    } else if (command.heap === "stop") {
      const { profile } = (await session.post("HeapProfiler.stopSampling")) as unknown as { profile: { head: HeapNode } };
      let total = 0;
      const bySite = new Map<string, number>();
      const name = (node: HeapNode): string => {
        const { functionName, url, lineNumber } = node.callFrame;
        return `${functionName || "(anonymous)"} ${url.replace(/^.*\/(dist|node_modules)\//, "$1/")}:${lineNumber + 1}`;
      };
      // Allocations in Node's helpers (nextTick, once, …) are told apart by their callers.
      const depth = Number(process.env["H2COUNTS_HEAP_CALLERS"] ?? 0);
      const walk = (node: HeapNode, callers: readonly string[]): void => {
        total += node.selfSize;
        const here = [name(node), ...callers].slice(0, depth + 1);
        if (node.selfSize > 0) {
          const key = here.join(" < ");
          bySite.set(key, (bySite.get(key) ?? 0) + node.selfSize);
        }
        for (const child of node.children) walk(child, here);
      };
      walk(profile.head, []);
      answer["heapBytes"] = total;
      answer["heapSites"] = [...bySite].sort((a, b) => b[1] - a[1]).slice(0, 60);
    }
    if (command.cpu === "start") {
      await session.post("Profiler.enable");
      await session.post("Profiler.setSamplingInterval", { interval: 100 });
      await session.post("Profiler.start");
    } else if (command.cpu === "stop") {
      const { profile } = (await session.post("Profiler.stop")) as unknown as { profile: unknown };
      if (command.cpuOut !== undefined) writeFileSync(command.cpuOut, JSON.stringify(profile));
    }
    writeFileSync(command.out, JSON.stringify(answer));
  };
  process.on("SIGUSR2", () => void run().catch((error: unknown) => process.stderr.write(`h2-counts probe: ${String(error)}\n`)));
}
