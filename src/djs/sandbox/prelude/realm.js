// @ts-check
// The realm: install the sandbox's globals, then freeze everything reachable, so that nothing a
// call changes survives into the next (DESIGN §2).
import { HttpRequestBlockedError } from "./blocked-error.js";
import { OpaqueBody } from "./bodies.js";
import { SandboxDate } from "./clock.js";
import { console } from "./console.js";
import { atob, btoa, DOMException, TextDecoder, TextEncoder } from "./encoding.js";
import { Headers } from "./headers.js";
import { sleep } from "./layer.js";
import { Request, Response } from "./request-response.js";
import { URL, URLSearchParams } from "./url.js";

const hasOwn = Object.prototype.hasOwnProperty;

/** @type {Record<string, unknown>} */
const installed = {
  Date: SandboxDate,
  Headers,
  URL,
  URLSearchParams,
  Request,
  Response,
  HttpRequestBlockedError,
  TextEncoder,
  TextDecoder,
  DOMException,
  atob,
  btoa,
  console,
  sleep,
};
export function installGlobals() {
  for (const name of Object.keys(installed)) {
    Object.defineProperty(globalThis, name, { value: installed[name], writable: true, configurable: true, enumerable: false });
  }
  // `using` and `await using` (lowered by the bundler, whose helpers look the symbols up as
  // `Symbol.dispose` or else `Symbol.for("Symbol.dispose")`): QuickJS has neither symbol, so a
  // class's `[Symbol.dispose]()` method was keyed "undefined" and every `using` threw "Object not
  // disposable". The registered symbols are the ones those helpers fall back on.
  for (const name of ["dispose", "asyncDispose"]) {
    if (!hasOwn.call(Symbol, name)) Object.defineProperty(Symbol, name, { value: Symbol.for(`Symbol.${name}`), writable: false, enumerable: false, configurable: false });
  }
  // A FinalizationRegistry's callback runs whenever the collector gets round to it: in a later
  // call, as code of an earlier one. Nothing else lets a policy's code outlive its call.
  // @ts-expect-error: the ECMAScript library declares it as always there.
  delete globalThis.FinalizationRegistry;
}

/**
 * Freezing a prototype makes its data properties read-only for every object that inherits
 * them: `this.name = "MyError"` or `obj.toString = f` would throw (the "override mistake").
 * These become accessors whose setter defines an own property on the object instead.
 */
/**
 * @param {object} proto
 * @param {(string | symbol)[]} keys
 */
function tame(proto, keys) {
  for (const key of keys) {
    const desc = Object.getOwnPropertyDescriptor(proto, key);
    if (desc === undefined || !hasOwn.call(desc, "value")) continue;
    const value = desc.value;
    Object.defineProperty(proto, key, {
      get() {
        return value;
      },
      set(next) {
        if (this === proto) throw new TypeError(`Cannot assign to read only property '${String(key)}' of a builtin`);
        Object.defineProperty(this, key, { value: next, writable: true, enumerable: true, configurable: true });
      },
      enumerable: desc.enumerable,
      configurable: false,
    });
  }
}
function tameBuiltins() {
  tame(Object.prototype, Object.getOwnPropertyNames(Object.prototype));
  tame(Function.prototype, ["constructor", "toString", "name"]);
  tame(Array.prototype, ["constructor", "toString"]);
  tame(Promise.prototype, ["constructor"]);
  const errors = [Error, TypeError, RangeError, SyntaxError, ReferenceError, EvalError, URIError, globalThis.InternalError, globalThis.AggregateError];
  for (const E of errors) if (typeof E === "function") tame(E.prototype, ["name", "message", "constructor", "toString"]);
}

/**
 * Called before the policy loads: freezes every builtin and the global object itself. A
 * policy's writes to `globalThis` go to a fresh object made for each call instead.
 */
export function freeze() {
  tameBuiltins();
  const seen = new WeakSet();
  // Intrinsics no global property leads to: iterator and generator prototypes. Left
  // unfrozen, a call could stash state on them (or replace `next`) for the next call.
  const hidden = [
    Object.getPrototypeOf([][Symbol.iterator]()),
    Object.getPrototypeOf(new Map()[Symbol.iterator]()),
    Object.getPrototypeOf(new Set()[Symbol.iterator]()),
    Object.getPrototypeOf(""[Symbol.iterator]()),
    Object.getPrototypeOf("".matchAll(/(?:)/g)),
    Object.getPrototypeOf(function* () {}),
    Object.getPrototypeOf(async function () {}),
    Object.getPrototypeOf(async function* () {}),
    Object.getPrototypeOf((function* () {})()),
    Object.getPrototypeOf((async function* () {})()),
    Object.getOwnPropertyDescriptor(Function.prototype, "caller")?.get,
    // The iterator helpers' prototypes, where this QuickJS has them.
    typeof globalThis.Iterator?.prototype?.map === "function" ? Object.getPrototypeOf([].values().map((x) => x)) : undefined,
    typeof globalThis.Iterator?.from === "function" ? Object.getPrototypeOf(Iterator.from(/** @type {any} */ ({ next: () => ({ done: true }) }))) : undefined,
    // The prelude's own classes that no global leads to.
    OpaqueBody,
  ];
  const stack = [globalThis, ...hidden];
  while (stack.length > 0) {
    const value = stack.pop();
    if ((typeof value !== "object" && typeof value !== "function") || value === null || seen.has(value)) continue;
    seen.add(value);
    for (const key of Reflect.ownKeys(value)) {
      const desc = Object.getOwnPropertyDescriptor(value, key);
      if (desc === undefined) continue;
      if (hasOwn.call(desc, "value")) stack.push(desc.value);
      else {
        stack.push(desc.get);
        stack.push(desc.set);
      }
    }
    stack.push(Object.getPrototypeOf(value));
    Object.freeze(value);
  }
}
