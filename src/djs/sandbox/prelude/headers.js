// @ts-check
// Headers, as WHATWG fetch has them, over one flat list of lowercase names and values.

const tokenChars = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const badValue = /[\0\r\n]/;
// Validated names, lowercased. A pure function's results: nothing a policy can observe or change.
/** @type {Map<string, string>} */
const knownNames = new Map();
/** @param {unknown} name */
function headerName(name) {
  const n = typeof name === "string" ? name : String(name);
  const known = knownNames.get(n);
  if (known !== undefined) return known;
  if (!tokenChars.test(n)) throw new TypeError(`invalid header name: ${JSON.stringify(n)}`);
  const lower = n.toLowerCase();
  if (knownNames.size < 512) knownNames.set(n, lower);
  return lower;
}
/** @param {unknown} value */
function headerValue(value) {
  const v = String(value).replace(/^[\t\n\r ]+|[\t\n\r ]+$/g, "");
  if (badValue.test(v)) throw new TypeError(`invalid header value: ${JSON.stringify(v)}`);
  return v;
}

// The prelude's own access to a Headers' internals: closures, not statics a policy could call.
/** @type {(headers: Headers) => string[]} */
export let headersFlat;
/** @type {(joined: string, immutable?: boolean) => Headers} */
export let headersFromJoined;
/** @type {(headers: Headers) => boolean} */
export let headersDirty;

/**
 * Headers as one flat list, [name, value, name, value, …], lowercase names in arrival order.
 * The proxy's own lists arrive LF-joined and are split on first use: most calls never look.
 */
export class Headers {
  /** @type {string | null} */
  #raw = null;
  /** @type {string[]} */
  #flatList = [];
  #dirty = false;
  #immutable = false;
  /** @param {any} [init] a Headers, an iterable of pairs, or a record; anything a policy passes */
  constructor(init) {
    if (init === undefined || init === null) return;
    if (init instanceof Headers) {
      this.#flat = init.#flat.slice();
    } else if (typeof init[Symbol.iterator] === "function") {
      for (const pair of init) {
        const entry = Array.from(pair);
        if (entry.length !== 2) throw new TypeError("a header init pair must have two elements");
        this.append(entry[0], entry[1]);
      }
    } else if (typeof init === "object") {
      for (const key of Object.keys(init)) this.append(key, init[key]);
    } else {
      throw new TypeError("Headers init must be an object or an iterable of pairs");
    }
    this.#dirty = false;
  }
  get #flat() {
    if (this.#raw !== null) {
      this.#flatList = this.#raw === "" ? [] : this.#raw.split("\n");
      this.#raw = null;
    }
    return this.#flatList;
  }
  /** @param {string[]} list */
  set #flat(list) {
    this.#raw = null;
    this.#flatList = list;
  }
  #write() {
    if (this.#immutable) throw new TypeError("these headers are immutable");
    this.#dirty = true;
  }
  /** @param {string} n */
  #without(n) {
    const kept = [];
    const flat = this.#flat;
    for (let i = 0; i < flat.length; i += 2) if (flat[i] !== n) kept.push(flat[i], flat[i + 1]);
    return kept;
  }
  /**
   * @param {unknown} name
   * @param {unknown} value
   */
  append(name, value) {
    const n = headerName(name);
    const v = headerValue(value);
    this.#write();
    this.#flat.push(n, v);
  }
  /**
   * @param {unknown} name
   * @param {unknown} value
   */
  set(name, value) {
    const n = headerName(name);
    const v = headerValue(value);
    this.#write();
    const flat = this.#flat;
    let i = 0;
    while (i < flat.length && flat[i] !== n) i += 2;
    if (i === flat.length) {
      flat.push(n, v);
      return;
    }
    // The first occurrence keeps its place and takes the value; later ones go.
    const rest = [];
    for (let j = i + 2; j < flat.length; j += 2) if (flat[j] !== n) rest.push(flat[j], flat[j + 1]);
    flat.length = i + 2;
    flat[i + 1] = v;
    for (const item of rest) flat.push(item);
  }
  /** @param {unknown} name */
  delete(name) {
    const n = headerName(name);
    this.#write();
    this.#flat = this.#without(n);
  }
  /** @param {unknown} name */
  get(name) {
    const n = headerName(name);
    const flat = this.#flat;
    let found = null;
    for (let i = 0; i < flat.length; i += 2) {
      if (flat[i] === n) found = found === null ? flat[i + 1] : `${found}, ${flat[i + 1]}`;
    }
    return found;
  }
  getSetCookie() {
    const out = [];
    const flat = this.#flat;
    for (let i = 0; i < flat.length; i += 2) if (flat[i] === "set-cookie") out.push(flat[i + 1]);
    return out;
  }
  /** @param {unknown} name */
  has(name) {
    const n = headerName(name);
    const flat = this.#flat;
    for (let i = 0; i < flat.length; i += 2) if (flat[i] === n) return true;
    return false;
  }
  *entries() {
    // WHATWG order: sorted by name, repeated names combined, except Set-Cookie.
    /** @type {string[]} */
    const names = [];
    for (let i = 0; i < this.#flat.length; i += 2) if (!names.includes(this.#flat[i])) names.push(this.#flat[i]);
    names.sort();
    for (const name of names) {
      if (name === "set-cookie") for (const cookie of this.getSetCookie()) yield [name, cookie];
      else yield [name, /** @type {string} */ (this.get(name))];
    }
  }
  *keys() {
    for (const [name] of this.entries()) yield name;
  }
  *values() {
    for (const [, value] of this.entries()) yield value;
  }
  /**
   * @param {(value: string, name: string, headers: Headers) => void} callback
   * @param {unknown} [thisArg]
   */
  forEach(callback, thisArg) {
    for (const [name, value] of this.entries()) callback.call(thisArg, value, name, this);
  }
  [Symbol.iterator]() {
    return this.entries();
  }
  get [Symbol.toStringTag]() {
    return "Headers";
  }
  static {
    headersFlat = (headers) => headers.#flat.slice();
    /** The proxy's own list, LF-joined: already valid and lowercase, so taken as it is. */
    headersFromJoined = (joined, immutable) => {
      const headers = new Headers();
      headers.#raw = joined;
      headers.#immutable = immutable === true;
      return headers;
    };
    headersDirty = (headers) => headers.#dirty;
  }
}

