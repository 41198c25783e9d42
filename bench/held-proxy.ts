/**
 * What bench/h2-held.ts and bench/h1-held.ts share: the `--trees` list they compare, and the
 * proxy child (bench/h2-windows-proxy.ts) each tree runs as, with `--expose-gc` for its readings.
 */
import { fork, type ChildProcess } from "node:child_process";
import { join, resolve as resolvePath } from "node:path";
import { ask, root, track } from "./children.js";
import type { WindowsProxyReady } from "./h2-windows-proxy.js";

/** One tree to measure: `label=DIR` or `label=DIR:{"limit":n,…}` (limits over the defaults). */
export interface HeldConfig {
  readonly label: string;
  readonly tree: string;
  readonly limits: Readonly<Record<string, number>>;
}

/** `--trees`: comma-separated `label=DIR[:limits JSON]`. */
export function parseTrees(spec: string): HeldConfig[] {
  return spec.split(",").map((item) => {
    const [label, rest] = item.split("=", 2) as [string, string];
    const colon = rest.indexOf(":");
    return colon < 0 ? { label, tree: resolvePath(rest), limits: {} } : { label, tree: resolvePath(rest.slice(0, colon)), limits: JSON.parse(rest.slice(colon + 1)) as Record<string, number> };
  });
}

/** The tree's proxy, trusting the bench upstream's CA, resolving `origins` bench origins to 127.0.0.1; `limits` go under the tree's own. */
export async function startHeldProxy(config: HeldConfig, caFile: string, origins: number, limits: Readonly<Record<string, number>> = {}): Promise<{ child: ChildProcess; url: string; caPem: string }> {
  const child = track(
    fork(join(root, "bench", "h2-windows-proxy.ts"), [config.tree, caFile, JSON.stringify({ ...limits, ...config.limits })], {
      execArgv: ["--import", "tsx", "--expose-gc"],
      env: { ...process.env, H2WIN_ORIGINS: String(origins) },
      cwd: config.tree,
      stdio: ["ignore", "inherit", "inherit", "ipc"],
    }),
    `egressgate ${config.label}`,
  );
  const ready = await ask<WindowsProxyReady>(child, "ready", undefined, 60_000);
  return { child, url: `http://127.0.0.1:${ready.port}`, caPem: ready.caPem };
}
