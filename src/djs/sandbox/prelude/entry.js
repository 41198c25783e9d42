// @ts-check
// The entry points the worker calls (src/djs/sandbox.ts): install() once per QuickJS context,
// then freeze, load, and one call (with finish and takeBytes) per phase call.
import { HttpRequestBlockedError } from "./blocked-error.js";
import { bodyState, bodyUsed, startTurn, turn } from "./bodies.js";
import { installClock, startClock } from "./clock.js";
import { clearLogs, logs } from "./console.js";
import { copyBuffer } from "./encoding.js";
import { headersDirty, headersFlat } from "./headers.js";
import { setHost } from "./host.js";
import { effectBytes, layerDivergence, layerStop, makeNext, passedIndex, rejectionIndex, startLayer } from "./layer.js";
import { freeze, installGlobals } from "./realm.js";
import { makeRequest, makeResponse, Request, Response } from "./request-response.js";
import { setCanonicalHref } from "./url.js";

/** @typedef {import("./bodies.js").BodySource} BodySource */
/** @typedef {import("./bodies.js").BodyState} BodyState */
/** @typedef {import("./host.js").Host} Host */
/**
 * What a call answers when a code does not say it all; src/djs/protocol.ts's `Outcome`.
 * @typedef {{ t: string, logs?: unknown, [field: string]: unknown }} Outcome
 */
/**
 * The policy's top level, wrapped in a function of `globalThis`: each call returns its exports.
 * @typedef {(this: object, scope: object) => Record<string, (...args: unknown[]) => unknown>} PolicyFactory
 */

/** @type {PolicyFactory | null} */
let factory = null;
/** @type {number | Outcome | undefined} */
let outcome;
/** @type {Uint8Array | null} */
let stash = null;

/**
 * @param {BodyState | null} state
 * @returns {{ h: BodySource } | { n: number } | { b: number } | null}
 */
function serialiseBody(state) {
  if (state === null) return null;
  if (typeof state.source === "number") return { n: state.source };
  if (state.source !== undefined) return { h: state.source };
  stash = state.bytes;
  return { b: state.bytes.byteLength };
}
/**
 * @param {unknown} error
 * @returns {Outcome}
 */
function thrown(error) {
  try {
    // A rejection of next() or sleep() thrown on: the proxy answers with the original failure.
    const from = rejectionIndex(error);
    const origin = from === undefined ? {} : { from };
    if (error instanceof HttpRequestBlockedError) {
      return { t: "blocked", status: Number(error.status), message: String(error.message), statusText: String(error.statusText), ...origin };
    }
    if (error instanceof Error) return { t: "throw", name: String(error.name), message: String(error.message), stack: String(error.stack ?? ""), ...origin };
    return { t: "throw", name: typeof error, message: String(error), stack: "" };
  } catch {
    return { t: "throw", name: "Error", message: "the policy threw a value that cannot be described", stack: "" };
  }
}
/** The common outcomes travel as numbers: QuickJS's JSON is the slowest part of a call. */
const codes = { false: 0, true: 1, unchanged: 2 };
/** What `call` answers while the phase's promise has yet to settle: no outcome is negative. */
const pending = -1;
/**
 * @param {Phase} phase
 * @param {unknown} value what the phase returned, or its promise settled to
 * @param {Request | undefined} request the call's request, for onRequest and onResponse
 * @returns {number | Outcome}
 */
function settle(phase, value, request) {
  if (phase === "handle") return settleLayer(value);
  if (phase === "isRequestAllowed" || phase === "isIpAllowed") {
    return typeof value === "boolean" ? (value ? codes.true : codes.false) : withShown({ t: "value", v: typeof value }, value);
  }
  if (phase === "onResponse" && value === undefined) return codes.unchanged;
  if (phase === "onRequest" && (value === undefined || value === request)) {
    // onRequest always has its request.
    const headers = /** @type {Request} */ (request).headers;
    const dirty = headersDirty(headers);
    const consumed = bodyUsed(/** @type {Request} */ (request));
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
  return value === null ? { t: "bad", what: "null" } : withShown({ t: "bad", what: typeof value }, value);
}

/**
 * What handle answered: next()'s Response as it came (passed through, by its effect index), or
 * a Response of the policy's own. A rerun that left the journal's path fails whatever it answered.
 * @param {unknown} value
 * @returns {Outcome}
 */
function settleLayer(value) {
  const passed = passedIndex(value, (response) => !response.bodyUsed && !headersDirty(response.headers));
  if (passed >= 0) return { t: "passed", i: passed };
  if (value instanceof Response) return /** @type {Outcome} */ (settle("onResponse", value, undefined));
  if (value === null) return { t: "bad", what: "null" };
  if (value instanceof Request) return { t: "bad", what: "a Request" };
  return withShown({ t: "bad", what: typeof value }, value);
}

/**
 * The most of a value's view that travels: far past what the log shows (100 characters), since
 * the proxy redacts the text before it cuts it (shownValue in src/pipeline/djs-phases.ts).
 */
const maxShownChars = 65536;
/** Keys of an object shown. */
const maxShownKeys = 5;
/**
 * An outcome for a value its phase cannot use, with `shown`: what the log's detail shows of it.
 * Reading it can run the policy's own code (a getter, a Proxy's trap): a throw there, or a
 * value with nothing to show (undefined), leaves it out.
 * @param {Outcome} outcome
 * @param {unknown} value
 * @returns {Outcome}
 */
function withShown(outcome, value) {
  try {
    const shown = view(value);
    return shown === undefined ? outcome : { ...outcome, shown: shown.slice(0, maxShownChars) };
  } catch {
    return outcome;
  }
}
/**
 * @param {unknown} value
 * @returns {string | undefined}
 */
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
      if (value === null) return undefined;
      if (Array.isArray(value)) return `an array of ${value.length}`;
      const proto = Object.getPrototypeOf(value);
      const kind = proto === null ? "null-prototype object" : String(proto.constructor?.name ?? "object");
      const keys = Object.keys(value);
      const listed = keys.slice(0, maxShownKeys).join(", ") + (keys.length > maxShownKeys ? ", …" : "");
      return keys.length === 0 ? kind : `${kind} { ${listed} }`;
    }
    default:
      return undefined;
  }
}
/**
 * A handle call's outcome when its promise never settled in this run: it diverged, or stopped
 * for a body to be loaded or at an effect for the proxy to perform.
 * @returns {Outcome | undefined}
 */
function layerUnsettled() {
  const stop = layerStop();
  if (stop === null || stop.t === "diverged") return stop ?? undefined;
  const need = turn.needed === null ? [] : [...turn.needed];
  if (need.length > 0) return { t: "need", which: need };
  if (stop.k === "next" && stop.body !== null && "b" in stop.body) stash = effectBytes();
  return stop;
}

/** Whether a value is a thenable; the check itself must not let a hostile getter escape. */
/**
 * @param {any} value
 * @returns {value is PromiseLike<unknown>}
 */
function isThenable(value) {
  return value !== null && (typeof value === "object" || typeof value === "function") && typeof value.then === "function";
}
/**
 * A handle call's rerun that left the journal's path fails, whatever it answered.
 * @param {number | Outcome} settled
 */
function conclude(settled) {
  const diverged = layerDivergence();
  return diverged === null ? settled : { t: "diverged", what: diverged };
}
/** A settled outcome as the worker reads it: a code, or JSON when there is more to say. */
/** @param {number | Outcome} settled */
function encode(settled) {
  if (typeof settled === "number" && logs.length === 0) return settled;
  /** @type {Outcome} */
  const full = typeof settled === "number" ? { t: "code", v: settled } : settled;
  if (logs.length > 0) full.logs = logs;
  return JSON.stringify(full);
}
/** @typedef {"isRequestAllowed" | "isIpAllowed" | "onRequest" | "onResponse" | "handle"} Phase */
/** @type {Phase[]} In src/djs/protocol.ts's order: a call names its phase by index. */
const phases = ["isRequestAllowed", "isIpAllowed", "onRequest", "onResponse", "handle"];

/** The most names a load reports: a policy that exports thousands gets the first ones named. */
const maxFound = 200;

/**
 * Whether a value can serve as a phase: a function that is not a class (calling a class throws
 * on every call).
 * @param {unknown} value
 */
function isPhaseFunction(value) {
  return typeof value === "function" && kindOfValue(value) === "function";
}
/**
 * What a value is, in a word the host can put in a sentence: `function`, `class`, `null`, a
 * `typeof`, or an object's tag (`Object`, `Array`, `Set`, …). Never throws: a hostile getter
 * answers `object`.
 * @param {unknown} value
 * @returns {string}
 */
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
/**
 * What a policy's top level defined, for the host to judge (src/djs/phase-check.ts): its exports
 * (a script: its phase names and the top-level names the host asked about), with the own keys of
 * an object default export, and the names its top level set on `globalThis` (or `this`), which
 * no call ever reads. Read through descriptors: no getter of the policy runs.
 * @param {unknown} names
 * @param {object} globals
 * @returns {{ name: string, what: string, from: "export" | "global", holds?: string[] }[]}
 */
function inspect(names, globals) {
  /** @type {{ name: string, what: string, from: "export" | "global", holds?: string[] }[]} */
  const found = [];
  /**
   * @param {object} from
   * @param {"export" | "global"} where
   */
  const collect = (from, where) => {
    for (const name of Object.getOwnPropertyNames(from)) {
      if (found.length >= maxFound) return;
      const desc = Object.getOwnPropertyDescriptor(from, name);
      if (desc === undefined) continue;
      const value = desc.value;
      if (where === "export" && value === undefined && !("get" in desc && desc.get !== undefined)) continue;
      /** @type {{ name: string, what: string, from: "export" | "global", holds?: string[] }} */
      const entry = { name, what: "get" in desc && desc.get !== undefined ? "accessor" : kindOfValue(value), from: where };
      if (name === "default" && value !== null && typeof value === "object") {
        try {
          entry.holds = Object.getOwnPropertyNames(value).slice(0, maxFound);
        } catch {
          entry.holds = [];
        }
      }
      found.push(entry);
    }
  };
  // A Proxy's traps are the policy's own code: when one throws, what was gathered so far is what
  // is reported.
  try {
    if (names !== null && typeof names === "object") collect(names, "export");
    collect(globals, "global");
    return found;
  } catch {
    return found;
  }
}

/**
 * Installs the sandbox's API in this realm and answers the functions the worker calls.
 * @param {Host} host
 */
export function install(host) {
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
      // Made after the realm was frozen, and shared by every call: a script reaches it as
      // `arguments.callee`.
      Object.freeze(policyFactory.prototype);
      Object.freeze(policyFactory);
      factory = policyFactory;
      const scope = Object.create(globalThis);
      const exported = factory.call(scope, scope);
      // A script's factory answers its phases only; its inspection twin also answers the
      // top-level names that look like phase names, for the host to name what it found.
      let names = exported;
      let globals = scope;
      if (inspectFactory !== undefined) {
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
      outcome = undefined;
      stash = null;
      const phase = /** @type {Phase} */ (phases[phaseIndex]);
      /** @type {Request | undefined} */
      let request;
      /** @type {unknown[]} */
      let args;
      if (phase === "isIpAllowed") {
        // method, url, headers, hasBody carry hostname, ip, family, port; requestBody the protocol.
        args = [{ hostname: method, ip: url, family: headers, port: hasBody, protocol: requestBody }];
        startTurn(undefined, undefined);
      } else if (phase === "onResponse") {
        startTurn(undefined, responseBody === undefined ? undefined : new Uint8Array(responseBody));
        request = makeRequest(method, url, headers, false);
        args = [makeResponse(/** @type {number} */ (status), /** @type {string} */ (statusText), /** @type {string} */ (responseHeaders), /** @type {string} */ (responseUrl), responseHasBody === true), request];
      } else if (phase === "handle") {
        const current = startTurn(requestBody === undefined ? undefined : new Uint8Array(requestBody), undefined);
        current.replayable = statusText === true;
        /** @type {(Uint8Array | undefined)[]} */
        const loaded = [];
        for (let i = 10; i < arguments.length; i++) loaded.push(arguments[i] === undefined ? undefined : new Uint8Array(arguments[i]));
        current.next = loaded;
        startLayer(status);
        request = makeRequest(method, url, headers, hasBody);
        args = [request, makeNext(request)];
      } else {
        startTurn(requestBody === undefined ? undefined : new Uint8Array(requestBody), undefined);
        request = makeRequest(method, url, headers, phase === "onRequest" && hasBody);
        args = [request];
      }
      try {
        const scope = Object.create(globalThis);
        const result = /** @type {PolicyFactory} */ (factory).call(scope, scope)[phase](...args);
        if (!isThenable(result)) return encode(conclude(settle(phase, result, request)));
        // Only this call's own handlers may settle it: the host runs every pending job before
        // the call ends, and `mine` keeps a handler that ran late from answering for another
        // call. Promise.resolve reads the result's `constructor`, which may throw.
        const mine = turn;
        Promise.resolve(result).then(
          (value) => {
            if (turn !== mine) return;
            // Reading what the phase settled to runs the policy's code (a getter, a Proxy's
            // trap): a throw there is the policy's, as it is when the phase returns at once.
            // Uncaught, it left the call with no outcome, reported as a promise that never settles.
            try {
              outcome = settle(phase, value, request);
            } catch (error) {
              outcome = thrown(error);
            }
          },
          (error) => {
            if (turn === mine) outcome = thrown(error);
          },
        );
      } catch (error) {
        return encode(conclude(thrown(error)));
      }
      return pending;
    },
    /** The outcome of an asynchronous call, once the pending jobs ran. */
    finish() {
      /** @type {number | Outcome | undefined} */
      let settled = outcome === undefined ? undefined : conclude(outcome);
      if (settled === undefined) settled = layerUnsettled();
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
}
