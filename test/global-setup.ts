import { execFileSync } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("../", import.meta.url));

/** The newest modification time of any file under `dir`. */
function newest(dir: string): number {
  let latest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    latest = Math.max(latest, entry.isDirectory() ? newest(path) : statSync(path).mtimeMs);
  }
  return latest;
}

/**
 * The CLI tests run the built CLI (dist/cli/bin.js): a child through tsx spent about a second of
 * CPU more to start, compiling the sources in a loader thread (docs/testing.md, "Suite duration").
 * So that they never test a build older than the sources, dist is built first when it is missing
 * or any file under src is newer than it (CI builds just before, and this finds nothing to do).
 */
export default function setup(): void {
  let built = 0;
  try {
    built = statSync(join(root, "dist", "cli", "bin.js")).mtimeMs;
  } catch {
    // No build yet.
  }
  if (built >= newest(join(root, "src"))) return;
  execFileSync("npm", ["run", "build"], { cwd: root, stdio: "inherit", timeout: 300_000 });
}
