import { execFileSync } from "node:child_process";
import { mkdtempSync, rmdirSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { onTestFinished } from "vitest";

function mount(dir: string, bytes: number): void {
  execFileSync("mount", ["-t", "tmpfs", "-o", `size=${bytes},mode=0700`, "tmpfs", dir], { stdio: "pipe" });
}

/** `umount -l`: detached at once, even while a process still has a file on it open. */
function unmount(dir: string): void {
  execFileSync("umount", ["-l", dir], { stdio: "pipe" });
}

/**
 * Why a tmpfs cannot be mounted here (not root, or a container without CAP_SYS_ADMIN), or
 * undefined when it can: tried once, on a folder of its own, and unmounted at once.
 */
export const tmpfsRefused: string | undefined = (() => {
  const dir = mkdtempSync(join(tmpdir(), "egressgate-tmpfs-probe-"));
  try {
    mount(dir, 64 * 1024);
    unmount(dir);
    return undefined;
  } catch (error) {
    const stderr = String((error as { stderr?: unknown }).stderr ?? "").trim();
    return `mount -t tmpfs is not permitted here (${stderr || (error as Error).message}): it needs root with CAP_SYS_ADMIN`;
  } finally {
    rmdirSync(dir);
  }
})();

/**
 * A tmpfs of `bytes` (a full disk on demand) on a folder of its own; unmounted and the folder
 * removed when the test finishes. Only where {@link tmpfsRefused} is undefined.
 */
export function smallDisk(bytes = 64 * 1024): string {
  const dir = mkdtempSync(join(tmpdir(), "egressgate-small-disk-"));
  mount(dir, bytes);
  onTestFinished(() => {
    unmount(dir);
    rmdirSync(dir);
  });
  return dir;
}

/** Takes every free block of the disk at `dir` with a file of its own, and returns its path (remove it to make room again). */
export function fillDisk(dir: string): string {
  const file = join(dir, "fill");
  try {
    writeFileSync(file, Buffer.alloc(64 * 1024 * 1024));
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "ENOSPC") throw error;
    return file;
  }
  throw new Error(`${dir} took 64 MiB: not a small disk`);
}
