import type { Socket } from "node:net";
import { closeBegun } from "./linger.js";

/** What a guest may send after a CONNECT or an upgrade while it waits its turn. */
export const maxEarlyBytes = 64 * 1024;

/**
 * The heads of the requests parsed ahead on one connection (parsed, their turn not yet come) past
 * which the connection is not read until their turn comes: one head of the largest size a guest
 * may send (`maxHeaderBytes`). `limits.pipelinedRequests` alone let 16 heads of 64 KiB wait on
 * each of a source's 256 connections: 281 MiB of heap (docs/performance.md, "What one source
 * holds"). Requests are served one at a time, so reading further ahead serves none sooner.
 */
export const maxAheadBytes = 64 * 1024;

/**
 * The requests of one guest connection. Pipelined requests are served one at a time, in order:
 * their responses must leave in order anyway, and one connection must not fan out into a
 * thousand upstream requests. When the connection closes, every request on it ends: Node 20
 * never emits `close` on a queued pipelined response whose socket died.
 */
export interface Lane {
  tail: Promise<void>;
  readonly ends: Set<() => void>;
  /** Requests parsed on this connection and not yet ended, the one being served included. */
  waiting: number;
  /** The connection is not read until the waiting requests drop back (see `enter`). */
  paused: boolean;
  /** The socket's `resume` is watched, so that Node's own resumption does not undo the pause. */
  watched?: boolean;
  /** Bytes of the heads of the requests whose turn has not come (see {@link maxAheadBytes}). */
  aheadBytes: number;
  /** The latest request parsed on the connection. */
  last?: LaneRequest;
}

/** A request on a lane, as a parse error after it needs to know it. */
export interface LaneRequest {
  readonly req: { readonly complete: boolean };
  readonly res: { readonly headersSent: boolean };
  /** Its turn has come: the requests before it are answered. */
  started: boolean;
  /** Its head's bytes while they count in the lane's `aheadBytes`: until its turn comes or it ends. */
  ahead?: number;
  /** Its body broke in the parser before its turn: it answers this instead, in order. */
  broken?: Error;
  /**
   * Its body broke in the parser while it was served, before its response began: this answer
   * went out in its place and closed the connection. Its line says so (the proxy's refusal, not
   * a guest that left).
   */
  answered?: Error;
  /** Its guest asked for `100 Continue` and has not had it: the silence is the proxy's. */
  awaitingContinue?: boolean;
}

/** Where the answer to a parse error goes (see {@link Lanes.placeParseError}). */
export type ParseErrorPlace =
  | { readonly answer: "now" }
  | { readonly answer: "after"; readonly before: Promise<void> }
  | { readonly answer: "by the request" }
  | { readonly answer: "none" };

/** The lanes of every guest connection, and the reading of those connections they control. */
export class Lanes {
  private readonly lanes = new WeakMap<Socket, Lane>();

  constructor(private readonly pipelinedRequests: number) {}

  of(socket: Socket): Lane {
    let lane = this.lanes.get(socket);
    if (lane === undefined) {
      const created: Lane = { tail: Promise.resolve(), ends: new Set(), waiting: 0, paused: false, aheadBytes: 0 };
      socket.once("close", () => {
        for (const end of created.ends) end();
      });
      this.lanes.set(socket, created);
      lane = created;
    }
    return lane;
  }

  /**
   * Node parses pipelined requests as fast as they arrive and pauses a connection only for
   * responses it cannot write, and nothing is written while the first request waits: a guest
   * could queue a hundred thousand requests (50 times their size in memory) behind one slow one.
   * Past `limits.pipelinedRequests` waiting, the connection is not read until half have gone;
   * past {@link maxAheadBytes} of heads whose turn has not come, until it has come for enough of
   * them. `request.ahead` is its head's size, given back by {@link begin} or {@link leave}.
   */
  enter(lane: Lane, socket: Socket, request: LaneRequest): void {
    lane.waiting += 1;
    lane.aheadBytes += request.ahead ?? 0;
    const ahead = lane.aheadBytes > maxAheadBytes && lane.waiting > 1;
    if (lane.waiting <= this.pipelinedRequests + 1 && !ahead) return;
    lane.paused = true;
    if (!lane.watched) {
      lane.watched = true;
      // Node's own write backpressure (socketOnDrain) resumes any socket whose `_paused` is set,
      // ours too, as soon as a response drains: the pause is taken back each time, before Node's
      // own listener reads on. The socket only: stopping its reads is enough, and a parser
      // paused while bytes still reach it fails them as a malformed request ("paused"). Once a
      // connection: each pause had added another listener.
      socket.prependListener("resume", () => {
        const state = pausable(socket);
        // Once the connection's close has begun nothing more on it is processed, and a linger must read on.
        if (!lane.paused || socket.destroyed || state.parser == null || closeBegun(socket)) return;
        state._paused = true;
        socket.pause();
      });
    }
    // As Node's own server does for write backpressure: `_paused` makes it pause its parser once
    // the chunk being parsed is done (pausing it inside this callback would drop the chunk's
    // rest), so requests still in the buffer stay bytes, not request objects. On a TLS guest
    // connection the records its last read decrypted are parsed all the same (parseWhatWasRead).
    const state = pausable(socket);
    if (state._paused === true) return;
    state._paused = true;
    socket.pause();
  }

  /**
   * Where the answer to a parse error goes. Written at once, it landed inside a response under
   * way, or took the place of one not yet begun. In a new request's head: after the requests
   * before it. In the body of a request still waiting its turn: that request answers it, in
   * order. In the body of the request being served: at once, in its place (see `answered`),
   * unless its response has begun (a hook or an upstream answered early), when nothing more can
   * be said on the connection.
   *
   * @param guestLeft the guest ended its side mid-request: the request being served was left,
   *   and its line says so (499), whatever is written after it.
   */
  placeParseError(socket: Socket, answer: Error, guestLeft = false): ParseErrorPlace {
    const lane = this.lanes.get(socket);
    const last = lane?.last;
    if (lane === undefined || lane.ends.size === 0 || last === undefined) return { answer: "now" };
    if (last.req.complete) return { answer: "after", before: lane.tail };
    if (!last.started) {
      last.broken = answer;
      return { answer: "by the request" };
    }
    if (last.res.headersSent) return { answer: "none" };
    if (!guestLeft) last.answered = answer;
    return { answer: "now" };
  }

  /**
   * The answer that closes the connection went out in place of its requests' responses (the
   * parser's, as bytes on the socket): every request on it is over now, as when the connection
   * closes, though the socket lingers on to read what the guest still sends.
   */
  endAll(socket: Socket): void {
    const lane = this.lanes.get(socket);
    if (lane !== undefined) for (const end of lane.ends) end();
  }

  /** The connection's lane, if it has one: requests parsed on it and not yet ended. */
  find(socket: Socket): Lane | undefined {
    return this.lanes.get(socket);
  }

  /** `request`'s turn has come: its head no longer counts as read ahead. */
  begin(lane: Lane, socket: Socket, request: LaneRequest): void {
    request.started = true;
    this.giveBack(lane, request);
    this.resumeIfBelow(lane, socket);
  }

  /** `request` has ended (answered, or its connection gone), whether or not its turn came. */
  leave(lane: Lane, socket: Socket, request: LaneRequest): void {
    lane.waiting -= 1;
    this.giveBack(lane, request);
    this.resumeIfBelow(lane, socket);
  }

  private giveBack(lane: Lane, request: LaneRequest): void {
    lane.aheadBytes -= request.ahead ?? 0;
    request.ahead = 0;
  }

  /** Reads the connection again once half the requests have gone, and half the heads read ahead. */
  private resumeIfBelow(lane: Lane, socket: Socket): void {
    if (!lane.paused || lane.waiting > Math.floor(this.pipelinedRequests / 2) || lane.aheadBytes > maxAheadBytes / 2) return;
    lane.paused = false;
    const state = pausable(socket);
    // No parser: an upgrade or a CONNECT owns the socket now, and reads it itself.
    if (socket.destroyed || state._paused !== true || state.parser == null) return;
    state._paused = false;
    state.parser.resume();
    socket.resume();
  }

  /**
   * For an upgrade or a CONNECT, which take the connection over once the requests before it are
   * answered: their responses must reach the guest before the 101 or the 200, never inside the
   * new stream. Until then the guest's bytes (frames, a ClientHello) are kept, up to 64 KiB, and
   * returned after `head`; undefined when the connection closed meanwhile. Past 64 KiB the
   * connection is cut, `overflowed` called first: the requests in front and the one taking over
   * lose their connection to the proxy, not to the guest, and their lines must say so.
   */
  async takeOver(socket: Socket, head: Buffer, overflowed: () => void): Promise<Buffer | undefined> {
    const lane = this.of(socket);
    const previous = lane.tail;
    // Nothing follows on this connection.
    lane.tail = new Promise<void>(() => undefined);
    // A pause set while the requests before it were parsed stopped the socket's handle, and
    // Node's hand-over never restarts it: reading is ours from here.
    lane.paused = false;
    pausable(socket)._paused = false;
    const handle = (socket as unknown as { _handle?: { reading: boolean; readStart(): number } | null })._handle;
    if (handle && !handle.reading) {
      handle.reading = true;
      handle.readStart();
    }
    const early: Buffer[] = [head];
    let bytes = head.length;
    const keep = (chunk: Buffer): void => {
      bytes += chunk.length;
      if (bytes <= maxEarlyBytes) return void early.push(chunk);
      socket.off("data", keep);
      overflowed();
      socket.destroy();
    };
    socket.on("data", keep);
    await previous;
    // A plain tunnel serves requests on this same socket again: they start a lane of their own.
    this.lanes.delete(socket);
    // The next owner adds its own listener in this same turn, so no byte falls between.
    socket.off("data", keep);
    if (socket.destroyed) return undefined;
    return early.length === 1 ? head : Buffer.concat(early);
  }
}

/**
 * Keeps Node's HTTP/1.1 parser parsing what a paused TLS guest connection's last read brought.
 * Node's server reads a TLS socket's handle itself (the consume path: no JavaScript `Buffer` a
 * read, about 4% of the proxy's CPU an HTTP/1.1 request against the stream path), and pausing the
 * socket stops its reads, but a TLSWrap still hands the parser, one by one, every record it has
 * decrypted from the read under way. After each, Node pauses its parser if `_paused` is set (by
 * its own write backpressure or by {@link Lanes.enter}), and a paused parser fails the next record
 * as a malformed request ("paused"): 400 to a pipelining guest. So the parser is resumed as soon
 * as Node has paused it: the reads stay stopped, and what one read decrypted (64 KiB at most) is
 * parsed past the bound. A plain tunnel's socket is a stream (tunnel.ts): its parser is handed
 * chunks, and a paused stream keeps what it read.
 */
export function parseWhatWasRead(socket: Socket): void {
  const state = socket as unknown as { _paused?: boolean; parser?: ConsumingParser | null };
  const parser = state.parser;
  if (parser == null || parser._consumed !== true) return;
  const key = (parser.constructor as { kOnExecute?: unknown }).kOnExecute;
  const executed = typeof key === "number" ? parser[key] : undefined;
  if (typeof key !== "number" || typeof executed !== "function") {
    // A Node whose parser reports its reads elsewhere: the stream path, a Buffer a read.
    parser.unconsume();
    parser._consumed = false;
    return;
  }
  // Node clears it when it frees the parser (the connection closed, or was upgraded).
  parser[key] = (result: unknown): void => {
    executed.call(parser, result);
    if (state._paused === true && state.parser === parser) parser.resume();
  };
}

/** Node's HTTP parser where it reads a socket's handle itself, and reports each read's parse. */
interface ConsumingParser {
  _consumed?: boolean;
  [callback: number]: unknown;
  resume(): void;
  unconsume(): void;
}

/**
 * What Node's HTTP server keeps on a guest connection for its own backpressure: `_paused`, which
 * it checks after each parse to pause `parser` (null once it lets go of the socket).
 */
function pausable(socket: Socket): { _paused?: boolean; parser?: { pause(): void; resume(): void } | null } {
  return socket as unknown as { _paused?: boolean; parser?: { pause(): void; resume(): void } | null };
}
