/**
 * `{ ...base, ...fields }`, built so that V8 keeps one hidden class for every object it makes.
 *
 * On Node 20 (V8 11.3), an object literal that starts with a spread and then adds a property,
 * `{ ...base, key }`, gets a hidden class of its own each time once its function is optimised:
 * about 1 µs a property, a new class for the garbage collector every call, and every place that
 * later reads such objects sees a different class each time and falls back to a generic lookup.
 * One such literal on the request path cost about a fifth of a small proxied GET's CPU (see
 * docs/performance.md, "Object spreads"). `Object.assign` onto an empty literal takes the
 * ordinary shared transitions. eslint refuses the literal form in src/.
 */
export function withFields<T extends object, U extends object>(base: T, fields: U): Omit<T, keyof U> & U {
  return Object.assign({}, base, fields);
}
