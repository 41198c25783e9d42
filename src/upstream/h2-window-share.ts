import type { Http2Session, Http2Stream } from "node:http2";
import { afterReads } from "../after-reads.js";
import { defaultWindow } from "./h2-windows.js";

/**
 * The stream window a session advertises when its receiving streams hold `held` bytes each (one
 * entry per stream with a body still coming; 0 for one that holds nothing): the largest of
 * `streamBytes` and the values one byte under a power of two below it (as the default
 * `limits.h2StreamWindowBytes` is, and Node's 65,535: see docs/performance.md, "HTTP/2
 * flow-control windows") with which every stream, filling its window, leaves the streams holding
 * at most `budgetBytes` together; never below RFC 9113's 65,535, so a stream that is read still
 * moves 64 KiB per round trip however full the connection is. A stream already holding more than
 * the window (it filled a larger one) counts what it holds: a lower window does not empty it.
 *
 * @example sharedWindow(1_048_575, 16 * 2 ** 20, new Array(100).fill(0)) === 131_071
 */
export function sharedWindow(streamBytes: number, budgetBytes: number, held: readonly number[], emptyToo = 0): number {
  for (let window = Math.min(streamBytes, budgetBytes); window > defaultWindow; window = stepDown(window) < window ? stepDown(window) : stepDown(Math.floor(window / 2))) {
    let total = emptyToo * window;
    for (const bytes of held) total += Math.max(bytes, window);
    if (total <= budgetBytes) return window;
  }
  return defaultWindow;
}

/** The largest value one byte under a power of two that is at most `bytes`. */
function stepDown(bytes: number): number {
  return 2 ** Math.floor(Math.log2(bytes + 1)) - 1;
}

/**
 * Node's Http2Stream hands each DATA chunk to push() as a view into the buffer of the socket read
 * it came in, shared with the other streams' chunks of that read: one view kept alive keeps the
 * whole read buffer. A chunk that stays in a stopped stream's buffer is copied, so that it holds
 * only its own bytes (a guest's request bodies, h2-guest.ts; an upstream's responses, WindowShare).
 * A chunk read at once (the stream flowing, its buffer empty) is passed on as it is.
 */
export function keepOwnBytes(stream: Http2Stream): void {
  const push = stream.push;
  stream.push = (chunk: unknown, encoding?: BufferEncoding): boolean => {
    const stays = chunk instanceof Uint8Array && (stream.readableFlowing !== true || stream.readableLength > 0);
    return push.call(stream, stays ? Buffer.from(chunk) : chunk, encoding);
  };
}

/** `count` streams holding nothing, for {@link sharedWindow}. */
export function emptyStreams(count: number): number[] {
  return new Array<number>(count).fill(0);
}

export interface WindowShareOptions {
  /** `limits.h2StreamWindowBytes`: a stream's window while the connection has room. */
  readonly streamBytes: number;
  /** `limits.h2ConnectionBufferBytes`: what the streams' windows may add up to. */
  readonly budgetBytes: number;
  /** How long the peer may take to acknowledge a lowered window before `onUnacknowledged`. */
  readonly ackMs: number;
  /** The peer left a SETTINGS of the share's unacknowledged for `ackMs`: it keeps its old windows until it does. */
  readonly onUnacknowledged: () => void;
}

/** SETTINGS the share leaves unacknowledged at most, under Node's maxOutstandingSettings (10). */
const maxUnacknowledged = 8;

/** Each upstream session's share, for the exchange that opens a stream on it (sendOnSession). */
export const windowShares = new WeakMap<Http2Session, WindowShare>();

/**
 * An upstream connection's receive windows shared by the streams that have a response coming, as
 * {@link sharedWindow} says. Node gives a connection's window back as DATA arrives, read or not,
 * so only a stream's window bounds what a stream whose reader stopped holds, and a connection of
 * `limits.h2Streams` such streams held that many windows (100 MiB at the defaults). Node has no
 * window per stream to set; SETTINGS_INITIAL_WINDOW_SIZE, changed on a live connection, moves
 * every stream's window by the difference (RFC 9113 §6.9.2; below zero for a stream that holds
 * more than the new value, which then gets nothing more until that much is read).
 *
 * A lower value is sent at once; a higher one only once the peer has acknowledged the last, and
 * only with room for half as many streams again, so a connection whose count swings sends one
 * SETTINGS per round trip at most. The peer sends by the old
 * value until it has the new one (§6.9.3), so this suits only streams the proxy opens: each is
 * counted before its HEADERS go (reserve()), so the SETTINGS goes ahead of them and the upstream
 * reads it before it can answer. A peer that opens its own streams (a guest) may write a whole
 * old window on many at once before it reads the lower value; a guest connection's window is
 * fixed instead (h2GuestWindow). A peer that never acknowledges would keep the old windows for
 * good, so after `ackMs` its session takes no new streams (onUnacknowledged).
 */
export class WindowShare {
  private readonly streams = new Set<Http2Stream>();
  /** Streams about to open (reserve()), counted as holding nothing. */
  private reserved = 0;
  /** The value last sent (or the session's first SETTINGS', `streamBytes`). */
  private advertised: number;
  private deadline: NodeJS.Timeout | undefined;
  /** SETTINGS sent and not yet acknowledged, the session's first included. */
  private unacknowledged = 1;
  /** What each counted stream holds, refilled at each update (no array per update). */
  private readonly held: number[] = [];

  constructor(
    private readonly session: Http2Session,
    private readonly options: WindowShareOptions,
  ) {
    this.advertised = options.streamBytes;
    // An acknowledgement: any SETTINGS still unacknowledged gets `ackMs` from here.
    session.on("localSettings", () => {
      this.unacknowledged = Math.max(0, this.unacknowledged - 1);
      this.clearDeadline();
      if (session.pendingSettingsAck) this.armDeadline();
      this.update();
    });
    session.once("close", () => this.clearDeadline());
  }

  /** The window this share advertises now (the last SETTINGS sent, acknowledged or not). */
  get window(): number {
    return this.advertised;
  }

  /**
   * Counts a stream the proxy is about to open, so that a lower window goes out before its
   * HEADERS; `attach` it once opened (or with `undefined` if it never was).
   */
  reserve(): (stream: Http2Stream | undefined) => void {
    this.reserved += 1;
    this.update();
    let attached = false;
    return (stream) => {
      if (attached) return;
      attached = true;
      this.reserved -= 1;
      if (stream === undefined) this.update();
      else this.receive(stream);
    };
  }

  /** A stream with a body coming: counted until its readable side ends or it closes. */
  receive(stream: Http2Stream): void {
    if (this.streams.has(stream) || stream.readableEnded || stream.destroyed) {
      this.update();
      return;
    }
    this.streams.add(stream);
    keepOwnBytes(stream);
    const release = (): void => {
      if (!this.streams.delete(stream)) return;
      stream.off("end", release);
      stream.off("close", release);
      this.update();
    };
    stream.once("end", release);
    stream.once("close", release);
    this.update();
  }

  private update(): void {
    const session = this.session;
    if (session.destroyed || session.closed) return;
    const { streamBytes, budgetBytes } = this.options;
    const count = this.reserved + this.streams.size;
    // Every stream at the full window fits: nothing to change. Runs at every stream's start and
    // end, so the common case walks no stream (review finding: about 10 µs a small response).
    if (this.advertised === Math.min(streamBytes, budgetBytes) && count * this.advertised <= budgetBytes) return;
    const held = this.held;
    held.length = 0;
    for (const stream of this.streams) held.push(stream.readableLength);
    let target = sharedWindow(streamBytes, budgetBytes, held, this.reserved);
    if (target > this.advertised) {
      // Raised only once the last change is acknowledged (one SETTINGS per round trip at most),
      // and only with room for half as many streams again: a count going 16, 17, 16, 17 would
      // otherwise send a SETTINGS at every step.
      if (session.pendingSettingsAck) return;
      target = Math.max(this.advertised, sharedWindow(streamBytes, budgetBytes, held, this.reserved + Math.ceil(count / 2)));
    }
    if (target === this.advertised) return;
    // Node destroys a session past maxOutstandingSettings (10, its first SETTINGS included)
    // rather than throw (review finding): lowered no further until an ACK, whose update() retries.
    if (this.unacknowledged >= maxUnacknowledged) return;
    try {
      session.settings({ initialWindowSize: target });
    } catch {
      // A session Node is closing refuses new SETTINGS; it takes no new streams either.
      return;
    }
    this.unacknowledged += 1;
    const lowered = target < this.advertised;
    this.advertised = target;
    if (lowered) this.armDeadline();
  }

  private armDeadline(): void {
    if (this.deadline !== undefined) return;
    // Judged after that turn's reads: once the proxy has been paused past it, the timer fires
    // before the poll that reads the acknowledgement.
    this.deadline = setTimeout(afterReads, this.options.ackMs, () => {
      this.deadline = undefined;
      if (!this.session.destroyed && this.session.pendingSettingsAck) this.options.onUnacknowledged();
    });
    this.deadline.unref();
  }

  private clearDeadline(): void {
    clearTimeout(this.deadline);
    this.deadline = undefined;
  }
}
