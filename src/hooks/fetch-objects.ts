import { Readable } from "node:stream";
import type { ReadableStream as NodeReadableStream } from "node:stream/web";
import { EgressError, badRequest, quoteShort } from "../errors.js";
import { endToEndHeaders, expectRefused, hasExpect, httpToken, type HeaderList } from "../headers.js";
import { discardBody } from "../streams.js";
import { markMadeBody } from "./made-bodies.js";
import type { HookSignal } from "./run-hook.js";

/**
 * Conversions between the proxy's own request/response shapes and the WHATWG `Request` and
 * `Response` that hooks receive. The classes are Node's globals, the same ones a hook gets from
 * `new Request()`; checks use the string tag, so objects from the `undici` package pass too.
 */
export function isRequest(value: unknown): value is Request {
  return tagOf(value) === "[object Request]";
}

/** The value's tag, or undefined when reading it throws (a Proxy's trap, a getter of a hook's). */
function tagOf(value: unknown): string | undefined {
  try {
    return Object.prototype.toString.call(value);
  } catch {
    return undefined;
  }
}

export function isResponse(value: unknown): value is Response {
  return tagOf(value) === "[object Response]";
}

/** A raw header list as WHATWG Headers, with `host` set from the URL (as it will be sent). */
export function toHeaders(list: HeaderList, host: string | undefined): Headers {
  const headers = new Headers();
  try {
    for (let i = 0; i < list.length; i += 2) headers.append(list[i]!, list[i + 1]!);
  } catch (error) {
    throw badRequest(`a header cannot be represented for hooks: ${(error as Error).message}`);
  }
  if (host !== undefined) headers.set("host", host);
  return headers;
}

/**
 * A hook's WHATWG Headers back to a raw list, hop-by-hop and Host removed; Set-Cookie stays
 * split. `subject` names what they came from ("the Response onRequest returned"). They are the
 * hook's object: a subclass's `headers` getter or a Proxy can yield what Headers itself refuses
 * (an empty or non-token name, `:status`, CR LF, NUL, a character past U+00FF), and real Headers
 * take control characters Node will not write. HTTP/1.1 guests then got the proxy's own "internal
 * error", HTTP/2 guests a reset or the field silently dropped, and an upstream the request before
 * the refusal. Every field is checked here, as Node's writer checks it: a bad one is the hook's
 * failure, 502 `EG_HOOK_FAILED`, named in the message (its value is not quoted: it may be a secret).
 */
export function fromHeaders(headers: Headers, subject: string): HeaderList {
  const list: HeaderList = [];
  for (const [name, value] of headers) {
    if (name === "set-cookie") continue;
    list.push(checkedName(name, subject), checkedValue(name, value, subject));
  }
  for (const cookie of headers.getSetCookie()) list.push("set-cookie", checkedValue("set-cookie", cookie, subject));
  return endToEndHeaders(list, dropFromHooks);
}

/**
 * The headers of a Request a hook hands back to be sent (its onRequest's, or one it passes to
 * next()), as {@link fromHeaders}; one with `Expect` is the hook's failure, 502 `EG_HOOK_FAILED`.
 */
export function fromRequestHeaders(headers: Headers, subject: string): HeaderList {
  const list = fromHeaders(headers, subject);
  if (hasExpect(list)) throw new EgressError("EG_HOOK_FAILED", 502, `${subject} ${expectRefused}`);
  return list;
}

/** What Node's http writer refuses in a field value (its checkInvalidHeaderChar): HTAB, visible ASCII, obs-text only. */
const invalidValueChar = /[^\t\x20-\x7e\x80-\xff]/;

function checkedName(name: unknown, subject: string): string {
  if (typeof name !== "string" || !httpToken.test(name)) {
    const shown = typeof name === "string" ? quoteShort(name) : `a ${typeof name}`;
    throw new EgressError("EG_HOOK_FAILED", 502, `${subject} has a header name that is not an HTTP token: ${shown}`);
  }
  return name;
}

function checkedValue(name: string, value: unknown, subject: string): string {
  if (typeof value !== "string") throw new EgressError("EG_HOOK_FAILED", 502, `${subject} has a ${quoteShort(name)} header whose value is a ${typeof value}, not a string`);
  if (invalidValueChar.test(value)) {
    throw new EgressError(
      "EG_HOOK_FAILED",
      502,
      `${subject} has a ${quoteShort(name)} header whose value holds a character no header may carry (CR, LF, NUL, another control character, or one past U+00FF)`,
    );
  }
  return value;
}

const dropFromHooks = new Set(["host"]);

export function makeRequest(url: URL, method: string, headers: HeaderList, body: ReadableStream<Uint8Array> | null): Request {
  return new Request(url.href, {
    method,
    headers: toHeaders(headers, url.host),
    body,
    ...(body === null ? {} : { duplex: "half" as const }),
  } as RequestInit);
}

export function makeResponse(status: number, headers: HeaderList, body: ReadableStream<Uint8Array> | null): Response {
  const nullBody = status === 204 || status === 205 || status === 304;
  return new Response(nullBody ? null : body, { status, headers: toHeaders(headers, undefined) });
}

/** The URL a hook's Request names, which must stay HTTP(S). */
export function requestUrl(request: Request, hook: string): URL {
  const url = new URL(request.url);
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new EgressError("EG_HOOK_FAILED", 502, `${hook} returned a Request for a non-HTTP URL (${url.protocol})`);
  }
  url.hash = "";
  return url;
}

/**
 * A Node body as a web stream, read only when pulled; cancelling it discards the Node stream.
 * Not `Readable.toWeb`: on Node 20 its adapter still enqueues data that arrives after a cancel,
 * and the "Controller is already closed" TypeError it then throws is uncaught (it ended the
 * process when a layer cancelled a response body it did not want).
 */
export function webBody(body: Readable): ReadableStream<Uint8Array> {
  let iterator: AsyncIterator<Buffer> | undefined;
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        iterator ??= body[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
        try {
          const next = await iterator.next();
          if (next.done === true) controller.close();
          else controller.enqueue(new Uint8Array(next.value.buffer, next.value.byteOffset, next.value.byteLength));
        } catch (error) {
          controller.error(error);
        }
      },
      cancel(reason) {
        discardBody(body, reason instanceof Error ? reason : undefined);
      },
    },
    { highWaterMark: 0 },
  );
}

/** A web body as a Node stream for undici or the guest. */
export function nodeBody(body: ReadableStream<Uint8Array>): Readable {
  const node = Readable.fromWeb(body as unknown as NodeReadableStream<Uint8Array>);
  // A body can fail before anyone reads it (a request whose guest left while a hook read a clone
  // of it: the pipeline never sends it): each consumer listens for itself, and an unlistened
  // 'error' would end the process.
  node.on("error", () => undefined);
  return node;
}

/**
 * Reads a body a hook built itself (a rewrite), so it can be sent with an exact
 * Content-Length. Bounded by the hook body limit, and by `deadline` when given: the body is part
 * of the hook's answer, and one that never ends (a stream the hook never closes) otherwise held
 * the guest, with nothing sent and nothing logged, until the guest's connection timed out.
 */
export async function readHookBody(
  body: ReadableStream<Uint8Array>,
  limit: number,
  deadline?: { readonly ms: number; readonly error: () => EgressError; readonly ended?: { readonly signal: HookSignal; readonly error: () => EgressError } },
): Promise<Buffer> {
  const reader = body.getReader();
  let late: EgressError | undefined;
  const stop = (error: EgressError): void => {
    late ??= error;
    void reader.cancel(late).catch(() => undefined);
  };
  // Cancelling resolves the pending read as done: `late` tells that end from a real one.
  const timer = deadline === undefined ? undefined : setTimeout(() => stop(deadline.error()), Math.max(0, deadline.ms));
  // The request ended (its guest left, the drain cut it): the read is let go now, not at the deadline.
  const ended = deadline?.ended;
  const onEnded = ended === undefined ? undefined : (): void => stop(ended.error());
  if (ended !== undefined && onEnded !== undefined) {
    if (ended.signal.aborted) onEnded();
    else ended.signal.once("abort", onEnded);
  }
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    for (;;) {
      const next = await reader.read();
      if (late !== undefined) throw late;
      if (next.done) return Buffer.concat(chunks);
      const chunk: unknown = next.value;
      if (!(chunk instanceof Uint8Array)) throw new TypeError("a body chunk is not a Uint8Array");
      size += chunk.byteLength;
      if (size > limit) throw new EgressError("EG_TOO_LARGE", 413, `the request body a hook built is larger than maxHttpBodyBytes (${limit})`);
      chunks.push(chunk);
    }
  } catch (error) {
    if (late === undefined) void reader.cancel().catch(() => undefined);
    throw error;
  } finally {
    clearTimeout(timer);
    if (ended !== undefined && onEnded !== undefined) ended.signal.off("abort", onEnded);
  }
}

/**
 * The body of a Response a hook made, as a Node stream for the guest. Only the hook's code
 * produces it, and no upstream timer watches it: one that fell silent after the head held the
 * guest until the guest's connection timed out. Silence of `silenceMs` while the guest waits for
 * more (as `timeouts.upstreamBodyMs` cuts an upstream's body) fails it, and the guest's response
 * is cut. A guest that reads slowly starts no timer: only a pending read does.
 */
export function hookResponseBody(body: ReadableStream<Uint8Array>, silenceMs: number | undefined, subject: string, phase: string): Readable {
  if (silenceMs === undefined) return markMadeBody(nodeBody(body), subject, silenceMs, phase);
  const reader = body.getReader();
  let timer: NodeJS.Timeout | undefined;
  const node = new Readable({
    read() {
      timer ??= setTimeout(() => {
        node.destroy(new EgressError("EG_HOOK_TIMEOUT", 504, `${subject} produced nothing for ${silenceMs} ms (timeouts.upstreamBodyMs); the guest's response was cut`, { failure: "time" }));
      }, silenceMs);
      pull();
    },
    destroy(error, callback) {
      clearTimeout(timer);
      void reader.cancel(error ?? undefined).catch(() => undefined);
      callback(error);
    },
  });
  // Empty chunks are no data: read on, so the stream is never left without a read in flight.
  const pull = (): void => {
    reader.read().then(
      (next) => {
        if (node.destroyed) return;
        const chunk: unknown = next.value;
        if (next.done) {
          clearTimeout(timer);
          node.push(null);
        } else if (!(chunk instanceof Uint8Array)) {
          node.destroy(new TypeError(`${subject} enqueued a chunk that is not a Uint8Array`));
        } else if (chunk.byteLength === 0) {
          pull();
        } else {
          clearTimeout(timer);
          timer = undefined;
          node.push(chunk);
        }
      },
      (error: unknown) => node.destroy(error instanceof Error ? error : new Error(`${subject} failed`, { cause: error })),
    )
      // A push that throws (a consumer's synchronous `data` listener) must not become an
      // unhandled rejection, which ends the process.
      .catch((error: unknown) => node.destroy(error instanceof Error ? error : new Error(String(error))));
  };
  // As nodeBody: a body can fail before anyone reads it.
  node.on("error", () => undefined);
  return markMadeBody(node, subject, silenceMs, phase);
}
