import { constants, type ServerOptions } from "node:http2";

/**
 * The guest-side HTTP/2 limits (README "HTTP/2 and gRPC"). Node's own defaults are made for a
 * server that answers from memory; a proxy opens an upstream stream (and may run hooks) for each
 * guest stream, so every one of these is set explicitly rather than left to Node.
 */
export const h2Limits = Object.freeze({
  /** SETTINGS_MAX_CONCURRENT_STREAMS; Node's default is unlimited. */
  maxConcurrentStreams: 100,
  /** SETTINGS_MAX_HEADER_LIST_SIZE, the same 64 KiB an HTTP/1.1 head may have (DESIGN §5). */
  maxHeaderListSize: 64 * 1024,
  /** Header fields in one block (Node's own default is 128). */
  maxHeaderListPairs: 256,
  /** MiB of nghttp2 state and queued frames per session; past it new streams are refused. */
  maxSessionMemory: 10,
  /**
   * Pipeline work running per session, counting streams the guest has reset whose work has not
   * finished yet (CVE-2023-44487: a reset frees the stream slot, not the work behind it).
   */
  maxRunningStreams: 100,
  /** Streams refused because the running work was at its cap, before the session gets GOAWAY. */
  maxRefusedStreams: 100,
  /** Streams the guest may reset per {@link h2Limits.windowMs}, before GOAWAY(ENHANCE_YOUR_CALM). */
  maxResetsPerWindow: 200,
  /** SETTINGS frames per window. */
  maxSettingsPerWindow: 100,
  /** PING frames per window. */
  maxPingsPerWindow: 500,
  windowMs: 10_000,
});

/** The http2.Server options derived from {@link h2Limits}. */
export function h2ServerOptions(): ServerOptions {
  return {
    maxSessionMemory: h2Limits.maxSessionMemory,
    maxHeaderListPairs: h2Limits.maxHeaderListPairs,
    // Frames that nghttp2 refuses as invalid, and streams it refuses itself, end the session sooner.
    maxSessionInvalidFrames: 100,
    maxSessionRejectedStreams: 100,
    settings: {
      maxConcurrentStreams: h2Limits.maxConcurrentStreams,
      maxHeaderListSize: h2Limits.maxHeaderListSize,
      // Server push is never used: a guest must not be sent anything it did not ask for.
      enablePush: false,
    },
  };
}

export const h2Codes = Object.freeze({
  cancel: constants.NGHTTP2_CANCEL,
  refusedStream: constants.NGHTTP2_REFUSED_STREAM,
  internalError: constants.NGHTTP2_INTERNAL_ERROR,
  enhanceYourCalm: constants.NGHTTP2_ENHANCE_YOUR_CALM,
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
