// @ts-check
// Request and Response, and how the sandbox makes them from the heads the proxy sends.
import { bodyFrom, bodyInit, BodyMixin, bodyState, bodyUsed, holdRequest, turn } from "./bodies.js";
import { Headers, headersFromJoined } from "./headers.js";
import { URL } from "./url.js";

const methods = new Set(["DELETE", "GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"]);
const methodToken = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** As in fetch: a Request cannot be made with these. */
const forbiddenMethods = new Set(["CONNECT", "TRACE", "TRACK"]);

/** Set just before the sandbox builds a Request itself: the head is already valid, skip parsing. */
/** @type {{ method: string, url: string, headers: Headers } | null} */
let internalHead = null;

export class Request extends BodyMixin {
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
    // In handle, a clone is how a layer sends the guest's body more than once (a retry): the
    // proxy holds the body, so every next() can send its bytes rather than the guest's one stream.
    const state = bodyState(this);
    if (turn.next !== null && state?.source === "request" && state.turn === turn) holdRequest();
    return new Request(this);
  }
  get [Symbol.toStringTag]() {
    return "Request";
  }
}

/** Set just before the sandbox builds the upstream's Response: valid already, so not checked again. */
/** @type {{ status: number, statusText: string, url: string, headers: Headers } | null} */
let internalResponse = null;

export class Response extends BodyMixin {
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
  /**
   * @param {unknown} data
   * @param {any} [init]
   */
  static json(data, init = {}) {
    const text = JSON.stringify(data);
    if (text === undefined) throw new TypeError("the value cannot be serialised as JSON");
    const headers = new Headers(init.headers);
    if (!headers.has("content-type")) headers.set("content-type", "application/json");
    return new Response(text, { ...init, headers });
  }
  /**
   * @param {unknown} url
   * @param {number} [status]
   */
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

/**
 * The call's request, from the head the proxy sent: already valid, so not checked again.
 * @param {string} method
 * @param {string} url
 * @param {string} headers LF-joined, lowercase names
 * @param {boolean} hasBody
 */
export function makeRequest(method, url, headers, hasBody) {
  internalHead = { method, url, headers: headersFromJoined(headers, false) };
  const request = new Request();
  bodyInit(request, hasBody ? { source: "request", turn } : null);
  return request;
}
/**
 * The upstream's response, from the head the proxy sent.
 * @param {number} status
 * @param {string} statusText
 * @param {string} headers LF-joined, lowercase names
 * @param {string} url
 * @param {boolean} hasBody
 * @param {import("./bodies.js").BodySource} [source] whose body it is: onResponse's response, or next() number n's
 */
export function makeResponse(status, statusText, headers, url, hasBody, source = "response") {
  // The upstream's head, already parsed and lowercased by the proxy: taken as it is.
  internalResponse = { status, statusText, url, headers: headersFromJoined(headers, false) };
  const response = new Response();
  bodyInit(response, hasBody ? { source, turn } : null);
  return response;
}
