import { Readable } from "node:stream";
import { ReadableStream } from "node:stream/web";
import { canDecode, contentDecoder } from "../content-decoders.js";
import { contentCodingList } from "../headers.js";

export interface BodyTapOptions {
  /** Bytes a hook may read before the stream errors (counted before decoding). */
  readonly limit: number;
  /** Keep the raw chunks a hook pulled, so they can be forwarded unchanged afterwards. */
  readonly record: boolean;
  /** Content codings to undo for the hook (gzip, deflate, br), in the order they were applied ({@link contentCodings}). */
  readonly encodings?: readonly string[];
  /** Called on the first read: the guest may be waiting for `100 Continue`. */
  readonly onStart?: () => void;
  /** The body's Content-Length, when it has one: past `limit`, the first read fails before onStart. */
  readonly declaredLength?: number;
}

/** A request's Content-Length, for {@link BodyTapOptions.declaredLength}; nothing without one. */
export function declaredLength(headers: readonly string[]): { declaredLength?: number } {
  for (let i = 0; i < headers.length; i += 2) {
    if (headers[i]!.toLowerCase() === "content-length") return { declaredLength: Number(headers[i + 1]) };
  }
  return {};
}

/** Thrown into a hook's read when it goes past the body limit. */
export class BodyLimitError extends Error {
  constructor(limit: number) {
    super(`body is larger than the ${limit}-byte limit for bodies that hooks read`);
    this.name = "BodyLimitError";
  }
}

/** How long reading a whole body may take, and what the read fails with past that. */
export interface ReadDeadline {
  readonly ms: number;
  readonly error: () => Error;
}

/**
 * Reads a whole body (a Node or a web stream) into one buffer, throwing BodyLimitError past
 * `limit` bytes; leaving the loop early releases the stream. With a `deadline`, a body that has
 * not ended by then fails with its error: a guest (or an upstream) sending a byte now and then
 * is never silent long enough for a silence timer, and held the request and its connection for
 * as long as it kept on (black-box finding, a decider's `includeBody`).
 */
export async function readBounded(stream: AsyncIterable<Uint8Array>, limit: number, deadline?: ReadDeadline): Promise<Buffer> {
  const chunks: Uint8Array[] = [];
  let size = 0;
  if (deadline === undefined) {
    for await (const chunk of stream) {
      size += chunk.byteLength;
      if (size > limit) throw new BodyLimitError(limit);
      chunks.push(chunk);
    }
    return Buffer.concat(chunks);
  }
  const iterator = stream[Symbol.asyncIterator]();
  let timer: NodeJS.Timeout | undefined;
  // Raced against every read from the first, so its rejection is always handled.
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(deadline.error()), Math.max(0, deadline.ms));
  });
  try {
    for (;;) {
      const next = await Promise.race([iterator.next(), late]);
      if (next.done === true) return Buffer.concat(chunks);
      size += next.value.byteLength;
      if (size > limit) throw new BodyLimitError(limit);
      chunks.push(next.value);
    }
  } catch (error) {
    // As leaving a for-await loop does. Past the deadline a read is still pending, and the
    // release waits for it: the answer does not (the guest side closes an upload left unread).
    void Promise.resolve()
      .then(() => iterator.return?.())
      .catch(() => undefined);
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

/** Codings stacked past this many are not undone for hooks. */
const maxCodings = 3;

/**
 * A response's content codings in the order they were applied (RFC 9110 §8.4: a list, over one
 * or several header lines), when the tap can undo every one; undefined when there are none, one
 * it cannot undo, or more than {@link maxCodings}. A hook is then shown the bytes as they came and
 * the Content-Encoding that says what they are. Undoing only the first line's coding handed a
 * hook still-compressed bytes as the plain body, with the header that said so removed.
 */
export function contentCodings(headers: readonly string[]): readonly string[] | undefined {
  const codings = contentCodingList(headers);
  if (codings.length === 0 || codings.length > maxCodings || !codings.every(canDecode)) return undefined;
  return codings;
}

const replays = new WeakSet<Readable>();

/**
 * Whether `body` is a {@link BodyTap.replay} of a body a hook or a policy started to read: it
 * fails when the source does, which may be before its first byte, while the hook held it.
 */
export function isReplay(body: Readable): boolean {
  return replays.has(body);
}

/**
 * A lazy bridge from a Node body stream to the WHATWG stream a hook sees. Nothing is read until
 * the hook reads, so an unread body can still be handed on as the original Node stream, at no
 * cost. Once reading starts, bytes are counted against the limit (while the hook phase lasts),
 * optionally recorded raw, and decoded if the body is compressed.
 */
export class BodyTap {
  readonly web: ReadableStream<Uint8Array>;
  started = false;
  limitHit = false;
  /** Why the body failed under the hook's read (the source, or undoing its coding); not the limit. */
  failure: Error | undefined;
  bytes = 0;
  private capActive = true;
  private readonly recorded: Buffer[] = [];
  private sourceIterator: AsyncIterator<Buffer> | undefined;
  /** The source read in flight, so a replay never races it. */
  private pending: Promise<IteratorResult<Buffer>> | undefined;
  private reader: Readable | undefined;
  /** After the hook phase, what the guest's replay reads, for a clone the hook still reads. */
  private mirror: Mirror | undefined;

  constructor(
    readonly source: Readable,
    private readonly options: BodyTapOptions,
  ) {
    let iterator: AsyncIterator<Buffer> | undefined;
    let decoded = 0;
    this.web = new ReadableStream<Uint8Array>(
      {
        pull: async (controller) => {
          iterator ??= this.start()[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
          try {
            const next = await iterator.next();
            if (next.done === true) {
              controller.close();
              return;
            }
            // The limit also holds after decoding: 100 KB of gzip can inflate to gigabytes.
            decoded += next.value.byteLength;
            if ((this.capActive || this.mirror !== undefined) && decoded > options.limit) {
              this.limitHit = true;
              this.reader?.destroy();
              throw new BodyLimitError(options.limit);
            }
            controller.enqueue(new Uint8Array(next.value.buffer, next.value.byteOffset, next.value.byteLength));
          } catch (error) {
            if (!(error instanceof BodyLimitError)) this.failure ??= error as Error;
            controller.error(error);
          }
        },
        cancel: () => {
          this.reader?.destroy();
        },
      },
      // Nothing is pulled until a hook reads: an unread body stays the guest's own stream.
      { highWaterMark: 0 },
    );
  }

  /** After the hook phase, forwarding is not capped: only what hooks read is. */
  endHookPhase(): void {
    this.capActive = false;
  }

  private next(): Promise<IteratorResult<Buffer>> {
    // destroyOnReturn: false, so stopping the hook's reader leaves the rest for a replay.
    this.sourceIterator ??= this.source.iterator({ destroyOnReturn: false })[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
    this.pending = this.sourceIterator.next();
    return this.pending;
  }

  /** Raw chunks from the source: counted, capped while hooks run, and recorded when asked. */
  private async *raw(): AsyncGenerator<Buffer> {
    const { limit, record } = this.options;
    if (this.limitHit) throw new BodyLimitError(limit);
    try {
      for (;;) {
        // Once the replay has the source, the hook's reader (a clone it still reads) gets the
        // replay's chunks: two readers of one source would each get part of the body.
        const next = this.mirror !== undefined ? await this.mirror.next() : await this.next();
        if (next.done === true) return;
        const chunk = next.value;
        this.bytes += chunk.length;
        // A hook's read stays bounded after the phase: it is still the hook's.
        if ((this.capActive || this.mirror !== undefined) && this.bytes > limit) {
          this.limitHit = true;
          throw new BodyLimitError(limit);
        }
        // Only what the hook phase reads is kept for a replay; a body passed on afterwards
        // (new Response(response.body, response)) must not pile up here.
        if (record && this.capActive) this.recorded.push(chunk);
        yield chunk;
      }
    } finally {
      // The hook's reader stopped (cancelled, or past the limit): the replay feeds it no more.
      this.mirror?.detach();
    }
  }

  private start(): Readable {
    this.started = true;
    // A body announced larger than the limit is refused without asking the guest for it.
    const tooLarge = (this.options.declaredLength ?? 0) > this.options.limit;
    if (tooLarge) this.limitHit = true;
    else this.options.onStart?.();
    const raw = Readable.from(this.raw(), { objectMode: false });
    // Read through an iterator, which stops listening once it has thrown: the error a failed
    // source gives the reader is emitted after that, and unlistened it ended the process.
    raw.on("error", () => undefined);
    this.reader = raw;
    // The last coding applied is undone first.
    let decoded: Readable = raw;
    for (const coding of [...(this.options.encodings ?? [])].reverse()) {
      const decoder = contentDecoder(coding);
      decoder.on("error", () => undefined);
      const from = decoded;
      from.once("error", (error) => decoder.destroy(error));
      decoder.once("close", () => from.destroy());
      decoded = from.pipe(decoder);
    }
    return decoded;
  }

  /**
   * The body as it arrived: the raw chunks the hook pulled, then whatever it left unread. Used
   * when a hook read a response body and then let the response through unchanged.
   */
  replay(keepReader = false): Readable {
    if (!this.started) return this.source;
    // A reader kept (a clone the hook reads on after returning, as a request's clone may) gets
    // the rest of the body from the replay, as the guest reads it: destroyed, its read failed
    // with "Premature close", or ended the process when nothing caught it (black-box finding).
    if (keepReader && this.reader !== undefined && !this.reader.destroyed) this.mirror = new Mirror(this.options.limit);
    else this.reader?.destroy();
    const replayed = Readable.from(this.replayChunks(this.mirror), { objectMode: false });
    replays.add(replayed);
    return replayed;
  }

  private async *replayChunks(mirror: Mirror | undefined): AsyncGenerator<Buffer> {
    try {
      const inFlight = await this.pending;
      yield* this.recorded;
      if (inFlight?.done === true) return mirror?.end();
      // A read that was in flight when the hook stopped was recorded only if the hook's reader
      // took it; otherwise it is sent here, in order. The hook's reader, kept, has it too.
      if (inFlight !== undefined && !this.recorded.includes(inFlight.value)) yield inFlight.value;
      for (;;) {
        const next = await this.next();
        if (next.done === true) return mirror?.end();
        mirror?.push(next.value);
        yield next.value;
      }
    } catch (error) {
      mirror?.fail(error as Error);
      throw error;
    } finally {
      // The guest's response stopped before the body's end (the guest left): so does the hook's read.
      mirror?.fail(new Error("the response body was not read to its end: the guest's response stopped first"));
    }
  }
}

/**
 * The chunks the replay read, queued for a hook's reader that outlived the hook phase. The guest
 * sets the pace; what the hook's reader has yet to take waits here, up to the hook body limit,
 * past which its read fails with BodyLimitError and the guest's response goes on.
 */
class Mirror {
  private readonly chunks: Buffer[] = [];
  private queued = 0;
  private done = false;
  private error: Error | undefined;
  private waiting: { resolve: (next: IteratorResult<Buffer>) => void; reject: (error: Error) => void } | undefined;

  constructor(private readonly limit: number) {}

  push(chunk: Buffer): void {
    if (this.done) return;
    if (this.waiting !== undefined) {
      const waiting = this.waiting;
      this.waiting = undefined;
      waiting.resolve({ done: false, value: chunk });
      return;
    }
    this.queued += chunk.length;
    if (this.queued > this.limit) this.fail(new BodyLimitError(this.limit));
    else this.chunks.push(chunk);
  }

  end(): void {
    if (this.done) return;
    this.done = true;
    this.waiting?.resolve({ done: true, value: undefined });
    this.waiting = undefined;
  }

  fail(error: Error): void {
    if (this.done) return;
    this.done = true;
    this.error = error;
    this.chunks.length = 0;
    this.waiting?.reject(error);
    this.waiting = undefined;
  }

  /** The reader is gone: nothing more is kept for it. */
  detach(): void {
    this.done = true;
    this.chunks.length = 0;
    this.waiting = undefined;
  }

  next(): Promise<IteratorResult<Buffer>> {
    const chunk = this.chunks.shift();
    if (chunk !== undefined) {
      this.queued -= chunk.length;
      return Promise.resolve({ done: false, value: chunk });
    }
    if (this.error !== undefined) return Promise.reject(this.error);
    if (this.done) return Promise.resolve({ done: true, value: undefined });
    return new Promise((resolve, reject) => (this.waiting = { resolve, reject }));
  }
}
