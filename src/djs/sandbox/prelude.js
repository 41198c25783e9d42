// The tier-2 sandbox's own API, evaluated once inside each QuickJS context (never in Node).
// It installs the web classes a policy may use, then freezes the realm, and returns the
// functions the worker calls. `host` holds the few functions the worker provides: UTF-8
// conversion and WHATWG URL parsing, so URLs parse exactly as the proxy's own do.
(function installSandbox(host) {
  "use strict";
  // Strings cross between QuickJS and the worker as C strings, which end at NUL. Text that may
  // hold one crosses as JSON instead, so a body like "safe\0<rest>" is never cut short.
  const hasNul = (text) => text.indexOf("\0") !== -1;
  function parseUrl(input, base, part, value) {
    if (hasNul(input) || (base !== undefined && hasNul(base)) || (value !== undefined && hasNul(value))) {
      return host.parseUrl(JSON.stringify([input, base ?? null, part ?? null, value ?? null]), undefined, undefined, undefined, true);
    }
    return host.parseUrl(input, base, part, value);
  }
  function utf8Encode(text) {
    return hasNul(text) ? host.utf8Encode(JSON.stringify(text), true) : host.utf8Encode(text, false);
  }
  function utf8Decode(buffer, fatal, ignoreBOM) {
    const text = host.utf8Decode(buffer, fatal, ignoreBOM);
    return typeof text === "string" || text === undefined ? text : JSON.parse(text.json);
  }
  const OriginalDate = Date;
  const hasOwn = Object.prototype.hasOwnProperty;
  /** The proxy's clock at the start of the current call (DESIGN §2). */
  let clock = 0;

  // --- Date: the clock is fixed for the whole call ---------------------------------------
  function SandboxDate(...args) {
    if (new.target === undefined) return new OriginalDate(clock).toString();
    return args.length === 0 ? Reflect.construct(OriginalDate, [clock], new.target) : Reflect.construct(OriginalDate, args, new.target);
  }
  SandboxDate.prototype = OriginalDate.prototype;
  Object.defineProperty(OriginalDate.prototype, "constructor", { value: SandboxDate });
  SandboxDate.now = () => clock;
  SandboxDate.parse = OriginalDate.parse;
  SandboxDate.UTC = OriginalDate.UTC;

  // --- Math.random: seeded by the proxy for each call ----------------------------------------
  // A call that stops to have a body loaded runs again with the same seed (and clock), so the
  // rerun makes the same choices as the first run did.
  let randomState = 1;
  Math.random = function random() {
    // xorshift32: enough for sampling and jitter; policies have no crypto.
    let x = randomState;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    randomState = x >>> 0;
    return randomState / 4294967296;
  };

  // --- Headers ------------------------------------------------------------------------------
  const tokenChars = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
  const badValue = /[\0\r\n]/;
  // Validated names, lowercased. A pure function's results: nothing a policy can observe or change.
  const knownNames = new Map();
  function headerName(name) {
    const n = typeof name === "string" ? name : String(name);
    const known = knownNames.get(n);
    if (known !== undefined) return known;
    if (!tokenChars.test(n)) throw new TypeError(`invalid header name: ${JSON.stringify(n)}`);
    const lower = n.toLowerCase();
    if (knownNames.size < 512) knownNames.set(n, lower);
    return lower;
  }
  function headerValue(value) {
    const v = String(value).replace(/^[\t\n\r ]+|[\t\n\r ]+$/g, "");
    if (badValue.test(v)) throw new TypeError(`invalid header value: ${JSON.stringify(v)}`);
    return v;
  }

  /**
   * Headers as one flat list, [name, value, name, value, …], lowercase names in arrival order.
   * The proxy's own lists arrive LF-joined and are split on first use: most calls never look.
   */
  // The prelude's own access to a Headers' internals: closures, not statics a policy could call.
  let headersFlat, headersFromJoined, headersDirty;
  class Headers {
    #raw = null;
    #flatList = [];
    #dirty = false;
    #immutable = false;
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
    set #flat(list) {
      this.#raw = null;
      this.#flatList = list;
    }
    #write() {
      if (this.#immutable) throw new TypeError("these headers are immutable");
      this.#dirty = true;
    }
    #without(n) {
      const kept = [];
      const flat = this.#flat;
      for (let i = 0; i < flat.length; i += 2) if (flat[i] !== n) kept.push(flat[i], flat[i + 1]);
      return kept;
    }
    append(name, value) {
      const n = headerName(name);
      const v = headerValue(value);
      this.#write();
      this.#flat.push(n, v);
    }
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
    delete(name) {
      const n = headerName(name);
      this.#write();
      this.#flat = this.#without(n);
    }
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
    has(name) {
      const n = headerName(name);
      const flat = this.#flat;
      for (let i = 0; i < flat.length; i += 2) if (flat[i] === n) return true;
      return false;
    }
    *entries() {
      // WHATWG order: sorted by name, repeated names combined, except Set-Cookie.
      const names = [];
      for (let i = 0; i < this.#flat.length; i += 2) if (!names.includes(this.#flat[i])) names.push(this.#flat[i]);
      names.sort();
      for (const name of names) {
        if (name === "set-cookie") for (const cookie of this.getSetCookie()) yield [name, cookie];
        else yield [name, this.get(name)];
      }
    }
    *keys() {
      for (const [name] of this.entries()) yield name;
    }
    *values() {
      for (const [, value] of this.entries()) yield value;
    }
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

  // --- URLSearchParams -------------------------------------------------------------------------
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
  function formEncode(text) {
    return encodeURIComponent(text)
      .replace(/[!'()~]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)
      .replace(/%20/g, "+");
  }

  class URLSearchParams {
    #pairs = [];
    #owner = null;
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
    append(name, value) {
      this.#pairs.push([String(name), String(value)]);
      this.#update();
    }
    delete(name, value) {
      const n = String(name);
      this.#pairs = this.#pairs.filter((pair) => pair[0] !== n || (value !== undefined && pair[1] !== String(value)));
      this.#update();
    }
    get(name) {
      const pair = this.#pairs.find((p) => p[0] === String(name));
      return pair === undefined ? null : pair[1];
    }
    getAll(name) {
      return this.#pairs.filter((p) => p[0] === String(name)).map((p) => p[1]);
    }
    has(name, value) {
      return this.#pairs.some((p) => p[0] === String(name) && (value === undefined || p[1] === String(value)));
    }
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
    static attach(params, owner, search) {
      params.#parse(search);
      params.#owner = owner;
    }
    static reparse(params, search) {
      params.#parse(search);
    }
  }

  // --- URL: parsed by the worker's WHATWG parser, the same one the proxy uses ----------------
  const urlState = new WeakMap();
  const urlParts = ["href", "origin", "protocol", "username", "password", "host", "hostname", "port", "pathname", "search", "hash"];
  /** The worker answers with the parts joined by LF, which a serialised URL never contains (the string crosses into QuickJS as a C string, so NUL cannot be used). */
  function partsOf(joined) {
    const values = joined.split("\n");
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
  const canonicalShape = /^(https?:)\/\/(?:([^:@/]*)(?::([^@/]*))?@)?([a-z0-9.-]+|\[[0-9a-f:.]+\])(?::(\d+))?(\/[^?#]*)(\?[^#]*)?(#.*)?$/;
  function canonicalParts(href) {
    const m = canonicalShape.exec(href);
    if (m === null) return undefined;
    const protocol = m[1];
    const hostname = m[4];
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
      pathname: m[6],
      search: m[7] === undefined || m[7] === "?" ? "" : m[7],
      hash: m[8] === undefined || m[8] === "#" ? "" : m[8],
    };
  }
  function parseOrThrow(input, base) {
    if (base === undefined && input === canonicalHref) {
      const parts = canonicalParts(input);
      if (parts !== undefined) return parts;
    }
    const parsed = parseUrl(String(input), base === undefined ? undefined : String(base));
    if (parsed === undefined) throw new TypeError(`Invalid URL: ${String(input)}`);
    return partsOf(parsed);
  }
  class URL {
    constructor(input, base) {
      urlState.set(this, { parts: parseOrThrow(input, base), params: null });
    }
    static canParse(input, base) {
      return parseUrl(String(input), base === undefined ? undefined : String(base)) !== undefined;
    }
    static parse(input, base) {
      try {
        return new URL(input, base);
      } catch {
        return null;
      }
    }
    get searchParams() {
      const state = urlState.get(this);
      if (state.params === null) {
        state.params = new URLSearchParams();
        URLSearchParams.attach(state.params, this, state.parts.search);
      }
      return state.params;
    }
    toString() {
      return urlState.get(this).parts.href;
    }
    toJSON() {
      return urlState.get(this).parts.href;
    }
    get [Symbol.toStringTag]() {
      return "URL";
    }
  }
  /** A setter: the worker's parser applies the change, as WHATWG's setters do. */
  function setUrlPart(url, part, value) {
    const state = urlState.get(url);
    const parsed = parseUrl(state.parts.href, undefined, part, String(value));
    if (parsed === undefined) return;
    state.parts = partsOf(parsed);
    if (state.params !== null && part !== "search") URLSearchParams.reparse(state.params, state.parts.search);
  }
  for (const part of urlParts) {
    Object.defineProperty(URL.prototype, part, {
      get() {
        return urlState.get(this).parts[part];
      },
      set:
        part === "origin"
          ? undefined
          : function (value) {
              setUrlPart(this, part, value);
            },
      enumerable: true,
      configurable: true,
    });
  }

  // --- TextEncoder, TextDecoder, atob, btoa ----------------------------------------------------
  function toBytes(data) {
    if (data instanceof Uint8Array) return data;
    if (data instanceof ArrayBuffer) return new Uint8Array(data);
    if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    throw new TypeError("expected an ArrayBuffer or a typed array");
  }
  function copyBuffer(bytes) {
    return bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
  }
  class TextEncoder {
    get encoding() {
      return "utf-8";
    }
    encode(text = "") {
      return new Uint8Array(utf8Encode(String(text)));
    }
  }
  class TextDecoder {
    #fatal;
    #bom;
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
    decode(data) {
      if (data === undefined) return "";
      const text = utf8Decode(copyBuffer(toBytes(data)), this.#fatal, this.#bom);
      if (text === undefined) throw new TypeError("the data is not valid UTF-8");
      return text;
    }
  }
  const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  function btoa(data) {
    const s = String(data);
    let out = "";
    for (let i = 0; i < s.length; i += 3) {
      const a = s.charCodeAt(i);
      const b = s.charCodeAt(i + 1);
      const c = s.charCodeAt(i + 2);
      if (a > 255 || b > 255 || c > 255) throw new DOMException("btoa: the string contains characters outside Latin-1", "InvalidCharacterError");
      const n = (a << 16) | ((b || 0) << 8) | (c || 0);
      out += b64[n >> 18] + b64[(n >> 12) & 63] + (i + 1 < s.length ? b64[(n >> 6) & 63] : "=") + (i + 2 < s.length ? b64[n & 63] : "=");
    }
    return out;
  }
  function atob(data) {
    let s = String(data).replace(/[\t\n\f\r ]/g, "");
    if (s.length % 4 === 0) s = s.replace(/==?$/, "");
    if (s.length % 4 === 1 || /[^A-Za-z0-9+/]/.test(s)) throw new DOMException("atob: the string is not valid base64", "InvalidCharacterError");
    let out = "";
    let bits = 0;
    let buffer = 0;
    for (const ch of s) {
      buffer = (buffer << 6) | b64.indexOf(ch);
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        out += String.fromCharCode((buffer >> bits) & 255);
      }
    }
    return out;
  }
  class DOMException extends Error {
    constructor(message = "", name = "Error") {
      super(message);
      Object.defineProperty(this, "name", { value: name, configurable: true, writable: true });
    }
  }

  // --- HttpRequestBlockedError -----------------------------------------------------------------
  class HttpRequestBlockedError extends Error {
    constructor(message = "request blocked by policy", status = 403, statusText = "Forbidden") {
      super(String(message));
      this.name = "HttpRequestBlockedError";
      if (!Number.isInteger(status) || status < 400 || status > 599) {
        throw new RangeError(`HttpRequestBlockedError: status must be an integer from 400 to 599, got ${status}`);
      }
      this.status = status;
      this.statusText = statusText;
    }
  }

  // --- Bodies: opaque handles to bytes that stay in the proxy until read --------------------------
  /**
   * The current call: the bodies the proxy has loaded for it, and which ones the policy asked
   * for. A body from the proxy keeps the call it came with, so nothing of one call can read
   * another's bytes, even code that somehow outlived its call.
   */
  let turn = { request: undefined, response: undefined, needed: null };
  /** What a body handle stands for: the body's state, and the Request or Response it came from. */
  const handleSource = new WeakMap();

  /** `request.body` / `response.body`: can only be passed on, never read directly. */
  class OpaqueBody {
    constructor() {
      throw new TypeError("bodies cannot be constructed; pass request.body or response.body on");
    }
    get locked() {
      return false;
    }
    get [Symbol.toStringTag]() {
      return "ReadableStream";
    }
  }
  function opaque(state, owner) {
    const handle = Object.create(OpaqueBody.prototype);
    handleSource.set(handle, { state, owner });
    return Object.freeze(handle);
  }

  /**
   * The body of a Request or Response: `{ source, turn }` for the proxy's own bytes (not loaded
   * here until read), `{ bytes }` for bytes made in the sandbox, or null.
   */
  function bodyFrom(init) {
    if (init === undefined || init === null) return null;
    if (typeof init === "string") return { bytes: new Uint8Array(utf8Encode(init)), contentType: "text/plain;charset=UTF-8" };
    if (init instanceof URLSearchParams) {
      return { bytes: new Uint8Array(utf8Encode(init.toString())), contentType: "application/x-www-form-urlencoded;charset=UTF-8" };
    }
    if (init instanceof ArrayBuffer || ArrayBuffer.isView(init)) return { bytes: new Uint8Array(copyBuffer(toBytes(init))) };
    const held = handleSource.get(init);
    if (held !== undefined) {
      // As in WHATWG fetch, a body already read cannot be passed on: use a clone's body instead.
      if (bodyUsed(held.owner)) throw new TypeError("the body was already read; pass on a clone's body instead");
      const { state } = held;
      return state.source !== undefined ? { source: state.source, turn: state.turn } : { bytes: state.bytes };
    }
    throw new TypeError("a body must be a string, bytes, URLSearchParams, or request.body/response.body");
  }

  /** Bytes of a body; a body the proxy has not loaded yet ends the call and asks for it. */
  function readBody(state) {
    if (state === null) return Promise.resolve(new Uint8Array(0));
    if (state.bytes !== undefined) return Promise.resolve(state.bytes);
    if (state.turn !== turn) return Promise.reject(new TypeError("a body from another call cannot be read"));
    const bytes = turn[state.source];
    if (bytes !== undefined) return Promise.resolve(bytes);
    // The proxy loads the body and runs the call again from the start, which is deterministic:
    // fresh state and the same clock. The policy cannot see this happen, nor catch it.
    (turn.needed ??= new Set()).add(state.source);
    // A fresh promise each time: one shared forever-pending promise would keep every call that
    // awaited it reachable, and the heap would fill up call by call.
    return new Promise(() => undefined);
  }

  // Likewise for bodies: a policy reaches BodyMixin as Object.getPrototypeOf(Request).
  let bodyInit, bodyState, bodyUsed;
  class BodyMixin {
    #state = null;
    #used = false;
    static {
      bodyInit = (target, state) => {
        target.#state = state;
      };
      bodyState = (target) => target.#state;
      bodyUsed = (target) => target.#used;
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
      // As in WHATWG fetch, reading a null body does not mark it used.
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
      return utf8Decode(copyBuffer(bytes), false, false);
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
  }

  const methods = new Set(["DELETE", "GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"]);
  const methodToken = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
  /** As in fetch: a Request cannot be made with these. */
  const forbiddenMethods = new Set(["CONNECT", "TRACE", "TRACK"]);

  /** Set just before the sandbox builds a Request itself: the head is already valid, skip parsing. */
  let internalHead = null;

  class Request extends BodyMixin {
    #method;
    #url;
    #headers;
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
      if (input instanceof Request) {
        if (init.body === undefined && bodyUsed(input)) throw new TypeError("Request body is already used");
        this.#method = input.method;
        this.#url = input.url;
        this.#headers = new Headers(input.headers);
        state = bodyState(input);
      } else {
        this.#url = new URL(String(input)).href;
        this.#method = "GET";
        this.#headers = new Headers();
      }
      if (init.method !== undefined) {
        const m = String(init.method);
        if (!methodToken.test(m)) throw new TypeError(`invalid method: ${JSON.stringify(m)}`);
        if (forbiddenMethods.has(m.toUpperCase())) throw new TypeError(`forbidden method: ${m}`);
        this.#method = methods.has(m.toUpperCase()) ? m.toUpperCase() : m;
      }
      if (init.headers !== undefined) this.#headers = new Headers(init.headers);
      if (init.body !== undefined) {
        state = bodyFrom(init.body);
        if (state?.contentType !== undefined && !this.#headers.has("content-type")) this.#headers.set("content-type", state.contentType);
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
      return new Request(this);
    }
    get [Symbol.toStringTag]() {
      return "Request";
    }
  }

  /** Set just before the sandbox builds the upstream's Response: valid already, so not checked again. */
  let internalResponse = null;

  class Response extends BodyMixin {
    #status;
    #statusText;
    #headers;
    #url = "";
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
      const status = init.status === undefined ? 200 : Number(init.status);
      if (!Number.isInteger(status) || status < 200 || status > 599) throw new RangeError(`invalid response status: ${init.status}`);
      const statusText = init.statusText === undefined ? "" : String(init.statusText);
      if (/[^\t\x20-\x7e\x80-\xff]/.test(statusText)) throw new TypeError("invalid statusText");
      this.#status = status;
      this.#statusText = statusText;
      this.#headers = new Headers(init.headers);
      const state = bodyFrom(body);
      if (state !== null && (status === 204 || status === 205 || status === 304)) {
        throw new TypeError(`a ${status} response cannot have a body`);
      }
      if (state?.contentType !== undefined && !this.#headers.has("content-type")) this.#headers.set("content-type", state.contentType);
      bodyInit(this, state);
    }
    static json(data, init = {}) {
      const text = JSON.stringify(data);
      if (text === undefined) throw new TypeError("the value cannot be serialised as JSON");
      const headers = new Headers(init.headers);
      if (!headers.has("content-type")) headers.set("content-type", "application/json");
      return new Response(text, { ...init, headers });
    }
    static redirect(url, status = 302) {
      if (![301, 302, 303, 307, 308].includes(status)) throw new RangeError(`invalid redirect status: ${status}`);
      return new Response(null, { status, headers: { location: new URL(String(url)).href } });
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
      const copy = new Response(null, { status: this.#status, statusText: this.#statusText, headers: this.#headers });
      copy.#url = this.#url;
      bodyInit(copy, bodyState(this));
      return copy;
    }
    get [Symbol.toStringTag]() {
      return "Response";
    }
  }

  // --- console: lines go to the proxy's log, with the policy's file name ------------------------
  let logs = [];
  const maxLogLines = 100;
  const maxLogChars = 8192;
  function show(value) {
    if (typeof value === "string") return value;
    if (value instanceof Error) return `${value.name}: ${value.message}`;
    try {
      const json = JSON.stringify(value);
      return json === undefined ? String(value) : json;
    } catch {
      return String(value);
    }
  }
  function logger(level) {
    return (...args) => {
      if (logs.length >= maxLogLines) return;
      logs.push([level, args.map(show).join(" ").slice(0, maxLogChars)]);
    };
  }
  const console = {
    log: logger("info"),
    info: logger("info"),
    debug: logger("debug"),
    warn: logger("warn"),
    error: logger("error"),
    trace: logger("debug"),
  };

  // --- the realm: install, then freeze everything reachable ---------------------------------------
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
  };
  for (const name of Object.keys(installed)) {
    Object.defineProperty(globalThis, name, { value: installed[name], writable: true, configurable: true, enumerable: false });
  }
  // A FinalizationRegistry's callback runs whenever the collector gets round to it: in a later
  // call, as code of an earlier one. Nothing else lets a policy's code outlive its call.
  delete globalThis.FinalizationRegistry;

  // --- calls: the worker's entry points ---------------------------------------------------------
  let factory = null;
  let outcome;
  let stash = null;

  function makeRequest(method, url, headers, hasBody) {
    internalHead = { method, url, headers: headersFromJoined(headers, false) };
    const request = new Request();
    bodyInit(request, hasBody ? { source: "request", turn } : null);
    return request;
  }
  function makeResponse(status, statusText, headers, url, hasBody) {
    // The upstream's head, already parsed and lowercased by the proxy: taken as it is.
    internalResponse = { status, statusText, url, headers: headersFromJoined(headers, false) };
    const response = new Response();
    bodyInit(response, hasBody ? { source: "response", turn } : null);
    return response;
  }
  function serialiseBody(state) {
    if (state === null) return null;
    if (state.source !== undefined) return { h: state.source };
    stash = state.bytes;
    return { b: state.bytes.byteLength };
  }
  function thrown(error) {
    try {
      if (error instanceof HttpRequestBlockedError) {
        return { t: "blocked", status: Number(error.status), message: String(error.message), statusText: String(error.statusText) };
      }
      if (error instanceof Error) return { t: "throw", name: String(error.name), message: String(error.message), stack: String(error.stack ?? "") };
      return { t: "throw", name: typeof error, message: String(error), stack: "" };
    } catch {
      return { t: "throw", name: "Error", message: "the policy threw a value that cannot be described", stack: "" };
    }
  }
  /** The common outcomes travel as numbers: QuickJS's JSON is the slowest part of a call. */
  const codes = { false: 0, true: 1, unchanged: 2 };
  /** What `call` answers while the phase's promise has yet to settle: no outcome is negative. */
  const pending = -1;
  function settle(phase, value, request) {
    if (phase === "isRequestAllowed" || phase === "isIpAllowed") {
      return typeof value === "boolean" ? (value ? codes.true : codes.false) : { t: "value", v: typeof value };
    }
    if (phase === "onResponse" && value === undefined) return codes.unchanged;
    if (phase === "onRequest" && (value === undefined || value === request)) {
      const headers = request.headers;
      const dirty = headersDirty(headers);
      const consumed = bodyUsed(request);
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
        body: serialiseBody(bodyState(value)),
      };
    }
    if (phase === "onRequest" && value instanceof Request) {
      if (value.bodyUsed) return { t: "bad", what: "a Request whose body was already read; return request.clone() instead" };
      return {
        t: "request",
        method: value.method,
        url: value.url,
        headers: headersFlat(value.headers),
        body: serialiseBody(bodyState(value)),
      };
    }
    return { t: "bad", what: value === null ? "null" : typeof value };
  }

  /** Whether a value is a thenable; the check itself must not let a hostile getter escape. */
  function isThenable(value) {
    return value !== null && (typeof value === "object" || typeof value === "function") && typeof value.then === "function";
  }
  /** A settled outcome as the worker reads it: a code, or JSON when there is more to say. */
  function encode(settled) {
    if (typeof settled === "number" && logs.length === 0) return settled;
    const full = typeof settled === "number" ? { t: "code", v: settled } : settled;
    if (logs.length > 0) full.logs = logs;
    return JSON.stringify(full);
  }
  const phases = ["isRequestAllowed", "isIpAllowed", "onRequest", "onResponse"];

  /**
   * Freezing a prototype makes its data properties read-only for every object that inherits
   * them: `this.name = "MyError"` or `obj.toString = f` would throw (the "override mistake").
   * These become accessors whose setter defines an own property on the object instead.
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

  return {
    /**
     * Called before the policy loads: freezes every builtin and the global object itself. A
     * policy's writes to `globalThis` go to a fresh object made for each call instead.
     */
    freeze() {
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
        typeof globalThis.Iterator?.from === "function" ? Object.getPrototypeOf(Iterator.from({ next: () => ({ done: true }) })) : undefined,
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
    },
    /**
     * Takes the policy's factory (its top level, wrapped in a function of `globalThis`), runs it
     * once to catch a top-level throw, and answers which phases it defines.
     */
    load(policyFactory) {
      // Made after the realm was frozen, and shared by every call: a script reaches it as
      // `arguments.callee`.
      Object.freeze(policyFactory.prototype);
      Object.freeze(policyFactory);
      factory = policyFactory;
      const scope = Object.create(globalThis);
      const exported = factory.call(scope, scope);
      return JSON.stringify(phases.filter((name) => typeof exported?.[name] === "function"));
    },
    /**
     * One call from the compiled state: the factory runs again with a fresh `globalThis`, so
     * module variables, the script's top-level bindings and globals are all new. Returns the
     * outcome when the phase settles synchronously, or `pending` (-1); then the worker runs the
     * pending jobs and asks finish().
     */
    call(phaseIndex, now, seed, method, url, headers, hasBody, requestBody, status, statusText, responseHeaders, responseUrl, responseHasBody, responseBody) {
      clock = now;
      randomState = seed >>> 0 || 1;
      canonicalHref = url;
      if (logs.length > 0) logs = [];
      outcome = undefined;
      stash = null;
      const phase = phases[phaseIndex];
      let request;
      let args;
      if (phase === "isIpAllowed") {
        // method, url, headers, hasBody carry hostname, ip, family, port; requestBody the protocol.
        args = [{ hostname: method, ip: url, family: headers, port: hasBody, protocol: requestBody }];
        turn = { request: undefined, response: undefined, needed: null };
      } else if (phase === "onResponse") {
        turn = { request: undefined, response: responseBody === undefined ? undefined : new Uint8Array(responseBody), needed: null };
        request = makeRequest(method, url, headers, false);
        args = [makeResponse(status, statusText, responseHeaders, responseUrl, responseHasBody), request];
      } else {
        turn = { request: requestBody === undefined ? undefined : new Uint8Array(requestBody), response: undefined, needed: null };
        request = makeRequest(method, url, headers, phase === "onRequest" && hasBody);
        args = [request];
      }
      try {
        const scope = Object.create(globalThis);
        const result = factory.call(scope, scope)[phase](...args);
        if (!isThenable(result)) return encode(settle(phase, result, request));
        // Only this call's own handlers may settle it: the host runs every pending job before
        // the call ends, and `mine` keeps a handler that ran late from answering for another
        // call. Promise.resolve reads the result's `constructor`, which may throw.
        const mine = turn;
        Promise.resolve(result).then(
          (value) => {
            if (turn === mine) outcome = settle(phase, value, request);
          },
          (error) => {
            if (turn === mine) outcome = thrown(error);
          },
        );
      } catch (error) {
        return encode(thrown(error));
      }
      return pending;
    },
    /** The outcome of an asynchronous call, once the pending jobs ran. */
    finish() {
      let settled = outcome;
      if (settled === undefined) {
        const need = turn.needed === null ? [] : [...turn.needed];
        settled = need.length > 0 ? { t: "need", which: need } : { t: "pending" };
      }
      outcome = undefined;
      return encode(settled);
    },
    /** The bytes of a body the policy made, if the outcome has one. */
    takeBytes() {
      const bytes = stash;
      stash = null;
      return bytes === null ? undefined : copyBuffer(bytes);
    },
  };
});
