// Generated from src/djs/sandbox/prelude/*.js by src/djs/build-prelude.ts (npm run build:prelude): edit
// those modules, not this file. test/unit/djs-prelude.test.ts fails while the two differ.
//
// The tier-2 sandbox's own API, evaluated once inside each QuickJS context (never in Node). Its
// value is a function of `host`, the few functions the worker provides; calling it installs the
// web classes a policy may use and returns the functions the worker calls (entry.js).
(function installSandbox(host) {
"use strict";
var __defProp = Object.defineProperty;
var __name = (target, value) => __defProp(target, "name", { value, configurable: true });

// src/djs/sandbox/prelude/blocked-error.js
var HttpRequestBlockedError = class extends Error {
  static {
    __name(this, "HttpRequestBlockedError");
  }
  // Without a statusText, the proxy sends the status's own reason phrase (451 Unavailable For Legal Reasons).
  constructor(message = "request blocked by policy", status = 403, statusText = status === 403 ? "Forbidden" : "") {
    super(String(message));
    this.name = "HttpRequestBlockedError";
    if (!Number.isInteger(status) || status < 400 || status > 599) {
      throw new RangeError(`HttpRequestBlockedError: status must be an integer from 400 to 599, got ${status}`);
    }
    this.status = status;
    this.statusText = statusText;
  }
};

// src/djs/sandbox/prelude/host.js
var functions;
function setHost(worker) {
  functions = worker;
}
__name(setHost, "setHost");
var hasNul = /* @__PURE__ */ __name((text) => text.indexOf("\0") !== -1, "hasNul");
function parseUrl(input, base, part, value) {
  if (hasNul(input) || base !== void 0 && hasNul(base) || value !== void 0 && hasNul(value)) {
    return functions.parseUrl(JSON.stringify([input, base ?? null, part ?? null, value ?? null]), void 0, void 0, void 0, true);
  }
  return functions.parseUrl(input, base, part, value);
}
__name(parseUrl, "parseUrl");
function utf8Encode(text) {
  const bytes = hasNul(text) ? functions.utf8Encode(JSON.stringify(text), true) : functions.utf8Encode(text, false);
  if (bytes === void 0) throw new RangeError("out of memory: the text's bytes do not fit in the policy's heap");
  return bytes;
}
__name(utf8Encode, "utf8Encode");
function utf8Decode(buffer, fatal, ignoreBOM) {
  const text = functions.utf8Decode(buffer, fatal, ignoreBOM);
  if (text === void 0 && !fatal) throw new RangeError("out of memory: the text does not fit in the policy's heap");
  return typeof text === "string" || text === void 0 ? text : JSON.parse(text.json);
}
__name(utf8Decode, "utf8Decode");

// src/djs/sandbox/prelude/encoding.js
function toBytes(data) {
  if (data instanceof Uint8Array) return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  throw new TypeError("expected an ArrayBuffer or a typed array");
}
__name(toBytes, "toBytes");
function copyBuffer(bytes) {
  return (
    /** @type {ArrayBuffer} */
    bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength)
  );
}
__name(copyBuffer, "copyBuffer");
var TextEncoder = class {
  static {
    __name(this, "TextEncoder");
  }
  get encoding() {
    return "utf-8";
  }
  /** @param {unknown} [text] */
  encode(text = "") {
    return new Uint8Array(utf8Encode(String(text)));
  }
};
var TextDecoder = class {
  static {
    __name(this, "TextDecoder");
  }
  /** @type {boolean} */
  #fatal;
  /** @type {boolean} */
  #bom;
  /**
   * @param {unknown} [label]
   * @param {{ fatal?: unknown, ignoreBOM?: unknown }} [options]
   */
  constructor(label = "utf-8", options = {}) {
    const l = String(label).trim().toLowerCase();
    if (l !== "utf-8" && l !== "utf8" && l !== "unicode-1-1-utf-8") throw new RangeError(`only UTF-8 is supported, not ${label}`);
    this.#fatal = options.fatal === true;
    this.#bom = options.ignoreBOM === true;
  }
  get encoding() {
    return "utf-8";
  }
  get fatal() {
    return this.#fatal;
  }
  get ignoreBOM() {
    return this.#bom;
  }
  /** @param {unknown} [data] */
  decode(data) {
    if (data === void 0) return "";
    const text = utf8Decode(copyBuffer(toBytes(data)), this.#fatal, this.#bom);
    if (text === void 0) throw new TypeError("the data is not valid UTF-8");
    return text;
  }
};
var b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
function btoa(data) {
  const s = String(data);
  let out = "";
  for (let i = 0; i < s.length; i += 3) {
    const a = s.charCodeAt(i);
    const b = s.charCodeAt(i + 1);
    const c = s.charCodeAt(i + 2);
    if (a > 255 || b > 255 || c > 255) throw new DOMException("btoa: the string contains characters outside Latin-1", "InvalidCharacterError");
    const n = a << 16 | (b || 0) << 8 | (c || 0);
    out += b64[n >> 18] + b64[n >> 12 & 63] + (i + 1 < s.length ? b64[n >> 6 & 63] : "=") + (i + 2 < s.length ? b64[n & 63] : "=");
  }
  return out;
}
__name(btoa, "btoa");
function atob(data) {
  let s = String(data).replace(/[\t\n\f\r ]/g, "");
  if (s.length % 4 === 0) s = s.replace(/==?$/, "");
  if (s.length % 4 === 1 || /[^A-Za-z0-9+/]/.test(s)) throw new DOMException("atob: the string is not valid base64", "InvalidCharacterError");
  let out = "";
  let bits = 0;
  let buffer = 0;
  for (const ch of s) {
    buffer = buffer << 6 | b64.indexOf(ch);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += String.fromCharCode(buffer >> bits & 255);
    }
  }
  return out;
}
__name(atob, "atob");
var DOMException = class extends Error {
  static {
    __name(this, "DOMException");
  }
  constructor(message = "", name = "Error") {
    super(message);
    Object.defineProperty(this, "name", { value: name, configurable: true, writable: true });
  }
};

// src/djs/sandbox/prelude/url.js
function formDecode(text) {
  const plus = text.replace(/\+/g, " ");
  try {
    return decodeURIComponent(plus);
  } catch {
    return plus.replace(/(%[0-9A-Fa-f]{2})+/g, (run) => {
      try {
        return decodeURIComponent(run);
      } catch {
        return run;
      }
    });
  }
}
__name(formDecode, "formDecode");
function formEncode(text) {
  return encodeURIComponent(text).replace(/[!'()~]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`).replace(/%20/g, "+");
}
__name(formEncode, "formEncode");
var URLSearchParams = class _URLSearchParams {
  static {
    __name(this, "URLSearchParams");
  }
  /** @type {[string, string][]} */
  #pairs = [];
  /** @type {URL | null} */
  #owner = null;
  /** @param {any} [init] a query string, a URLSearchParams, an iterable of pairs, or a record */
  constructor(init) {
    if (init === void 0 || init === null) return;
    if (init instanceof _URLSearchParams) {
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
    this.#pairs = this.#pairs.filter((pair) => pair[0] !== n || value !== void 0 && pair[1] !== String(value));
    this.#update();
  }
  /** @param {unknown} name */
  get(name) {
    const pair = this.#pairs.find((p) => p[0] === String(name));
    return pair === void 0 ? null : pair[1];
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
    return this.#pairs.some((p) => p[0] === String(name) && (value === void 0 || p[1] === String(value)));
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
    this.#pairs.sort((a, b) => a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0);
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
};
var urlState = /* @__PURE__ */ new WeakMap();
var urlParts = ["href", "origin", "protocol", "username", "password", "host", "hostname", "port", "pathname", "search", "hash"];
function partsOf(joined) {
  const values = joined.split("\n");
  const parts = {};
  for (let i = 0; i < urlParts.length; i++) parts[urlParts[i]] = values[i];
  return parts;
}
__name(partsOf, "partsOf");
var canonicalHref = "";
function setCanonicalHref(href) {
  canonicalHref = href;
}
__name(setCanonicalHref, "setCanonicalHref");
var canonicalShape = /^(https?:)\/\/(?:([^:@/]*)(?::([^@/]*))?@)?([a-z0-9.-]+|\[[0-9a-f:.]+\])(?::(\d+))?(\/[^?#]*)(\?[^#]*)?(#.*)?$/;
function canonicalParts(href) {
  const m = canonicalShape.exec(href);
  if (m === null) return void 0;
  const protocol = (
    /** @type {string} */
    m[1]
  );
  const hostname = (
    /** @type {string} */
    m[4]
  );
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
    pathname: (
      /** @type {string} */
      m[6]
    ),
    search: m[7] === void 0 || m[7] === "?" ? "" : m[7],
    hash: m[8] === void 0 || m[8] === "#" ? "" : m[8]
  };
}
__name(canonicalParts, "canonicalParts");
function parseOrThrow(input, base) {
  if (base === void 0 && input === canonicalHref) {
    const parts = canonicalParts(input);
    if (parts !== void 0) return parts;
  }
  const parsed = parseUrl(String(input), base === void 0 ? void 0 : String(base));
  if (parsed === void 0) throw new TypeError(`Invalid URL: ${String(input)}`);
  return partsOf(parsed);
}
__name(parseOrThrow, "parseOrThrow");
var URL = class _URL {
  static {
    __name(this, "URL");
  }
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
    return parseUrl(String(input), base === void 0 ? void 0 : String(base)) !== void 0;
  }
  /**
   * @param {unknown} input
   * @param {unknown} [base]
   */
  static parse(input, base) {
    try {
      return new _URL(input, base);
    } catch {
      return null;
    }
  }
  get searchParams() {
    const state = (
      /** @type {UrlState} */
      urlState.get(this)
    );
    if (state.params === null) {
      state.params = new URLSearchParams();
      URLSearchParams.attach(state.params, this, state.parts.search);
    }
    return state.params;
  }
  toString() {
    return (
      /** @type {UrlState} */
      urlState.get(this).parts.href
    );
  }
  toJSON() {
    return (
      /** @type {UrlState} */
      urlState.get(this).parts.href
    );
  }
  get [Symbol.toStringTag]() {
    return "URL";
  }
};
function setUrlPart(url, part, value) {
  const state = (
    /** @type {UrlState} */
    urlState.get(url)
  );
  const parsed = parseUrl(state.parts.href, void 0, part, String(value));
  if (parsed === void 0) return;
  state.parts = partsOf(parsed);
  if (state.params !== null && part !== "search") URLSearchParams.reparse(state.params, state.parts.search);
}
__name(setUrlPart, "setUrlPart");
for (const part of urlParts) {
  Object.defineProperty(URL.prototype, part, {
    /** @this {URL} */
    get() {
      return (
        /** @type {UrlState} */
        urlState.get(this).parts[part]
      );
    },
    set: part === "origin" ? void 0 : (
      /**
       * @this {URL}
       * @param {unknown} value
       */
      function(value) {
        setUrlPart(this, part, value);
      }
    ),
    enumerable: true,
    configurable: true
  });
}

// src/djs/sandbox/prelude/bodies.js
var turn = { request: void 0, response: void 0, needed: null, next: null, replayable: false };
function startTurn(request, response) {
  turn = { request, response, needed: null, next: null, replayable: false };
  return turn;
}
__name(startTurn, "startTurn");
function need(source) {
  if (bodyBytes(source) === void 0) (turn.needed ??= /* @__PURE__ */ new Set()).add(source);
}
__name(need, "need");
function holdRequest() {
  if (turn.request === void 0 && !turn.replayable) (turn.needed ??= /* @__PURE__ */ new Set()).add("held");
}
__name(holdRequest, "holdRequest");
function bodyBytes(source) {
  return typeof source === "number" ? turn.next?.[source] : turn[source];
}
__name(bodyBytes, "bodyBytes");
var handleSource = /* @__PURE__ */ new WeakMap();
var OpaqueBody = class {
  static {
    __name(this, "OpaqueBody");
  }
  constructor() {
    throw new TypeError("bodies cannot be constructed; pass request.body or response.body on");
  }
  get locked() {
    return false;
  }
  get [Symbol.toStringTag]() {
    return "ReadableStream";
  }
};
function opaque(state, owner) {
  const handle = Object.create(OpaqueBody.prototype);
  handleSource.set(handle, { state, owner });
  return Object.freeze(handle);
}
__name(opaque, "opaque");
function bodyFrom(init) {
  if (init === void 0 || init === null) return null;
  if (typeof init === "string") return { bytes: new Uint8Array(utf8Encode(init)), contentType: "text/plain;charset=UTF-8" };
  if (init instanceof URLSearchParams) {
    return { bytes: new Uint8Array(utf8Encode(init.toString())), contentType: "application/x-www-form-urlencoded;charset=UTF-8" };
  }
  if (init instanceof ArrayBuffer || ArrayBuffer.isView(init)) return { bytes: new Uint8Array(copyBuffer(toBytes(init))) };
  const held = handleSource.get(init);
  if (held !== void 0) {
    if (bodyUsed(held.owner)) throw new TypeError("the body was already read; pass on a clone's body instead");
    const { state } = held;
    return state.source !== void 0 ? { source: state.source, turn: state.turn } : { bytes: state.bytes };
  }
  throw new TypeError("a body must be a string, bytes, URLSearchParams, or request.body/response.body");
}
__name(bodyFrom, "bodyFrom");
function readBody(state) {
  if (state === null) return Promise.resolve(new Uint8Array(0));
  if (state.bytes !== void 0) return Promise.resolve(state.bytes);
  if (state.turn !== turn) return Promise.reject(new TypeError("a body from another call cannot be read"));
  const bytes = bodyBytes(state.source);
  if (bytes !== void 0) return Promise.resolve(bytes);
  need(state.source);
  return new Promise(() => void 0);
}
__name(readBody, "readBody");
var bodyInit;
var bodyState;
var bodyUsed;
var bodySent;
var BodyMixin = class {
  static {
    __name(this, "BodyMixin");
  }
  /** @type {BodyState | null} */
  #state = null;
  #used = false;
  static {
    bodyInit = /* @__PURE__ */ __name((target, state) => {
      target.#state = state;
    }, "bodyInit");
    bodyState = /* @__PURE__ */ __name((target) => target.#state, "bodyState");
    bodyUsed = /* @__PURE__ */ __name((target) => target.#used, "bodyUsed");
    bodySent = /* @__PURE__ */ __name((target) => {
      if (target.#state !== null) target.#used = true;
    }, "bodySent");
  }
  get body() {
    const state = this.#state;
    if (state === null) return null;
    return opaque(state, this);
  }
  get bodyUsed() {
    return this.#used;
  }
  #consume() {
    if (this.#used) return Promise.reject(new TypeError("the body has already been read"));
    if (this.#state !== null) this.#used = true;
    return readBody(this.#state);
  }
  async arrayBuffer() {
    return copyBuffer(await this.#consume());
  }
  async bytes() {
    return new Uint8Array(await this.#consume());
  }
  async text() {
    const bytes = await this.#consume();
    return (
      /** @type {string} */
      utf8Decode(copyBuffer(bytes), false, false)
    );
  }
  async json() {
    return JSON.parse(await this.text());
  }
  async formData() {
    throw new TypeError("formData() is not available in policies");
  }
  async blob() {
    throw new TypeError("blob() is not available in policies");
  }
};

// src/djs/sandbox/prelude/clock.js
var OriginalDate = Date;
var clock = 0;
var randomState = 1;
function startClock(now, seed) {
  clock = now;
  randomState = seed >>> 0 || 1;
}
__name(startClock, "startClock");
function SandboxDate(...args) {
  if (new.target === void 0) return new OriginalDate(clock).toString();
  return args.length === 0 ? Reflect.construct(OriginalDate, [clock], new.target) : Reflect.construct(OriginalDate, args, new.target);
}
__name(SandboxDate, "SandboxDate");
SandboxDate.prototype = OriginalDate.prototype;
SandboxDate.now = () => clock;
SandboxDate.parse = OriginalDate.parse;
SandboxDate.UTC = OriginalDate.UTC;
function installClock() {
  Object.defineProperty(OriginalDate.prototype, "constructor", { value: SandboxDate });
  Math.random = /* @__PURE__ */ __name(function random() {
    let x = randomState;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    randomState = x >>> 0;
    return randomState / 4294967296;
  }, "random");
}
__name(installClock, "installClock");

// src/djs/sandbox/prelude/console.js
var logs = [];
function clearLogs() {
  if (logs.length > 0) logs = [];
  callChars = 0;
}
__name(clearLogs, "clearLogs");
var maxLogLines = 100;
var maxLineChars = 65536;
var maxCallChars = 1048576;
var callChars = 0;
function show(value) {
  if (typeof value === "string") return value;
  if (value instanceof Error) return `${value.name}: ${value.message}`;
  try {
    const json = JSON.stringify(value);
    return json === void 0 ? String(value) : json;
  } catch {
    return String(value);
  }
}
__name(show, "show");
function logger(level) {
  return (...args) => {
    if (logs.length >= maxLogLines || callChars >= maxCallChars) return;
    const line = args.map(show).join(" ").slice(0, maxLineChars);
    callChars += line.length;
    logs.push([level, line]);
  };
}
__name(logger, "logger");
var console = {
  log: logger("info"),
  info: logger("info"),
  debug: logger("debug"),
  warn: logger("warn"),
  error: logger("error"),
  trace: logger("debug")
};

// src/djs/sandbox/prelude/headers.js
var tokenChars = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
var badValue = /[\0\r\n]/;
var knownNames = /* @__PURE__ */ new Map();
function headerName(name) {
  const n = typeof name === "string" ? name : String(name);
  const known = knownNames.get(n);
  if (known !== void 0) return known;
  if (!tokenChars.test(n)) throw new TypeError(`invalid header name: ${JSON.stringify(n)}`);
  const lower = n.toLowerCase();
  if (knownNames.size < 512) knownNames.set(n, lower);
  return lower;
}
__name(headerName, "headerName");
function headerValue(value) {
  const v = String(value).replace(/^[\t\n\r ]+|[\t\n\r ]+$/g, "");
  if (badValue.test(v)) throw new TypeError(`invalid header value: ${JSON.stringify(v)}`);
  return v;
}
__name(headerValue, "headerValue");
var headersFlat;
var headersFromJoined;
var headersDirty;
var Headers = class _Headers {
  static {
    __name(this, "Headers");
  }
  /** @type {string | null} */
  #raw = null;
  /** @type {string[]} */
  #flatList = [];
  #dirty = false;
  #immutable = false;
  /** @param {any} [init] a Headers, an iterable of pairs, or a record; anything a policy passes */
  constructor(init) {
    if (init === void 0 || init === null) return;
    if (init instanceof _Headers) {
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
    const names = [];
    for (let i = 0; i < this.#flat.length; i += 2) if (!names.includes(this.#flat[i])) names.push(this.#flat[i]);
    names.sort();
    for (const name of names) {
      if (name === "set-cookie") for (const cookie of this.getSetCookie()) yield [name, cookie];
      else yield [
        name,
        /** @type {string} */
        this.get(name)
      ];
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
    headersFlat = /* @__PURE__ */ __name((headers) => headers.#flat.slice(), "headersFlat");
    headersFromJoined = /* @__PURE__ */ __name((joined, immutable) => {
      const headers = new _Headers();
      headers.#raw = joined;
      headers.#immutable = immutable === true;
      return headers;
    }, "headersFromJoined");
    headersDirty = /* @__PURE__ */ __name((headers) => headers.#dirty, "headersDirty");
  }
};

// src/djs/sandbox/prelude/request-response.js
var methods = /* @__PURE__ */ new Set(["DELETE", "GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"]);
var methodToken = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
var forbiddenMethods = /* @__PURE__ */ new Set(["CONNECT", "TRACE", "TRACK"]);
var internalHead = null;
var Request = class _Request extends BodyMixin {
  static {
    __name(this, "Request");
  }
  /** @type {string} */
  #method;
  /** @type {string} */
  #url;
  /** @type {Headers} */
  #headers;
  /**
   * @param {any} [input] a Request, or a URL
   * @param {any} [init] RequestInit, as a policy passes it
   */
  constructor(input, init = {}) {
    super();
    if (internalHead !== null) {
      this.#method = internalHead.method;
      this.#url = internalHead.url;
      this.#headers = internalHead.headers;
      internalHead = null;
      return;
    }
    let state = null;
    if (input instanceof _Request) {
      if (init.body === void 0 && bodyUsed(input)) throw new TypeError("Request body is already used");
      this.#method = input.method;
      this.#url = input.url;
      this.#headers = new Headers(input.headers);
      state = bodyState(input);
    } else {
      this.#url = new URL(String(input)).href;
      this.#method = "GET";
      this.#headers = new Headers();
    }
    if (init.method !== void 0) {
      const m = String(init.method);
      if (!methodToken.test(m)) throw new TypeError(`invalid method: ${JSON.stringify(m)}`);
      if (forbiddenMethods.has(m.toUpperCase())) throw new TypeError(`forbidden method: ${m}`);
      this.#method = methods.has(m.toUpperCase()) ? m.toUpperCase() : m;
    }
    if (init.headers !== void 0) this.#headers = new Headers(init.headers);
    if (init.body !== void 0) {
      state = bodyFrom(init.body);
      if (state?.contentType !== void 0 && !this.#headers.has("content-type")) this.#headers.set("content-type", state.contentType);
    }
    if (state !== null && (this.#method === "GET" || this.#method === "HEAD")) {
      throw new TypeError("a GET or HEAD request cannot have a body");
    }
    bodyInit(this, state);
  }
  get method() {
    return this.#method;
  }
  get url() {
    return this.#url;
  }
  get headers() {
    return this.#headers;
  }
  get redirect() {
    return "manual";
  }
  clone() {
    if (this.bodyUsed) throw new TypeError("cannot clone a Request whose body was read");
    const state = bodyState(this);
    if (turn.next !== null && state?.source === "request" && state.turn === turn) holdRequest();
    return new _Request(this);
  }
  get [Symbol.toStringTag]() {
    return "Request";
  }
};
var internalResponse = null;
var Response = class _Response extends BodyMixin {
  static {
    __name(this, "Response");
  }
  /** @type {number} */
  #status;
  /** @type {string} */
  #statusText;
  /** @type {Headers} */
  #headers;
  #url = "";
  /**
   * @param {unknown} [body]
   * @param {any} [init] ResponseInit, as a policy passes it
   */
  constructor(body = null, init = {}) {
    super();
    if (internalResponse !== null) {
      const head = internalResponse;
      internalResponse = null;
      this.#status = head.status;
      this.#statusText = head.statusText;
      this.#headers = head.headers;
      this.#url = head.url;
      return;
    }
    const status = init.status === void 0 ? 200 : Number(init.status);
    if (!Number.isInteger(status) || status < 200 || status > 599) throw new RangeError(`invalid response status: ${init.status}`);
    const statusText = init.statusText === void 0 ? "" : String(init.statusText);
    if (/[^\t\x20-\x7e\x80-\xff]/.test(statusText)) throw new TypeError("invalid statusText");
    this.#status = status;
    this.#statusText = statusText;
    this.#headers = new Headers(init.headers);
    const state = bodyFrom(body);
    if (state !== null && (status === 204 || status === 205 || status === 304)) {
      throw new TypeError(`a ${status} response cannot have a body`);
    }
    if (state?.contentType !== void 0 && !this.#headers.has("content-type")) this.#headers.set("content-type", state.contentType);
    bodyInit(this, state);
  }
  /**
   * @param {unknown} data
   * @param {any} [init]
   */
  static json(data, init = {}) {
    const text = JSON.stringify(data);
    if (text === void 0) throw new TypeError("the value cannot be serialised as JSON");
    const headers = new Headers(init.headers);
    if (!headers.has("content-type")) headers.set("content-type", "application/json");
    return new _Response(text, { ...init, headers });
  }
  /**
   * @param {unknown} url
   * @param {number} [status]
   */
  static redirect(url, status = 302) {
    if (![301, 302, 303, 307, 308].includes(status)) throw new RangeError(`invalid redirect status: ${status}`);
    return new _Response(null, { status, headers: { location: new URL(String(url)).href } });
  }
  static error() {
    throw new TypeError("Response.error() cannot be sent to a guest; throw HttpRequestBlockedError instead");
  }
  get status() {
    return this.#status;
  }
  get statusText() {
    return this.#statusText;
  }
  get ok() {
    return this.#status >= 200 && this.#status < 300;
  }
  get headers() {
    return this.#headers;
  }
  get redirected() {
    return false;
  }
  get url() {
    return this.#url;
  }
  get type() {
    return "default";
  }
  clone() {
    if (this.bodyUsed) throw new TypeError("cannot clone a Response whose body was read");
    const copy = new _Response(null, { status: this.#status, statusText: this.#statusText, headers: this.#headers });
    copy.#url = this.#url;
    bodyInit(copy, bodyState(this));
    return copy;
  }
  get [Symbol.toStringTag]() {
    return "Response";
  }
};
function makeRequest(method, url, headers, hasBody) {
  internalHead = { method, url, headers: headersFromJoined(headers, false) };
  const request = new Request();
  bodyInit(request, hasBody ? { source: "request", turn } : null);
  return request;
}
__name(makeRequest, "makeRequest");
function makeResponse(status, statusText, headers, url, hasBody, source = "response") {
  internalResponse = { status, statusText, url, headers: headersFromJoined(headers, false) };
  const response = new Response();
  bodyInit(response, hasBody ? { source, turn } : null);
  return response;
}
__name(makeResponse, "makeResponse");

// src/djs/sandbox/prelude/layer.js
var layer = null;
var never = /* @__PURE__ */ __name(() => new Promise(() => void 0), "never");
function startLayer(journalJson) {
  layer = {
    turn,
    journal: journalJson === void 0 ? [] : JSON.parse(journalJson),
    count: 0,
    responses: [],
    rejections: /* @__PURE__ */ new WeakMap(),
    effect: null,
    effectBytes: null,
    diverged: null,
    streamed: false
  };
}
__name(startLayer, "startLayer");
function current() {
  return layer !== null && layer.turn === turn ? layer : null;
}
__name(current, "current");
function layerStop() {
  const state = current();
  if (state === null) return null;
  if (state.diverged !== null) return { t: "diverged", what: state.diverged };
  return state.effect;
}
__name(layerStop, "layerStop");
function effectBytes() {
  return current()?.effectBytes ?? null;
}
__name(effectBytes, "effectBytes");
function layerDivergence() {
  const state = current();
  if (state === null) return null;
  if (state.diverged !== null) return state.diverged;
  if (state.count < state.journal.length) return `it answered after ${state.count} of the ${state.journal.length} next() and sleep() calls the first run made`;
  return null;
}
__name(layerDivergence, "layerDivergence");
function passedIndex(value, unchanged) {
  const state = current();
  if (state === null || !(value instanceof Response)) return -1;
  const i = state.responses.indexOf(value);
  return i >= 0 && unchanged(value) ? i : -1;
}
__name(passedIndex, "passedIndex");
function rejectionIndex(error) {
  const state = current();
  if (state === null || typeof error !== "object" || error === null) return void 0;
  return state.rejections.get(error);
}
__name(rejectionIndex, "rejectionIndex");
function fingerprint(bytes) {
  let hash = 2166136261;
  const step = Math.max(1, Math.floor(bytes.length / 4096));
  for (let i = 0; i < bytes.length; i += step) {
    hash ^= /** @type {number} */
    bytes[i];
    hash = Math.imul(hash, 16777619);
  }
  return `${bytes.length}:${(hash >>> 0).toString(16)}`;
}
__name(fingerprint, "fingerprint");
function rejectionError(rej) {
  if (rej.blocked) return new HttpRequestBlockedError(rej.message, rej.status, rej.statusText);
  const error = new Error(rej.message);
  error.name = rej.name;
  error.status = rej.status;
  error.code = rej.code;
  return error;
}
__name(rejectionError, "rejectionError");
function effect(state, kind, sig, describe, bytes) {
  const i = state.count++;
  const entry = state.journal[i];
  if (entry === void 0) {
    if (state.effect === null && state.diverged === null) {
      state.effect = describe(i);
      state.effectBytes = bytes;
    }
    return never();
  }
  if (entry.k !== kind || entry.sig !== sig) {
    state.diverged ??= `its effect number ${i} was ${entry.sig} in the run the proxy acted on, and is ${sig} now`;
    return never();
  }
  if (entry.rej !== void 0) {
    const error = rejectionError(entry.rej);
    state.rejections.set(error, i);
    return Promise.reject(error);
  }
  if (kind === "sleep") return Promise.resolve(void 0);
  const head = (
    /** @type {ResponseHead} */
    entry.res
  );
  const response = makeResponse(head.status, head.statusText, head.headers, head.url, head.hasBody, i);
  state.responses[i] = response;
  return Promise.resolve(response);
}
__name(effect, "effect");
function makeNext(own) {
  const mine = turn;
  return /* @__PURE__ */ __name(function next(input) {
    const state = current();
    if (state === null || turn !== mine) return Promise.reject(new TypeError("next() belongs to a call that has ended"));
    const chosen = input === void 0 ? own : input;
    if (!(chosen instanceof Request)) return Promise.reject(new TypeError("next() takes a Request, or nothing for the layer's own request"));
    if (chosen.bodyUsed) {
      return Promise.reject(new TypeError("next() was given a Request whose body was already read or sent; pass request.clone() to next() to send a body more than once"));
    }
    const bodyOf = bodyState(chosen);
    let body = null;
    let bodySig = null;
    let bytes = null;
    if (bodyOf !== null) {
      if (bodyOf.bytes !== void 0) {
        bytes = bodyOf.bytes;
        body = { b: bytes.byteLength };
        bodySig = fingerprint(bytes);
      } else if (bodyOf.turn !== turn) {
        return Promise.reject(new TypeError("a body from another call cannot be sent"));
      } else if (bodyOf.source === "request") {
        const once = turn.request === void 0 && !turn.replayable;
        if (once && state.streamed) {
          return Promise.reject(
            new TypeError("next() was given the request's body, which an earlier next() already streamed upstream; pass request.clone() to each next() to send a body more than once")
          );
        }
        if (once) state.streamed = true;
        body = { h: "request" };
        bodySig = "request";
      } else if (typeof bodyOf.source === "number") {
        body = { n: bodyOf.source };
        bodySig = `next:${bodyOf.source}`;
      } else {
        return Promise.reject(new TypeError("next() cannot send this body"));
      }
      bodySent(chosen);
    }
    const method = chosen.method;
    const url = chosen.url;
    const headers = headersFlat(chosen.headers);
    const sig = JSON.stringify(["next", method, url, headers, bodySig]);
    return effect(state, "next", sig, (i) => ({ t: "effect", k: "next", i, sig, method, url, headers, body }), bytes);
  }, "next");
}
__name(makeNext, "makeNext");
function sleep(ms) {
  const state = current();
  if (state === null) return Promise.reject(new TypeError("sleep() is only available while handle(request, next) runs"));
  const wait = Number(ms);
  if (!Number.isFinite(wait) || wait < 0) return Promise.reject(new RangeError(`sleep() takes a number of milliseconds from 0 up, not ${String(ms)}`));
  const sig = JSON.stringify(["sleep", wait]);
  return effect(state, "sleep", sig, (i) => ({ t: "effect", k: "sleep", i, sig, ms: wait }), null);
}
__name(sleep, "sleep");

// src/djs/sandbox/prelude/realm.js
var hasOwn = Object.prototype.hasOwnProperty;
var installed = {
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
  sleep
};
function installGlobals() {
  for (const name of Object.keys(installed)) {
    Object.defineProperty(globalThis, name, { value: installed[name], writable: true, configurable: true, enumerable: false });
  }
  for (const name of ["dispose", "asyncDispose"]) {
    if (!hasOwn.call(Symbol, name)) Object.defineProperty(Symbol, name, { value: /* @__PURE__ */ Symbol.for(`Symbol.${name}`), writable: false, enumerable: false, configurable: false });
  }
  delete globalThis.FinalizationRegistry;
}
__name(installGlobals, "installGlobals");
function tame(proto, keys) {
  for (const key of keys) {
    const desc = Object.getOwnPropertyDescriptor(proto, key);
    if (desc === void 0 || !hasOwn.call(desc, "value")) continue;
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
      configurable: false
    });
  }
}
__name(tame, "tame");
function tameBuiltins() {
  tame(Object.prototype, Object.getOwnPropertyNames(Object.prototype));
  tame(Function.prototype, ["constructor", "toString", "name"]);
  tame(Array.prototype, ["constructor", "toString"]);
  tame(Promise.prototype, ["constructor"]);
  const errors = [Error, TypeError, RangeError, SyntaxError, ReferenceError, EvalError, URIError, globalThis.InternalError, globalThis.AggregateError];
  for (const E of errors) if (typeof E === "function") tame(E.prototype, ["name", "message", "constructor", "toString"]);
}
__name(tameBuiltins, "tameBuiltins");
function freeze() {
  tameBuiltins();
  const seen = /* @__PURE__ */ new WeakSet();
  const hidden = [
    Object.getPrototypeOf([][Symbol.iterator]()),
    Object.getPrototypeOf((/* @__PURE__ */ new Map())[Symbol.iterator]()),
    Object.getPrototypeOf((/* @__PURE__ */ new Set())[Symbol.iterator]()),
    Object.getPrototypeOf(""[Symbol.iterator]()),
    Object.getPrototypeOf("".matchAll(/(?:)/g)),
    Object.getPrototypeOf(function* () {
    }),
    Object.getPrototypeOf(async function() {
    }),
    Object.getPrototypeOf(async function* () {
    }),
    Object.getPrototypeOf((function* () {
    })()),
    Object.getPrototypeOf((async function* () {
    })()),
    Object.getOwnPropertyDescriptor(Function.prototype, "caller")?.get,
    // The iterator helpers' prototypes, where this QuickJS has them.
    typeof globalThis.Iterator?.prototype?.map === "function" ? Object.getPrototypeOf([].values().map((x) => x)) : void 0,
    typeof globalThis.Iterator?.from === "function" ? Object.getPrototypeOf(Iterator.from(
      /** @type {any} */
      { next: /* @__PURE__ */ __name(() => ({ done: true }), "next") }
    )) : void 0,
    // The prelude's own classes that no global leads to.
    OpaqueBody
  ];
  const stack = [globalThis, ...hidden];
  while (stack.length > 0) {
    const value = stack.pop();
    if (typeof value !== "object" && typeof value !== "function" || value === null || seen.has(value)) continue;
    seen.add(value);
    for (const key of Reflect.ownKeys(value)) {
      const desc = Object.getOwnPropertyDescriptor(value, key);
      if (desc === void 0) continue;
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
__name(freeze, "freeze");

// src/djs/sandbox/prelude/entry.js
var factory = null;
var outcome;
var stash = null;
function serialiseBody(state) {
  if (state === null) return null;
  if (typeof state.source === "number") return { n: state.source };
  if (state.source !== void 0) return { h: state.source };
  stash = state.bytes;
  return { b: state.bytes.byteLength };
}
__name(serialiseBody, "serialiseBody");
function thrown(error) {
  try {
    const from = rejectionIndex(error);
    const origin = from === void 0 ? {} : { from };
    if (error instanceof HttpRequestBlockedError) {
      return { t: "blocked", status: Number(error.status), message: String(error.message), statusText: String(error.statusText), ...origin };
    }
    if (error instanceof Error) return { t: "throw", name: String(error.name), message: String(error.message), stack: String(error.stack ?? ""), ...origin };
    return { t: "throw", name: typeof error, message: String(error), stack: "" };
  } catch {
    return { t: "throw", name: "Error", message: "the policy threw a value that cannot be described", stack: "" };
  }
}
__name(thrown, "thrown");
var codes = { false: 0, true: 1, unchanged: 2 };
var pending = -1;
function settle(phase, value, request) {
  if (phase === "handle") return settleLayer(value);
  if (phase === "isRequestAllowed" || phase === "isIpAllowed") {
    return typeof value === "boolean" ? value ? codes.true : codes.false : withShown({ t: "value", v: typeof value }, value);
  }
  if (phase === "onResponse" && value === void 0) return codes.unchanged;
  if (phase === "onRequest" && (value === void 0 || value === request)) {
    const headers = (
      /** @type {Request} */
      request.headers
    );
    const dirty = headersDirty(headers);
    const consumed = bodyUsed(
      /** @type {Request} */
      request
    );
    if (!dirty && !consumed) return codes.unchanged;
    return { t: "continue", headers: dirty ? headersFlat(headers) : null, consumed };
  }
  if (value instanceof Response) {
    if (value.bodyUsed) return { t: "bad", what: "a Response whose body was already read" };
    return {
      t: "response",
      status: value.status,
      statusText: value.statusText,
      headers: headersFlat(value.headers),
      body: serialiseBody(bodyState(value))
    };
  }
  if (phase === "onRequest" && value instanceof Request) {
    if (value.bodyUsed) return { t: "bad", what: "a Request whose body was already read; return request.clone() instead" };
    return {
      t: "request",
      method: value.method,
      url: value.url,
      headers: headersFlat(value.headers),
      body: serialiseBody(bodyState(value))
    };
  }
  return value === null ? { t: "bad", what: "null" } : withShown({ t: "bad", what: typeof value }, value);
}
__name(settle, "settle");
function settleLayer(value) {
  const passed = passedIndex(value, (response) => !response.bodyUsed && !headersDirty(response.headers));
  if (passed >= 0) return { t: "passed", i: passed };
  if (value instanceof Response) return (
    /** @type {Outcome} */
    settle("onResponse", value, void 0)
  );
  if (value === null) return { t: "bad", what: "null" };
  if (value instanceof Request) return { t: "bad", what: "a Request" };
  return withShown({ t: "bad", what: typeof value }, value);
}
__name(settleLayer, "settleLayer");
var maxShownChars = 65536;
var maxShownKeys = 5;
function withShown(outcome2, value) {
  try {
    const shown = view(value);
    return shown === void 0 ? outcome2 : { ...outcome2, shown: shown.slice(0, maxShownChars) };
  } catch {
    return outcome2;
  }
}
__name(withShown, "withShown");
function view(value) {
  switch (typeof value) {
    case "string":
      return value;
    case "symbol":
      return value.description ?? "";
    case "number":
    case "boolean":
      return String(value);
    case "bigint":
      return `${value}n`;
    case "function":
      return String(value.name) || "(anonymous)";
    case "object": {
      if (value === null) return void 0;
      if (Array.isArray(value)) return `an array of ${value.length}`;
      const proto = Object.getPrototypeOf(value);
      const kind = proto === null ? "null-prototype object" : String(proto.constructor?.name ?? "object");
      const keys = Object.keys(value);
      const listed = keys.slice(0, maxShownKeys).join(", ") + (keys.length > maxShownKeys ? ", …" : "");
      return keys.length === 0 ? kind : `${kind} { ${listed} }`;
    }
    default:
      return void 0;
  }
}
__name(view, "view");
function layerUnsettled() {
  const stop = layerStop();
  if (stop === null || stop.t === "diverged") return stop ?? void 0;
  const need2 = turn.needed === null ? [] : [...turn.needed];
  if (need2.length > 0) return { t: "need", which: need2 };
  if (stop.k === "next" && stop.body !== null && "b" in stop.body) stash = effectBytes();
  return stop;
}
__name(layerUnsettled, "layerUnsettled");
function isThenable(value) {
  return value !== null && (typeof value === "object" || typeof value === "function") && typeof value.then === "function";
}
__name(isThenable, "isThenable");
function conclude(settled) {
  const diverged = layerDivergence();
  return diverged === null ? settled : { t: "diverged", what: diverged };
}
__name(conclude, "conclude");
function encode(settled) {
  if (typeof settled === "number" && logs.length === 0) return settled;
  const full = typeof settled === "number" ? { t: "code", v: settled } : settled;
  if (logs.length > 0) full.logs = logs;
  return JSON.stringify(full);
}
__name(encode, "encode");
var phases = ["isRequestAllowed", "isIpAllowed", "onRequest", "onResponse", "handle"];
var maxFound = 200;
function isPhaseFunction(value) {
  return typeof value === "function" && kindOfValue(value) === "function";
}
__name(isPhaseFunction, "isPhaseFunction");
function kindOfValue(value) {
  try {
    if (typeof value === "function") return /^class\b/.test(Function.prototype.toString.call(value)) ? "class" : "function";
    if (value === null) return "null";
    if (typeof value !== "object") return typeof value;
    return Object.prototype.toString.call(value).slice(8, -1);
  } catch {
    return typeof value;
  }
}
__name(kindOfValue, "kindOfValue");
function inspect(names, globals) {
  const found = [];
  const collect = /* @__PURE__ */ __name((from, where) => {
    for (const name of Object.getOwnPropertyNames(from)) {
      if (found.length >= maxFound) return;
      const desc = Object.getOwnPropertyDescriptor(from, name);
      if (desc === void 0) continue;
      const value = desc.value;
      if (where === "export" && value === void 0 && !("get" in desc && desc.get !== void 0)) continue;
      const entry = { name, what: "get" in desc && desc.get !== void 0 ? "accessor" : kindOfValue(value), from: where };
      if (name === "default" && value !== null && typeof value === "object") {
        try {
          entry.holds = Object.getOwnPropertyNames(value).slice(0, maxFound);
        } catch {
          entry.holds = [];
        }
      }
      found.push(entry);
    }
  }, "collect");
  try {
    if (names !== null && typeof names === "object") collect(names, "export");
    collect(globals, "global");
    return found;
  } catch {
    return found;
  }
}
__name(inspect, "inspect");
function install(host) {
  setHost(host);
  installClock();
  installGlobals();
  return {
    freeze,
    /**
     * Takes the policy's factory (its top level, wrapped in a function of `globalThis`), runs it
     * once to catch a top-level throw, and answers which phases it defines and what else it
     * found (src/djs/phase-check.ts judges it).
     * @param {PolicyFactory} policyFactory
     * @param {PolicyFactory} [inspectFactory] a script's top level again, answering more names
     */
    load(policyFactory, inspectFactory) {
      Object.freeze(policyFactory.prototype);
      Object.freeze(policyFactory);
      factory = policyFactory;
      const scope = Object.create(globalThis);
      const exported = factory.call(scope, scope);
      let names = exported;
      let globals = scope;
      if (inspectFactory !== void 0) {
        Object.freeze(inspectFactory.prototype);
        Object.freeze(inspectFactory);
        globals = Object.create(globalThis);
        names = inspectFactory.call(globals, globals);
      }
      return JSON.stringify({ phases: phases.filter((name) => isPhaseFunction(exported?.[name])), found: inspect(names, globals) });
    },
    /**
     * One call from the compiled state: the factory runs again with a fresh `globalThis`, so
     * module variables, the script's top-level bindings and globals are all new. Returns the
     * outcome when the phase settles synchronously, or `pending` (-1); then the worker runs the
     * pending jobs and asks finish(). The arguments are in src/djs/sandbox.ts's order (`arguments`).
     *
     * @param {number} phaseIndex
     * @param {number} now
     * @param {number} seed
     * @param {any} method the method; for isIpAllowed, the hostname
     * @param {any} url the URL; for isIpAllowed, the IP
     * @param {any} headers LF-joined; for isIpAllowed, the family
     * @param {any} hasBody whether the request has a body; for isIpAllowed, the port
     * @param {any} requestBody the request's body if loaded; for isIpAllowed, the protocol
     * @param {any} [status] for handle, the journal as JSON (or undefined), and then next()'s loaded bodies by index
     * @param {any} [statusText] for handle, whether the proxy holds the request's bytes
     * @param {string} [responseHeaders]
     * @param {string} [responseUrl]
     * @param {boolean} [responseHasBody]
     * @param {ArrayBuffer} [responseBody]
     */
    call(phaseIndex, now, seed, method, url, headers, hasBody, requestBody, status, statusText, responseHeaders, responseUrl, responseHasBody, responseBody) {
      startClock(now, seed);
      setCanonicalHref(url);
      clearLogs();
      outcome = void 0;
      stash = null;
      const phase = (
        /** @type {Phase} */
        phases[phaseIndex]
      );
      let request;
      let args;
      if (phase === "isIpAllowed") {
        args = [{ hostname: method, ip: url, family: headers, port: hasBody, protocol: requestBody }];
        startTurn(void 0, void 0);
      } else if (phase === "onResponse") {
        startTurn(void 0, responseBody === void 0 ? void 0 : new Uint8Array(responseBody));
        request = makeRequest(method, url, headers, false);
        args = [makeResponse(
          /** @type {number} */
          status,
          /** @type {string} */
          statusText,
          /** @type {string} */
          responseHeaders,
          /** @type {string} */
          responseUrl,
          responseHasBody === true
        ), request];
      } else if (phase === "handle") {
        const current2 = startTurn(requestBody === void 0 ? void 0 : new Uint8Array(requestBody), void 0);
        current2.replayable = statusText === true;
        const loaded = [];
        for (let i = 10; i < arguments.length; i++) loaded.push(arguments[i] === void 0 ? void 0 : new Uint8Array(arguments[i]));
        current2.next = loaded;
        startLayer(status);
        request = makeRequest(method, url, headers, hasBody);
        args = [request, makeNext(request)];
      } else {
        startTurn(requestBody === void 0 ? void 0 : new Uint8Array(requestBody), void 0);
        request = makeRequest(method, url, headers, phase === "onRequest" && hasBody);
        args = [request];
      }
      try {
        const scope = Object.create(globalThis);
        const result = (
          /** @type {PolicyFactory} */
          factory.call(scope, scope)[phase](...args)
        );
        if (!isThenable(result)) return encode(conclude(settle(phase, result, request)));
        const mine = turn;
        Promise.resolve(result).then(
          (value) => {
            if (turn !== mine) return;
            try {
              outcome = settle(phase, value, request);
            } catch (error) {
              outcome = thrown(error);
            }
          },
          (error) => {
            if (turn === mine) outcome = thrown(error);
          }
        );
      } catch (error) {
        return encode(conclude(thrown(error)));
      }
      return pending;
    },
    /** The outcome of an asynchronous call, once the pending jobs ran. */
    finish() {
      let settled = outcome === void 0 ? void 0 : conclude(outcome);
      if (settled === void 0) settled = layerUnsettled();
      if (settled === void 0) {
        const need2 = turn.needed === null ? [] : [...turn.needed];
        settled = need2.length > 0 ? { t: "need", which: need2 } : { t: "pending" };
      }
      outcome = void 0;
      return encode(settled);
    },
    /** The bytes of a body the policy made, if the outcome has one. */
    takeBytes() {
      const bytes = stash;
      stash = null;
      return bytes === null ? void 0 : copyBuffer(bytes);
    }
  };
}
__name(install, "install");
return install(host);
})
