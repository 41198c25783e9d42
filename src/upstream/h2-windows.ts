import type { Http2Session } from "node:http2";

/** RFC 9113 §6.9.2: the flow-control window a peer has until it says otherwise. */
export const defaultWindow = 65_535;

/** The proxy's HTTP/2 receive windows, on either side (`limits.h2StreamWindowBytes`, `limits.h2ConnectionWindowBytes`, `limits.h2ConnectionBufferBytes`). */
export interface H2Windows {
  /** SETTINGS_INITIAL_WINDOW_SIZE: the most one stream sends ahead of its reader, so the most the proxy holds for it. */
  readonly streamBytes: number;
  /** The connection's receive window, over all its streams. */
  readonly connectionBytes: number;
  /** What the streams' windows may add up to (`limits.h2ConnectionBufferBytes`, WindowShare). */
  readonly budgetBytes: number;
}

/**
 * Raises a session's connection-level receive window. RFC 9113 §6.9.2: it starts at 65,535 and
 * SETTINGS cannot change it, only a WINDOW_UPDATE on stream 0. Node gives the connection's window
 * back as each DATA frame arrives, whether or not its stream is read
 * (`nghttp2_session_consume_connection` in node_http2.cc's `OnDataChunkReceived`), and holds back
 * only the stream's: so this window paces the connection and holds nothing, and a stream whose
 * reader has stopped holds at most its stream window (docs/performance.md, "HTTP/2 flow-control
 * windows", measured).
 */
export function raiseConnectionWindow(session: Http2Session, bytes: number): void {
  if (bytes <= defaultWindow || session.destroyed) return;
  try {
    session.setLocalWindowSize(bytes);
  } catch {
    // A session already going (its socket closed under it) needs no window.
  }
}
