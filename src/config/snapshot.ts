import { makeIssue, OptionError, type Segment } from "./option-error.js";
import type { OptionNode } from "./validate.js";

/**
 * The options as data, read once, for the schema to check and the resolver to use: the same
 * values, whatever the caller's objects do when read again.
 *
 * The schema walks own enumerable keys, and the resolver reads options by name. Without a
 * snapshot, an option inherited from a prototype (`Object.create(defaults)`) was never checked
 * but used (`timeouts.hookMs: "abc"` answered every hooked request 504 "within abc ms"), and a
 * getter was checked with its first value and used with the next (NaN). Here each object the
 * schema describes becomes a new one with no prototype holding its own enumerable properties,
 * each getter called once; an option the object only inherits is refused (refuseInherited).
 * A read that throws is an option error naming the path, not the caller's raw error.
 *
 * Only what the schema describes is copied, following it: functions (hooks, `logSink`) stay
 * references, a value under an unknown key or of the wrong kind is kept as read for the schema
 * to refuse, and the symbols createHttpHooks binds to its `httpHooks` object (declarative-binding.ts)
 * are carried over by reference.
 */
export function snapshotOptions(node: OptionNode, value: unknown, segments: readonly Segment[], prefix: string): unknown {
  // Whatever throws on the way (a Proxy's trap) is an option error at the path it was reading.
  try {
    return copy(node, value, segments, prefix);
  } catch (error) {
    if (error instanceof OptionError) throw error;
    throw unreadable(segments, error, prefix);
  }
}

/**
 * An option the schema knows, or a map's entry, that the object only inherits is refused, not
 * left out: a class's method as `httpHooks.onRequest`, or `Object.create(defaults)`, would
 * otherwise start without it, silently (a hook that refused POSTs let them out).
 */
function refuseInherited(node: OptionNode, value: object, segments: readonly Segment[], prefix: string): void {
  const names = node.kind === "object" ? Object.keys(node.fields).filter((key) => key in value) : inheritedEnumerable(value);
  for (const key of names) {
    if (!Object.hasOwn(value, key)) throw new OptionError(makeIssue([...segments, key], "is inherited from a prototype: give it as the object's own property"), { prefix });
  }
}

function inheritedEnumerable(value: object): string[] {
  const keys: string[] = [];
  for (const key in value) keys.push(key);
  return keys;
}

function unreadable(segments: readonly Segment[], error: unknown, prefix: string): OptionError {
  const message = error instanceof Error ? error.message : String(error);
  return new OptionError(makeIssue(segments, `could not be read: ${message}`), { prefix, cause: error });
}

/** One own property, a getter called once with the object as `this`; `at` is its path, for an error. */
function readOwn(object: object, key: string, at: readonly Segment[], prefix: string): { readonly found: boolean; readonly value?: unknown } {
  try {
    const descriptor = Object.getOwnPropertyDescriptor(object, key);
    if (descriptor === undefined) return { found: false };
    return { found: true, value: descriptor.get !== undefined ? descriptor.get.call(object) : descriptor.value };
  } catch (error) {
    throw unreadable(at, error, prefix);
  }
}

/** A value the snapshot holds as its own, "__proto__" included (a key the schema refuses by name). */
function define(target: object, key: string | symbol, value: unknown): void {
  Object.defineProperty(target, key, { value, enumerable: typeof key === "string", writable: true, configurable: true });
}

function copy(node: OptionNode, value: unknown, segments: readonly Segment[], prefix: string): unknown {
  if (typeof value !== "object" || value === null) return value;
  if (node.kind === "list") {
    if (!Array.isArray(value)) return value;
    const length = readOwn(value, "length", segments, prefix).value as number;
    // Holes stay holes, as the schema's forEach and the resolver's map skip them.
    const out: unknown[] = new Array<unknown>(length);
    for (const key of Object.keys(value)) {
      const index = Number(key);
      if (!Number.isInteger(index) || index < 0 || index >= length || String(index) !== key) continue;
      const read = readOwn(value, key, [...segments, index], prefix);
      if (read.found) out[index] = snapshotOptions(node.items, read.value, [...segments, index], prefix);
    }
    return out;
  }
  if ((node.kind !== "object" && node.kind !== "map") || Array.isArray(value)) return value;
  refuseInherited(node, value, segments, prefix);
  const out: Record<string, unknown> = Object.create(null) as Record<string, unknown>;
  for (const key of Object.keys(value)) {
    const read = readOwn(value, key, [...segments, key], prefix);
    if (!read.found) continue;
    const field = node.kind === "map" ? node.values : Object.hasOwn(node.fields, key) ? node.fields[key] : undefined;
    define(out, key, field === undefined ? read.value : snapshotOptions(field, read.value, [...segments, key], prefix));
  }
  if (node.kind === "object") {
    for (const key of Object.getOwnPropertySymbols(value)) {
      const descriptor = Object.getOwnPropertyDescriptor(value, key);
      if (descriptor !== undefined && "value" in descriptor) define(out, key, descriptor.value);
    }
  }
  return out;
}
