import type { ProxyConfig } from "../config/document.js";
import type { CliLog } from "./cli-log.js";
import { loadConfigFileOffLoop } from "../config/parse-ahead.js";
import { watchedFiles, watchFiles, type FileWatch } from "../config/file-watch.js";

/** An editor's save is a burst of events (write, rename, chmod): one reload after it settles. */
const debounceMs = 300;

/**
 * `--watch`: runs `reload` (the SIGHUP path: a reload that fails is logged and the old
 * configuration keeps serving) when a file the configuration was read from changes. After each
 * reload the list is read again from the config file, which may name other policies or secret
 * files now; flags name the same files for the life of the process.
 */
export function watchConfiguration(config: ProxyConfig, env: NodeJS.ProcessEnv, reload: () => Promise<void>, log: CliLog): FileWatch {
  const current = async (): Promise<string[] | undefined> => {
    if (config.source === "flags") return undefined;
    try {
      // Off the event loop when large, as the reload parsed it: see loadConfigFileOffLoop.
      return watchedFiles(await loadConfigFileOffLoop(config.source, env));
    } catch {
      // A file that does not load keeps the list it had; the reload has said why.
      return undefined;
    }
  };
  let running = Promise.resolve();
  const watch = watchFiles(watchedFiles(config), {
    debounceMs,
    warn: (msg, fields) => log("warn", msg, fields),
    onChange: (changed) => {
      running = running.then(async () => {
        log("info", "files changed; reloading", { files: changed });
        await reload().catch((error: unknown) => log("error", "reload failed; the old configuration keeps serving", { error: (error as Error)?.message ?? String(error) }));
        const files = await current();
        if (files !== undefined) watch.update(files);
      });
    },
  });
  log("info", "watching for changes", { files: watch.files });
  return watch;
}
