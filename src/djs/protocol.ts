/**
 * What the proxy and a tier-2 worker say to each other. Everything here is structured-clone
 * data: a call's head goes in as JSON text, bodies as bytes, and the outcome comes back tagged.
 */

export type PolicyKind = "script" | "module" | "typescript";
export type PhaseName = "isRequestAllowed" | "isIpAllowed" | "onRequest" | "onResponse" | "handle";
/** By index on the wire, and in the prelude's own list (entry.js): new phases go at the end. */
export const phaseNames: readonly PhaseName[] = ["isRequestAllowed", "isIpAllowed", "onRequest", "onResponse", "handle"];

export interface DjsLimits {
  /** Wall-clock time for one call, in ms. Default 100. */
  readonly timeoutMs: number;
  /** QuickJS heap, in bytes. Default 32 MiB. */
  readonly memoryBytes: number;
  /** QuickJS stack, in bytes. Default 256 KiB; at most 1 MiB (the worker's own stack is 8 MiB). */
  readonly stackBytes: number;
  /** What one call may return: its head as JSON plus any body it built. Default 16 MiB. */
  readonly returnBytes: number;
  /**
   * Calls waiting or running at once, over all workers. One more is refused at once (502), so
   * a flood of requests cannot queue without bound behind a slow policy. Default 512.
   */
  readonly maxCalls: number;
}

/** How a worker gets its policy: the source to bundle (the first worker), or the bundled code. */
export type PolicySource =
  | {
      readonly kind: PolicyKind;
      readonly filename: string;
      readonly source: string;
      readonly modules: Readonly<Record<string, string>>;
      readonly fromDisk: boolean;
      /**
       * Given as text, with neither a kind nor a telling extension: `kind` is "module" if the
       * source has ES module syntax (esbuild parses it to tell), else it is a script, named
       * `scriptFilename`.
       */
      readonly detect?: { readonly scriptFilename: string };
    }
  | { readonly kind: PolicyKind; readonly filename: string; readonly code: string; readonly map: string | undefined };

export interface WorkerInit {
  readonly policy: PolicySource;
  readonly limits: DjsLimits;
  /** Two Float64 slots: when the running call started (epoch ms, 0 when idle), and its id. The host's watchdog reads them. */
  readonly heartbeat: SharedArrayBuffer;
  /** Int32 slot set to 1 once the init reply is posted, for a host waiting synchronously. */
  readonly ready: SharedArrayBuffer;
  /**
   * Two Int32 slots: how many call batches the host has posted, and 1 while the worker sleeps
   * waiting for the next. The worker takes batches off its port itself and sleeps in
   * `Atomics.wait`, not in its event loop: a wake-up costs a futex, not a trip through libuv.
   */
  readonly wake: SharedArrayBuffer;
  /**
   * One Int32 slot, shared by every worker of the process: held while a worker switches V8's
   * process-wide --expose-gc flag on and off to get its own collector, so that no two workers'
   * switches interleave (one's "off" landing inside another's "on … get").
   */
  readonly gcFlagLock: SharedArrayBuffer;
  /**
   * Int32 cells, one per call in flight, shared by every worker of one engine: a call's cell holds
   * its {@link claimOf} while it waits, and whoever changes that first decides its fate, so that
   * a call never both runs and is dropped. A worker sets {@link claimRunning} before it runs the
   * call; the host sets {@link claimDropped} when the call's request ended, or it waited past
   * `timeouts.hookMs`, and the worker then passes it by without running it.
   */
  readonly claims: SharedArrayBuffer;
  /**
   * QuickJS's WASM, compiled once by the host for all its workers (quickjs-module.ts); undefined
   * when the host could not compile it, and the worker compiles its own.
   */
  readonly quickjs: object | undefined;
}

/** A call's cell once a worker took it to run. */
export const claimRunning = 0;
/** A call's cell once the host dropped it: the worker passes it by. */
export const claimDropped = -1;

/**
 * What a waiting call's cell holds: taken from its id, which changes when the call moves to
 * another worker, so that a worker being stopped that still holds the old message passes it by.
 */
export function claimOf(id: number): number {
  return (id % 0x7fff_fffe) + 1;
}

export type InitReply =
  | {
      readonly ok: true;
      /** The kind and file name the policy loaded as: a `detect` source's are known only now. */
      readonly kind: PolicyKind;
      readonly filename: string;
      readonly code: string;
      readonly map: string | undefined;
      readonly phases: PhaseName[];
    }
  | { readonly ok: false; readonly message: string };

/** The address `isIpAllowed` is asked about. */
export interface IpCallInfo {
  readonly hostname: string;
  readonly ip: string;
  readonly family: number;
  readonly port: number;
  readonly protocol: string;
}

/**
 * One call, as flat fields: the worker hands each to QuickJS as a primitive, because QuickJS's
 * own JSON parsing would be the largest cost of a call. Header lists are joined with LF, which
 * no valid header name or value contains (strings cross into QuickJS as C strings: NUL would cut them).
 */
export interface CallMessage {
  readonly id: number;
  /** The call's cell in {@link WorkerInit.claims}. */
  readonly cell: number;
  readonly phase: PhaseName;
  /** The proxy's clock when the call started: the policy's `Date.now()`. */
  readonly now: number;
  /** Seeds the policy's `Math.random()`; a call run again (to load a body) keeps its seed. */
  readonly seed: number;
  readonly method: string;
  readonly url: string;
  readonly headers: string;
  readonly hasBody: boolean;
  readonly requestBody?: Uint8Array;
  readonly info?: IpCallInfo;
  readonly response?: {
    readonly status: number;
    readonly statusText: string;
    readonly headers: string;
    readonly url: string;
    readonly hasBody: boolean;
  };
  readonly responseBody?: Uint8Array;
  /**
   * handle only: the effects (`next()`, `sleep()`) the proxy has performed for this call so far,
   * in the order the policy made them. A rerun replays them instead of asking again.
   */
  readonly journal?: readonly JournalEntry[];
  /** handle only: the bodies of next()'s responses the proxy loaded for the policy, by effect index. */
  readonly nextBodies?: readonly (Uint8Array | undefined)[];
  /** handle only: the request's body is bytes in the proxy (held for a clone, or bytes already), so it can be sent more than once without loading it into the sandbox. */
  readonly replayable?: boolean;
}

/** A call as the pipeline makes it: the engine gives it its id and claim cell. */
export type CallFields = Omit<CallMessage, "id" | "cell">;

/** The head of a response that next() resolved to, as the sandbox rebuilds it. */
export interface ResponseHead {
  readonly status: number;
  readonly statusText: string;
  readonly headers: string;
  readonly url: string;
  readonly hasBody: boolean;
}

/** How next() or sleep() failed, for the sandbox to reject with. */
export interface EffectRejection {
  /** A refusal (403, or a policy's block status): HttpRequestBlockedError in the sandbox. */
  readonly blocked: boolean;
  readonly name: string;
  readonly message: string;
  readonly status: number;
  readonly statusText: string;
  readonly code: string;
}

/**
 * One effect a layer's call made and the proxy performed. `sig` is what the sandbox said the
 * effect was (kind, method, URL, headers, body); a rerun that makes a different effect at the same
 * place has diverged from the run the proxy acted on, and fails closed.
 */
export interface JournalEntry {
  readonly k: "next" | "sleep";
  readonly sig: string;
  /** next() resolved to this response. */
  readonly res?: ResponseHead;
  /** The effect rejected. */
  readonly rej?: EffectRejection;
}

/**
 * A body in an outcome: the proxy's own request or response body, the body of the response that
 * next() number `n` resolved to (handle), or bytes the policy made.
 */
export type BodyRef = null | { readonly h: "request" | "response" } | { readonly n: number } | { readonly b: number };

/**
 * A body a call stopped to have loaded: the request's, the response's, or next() number n's
 * response's; or, for "held", the request's bytes held by the proxy (handle's request.clone()),
 * so that they can be sent more than once without entering the sandbox.
 */
export type NeededBody = "request" | "response" | number | "held";

export type Outcome = (
  /** `shown`: what was returned, for the log ({@link Outcome} "bad"'s). */
  | { readonly t: "value"; readonly v: boolean | string; readonly shown?: string }
  | { readonly t: "code"; readonly v: number }
  | { readonly t: "continue"; readonly headers?: string[] | null; readonly consumed?: boolean }
  | { readonly t: "request"; readonly method: string; readonly url: string; readonly headers: string[]; readonly body: BodyRef }
  | { readonly t: "response"; readonly status: number; readonly statusText: string; readonly headers: string[]; readonly body: BodyRef }
  /** `from`: the error is the rejection of effect number `from`, thrown on as it was. */
  | { readonly t: "blocked"; readonly status: number; readonly message: string; readonly statusText: string; readonly from?: number }
  | { readonly t: "throw"; readonly name: string; readonly message: string; readonly stack: string; readonly from?: number }
  /**
   * The phase returned what it cannot use: `what` says what, and for a value of the wrong type
   * (`what` is its typeof) `shown` shows it, up to 65536 characters (a string's text, a symbol's
   * description, a number, an object's kind and first keys), for the proxy to redact and cut.
   */
  | { readonly t: "bad"; readonly what: string; readonly shown?: string }
  | { readonly t: "need"; readonly which: NeededBody[] }
  /** handle: the call stopped at effect `i`, which the journal does not hold yet; the proxy performs it and runs the call again. */
  | { readonly t: "effect"; readonly k: "next"; readonly i: number; readonly sig: string; readonly method: string; readonly url: string; readonly headers: string[]; readonly body: BodyRef }
  | { readonly t: "effect"; readonly k: "sleep"; readonly i: number; readonly sig: string; readonly ms: number }
  /** handle: the policy returned the response of next() number `i`, as it was. */
  | { readonly t: "passed"; readonly i: number }
  /** handle: a rerun made an effect other than the one the journal holds at that place. */
  | { readonly t: "diverged"; readonly what: string }
  | { readonly t: "pending" }
  | { readonly t: "limit"; readonly what: string }
  /**
   * The call never ran: its worker found it dropped (the host's own answer came first). `why`
   * is the host's: the call's request ended, or it waited past `timeouts.hookMs` for a worker.
   */
  | { readonly t: "dropped"; readonly why?: "ended" | "waited" }
) & { readonly logs?: [string, string][] };

export interface CallReply {
  readonly id: number;
  readonly outcome: Outcome;
  /** The body the policy built, when the outcome has `{ b }`. */
  readonly bytes?: Uint8Array;
}
