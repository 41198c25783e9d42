// @ts-check
// The few functions the worker provides (src/djs/host-functions.ts makes them): UTF-8
// conversion and WHATWG URL parsing, so URLs parse exactly as the proxy's own do.

/**
 * @typedef {object} Host
 * @property {(input: string, base: string | undefined, part?: string, value?: string, json?: boolean) => string | undefined} parseUrl
 *   The URL's parts, LF-joined, or undefined for a URL that does not parse (or whose parts the heap has no room for).
 * @property {(text: string, json: boolean) => ArrayBuffer | undefined} utf8Encode
 *   The bytes, or undefined when the policy's heap has no room for them.
 * @property {(buffer: ArrayBuffer, fatal: boolean, ignoreBOM: boolean) => string | { json: string } | undefined} utf8Decode
 *   The text, or `{ json }` for text that holds a NUL, or undefined for invalid UTF-8 when fatal
 *   (or for text the heap has no room for).
 */

/** @type {Host} */
let functions;

/** @param {Host} worker */
export function setHost(worker) {
  functions = worker;
}

// Strings cross between QuickJS and the worker as C strings, which end at NUL. Text that may
// hold one crosses as JSON instead, so a body like "safe\0<rest>" is never cut short.
/** @param {string} text */
const hasNul = (text) => text.indexOf("\0") !== -1;
/**
 * @param {string} input
 * @param {string} [base]
 * @param {string} [part]
 * @param {string} [value]
 */
export function parseUrl(input, base, part, value) {
  if (hasNul(input) || (base !== undefined && hasNul(base)) || (value !== undefined && hasNul(value))) {
    return functions.parseUrl(JSON.stringify([input, base ?? null, part ?? null, value ?? null]), undefined, undefined, undefined, true);
  }
  return functions.parseUrl(input, base, part, value);
}
/** @param {string} text */
export function utf8Encode(text) {
  const bytes = hasNul(text) ? functions.utf8Encode(JSON.stringify(text), true) : functions.utf8Encode(text, false);
  // The worker answers nothing when the heap has no room for the bytes: the call has hit its
  // memory limit, and must not go on with an empty body.
  if (bytes === undefined) throw new RangeError("out of memory: the text's bytes do not fit in the policy's heap");
  return bytes;
}
/**
 * @param {ArrayBuffer} buffer
 * @param {boolean} fatal
 * @param {boolean} ignoreBOM
 * @returns {string | undefined}
 */
export function utf8Decode(buffer, fatal, ignoreBOM) {
  const text = functions.utf8Decode(buffer, fatal, ignoreBOM);
  // Undefined is invalid UTF-8 only when fatal; otherwise the heap had no room for the text.
  if (text === undefined && !fatal) throw new RangeError("out of memory: the text does not fit in the policy's heap");
  return typeof text === "string" || text === undefined ? text : JSON.parse(text.json);
}
