import { createHash } from "node:crypto";
import { lstatSync, readlinkSync, statSync, watch, type FSWatcher } from "node:fs";
import path from "node:path";
import type { ProxyConfig } from "./document.js";
import { maxTextFileBytes, readFailure, readRegularFileSync } from "../regular-file.js";

/**
 * `--watch` (`watch: true`): the files a configuration was read from, watched for changes. Each
 * file's folder is watched, not the file: editors and `kubectl`'s ConfigMap swap replace a file
 * by renaming another over it, and a watch on the old inode would never fire again. Only an
 * event naming a watched file (or `..data`, kubectl's swap, or the folder itself) schedules a
 * look, so an audit log written next to the config cannot keep pushing the look back; and a
 * look comes at most `maxWaitMs` after the first event whatever follows. What decides is the
 * files' content, so a temp file, or a `touch`, reloads nothing. A folder that is deleted or
 * replaced (its inode changes) is watched again once it is back. A file reached through symlinks
 * has every link's folder watched too (an edit of the target fires nothing in the link's
 * folder), and each look follows the links again, so a link pointed elsewhere is followed to
 * its new target.
 */

/** The files a configuration was read from: the config file, every policy file, every `file:` secret. */
export function watchedFiles(config: ProxyConfig): string[] {
  const files = new Set<string>();
  if (config.source !== "flags") files.add(path.resolve(config.source));
  for (const guest of Object.values(config.guests)) {
    for (const script of guest.hooksScript ?? []) files.add(path.resolve(script));
    for (const entry of guest.hooks ?? []) if (entry.kind === "script") files.add(path.resolve(entry.path));
    for (const secret of Object.values(guest.secrets ?? {})) if (secret.from.startsWith("file:")) files.add(path.resolve(secret.from.slice(5)));
  }
  return [...files].sort();
}

export interface FileWatchOptions {
  /** Quiet time after the last event before the files are looked at: an editor's save is several events. */
  readonly debounceMs: number;
  /** Called once the debounce has passed and at least one file's content differs from what was last seen. */
  readonly onChange: (changed: readonly string[]) => void;
  /** A folder that cannot be watched (gone, no permission): said once per folder, then retried. */
  readonly warn: (msg: string, fields: Record<string, unknown>) => void;
  /** How long before a folder that could not be watched is tried again. */
  readonly retryMs?: number;
  /** The longest a look waits after the first event while events keep coming. Default 5 × debounceMs. */
  readonly maxWaitMs?: number;
}

export interface FileWatch {
  /** Watches these files from now on (a reload may name others), keeping what was seen of those it had. */
  update(files: readonly string[]): void;
  /** The files watched now. */
  readonly files: readonly string[];
  close(): void;
}

/**
 * What a file holds, as a digest; "missing" when it cannot be read (a rename in progress, say).
 * A FIFO or a device put in a file's place is not read (it would hold the event loop, and every
 * guest, until written to, or forever): it counts as a change, and the reload says what it is.
 */
function contentOf(file: string): string {
  try {
    // Capped as the files it watches are (a config file, a policy, a secret): one past the cap is
    // refused by the reload anyway, and is not read whole on the event loop to be hashed.
    return createHash("sha256").update(readRegularFileSync(file, maxTextFileBytes)).digest("hex");
  } catch (error) {
    return `missing:${readFailure(error)}`;
  }
}

export function watchFiles(initial: readonly string[], options: FileWatchOptions): FileWatch {
  const retryMs = options.retryMs ?? 1_000;
  let files: string[] = [];
  const seen = new Map<string, string>();
  const maxWaitMs = options.maxWaitMs ?? options.debounceMs * 5;
  const folders = new Map<string, { watcher: FSWatcher | undefined; retry: NodeJS.Timeout | undefined; warned: boolean; ino: number | undefined }>();
  let timer: NodeJS.Timeout | undefined;
  let firstEvent: number | undefined;
  let closed = false;

  const schedule = (): void => {
    if (closed) return;
    clearTimeout(timer);
    const now = performance.now();
    firstEvent ??= now;
    timer = setTimeout(look, Math.max(0, Math.min(options.debounceMs, firstEvent + maxWaitMs - now)));
    timer.unref();
  };

  /** The names that matter in each watched folder: the files', and their symlinks' targets'. */
  let names = new Map<string, ReadonlySet<string>>();

  /** Whether an event in `folder` naming `name` may concern a watched file. */
  const concerns = (folder: string, name: string | null): boolean => {
    if (name === null || name.startsWith("..") || name === path.basename(folder)) return true;
    return names.get(folder)?.has(name) ?? false;
  };

  /**
   * Each file's folder, and every link on the way to what it reads: each hop of a chain of
   * symlinks (a dangling last hop included, so its target appearing counts), and each folder on
   * the way that is itself a link (`current -> releases/42`), watched in its parent for a swap.
   */
  const wantedNames = (): Map<string, Set<string>> => {
    const wanted = new Map<string, Set<string>>();
    const add = (file: string): void => {
      const folder = path.dirname(file);
      const inFolder = wanted.get(folder) ?? new Set<string>();
      inFolder.add(path.basename(file));
      wanted.set(folder, inFolder);
    };
    const isLink = (at: string): boolean => {
      try {
        return lstatSync(at).isSymbolicLink();
      } catch {
        return false;
      }
    };
    for (const file of files) {
      let hop = file;
      // As many hops as the kernel follows (ELOOP past it): a loop ends here too.
      for (let hops = 0; hops < 40; hops++) {
        add(hop);
        for (let folder = path.dirname(hop); folder !== path.dirname(folder); folder = path.dirname(folder)) if (isLink(folder)) add(folder);
        let target: string;
        try {
          target = readlinkSync(hop);
        } catch {
          break; // not a link (EINVAL), or nothing there yet
        }
        hop = path.resolve(path.dirname(hop), target);
      }
    }
    return wanted;
  };

  /** Watches the folders the files and their targets are in now, and lets go of the others. */
  const syncFolders = (): void => {
    names = wantedNames();
    for (const [folder, entry] of folders) {
      if (names.has(folder)) continue;
      entry.watcher?.close();
      clearTimeout(entry.retry);
      folders.delete(folder);
    }
    for (const folder of names.keys()) {
      if (folders.has(folder)) continue;
      folders.set(folder, { watcher: undefined, retry: undefined, warned: false, ino: undefined });
      arm(folder);
    }
  };

  /** A folder deleted or replaced since it was armed is watched again (its old watch is blind). */
  const recheckFolders = (): void => {
    for (const [folder, entry] of folders) {
      if (entry.watcher === undefined) continue;
      let ino: number | undefined;
      try {
        ino = statSync(folder).ino;
      } catch {
        ino = undefined;
      }
      if (ino !== undefined && ino === entry.ino) continue;
      entry.watcher.close();
      entry.watcher = undefined;
      if (ino === undefined) failed(folder, Object.assign(new Error("the folder is gone"), { code: "ENOENT" }));
      else arm(folder);
    }
  };

  const look = (): void => {
    if (closed) return;
    firstEvent = undefined;
    // First the links, so a target folder a swap removed (kubectl's timestamped one) is let go, not retried.
    syncFolders();
    recheckFolders();
    const changed = files.filter((file) => {
      const now = contentOf(file);
      if (seen.get(file) === now) return false;
      seen.set(file, now);
      return true;
    });
    if (changed.length > 0) options.onChange(changed);
  };

  const arm = (folder: string): void => {
    const entry = folders.get(folder);
    if (entry === undefined || closed) return;
    entry.retry = undefined;
    let watcher: FSWatcher;
    try {
      entry.ino = statSync(folder).ino;
      // Not persistent: the proxy's listener keeps the process alive, the watch never should.
      watcher = watch(folder, { persistent: false }, (_event, name) => {
        if (concerns(folder, typeof name === "string" ? name : null)) schedule();
      });
    } catch (error) {
      failed(folder, error);
      return;
    }
    entry.watcher = watcher;
    if (entry.warned) {
      entry.warned = false;
      // The folder is back: what changed while it was gone counts.
      schedule();
    }
    // An unlistened 'error' (the folder deleted, inotify's limit) would take the process down.
    watcher.on("error", (error) => {
      watcher.close();
      if (entry.watcher === watcher) entry.watcher = undefined;
      failed(folder, error);
    });
  };

  const failed = (folder: string, error: unknown): void => {
    const entry = folders.get(folder);
    if (entry === undefined || closed) return;
    if (!entry.warned) options.warn("cannot watch a folder; retrying", { folder, error: (error as NodeJS.ErrnoException).code ?? (error as Error).message });
    entry.warned = true;
    entry.retry = setTimeout(() => arm(folder), retryMs);
    entry.retry.unref();
  };

  const update = (next: readonly string[]): void => {
    files = [...new Set(next.map((file) => path.resolve(file)))];
    for (const file of files) if (!seen.has(file)) seen.set(file, contentOf(file));
    for (const file of [...seen.keys()]) if (!files.includes(file)) seen.delete(file);
    syncFolders();
  };

  update(initial);
  return {
    update,
    get files() {
      return files;
    },
    close() {
      closed = true;
      clearTimeout(timer);
      for (const entry of folders.values()) {
        entry.watcher?.close();
        clearTimeout(entry.retry);
      }
      folders.clear();
    },
  };
}
