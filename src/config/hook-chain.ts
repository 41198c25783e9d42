import { programProblem } from "../deciders/find-program.js";
import { isDeciderEntry, resolveDecider, type ResolvedDecider } from "../deciders/options.js";
import type { DocumentPath } from "./paths.js";
import type { Segment } from "./option-error.js";
import type { CustomNode } from "./validate.js";

/**
 * A guest's `hooks` list in the config file (and the CLI's `--hooks-script`, `--hook-command`,
 * `--hook-url` and `--hook-opa`, in command-line order): the chain, each entry a tier-2 policy
 * (`{ script: FILE }`) or an external decider (`{ command }`, `{ webhook }`, `{ opa }` with
 * their options). A decider is checked by the same function as createHttpHooks' entries.
 */

/** One resolved entry: a policy file (absolute), or a decider ready to be made. */
export type HookChainConfig = { readonly kind: "script"; readonly path: string } | { readonly kind: "decider"; readonly decider: ResolvedDecider };

const entryDoc = "{ script: FILE }, or a decider: { command: [...] }, { webhook: URL } or { opa: URL }, with its options";

/** The schema's node for one entry. */
export const hookEntryNode: CustomNode = {
  kind: "custom",
  expect: entryDoc,
  doc: "One source of the chain: a tier-2 policy or an external decider.",
  check(value, report, context) {
    if (typeof value === "object" && value !== null && !Array.isArray(value) && "script" in value) {
      const keys = Object.keys(value);
      if (keys.length !== 1) return report(`a { script } entry has no other keys (got ${keys.join(", ")})`);
      const script = (value as Record<string, unknown>)["script"];
      if (typeof script !== "string" || script === "") report("must be a file path", ["script"]);
      return;
    }
    if (!isDeciderEntry(value)) return report(`must be ${entryDoc}`);
    resolveDecider(value, context.env ?? process.env, (reason, segments = [], kind = "invalid") => report(reason, segments, kind));
  },
};

/**
 * The entries of a valid `hooks` list, resolved: script paths and a command's program path (when
 * it has a slash) by `pathOf` (from the document's folder), a decider's `${NAME}` references from
 * `env`. A script that is not a file, or a program that cannot be started, is reported to `at`.
 */
export function resolveHookChain(
  entries: readonly Record<string, unknown>[],
  pathOf: DocumentPath,
  env: NodeJS.ProcessEnv,
  at: (segments: readonly Segment[], reason: string) => void,
  base: readonly Segment[],
  isFile: (file: string) => boolean,
): HookChainConfig[] {
  return entries.flatMap((entry, i): HookChainConfig[] => {
    if (typeof entry["script"] === "string") {
      const script = pathOf([...base, "hooks", i, "script"], entry["script"]);
      if (script === undefined) return [];
      if (!isFile(script)) at([...base, "hooks", i, "script"], `names ${script}, which is not a readable file`);
      return [{ kind: "script", path: script }];
    }
    const decider = resolveDecider(entry, env, (reason, segments = []) => at([...base, "hooks", i, ...segments], reason));
    if (decider === undefined) return [];
    if (decider.kind !== "command" || decider.shell) return [{ kind: "decider", decider }];
    // `./check.sh` next to the config file means the file's folder, as every relative path in it does.
    const written = decider.argv[0]!;
    const program = written.includes("/") ? pathOf([...base, "hooks", i, "command"], written) : written;
    if (program === undefined) return [];
    // A program that is not there is refused here, as a missing script is: served, every request
    // it was asked about got 502, and check-config said nothing. Looked for as spawn will: in the
    // PATH the child gets, from the proxy's working directory.
    const problem = programProblem(program, decider.env["PATH"], process.cwd());
    if (problem !== undefined) at([...base, "hooks", i, "command"], problem);
    if (program === written) return [{ kind: "decider", decider }];
    return [{ kind: "decider", decider: { ...decider, argv: [program, ...decider.argv.slice(1)], label: `command:${written}` } }];
  });
}
