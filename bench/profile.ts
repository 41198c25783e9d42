/**
 * The CPU profile of an egressgate child run under `node --cpu-prof` (`npm run bench -- --cpu-prof`):
 * self time per function and per file, and the inclusive time of egressgate's own functions.
 */
import { readFileSync } from "node:fs";
import { table } from "./report.js";

interface ProfileNode {
  readonly id: number;
  readonly callFrame: { readonly functionName: string; readonly url: string; readonly lineNumber: number };
  readonly hitCount?: number;
  readonly children?: readonly number[];
}

interface HotSpot {
  readonly name: string;
  readonly ms: number;
  readonly percent: number;
}

export interface ProfileSummary {
  readonly busyMs: number;
  /** Self time: where the CPU was when sampled. Native bindings (writev, …) include the syscall and the TLS record. */
  readonly functions: HotSpot[];
  readonly files: HotSpot[];
  /** Inclusive time of egressgate's own functions (dist/), to see what each stage costs with all it calls. */
  readonly ownInclusive: HotSpot[];
}

export function summarizeProfile(path: string): ProfileSummary {
  const profile = JSON.parse(readFileSync(path, "utf8")) as { nodes: ProfileNode[]; samples: number[]; startTime: number; endTime: number };
  const msPerSample = (profile.endTime - profile.startTime) / 1000 / Math.max(1, profile.samples.length);
  const short = (url: string): string => url.replace(/^file:\/\/.*?\/node_modules\//, "").replace(/^file:\/\/.*?\/dist\//, "dist/");
  const keyOf = (node: ProfileNode): string => {
    const { functionName, url, lineNumber } = node.callFrame;
    return `${functionName === "" ? "(anonymous)" : functionName}${url === "" ? "" : ` ${short(url)}:${lineNumber + 1}`}`;
  };
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  const self = new Map<string, number>();
  const byFile = new Map<string, number>();
  const inclusive = new Map<string, number>();
  let busyMs = 0;
  // Depth-first from the root; a function already on the path is not counted twice (recursion).
  const walk = (node: ProfileNode, onPath: ReadonlySet<string>): number => {
    const key = keyOf(node);
    const idle = node.callFrame.functionName === "(idle)";
    let total = idle ? 0 : (node.hitCount ?? 0) * msPerSample;
    if (total > 0) {
      busyMs += total;
      self.set(key, (self.get(key) ?? 0) + total);
      const file = node.callFrame.url === "" ? node.callFrame.functionName : short(node.callFrame.url);
      byFile.set(file, (byFile.get(file) ?? 0) + total);
    }
    const path = new Set(onPath).add(key);
    for (const id of node.children ?? []) {
      const child = byId.get(id);
      if (child !== undefined) total += walk(child, path);
    }
    if (!onPath.has(key) && node.callFrame.url.includes("/dist/")) inclusive.set(key, (inclusive.get(key) ?? 0) + total);
    return total;
  };
  const rootNode = profile.nodes[0];
  if (rootNode !== undefined) walk(rootNode, new Set());
  const top = (map: Map<string, number>, n: number): HotSpot[] =>
    [...map.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, n)
      .map(([name, ms]) => ({ name, ms: Math.round(ms), percent: Math.round((ms / busyMs) * 1000) / 10 }));
  return { busyMs: Math.round(busyMs), functions: top(self, 25), files: top(byFile, 15), ownInclusive: top(inclusive, 15) };
}

export function profileTables(profile: ProfileSummary): string {
  return [
    table(["self ms", "%", "function"], ["r", "r", "l"], profile.functions.map((f) => [String(f.ms), String(f.percent), f.name])),
    table(["self ms", "%", "file"], ["r", "r", "l"], profile.files.map((f) => [String(f.ms), String(f.percent), f.name])),
    table(["inclusive ms", "%", "egressgate function (dist/)"], ["r", "r", "l"], profile.ownInclusive.map((f) => [String(f.ms), String(f.percent), f.name])),
  ].join("\n\n");
}
