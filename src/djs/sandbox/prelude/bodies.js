// @ts-check
// Bodies: opaque handles to bytes that stay in the proxy until read, and the body methods that
// Request and Response share.
import { copyBuffer, toBytes } from "./encoding.js";
import { utf8Decode, utf8Encode } from "./host.js";
import { URLSearchParams } from "./url.js";

/**
 * The proxy's request or response body, or (in handle) the body of the response that next()
 * number n resolved to.
 * @typedef {"request" | "response" | number} BodySource
 */
/**
 * @typedef {object} Turn
 * @property {Uint8Array | undefined} request the request's body, once the proxy has loaded it
 * @property {Uint8Array | undefined} response the response's body, likewise
 * @property {Set<BodySource | "held"> | null} needed the bodies the call asked for and does not have; "held"
 *   asks the proxy to hold the request's bytes itself (handle), without loading them here
 * @property {(Uint8Array | undefined)[] | null} next handle only: next()'s response bodies the proxy loaded, by effect index
 * @property {boolean} replayable handle only: the proxy holds the request's bytes, so it can send them more than once unloaded
 */
/**
 * @typedef {{ source: BodySource, turn: Turn, bytes?: undefined, contentType?: undefined }
 *   | { bytes: Uint8Array, contentType?: string, source?: undefined, turn?: undefined }} BodyState
 */

/**
 * The current call: the bodies the proxy has loaded for it, and which ones the policy asked
 * for. A body from the proxy keeps the call it came with, so nothing of one call can read
 * another's bytes, even code that somehow outlived its call.
 */
/** @type {Turn} */
export let turn = { request: undefined, response: undefined, needed: null, next: null, replayable: false };
/**
 * Starts a call's turn, with the bodies the proxy sent along with it.
 * @param {Uint8Array | undefined} request
 * @param {Uint8Array | undefined} response
 */
export function startTurn(request, response) {
  turn = { request, response, needed: null, next: null, replayable: false };
  return turn;
}
/**
 * Asks the proxy for a body, unless it is loaded already: the call ends once it can go no
 * further, and runs again from the start with the bytes.
 * @param {BodySource} source
 */
export function need(source) {
  if (bodyBytes(source) === undefined) (turn.needed ??= new Set()).add(source);
}
/**
 * In handle: asks the proxy to hold the request's bytes, so that every next() can send them (a
 * retry), rather than the guest's one stream. They stay in the proxy until the policy reads them.
 */
export function holdRequest() {
  if (turn.request === undefined && !turn.replayable) (turn.needed ??= new Set()).add("held");
}
/**
 * The current call's bytes of a body from the proxy, if loaded.
 * @param {BodySource} source
 */
export function bodyBytes(source) {
  return typeof source === "number" ? turn.next?.[source] : turn[source];
}
/**
 * What a body handle stands for: the body's state, and the Request or Response it came from.
 * @type {WeakMap<object, { state: BodyState, owner: BodyMixin }>}
 */
const handleSource = new WeakMap();

/** `request.body` / `response.body`: can only be passed on, never read directly. */
export class OpaqueBody {
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
/**
 * @param {BodyState} state
 * @param {BodyMixin} owner
 */
function opaque(state, owner) {
  const handle = Object.create(OpaqueBody.prototype);
  handleSource.set(handle, { state, owner });
  return Object.freeze(handle);
}

/**
 * The body of a Request or Response: `{ source, turn }` for the proxy's own bytes (not loaded
 * here until read), `{ bytes }` for bytes made in the sandbox, or null.
 */
/**
 * @param {unknown} init
 * @returns {BodyState | null}
 */
export function bodyFrom(init) {
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
/**
 * @param {BodyState | null} state
 * @returns {Promise<Uint8Array>}
 */
function readBody(state) {
  if (state === null) return Promise.resolve(new Uint8Array(0));
  if (state.bytes !== undefined) return Promise.resolve(state.bytes);
  if (state.turn !== turn) return Promise.reject(new TypeError("a body from another call cannot be read"));
  const bytes = bodyBytes(state.source);
  if (bytes !== undefined) return Promise.resolve(bytes);
  // The proxy loads the body and runs the call again from the start, which is deterministic:
  // fresh state and the same clock. The policy cannot see this happen, nor catch it.
  need(state.source);
  // A fresh promise each time: one shared forever-pending promise would keep every call that
  // awaited it reachable, and the heap would fill up call by call.
  return new Promise(() => undefined);
}

// The prelude's own access to a body's internals: closures, not statics a policy could call (a
// policy reaches BodyMixin as Object.getPrototypeOf(Request)).
/** @type {(target: BodyMixin, state: BodyState | null) => void} */
export let bodyInit;
/** @type {(target: BodyMixin) => BodyState | null} */
export let bodyState;
/** @type {(target: BodyMixin) => boolean} */
export let bodyUsed;
/** Marks a body as sent, as fetch does with a request it sends: it cannot be read or sent again. */
/** @type {(target: BodyMixin) => void} */
export let bodySent;
export class BodyMixin {
  /** @type {BodyState | null} */
  #state = null;
  #used = false;
  static {
    bodyInit = (target, state) => {
      target.#state = state;
    };
    bodyState = (target) => target.#state;
    bodyUsed = (target) => target.#used;
    bodySent = (target) => {
      if (target.#state !== null) target.#used = true;
    };
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
    // Not fatal, so never undefined.
    return /** @type {string} */ (utf8Decode(copyBuffer(bytes), false, false));
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

