/**
 * Node's inspector flags, taken out of what a `--workers` primary hands its workers. Under
 * `node --inspect` (or `NODE_OPTIONS=--inspect`) node:cluster gives every worker an inspector of
 * its own, on the primary's port plus 1, 2, …: each runs any code sent to it in a process that
 * holds every guest's secrets and the CA's key. A worker refuses its own inspector and the
 * primary's as targets, not its siblings' (their ports are not known to it, and a replacement's
 * is new), so a guest allowed loopback reached one worker's inspector through another (helper
 * finding, eleventh session). The workers get none: the primary keeps its own, which every
 * worker refuses; request handling is debugged without `--workers`.
 */

/** The options that open the inspector, or set its port or how it announces itself. */
const inspectorOption = /^--(?:inspect(?:-brk|-brk-node|-wait)?|inspect-port|debug-port|inspect-publish-uid)(?:=|$)/;

/** Those of them that take their value as the next argument when it is not after `=`. */
const valueNext: ReadonlySet<string> = new Set(["--inspect-port", "--debug-port", "--inspect-publish-uid"]);

export interface WithoutInspector<T> {
  readonly kept: T;
  /** The options taken out, as they were written. */
  readonly dropped: readonly string[];
}

/** Which of `args` are the inspector's: an option, and the value after one that takes it so. */
function inspectorArgs(args: readonly string[]): boolean[] {
  const drop = args.map(() => false);
  for (let i = 0; i < args.length; i++) {
    const option = optionName(args[i]!);
    if (!inspectorOption.test(option)) continue;
    drop[i] = true;
    if (valueNext.has(option) && i + 1 < args.length) drop[++i] = true;
  }
  return drop;
}

/**
 * An option as Node reads it: it takes `_` for `-` in the name of a `--` option (before any `=`),
 * so `--inspect_brk=0` opens the inspector as `--inspect-brk=0` does, and went on to the workers.
 */
function optionName(arg: string): string {
  if (!arg.startsWith("--")) return arg;
  const equals = arg.indexOf("=");
  const name = equals < 0 ? arg : arg.slice(0, equals);
  return name.replaceAll("_", "-") + (equals < 0 ? "" : arg.slice(equals));
}

/** `process.execArgv` without the inspector's options. */
export function execArgvWithoutInspector(args: readonly string[]): WithoutInspector<string[]> {
  const drop = inspectorArgs(args);
  return { kept: args.filter((_, i) => !drop[i]), dropped: args.filter((_, i) => drop[i]) };
}

/**
 * `NODE_OPTIONS` without the inspector's options. Node splits it at spaces outside double
 * quotes, in which a backslash escapes the next character; each other option is kept as written.
 */
export function nodeOptionsWithoutInspector(options: string): WithoutInspector<string> {
  const tokens = options.match(/(?:"(?:\\.|[^"\\])*"?|[^ "])+/g) ?? [];
  const drop = inspectorArgs(tokens.map((token) => token.replace(/"((?:\\.|[^"\\])*)"?/g, (_all, inner: string) => inner.replace(/\\(.)/g, "$1"))));
  if (!drop.includes(true)) return { kept: options, dropped: [] };
  return { kept: tokens.filter((_, i) => !drop[i]).join(" "), dropped: tokens.filter((_, i) => drop[i]) };
}
