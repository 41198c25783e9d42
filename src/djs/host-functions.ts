import type { QuickJSContext, QuickJSHandle } from "quickjs-emscripten-core";
import type { HeapValues } from "./heap-values.js";

/** What `new URL()` inside the sandbox gets back: the parts Node's WHATWG parser produced, LF-joined. */
function urlParts(url: URL): string {
  return [url.href, url.origin, url.protocol, url.username, url.password, url.host, url.hostname, url.port, url.pathname, url.search, url.hash].join("\n");
}
const settableParts = new Set(["href", "protocol", "username", "password", "host", "hostname", "port", "pathname", "search", "hash"]);

/**
 * The `host` object the prelude is installed with (its host.js): the few functions the worker
 * provides, so that URLs parse exactly as the proxy's own do and UTF-8 is Node's. The caller
 * hands it to the prelude and disposes of it.
 *
 * Their results are made through `values`, which answers undefined when the policy's heap has no
 * room (the call is then a memory limit: `heapFull`). A function that throws with the heap full
 * answers undefined too: quickjs-emscripten would make a QuickJS error of it in that full heap,
 * unchecked, and when that traps it writes the trap to the process's stderr.
 */
export function newHostFunctions(ctx: QuickJSContext, values: HeapValues, heapFull: () => boolean): QuickJSHandle {
  const host = ctx.newObject();
  const guarded =
    (fn: (...args: QuickJSHandle[]) => QuickJSHandle) =>
    (...args: QuickJSHandle[]): QuickJSHandle => {
      try {
        return fn(...args);
      } catch (error) {
        if (heapFull()) return ctx.undefined;
        throw error;
      }
    };
  const parseUrl = ctx.newFunction("parseUrl", guarded((inputH, baseH, partH, valueH, jsonH) => {
    let input = ctx.getString(inputH);
    let base = ctx.typeof(baseH) === "string" ? ctx.getString(baseH) : undefined;
    let part = partH !== undefined && ctx.typeof(partH) === "string" ? ctx.getString(partH) : undefined;
    let value = valueH !== undefined && ctx.typeof(valueH) === "string" ? ctx.getString(valueH) : undefined;
    // The prelude's own flag (a boolean no URL string can be) for arguments sent as JSON.
    if (jsonH !== undefined && ctx.dump(jsonH) === true) {
      const args = JSON.parse(input) as [string, string | null, string | null, string | null];
      input = args[0];
      base = args[1] ?? undefined;
      part = args[2] ?? undefined;
      value = args[3] ?? undefined;
    }
    let url: URL;
    try {
      url = base === undefined ? new URL(input) : new URL(input, base);
      if (part !== undefined) {
        if (!settableParts.has(part)) return ctx.undefined;
        (url as unknown as Record<string, string>)[part] = value ?? "";
      }
    } catch {
      return ctx.undefined;
    }
    return values.string(urlParts(url)) ?? ctx.undefined;
  }));
  const utf8Encode = ctx.newFunction("utf8Encode", guarded((textH, jsonH) => {
    const raw = ctx.getString(textH);
    const text = ctx.dump(jsonH) === true ? (JSON.parse(raw) as string) : raw;
    const bytes = Buffer.from(text, "utf8");
    return values.arrayBuffer(bytes) ?? ctx.undefined;
  }));
  const utf8Decode = ctx.newFunction("utf8Decode", guarded((bufferH, fatalH, bomH) => {
    const view = ctx.getArrayBuffer(bufferH);
    let text: string;
    try {
      const decoder = new TextDecoder("utf-8", { fatal: ctx.dump(fatalH) === true, ignoreBOM: ctx.dump(bomH) === true });
      text = decoder.decode(view.value);
    } catch {
      return ctx.undefined;
    } finally {
      view.dispose();
    }
    if (!text.includes("\0")) return values.string(text) ?? ctx.undefined;
    // A C string would end at the NUL: hand the text over as JSON instead.
    const json = values.string(JSON.stringify(text));
    if (json === undefined) return ctx.undefined;
    const wrapped = ctx.newObject();
    ctx.setProp(wrapped, "json", json);
    json.dispose();
    return wrapped;
  }));
  for (const [name, fn] of [["parseUrl", parseUrl], ["utf8Encode", utf8Encode], ["utf8Decode", utf8Decode]] as const) {
    ctx.setProp(host, name, fn);
    fn.dispose();
  }
  return host;
}
