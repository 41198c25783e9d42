import { constants, type ServerOptions } from "node:http2";
import { maxRequestFields } from "./guest-request.js";
import { emptyStreams, sharedWindow } from "../upstream/h2-window-share.js";

/** The guest-side HTTP/2 limits that `limits.h2*` sets (README "HTTP/2 and gRPC"). */
export interface H2ConfiguredLimits {
  /** SETTINGS_MAX_CONCURRENT_STREAMS, and the pipeline work running per connection. */
  readonly h2Streams: number;
  /** SETTINGS_MAX_HEADER_LIST_SIZE; a longer request header list gets its stream reset, or 431. */
  readonly h2HeaderListBytes: number;
  /** MiB of nghttp2 state and queued frames per connection; past it new streams are refused. */
  readonly h2SessionMemoryMiB: number;
  /**
   * Streams a guest may reset per 10 s before GOAWAY(ENHANCE_YOUR_CALM), counting only resets
   * within {@link h2Limits.prematureResetMs} of the stream's start, before its response ended.
   */
  readonly h2ResetsPer10s: number;
  /** SETTINGS_INITIAL_WINDOW_SIZE: the most of one upload the proxy holds while its upstream takes none. */
  readonly h2StreamWindowBytes: number;
  /** The connection's receive window, raised with WINDOW_UPDATE once the session starts (raiseConnectionWindow). */
  readonly h2ConnectionWindowBytes: number;
  /** What the stream windows of one connection may add up to (h2GuestWindow). */
  readonly h2ConnectionBufferBytes: number;
  /** What the streams under way from one source address may be charged together (h2StreamCharge, SourceBudgets). */
  readonly sourceBufferBytes: number;
}

/**
 * The guest-side HTTP/2 limits. Node's own defaults are made for a server that answers from
 * memory; a proxy opens an upstream stream (and may run hooks) for each guest stream, so every
 * one of these is set explicitly rather than left to Node. The configurable ones come from
 * {@link H2ConfiguredLimits}; these are fixed.
 */
export const h2Limits = Object.freeze({
  /**
   * A guest's reset counts against `limits.h2ResetsPer10s` only within this long of its stream's
   * start, as Envoy counts a reset "premature" within a second of it. A rapid-reset flood resets
   * each stream as it opens it; a gRPC client's missed deadlines and cancellations end calls that
   * were in flight, and 300 calls whose deadline passed together (100 of them on the wire, at the
   * stream limit) were 100 resets at once: three such bursts in 10 s closed the connection, with
   * the calls still running on it (interop finding). A guest that waits this long before each
   * reset opens at most `limits.h2Streams` streams per this long, which any client may.
   */
  prematureResetMs: 1_000,
  /**
   * Header lists over `limits.h2HeaderListBytes` one connection may send per window before
   * GOAWAY(ENHANCE_YOUR_CALM). Until the guest acknowledges the proxy's SETTINGS, Node applies
   * no header-list limit and nghttp2 decodes whatever the HPACK table references: 250 one-byte
   * references to a 4 KB entry are 1 MB decoded from 300 bytes sent. Each such stream gets its
   * 431; a guest that keeps sending them is not making requests by mistake.
   */
  maxOversizedHeaderLists: 10,
  /** SETTINGS frames per window. */
  maxSettingsPerWindow: 100,
  /** PING frames per window. */
  maxPingsPerWindow: 500,
  windowMs: 10_000,
  /** Silence after the guest's FIN (or at most idleMs) before its session and socket are closed. */
  afterGuestEndMs: 5_000,
  /** After the proxy ends a session whose guest is gone or refused, how long its GOAWAY gets to go out before the socket is closed. */
  destroyLingerMs: 1_000,
});

/**
 * Entries Node keeps of one header block, its pseudo-headers counted (its own default is 128):
 * as many as a list within `limits.h2HeaderListBytes` can hold, each entry counting 32 bytes
 * besides its name and value (RFC 9113 §6.5.2). A block past this count gets its stream reset by
 * Node as it is decoded, before any answer can be made; one within it reaches the proxy, which
 * answers a request with more than {@link maxRequestFields} fields 431, as the HTTP/1.1 side does
 * (with the count at 260 it reset the stream, and the guest saw ENHANCE_YOUR_CALM, not a status).
 */
export function h2HeaderListPairs(limits: Pick<H2ConfiguredLimits, "h2HeaderListBytes">): number {
  return Math.max(maxRequestFields + 5, Math.floor(limits.h2HeaderListBytes / 32));
}

/**
 * The stream window every guest connection is given (SETTINGS_INITIAL_WINDOW_SIZE), fixed for the
 * connection's life: `limits.h2Streams` streams' share of `limits.h2ConnectionBufferBytes`, the
 * largest value one byte under a power of two within it (131,071 bytes at the defaults), capped at
 * `limits.h2StreamWindowBytes` and never below 65,535 (sharedWindow). A guest that fills every
 * window it may open holds the proxy to the budget (65,535 bytes a stream past it when the budget
 * is too small for that many). It was lowered and raised with the count of uploads: a guest
 * sends by the window it last read, so one starting many uploads together sent 1 MiB on each
 * before it read the lower one, and the proxy had to reset compliant streams (docs/reliability.md,
 * thirteenth session). The guest's leg is a local one, where a small window costs little
 * (docs/performance.md, "What a stopped HTTP/2 reader holds").
 */
export function h2GuestWindow(limits: Pick<H2ConfiguredLimits, "h2StreamWindowBytes" | "h2ConnectionBufferBytes" | "h2Streams">): number {
  return sharedWindow(limits.h2StreamWindowBytes, limits.h2ConnectionBufferBytes, emptyStreams(limits.h2Streams));
}

/**
 * What one guest stream is charged against `limits.sourceBufferBytes` (SourceBudgets) while it is
 * open: the most its windows let the proxy hold for it. Its request body, if one may come, up to
 * the guest connection's window ({@link h2GuestWindow}: the guest may send that much before the
 * proxy reads any of it); and its response, up to one upstream stream's window
 * (`limits.h2StreamWindowBytes`, within `limits.h2ConnectionBufferBytes`), which an HTTP/2
 * upstream fills when the guest stops reading. An upstream connection lowers its streams' windows
 * only when it carries many: a source whose streams go to many origins, a few to each, gets the
 * whole window on every one. 1,048,575 bytes a request without a body at the defaults,
 * 1,179,646 with one.
 */
export function h2StreamCharge(limits: Pick<H2ConfiguredLimits, "h2StreamWindowBytes" | "h2ConnectionBufferBytes" | "h2Streams">, hasBody: boolean): number {
  return (hasBody ? h2GuestWindow(limits) : 0) + Math.min(limits.h2StreamWindowBytes, limits.h2ConnectionBufferBytes);
}

/** The http2.Server options for these limits. */
export function h2ServerOptions(limits: Omit<H2ConfiguredLimits, "sourceBufferBytes">): ServerOptions {
  return {
    maxSessionMemory: limits.h2SessionMemoryMiB,
    maxHeaderListPairs: h2HeaderListPairs(limits),
    // Frames that nghttp2 refuses as invalid, and streams it refuses itself, end the session sooner.
    maxSessionInvalidFrames: 100,
    maxSessionRejectedStreams: 100,
    settings: {
      // Node's default is unlimited.
      maxConcurrentStreams: limits.h2Streams,
      maxHeaderListSize: limits.h2HeaderListBytes,
      // Server push is never used: a guest must not be sent anything it did not ask for.
      enablePush: false,
      initialWindowSize: h2GuestWindow(limits),
    },
  };
}

export const h2Codes = Object.freeze({
  cancel: constants.NGHTTP2_CANCEL,
  refusedStream: constants.NGHTTP2_REFUSED_STREAM,
  internalError: constants.NGHTTP2_INTERNAL_ERROR,
  enhanceYourCalm: constants.NGHTTP2_ENHANCE_YOUR_CALM,
  settingsTimeout: constants.NGHTTP2_SETTINGS_TIMEOUT,
  noError: constants.NGHTTP2_NO_ERROR,
});

/**
 * Header fields HTTP/2 forbids (RFC 9113 §8.2.2): Node refuses to send them, and nghttp2 treats
 * a request carrying them as malformed. `te` is allowed only as `trailers`.
 */
export const h2ConnectionHeaders: ReadonlySet<string> = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "upgrade",
  "host",
  "http2-settings",
]);
