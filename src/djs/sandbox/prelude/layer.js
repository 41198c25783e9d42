// @ts-check
// Layers: `handle(request, next)`'s next() and the global sleep(). Neither can run inside the
// sandbox: the proxy performs them. They are effects, numbered in the order the policy makes
// them. The call carries a journal of the effects already performed: an effect the journal holds
// resolves (or rejects) with what was recorded; the first one it does not hold ends the call, the
// proxy performs it, and the call runs again from the start with one more entry. Fresh state, a
// fixed clock and seed make every rerun take the same path, so nothing is ever done twice; a
// rerun that asks for something else at a recorded place has diverged, and fails closed.
import { HttpRequestBlockedError } from "./blocked-error.js";
import { bodySent, bodyState, turn } from "./bodies.js";
import { headersFlat } from "./headers.js";
import { makeResponse, Request, Response } from "./request-response.js";

/** @typedef {import("./bodies.js").Turn} Turn */
/** @typedef {{ status: number, statusText: string, headers: string, url: string, hasBody: boolean }} ResponseHead */
/** @typedef {{ blocked: boolean, name: string, message: string, status: number, statusText: string, code: string }} Rejection */
/** @typedef {{ k: "next" | "sleep", sig: string, res?: ResponseHead, rej?: Rejection }} JournalEntry */
/** @typedef {null | { h: "request" } | { n: number } | { b: number }} BodyRef */
/**
 * The effect a call stopped at: src/djs/protocol.ts's `effect` outcome.
 * @typedef {{ t: "effect", k: "next", i: number, sig: string, method: string, url: string, headers: string[], body: BodyRef }
 *   | { t: "effect", k: "sleep", i: number, sig: string, ms: number }} Effect
 */
/**
 * @typedef {object} Layer
 * @property {Turn} turn the call this state belongs to
 * @property {JournalEntry[]} journal
 * @property {number} count effects made so far in this run
 * @property {Response[]} responses next()'s responses in this run, by effect index
 * @property {WeakMap<object, number>} rejections errors next() or sleep() rejected with, to their effect index
 * @property {Effect | null} effect the first effect the journal does not hold
 * @property {Uint8Array | null} effectBytes the body that effect sends, when the policy made it
 * @property {string | null} diverged how this run left the journal's path
 * @property {boolean} streamed whether a next() sent the guest's body as its one stream
 */

/** @type {Layer | null} */
let layer = null;

/** A promise for an effect that will not settle in this run: the call ends there. */
const never = () => new Promise(() => undefined);

/**
 * Starts a handle call's layer state.
 * @param {string | undefined} journalJson
 */
export function startLayer(journalJson) {
  layer = {
    turn,
    journal: journalJson === undefined ? [] : JSON.parse(journalJson),
    count: 0,
    responses: [],
    rejections: new WeakMap(),
    effect: null,
    effectBytes: null,
    diverged: null,
    streamed: false,
  };
}

/** The current call's layer state, if the call is a handle call. */
function current() {
  return layer !== null && layer.turn === turn ? layer : null;
}

/**
 * What a handle call's run comes to when its promise has not settled: divergence first, then
 * the effect to perform. Bodies to load (`need`) come before the effect; the caller sees to those.
 * @returns {{ t: "diverged", what: string } | Effect | null}
 */
export function layerStop() {
  const state = current();
  if (state === null) return null;
  if (state.diverged !== null) return { t: "diverged", what: state.diverged };
  return state.effect;
}
/** The bytes the pending effect sends, for takeBytes. */
export function effectBytes() {
  return current()?.effectBytes ?? null;
}

/**
 * How a settled run of handle ends, before its value counts: a rerun that diverged, or that made
 * fewer effects than the journal holds (it stopped short of what the proxy already did), fails.
 * @returns {string | null}
 */
export function layerDivergence() {
  const state = current();
  if (state === null) return null;
  if (state.diverged !== null) return state.diverged;
  if (state.count < state.journal.length) return `it answered after ${state.count} of the ${state.journal.length} next() and sleep() calls the first run made`;
  return null;
}

/**
 * The next() response `value` is, unchanged, if it is one: its effect index.
 * @param {unknown} value
 * @param {(response: Response) => boolean} unchanged
 */
export function passedIndex(value, unchanged) {
  const state = current();
  if (state === null || !(value instanceof Response)) return -1;
  const i = state.responses.indexOf(value);
  return i >= 0 && unchanged(value) ? i : -1;
}

/**
 * The effect index of an error next() or sleep() rejected with, if `error` is one.
 * @param {unknown} error
 */
export function rejectionIndex(error) {
  const state = current();
  if (state === null || typeof error !== "object" || error === null) return undefined;
  return state.rejections.get(error);
}

/**
 * A cheap fingerprint of bytes, for the journal check: at most 4096 of them, evenly spaced, and
 * the length. The run that made them was deterministic; this only has to catch a rerun that is not.
 * @param {Uint8Array} bytes
 */
function fingerprint(bytes) {
  let hash = 0x811c9dc5;
  const step = Math.max(1, Math.floor(bytes.length / 4096));
  for (let i = 0; i < bytes.length; i += step) {
    hash ^= /** @type {number} */ (bytes[i]);
    hash = Math.imul(hash, 0x01000193);
  }
  return `${bytes.length}:${(hash >>> 0).toString(16)}`;
}

/**
 * @param {Rejection} rej
 * @returns {Error}
 */
function rejectionError(rej) {
  if (rej.blocked) return new HttpRequestBlockedError(rej.message, rej.status, rej.statusText);
  /** @type {Error & { status?: number, code?: string }} */
  const error = new Error(rej.message);
  error.name = rej.name;
  error.status = rej.status;
  error.code = rej.code;
  return error;
}

/**
 * One effect: replayed from the journal, or the place where this run ends.
 * @param {Layer} state
 * @param {"next" | "sleep"} kind
 * @param {string} sig
 * @param {(i: number) => Effect} describe
 * @param {Uint8Array | null} bytes
 * @returns {Promise<any>}
 */
function effect(state, kind, sig, describe, bytes) {
  const i = state.count++;
  const entry = state.journal[i];
  if (entry === undefined) {
    // Only the first: effects are performed one at a time, in the order they were made.
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
  if (entry.rej !== undefined) {
    const error = rejectionError(entry.rej);
    state.rejections.set(error, i);
    return Promise.reject(error);
  }
  if (kind === "sleep") return Promise.resolve(undefined);
  const head = /** @type {ResponseHead} */ (entry.res);
  const response = makeResponse(head.status, head.statusText, head.headers, head.url, head.hasBody, i);
  state.responses[i] = response;
  return Promise.resolve(response);
}

/**
 * The `next` a handle call gets: sends a Request (the layer's own when called with nothing)
 * through the rest of the path, and resolves to the Response.
 * @param {Request} own
 */
export function makeNext(own) {
  const mine = turn;
  /** @param {unknown} [input] */
  return function next(input) {
    const state = current();
    if (state === null || turn !== mine) return Promise.reject(new TypeError("next() belongs to a call that has ended"));
    const chosen = input === undefined ? own : input;
    if (!(chosen instanceof Request)) return Promise.reject(new TypeError("next() takes a Request, or nothing for the layer's own request"));
    if (chosen.bodyUsed) {
      return Promise.reject(new TypeError("next() was given a Request whose body was already read or sent; pass request.clone() to next() to send a body more than once"));
    }
    const bodyOf = bodyState(chosen);
    /** @type {BodyRef} */
    let body = null;
    /** @type {unknown} */
    let bodySig = null;
    /** @type {Uint8Array | null} */
    let bytes = null;
    if (bodyOf !== null) {
      if (bodyOf.bytes !== undefined) {
        bytes = bodyOf.bytes;
        body = { b: bytes.byteLength };
        bodySig = fingerprint(bytes);
      } else if (bodyOf.turn !== turn) {
        return Promise.reject(new TypeError("a body from another call cannot be sent"));
      } else if (bodyOf.source === "request") {
        // Unloaded and not held by the proxy, the guest's body goes as its one stream.
        const once = turn.request === undefined && !turn.replayable;
        if (once && state.streamed) {
          return Promise.reject(
            new TypeError("next() was given the request's body, which an earlier next() already streamed upstream; pass request.clone() to each next() to send a body more than once"),
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
  };
}

/**
 * The global `sleep(ms)`: waits, inside handle only, without holding the sandbox (it has no
 * timers). The proxy bounds it by the request's `timeouts.requestMs`.
 * @param {unknown} ms
 * @returns {Promise<void>}
 */
export function sleep(ms) {
  const state = current();
  if (state === null) return Promise.reject(new TypeError("sleep() is only available while handle(request, next) runs"));
  const wait = Number(ms);
  if (!Number.isFinite(wait) || wait < 0) return Promise.reject(new RangeError(`sleep() takes a number of milliseconds from 0 up, not ${String(ms)}`));
  const sig = JSON.stringify(["sleep", wait]);
  return effect(state, "sleep", sig, (i) => ({ t: "effect", k: "sleep", i, sig, ms: wait }), null);
}
