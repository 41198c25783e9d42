// @ts-check
// URL and URLSearchParams. URLs are parsed by the worker's WHATWG parser, the same one the proxy
// uses; the query's pairs are kept here.
import { parseUrl } from "./host.js";

// --- URLSearchParams -------------------------------------------------------------------------
/** @param {string} text */
function formDecode(text) {
  const plus = text.replace(/\+/g, " ");
  try {
    return decodeURIComponent(plus);
  } catch {
    // A stray % stays as written, as the WHATWG parser leaves it.
    return plus.replace(/(%[0-9A-Fa-f]{2})+/g, (run) => {
      try {
        return decodeURIComponent(run);
      } catch {
        return run;
      }
    });
  }
}
/** @param {string} text */
function formEncode(text) {
  return encodeURIComponent(text)
    .replace(/[!'()~]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)
    .replace(/%20/g, "+");
}

export class URLSearchParams {
  /** @type {[string, string][]} */
  #pairs = [];
  /** @type {URL | null} */
  #owner = null;
  /** @param {any} [init] a query string, a URLSearchParams, an iterable of pairs, or a record */
  constructor(init) {
    if (init === undefined || init === null) return;
    if (init instanceof URLSearchParams) {
      this.#pairs = init.#pairs.map((pair) => [pair[0], pair[1]]);
    } else if (typeof init === "object" && typeof init[Symbol.iterator] === "function") {
      for (const pair of init) {
        const entry = Array.from(pair);
        if (entry.length !== 2) throw new TypeError("a URLSearchParams init pair must have two elements");
        this.#pairs.push([String(entry[0]), String(entry[1])]);
      }
    } else if (typeof init === "object") {
      for (const key of Object.keys(init)) this.#pairs.push([key, String(init[key])]);
    } else {
      this.#parse(String(init));
    }
  }
  /** @param {string} text */
  #parse(text) {
    this.#pairs = [];
    const query = text.startsWith("?") ? text.slice(1) : text;
    for (const part of query.split("&")) {
      if (part === "") continue;
      const eq = part.indexOf("=");
      const name = eq === -1 ? part : part.slice(0, eq);
      const value = eq === -1 ? "" : part.slice(eq + 1);
      this.#pairs.push([formDecode(name), formDecode(value)]);
    }
  }
  #update() {
    if (this.#owner !== null) setUrlPart(this.#owner, "search", this.toString());
  }
  get size() {
    return this.#pairs.length;
  }
  /**
   * @param {unknown} name
   * @param {unknown} value
   */
  append(name, value) {
    this.#pairs.push([String(name), String(value)]);
    this.#update();
  }
  /**
   * @param {unknown} name
   * @param {unknown} [value]
   */
  delete(name, value) {
    const n = String(name);
    this.#pairs = this.#pairs.filter((pair) => pair[0] !== n || (value !== undefined && pair[1] !== String(value)));
    this.#update();
  }
  /** @param {unknown} name */
  get(name) {
    const pair = this.#pairs.find((p) => p[0] === String(name));
    return pair === undefined ? null : pair[1];
  }
  /** @param {unknown} name */
  getAll(name) {
    return this.#pairs.filter((p) => p[0] === String(name)).map((p) => p[1]);
  }
  /**
   * @param {unknown} name
   * @param {unknown} [value]
   */
  has(name, value) {
    return this.#pairs.some((p) => p[0] === String(name) && (value === undefined || p[1] === String(value)));
  }
  /**
   * @param {unknown} name
   * @param {unknown} value
   */
  set(name, value) {
    const n = String(name);
    const i = this.#pairs.findIndex((p) => p[0] === n);
    this.#pairs = this.#pairs.filter((p, j) => p[0] !== n || j === i);
    if (i === -1) this.#pairs.push([n, String(value)]);
    else this.#pairs[i][1] = String(value);
    this.#update();
  }
  sort() {
    this.#pairs.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    this.#update();
  }
  /**
   * @param {(value: string, name: string, params: URLSearchParams) => void} callback
   * @param {unknown} [thisArg]
   */
  forEach(callback, thisArg) {
    for (const [name, value] of this.#pairs) callback.call(thisArg, value, name, this);
  }
  *entries() {
    for (const [name, value] of this.#pairs) yield [name, value];
  }
  *keys() {
    for (const [name] of this.#pairs) yield name;
  }
  *values() {
    for (const [, value] of this.#pairs) yield value;
  }
  [Symbol.iterator]() {
    return this.entries();
  }
  toString() {
    return this.#pairs.map(([name, value]) => `${formEncode(name)}=${formEncode(value)}`).join("&");
  }
  get [Symbol.toStringTag]() {
    return "URLSearchParams";
  }
  /**
   * @param {URLSearchParams} params
   * @param {URL} owner
   * @param {string} search
   */
  static attach(params, owner, search) {
    params.#parse(search);
    params.#owner = owner;
  }
  /**
   * @param {URLSearchParams} params
   * @param {string} search
   */
  static reparse(params, search) {
    params.#parse(search);
  }
}

// --- URL: parsed by the worker's WHATWG parser, the same one the proxy uses ----------------
/** @typedef {Record<string, string>} UrlParts the WHATWG parts, by name (`urlParts`) */
/** @typedef {{ parts: UrlParts, params: URLSearchParams | null }} UrlState */
/** @type {WeakMap<URL, UrlState>} */
const urlState = new WeakMap();
const urlParts = ["href", "origin", "protocol", "username", "password", "host", "hostname", "port", "pathname", "search", "hash"];
/** The worker answers with the parts joined by LF, which a serialised URL never contains (the string crosses into QuickJS as a C string, so NUL cannot be used). */
/** @param {string} joined */
function partsOf(joined) {
  const values = joined.split("\n");
  /** @type {UrlParts} */
  const parts = {};
  for (let i = 0; i < urlParts.length; i++) parts[urlParts[i]] = values[i];
  return parts;
}
/**
 * The proxy hands the policy URLs it has already serialised with the same WHATWG parser, and
 * parsing a serialised http(s) URL gives back its own parts. So `new URL(request.url)`, the
 * most common call in a policy, is split here, without a round trip to the worker.
 */
let canonicalHref = "";
/** @param {string} href the URL of the call's request */
export function setCanonicalHref(href) {
  canonicalHref = href;
}
const canonicalShape = /^(https?:)\/\/(?:([^:@/]*)(?::([^@/]*))?@)?([a-z0-9.-]+|\[[0-9a-f:.]+\])(?::(\d+))?(\/[^?#]*)(\?[^#]*)?(#.*)?$/;
/**
 * @param {string} href
 * @returns {UrlParts | undefined}
 */
function canonicalParts(href) {
  const m = canonicalShape.exec(href);
  if (m === null) return undefined;
  const protocol = /** @type {string} */ (m[1]);
  const hostname = /** @type {string} */ (m[4]);
  const port = m[5] ?? "";
  const host = port === "" ? hostname : `${hostname}:${port}`;
  return {
    href,
    origin: `${protocol}//${host}`,
    protocol,
    username: m[2] ?? "",
    password: m[3] ?? "",
    host,
    hostname,
    port,
    pathname: /** @type {string} */ (m[6]),
    search: m[7] === undefined || m[7] === "?" ? "" : m[7],
    hash: m[8] === undefined || m[8] === "#" ? "" : m[8],
  };
}
/**
 * @param {unknown} input
 * @param {unknown} [base]
 */
function parseOrThrow(input, base) {
  if (base === undefined && input === canonicalHref) {
    const parts = canonicalParts(input);
    if (parts !== undefined) return parts;
  }
  const parsed = parseUrl(String(input), base === undefined ? undefined : String(base));
  if (parsed === undefined) throw new TypeError(`Invalid URL: ${String(input)}`);
  return partsOf(parsed);
}
export class URL {
  /**
   * @param {unknown} input
   * @param {unknown} [base]
   */
  constructor(input, base) {
    urlState.set(this, { parts: parseOrThrow(input, base), params: null });
  }
  /**
   * @param {unknown} input
   * @param {unknown} [base]
   */
  static canParse(input, base) {
    return parseUrl(String(input), base === undefined ? undefined : String(base)) !== undefined;
  }
  /**
   * @param {unknown} input
   * @param {unknown} [base]
   */
  static parse(input, base) {
    try {
      return new URL(input, base);
    } catch {
      return null;
    }
  }
  get searchParams() {
    const state = /** @type {UrlState} */ (urlState.get(this));
    if (state.params === null) {
      state.params = new URLSearchParams();
      URLSearchParams.attach(state.params, this, state.parts.search);
    }
    return state.params;
  }
  toString() {
    return /** @type {UrlState} */ (urlState.get(this)).parts.href;
  }
  toJSON() {
    return /** @type {UrlState} */ (urlState.get(this)).parts.href;
  }
  get [Symbol.toStringTag]() {
    return "URL";
  }
}
/** A setter: the worker's parser applies the change, as WHATWG's setters do. */
/**
 * @param {URL} url
 * @param {string} part
 * @param {unknown} value
 */
function setUrlPart(url, part, value) {
  const state = /** @type {UrlState} */ (urlState.get(url));
  const parsed = parseUrl(state.parts.href, undefined, part, String(value));
  if (parsed === undefined) return;
  state.parts = partsOf(parsed);
  if (state.params !== null && part !== "search") URLSearchParams.reparse(state.params, state.parts.search);
}
for (const part of urlParts) {
  Object.defineProperty(URL.prototype, part, {
    /** @this {URL} */
    get() {
      return /** @type {UrlState} */ (urlState.get(this)).parts[part];
    },
    set:
      part === "origin"
        ? undefined
        : /**
           * @this {URL}
           * @param {unknown} value
           */
          function (value) {
            setUrlPart(this, part, value);
          },
    enumerable: true,
    configurable: true,
  });
}

