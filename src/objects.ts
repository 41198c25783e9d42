/**
 * `{ ...base, ...fields }`, built so that V8 keeps one hidden class for every object it makes.
 *
 * On Node 20 (V8 11.3), an object literal that starts with a spread and then adds a property,
 * `{ ...base, key }`, gets a hidden class of its own each time once its function is optimised:
 * about 1 µs a property, a new class for the garbage collector every call, and every place that
 * later reads such objects sees a different class each time and falls back to a generic lookup.
 * One such literal on the request path cost about a quarter of a small proxied GET's CPU (see
 * docs/performance.md, "Object spreads"). `Object.assign` onto an empty literal takes the
 * ordinary shared transitions. eslint refuses the literal form in src/ (outside src/cli and
 * src/config). A clone then assigned to, `o = { ...base }; o.key = 1`, has the same cost and is
 * not caught. Not for dictionaries read from input: Object.assign sets an own `__proto__` key
 * as the prototype, where a spread kept it as a key.
 */
export function withFields<T extends object, U extends object>(base: T, fields: U): Omit<T, keyof U> & U {
  return Object.assign({}, base, fields);
}
