import { createHash } from "node:crypto";
import { Readable } from "node:stream";
import { createBrotliCompress, createDeflate, createGzip } from "node:zlib";
import { EgressError } from "../errors.js";
import { contentCodingList, hasNoContent, noContentFraming } from "../headers.js";
import type { Logger } from "../log.js";
import type { Executor, ExecutorResponse, GuestGone, OutboundRequest } from "../pipeline/exchange.js";
import { secretToken, type SecretStore } from "../policy/secrets.js";
import { hiddenPath } from "../policy/hidden-url.js";
import { tokenizeHeader } from "./entry.js";
import { inlineBodyLimit, maxRecordedMs, type RecordedEntry } from "./har.js";
import { bodyWithTokens, fieldsOf, type BodyForKey, type MatchOptions } from "./match.js";
import { sidecarPath, type ReplaySource } from "./replay-source.js";
import { withFields } from "../objects.js";
import { FileReadError, openRegularFile, readFailure } from "../regular-file.js";

export interface ReplayDeps {
  readonly source: ReplaySource;
  readonly match: MatchOptions;
  /** `recorded`: wait as long as the recording did for the head, and pace the body's chunks. */
  readonly latency: "none" | "recorded";
  /** `--record-missing`: a miss goes to the real network through this (the recorder), and is recorded. */
  readonly missing: Executor | undefined;
  /** The guest asking: it is answered only with entries it may use (its own, or no one guest's). */
  readonly guest: string;
  readonly secrets: () => SecretStore | undefined;
  readonly log: Logger;
}

/** Headers that describe one connection or one transfer: never replayed as recorded. */
const notReplayed = new Set(["connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "proxy-authenticate", "content-length"]);
const methodsWithoutBody = new Set(["HEAD"]);
const encoders: Record<string, () => NodeJS.ReadWriteStream> = { gzip: createGzip, "x-gzip": createGzip, deflate: createDeflate, br: createBrotliCompress };

/**
 * Answers from a recording instead of the network: the request (tokenized, so a placeholder or
 * value of any run matches the `EGRESSGATE_SECRET{NAME}` the file holds) is matched against
 * the file, and the recorded response is rebuilt. No DNS, TCP or TLS; every check above has
 * already run.
 */
export function replayExecutor(deps: ReplayDeps): Executor {
  return {
    async send(request, address, signal, info) {
      const secrets = deps.secrets();
      const body = await readBody(request.body);
      const tokenize = (text: string): string => secrets?.tokenize(text) ?? text;
      // A hidden hop is matched as the recorder wrote it: its origin and its secret's token (entry.ts).
      const hidden = request.hiddenPath;
      const url = new URL(hidden === undefined ? tokenize(request.url.href) : `${tokenize(request.url.origin)}/${secretToken(hidden)}`);
      const named = namedUrl(request);
      const headers: [string, string][] = [];
      for (let i = 0; i < request.headers.length; i += 2) {
        const name = request.headers[i]!;
        if (deps.match.matchHeaders.includes(name.toLowerCase())) headers.push([name, tokenizeHeader(request.headers[i + 1]!, tokenize)]);
      }
      const fields = fieldsOf(request.method, url, headers, keyBody(body, secrets), deps.match);
      // Only the entries this guest may use: its own, and those no one guest made (replay-source.ts).
      const taken = deps.source.take(fields, deps.guest);
      if ("miss" in taken) {
        if (deps.missing !== undefined && taken.code === "EG_REPLAY_MISS") {
          if (body !== null && !("bytes" in body)) throw new EgressError("EG_REPLAY_MISS", 502, `no recorded response matches ${request.method} ${named}, and a request body over 1 MiB cannot be sent on with --record-missing`);
          return deps.missing.send(withFields(request, { body: body === null ? null : body.bytes }), address, signal, info);
        }
        // The guest is told what missed; the recording's path and its nearest entry (which another
        // guest may have made, and whose path can say whose it is) are for the operator's log.
        const message = `${taken.code === "EG_REPLAY_MISS" ? "no recorded response matches" : "no recorded response is left for"} ${request.method} ${named}`;
        const detail = `${deps.source.path}: ${taken.miss}`;
        deps.log.warn("replay miss", { code: taken.code, guest: deps.guest, id: info.id, hop: info.hop, method: request.method, url: named, reason: taken.miss, recording: deps.source.path });
        throw new EgressError(taken.code, 502, `${message} (see the proxy log)`, { detail });
      }
      const entry = taken.hit.entry;
      if (deps.latency === "recorded") await sleep(positive(entry.timings?.send) + positive(entry.timings?.wait), signal);
      return respond(entry, request, deps, signal);
    },
  };
}

/** The request's URL as a miss names it: no query, and a hidden hop's origin only. */
function namedUrl(request: OutboundRequest): string {
  return `${request.url.origin}${request.hiddenPath === undefined ? request.url.pathname : hiddenPath(request.hiddenPath)}`;
}

type ReadBody = { bytes: Buffer } | { sha256: string; size: number } | null;

/** The guest's body, read whole for the key: bytes when small, else only its hash. */
async function readBody(body: OutboundRequest["body"]): Promise<ReadBody> {
  if (body === null) return null;
  if (body instanceof Uint8Array) return { bytes: Buffer.from(body) };
  const hash = createHash("sha256");
  const held: Buffer[] = [];
  let size = 0;
  for await (const chunk of body as AsyncIterable<Buffer>) {
    hash.update(chunk);
    size += chunk.length;
    if (size <= inlineBodyLimit) held.push(chunk);
    else held.length = 0;
  }
  return size <= inlineBodyLimit ? { bytes: Buffer.concat(held) } : { sha256: hash.digest("hex"), size };
}

/** Placeholders in the body become tokens, as the recorder wrote them (one rule for both: {@link bodyWithTokens}). */
function keyBody(body: ReadBody, secrets: SecretStore | undefined): BodyForKey {
  if (body === null || !("bytes" in body)) return body === null ? null : { sha256: body.sha256 };
  return { bytes: bodyWithTokens(body.bytes, secrets) };
}

async function respond(entry: RecordedEntry, request: OutboundRequest, deps: ReplayDeps, signal: GuestGone): Promise<ExecutorResponse> {
  const { response } = entry;
  const headers: string[] = [];
  let location: string | undefined;
  // Tokens of echoed placeholders become this run's (the recorder wrote them so); not in the
  // Location fields, whose tokens name the recorded hop the next request must match.
  const secrets = deps.secrets();
  const placeholders = (text: string): string => secrets?.placeholdersForTokens(text) ?? text;
  for (const { name, value } of response.headers ?? []) {
    const lower = name.toLowerCase();
    // HTTP/2 pseudo-headers, as Chrome exports them, and per-connection fields.
    if (lower.startsWith(":") || notReplayed.has(lower)) continue;
    if (lower === "location") location = location === undefined ? value : location;
    headers.push(name, lower === "location" || lower === "content-location" ? value : placeholders(value));
  }
  const content = response.content;
  const noBody = methodsWithoutBody.has(request.method) || hasNoContent(response.status) || (response.status >= 100 && response.status < 200);
  if (noBody) {
    const recordedLength = (response.headers ?? []).find((h) => h.name.toLowerCase() === "content-length");
    if (recordedLength !== undefined) headers.push("content-length", recordedLength.value);
    // A 204 has no length and a 205 only 0; a HAR from before, or from elsewhere, may say otherwise.
    return { status: response.status, headers: noContentFraming(response.status, headers), body: null, location };
  }
  // Recorded trailer fields go after the body again (the guest's side leaves out what may not
  // be one); placeholders as in the headers.
  const recordedTrailers = response._trailers?.flatMap(({ name, value }) => [name, placeholders(value)]);
  const trailers = recordedTrailers !== undefined && recordedTrailers.length > 0 ? recordedTrailers : undefined;
  // gRPC's Trailers-Only answer (grpc-status in the head, no message, no trailers) is a head that
  // ends the stream, as the live path passes it on (h2-exchange.ts). Replayed as a head and then
  // an empty body, grpc-js failed the call INTERNAL "Call ended without gRPC status" instead of
  // the recorded status: it reads grpc-status from a head only when that head ends the stream.
  if (trailers === undefined && isTrailersOnly(response)) return { status: response.status, headers, body: null, location };
  let body: Readable;
  let length: number | undefined;
  if (content?._file !== undefined) {
    const file = sidecarPath(deps.source.path, content._file);
    // Checked at the start, but the folder may change since: a FIFO put there would hold a
    // threadpool thread in open() for good (four of them stop every fs call), so the file is
    // opened without blocking and refused unless regular, and the stream reads that descriptor.
    let opened: Awaited<ReturnType<typeof openRegularFile>>;
    try {
      opened = await openRegularFile(file);
    } catch (error) {
      const reason = error instanceof FileReadError ? error.reason : (error as NodeJS.ErrnoException).code === "ENOENT" ? "missing" : `unreadable (${readFailure(error)})`;
      throw new EgressError("EG_REPLAY_MISS", 502, `the recorded response for ${request.method} ${namedUrl(request)} is in a sidecar file that is ${reason} (${content._file})`);
    }
    body = opened.handle.createReadStream({ highWaterMark: 64 * 1024 });
    length = opened.stats.size;
  } else {
    const text = content?.text ?? "";
    const bytes = content?.encoding === "base64" ? Buffer.from(text, "base64") : Buffer.from(placeholders(text), "utf8");
    body = chunked(bytes, entry._egressgate?.chunks, deps.latency === "recorded", signal);
    length = bytes.length;
  }
  // Every coding the header lines name, in the order applied (the recorder undid them all, the
  // last first): a body stored decoded is encoded again by each in turn. Only the last line's
  // value was read, as one coding, so codings on two lines got a body in the last alone, and a
  // line naming several went out decoded.
  const codings = content?._encoded === undefined ? contentCodingList(headers) : [];
  const encodersFor = codings.map((coding) => (Object.hasOwn(encoders, coding) ? encoders[coding] : undefined));
  if (codings.length > 0 && encodersFor.every((encoder) => encoder !== undefined)) {
    // Stored decoded; sent encoded again, as the header says (the bytes differ, the content does not).
    for (const encoder of encodersFor) {
      const encoded = encoder!();
      body.on("error", (error) => (encoded as unknown as Readable).destroy(error));
      body = body.pipe(encoded) as unknown as Readable;
    }
  } else {
    // A coding this proxy cannot apply (a HAR from elsewhere holds content decoded whatever its
    // header says): the decoded body goes out as it is, without Content-Encoding.
    if (codings.length > 0) {
      for (let at = headers.length - 2; at >= 0; at -= 2) if (headers[at]!.toLowerCase() === "content-encoding") headers.splice(at, 2);
    }
    // Trailers go to an HTTP/1.1 guest only on a chunked response: no length then.
    if (trailers === undefined) headers.push("content-length", String(length));
  }
  if (deps.latency === "recorded" && entry._egressgate?.chunks === undefined) body = delayEnd(body, positive(entry.timings?.receive), signal);
  return trailers === undefined ? { status: response.status, headers, body, location } : { status: response.status, headers, body, location, trailers: () => trailers };
}

/** A recorded gRPC Trailers-Only answer: grpc-status among the head's fields, and no body. */
function isTrailersOnly(response: RecordedEntry["response"]): boolean {
  const content = response.content;
  if (content?._file !== undefined || (content?.text ?? "") !== "") return false;
  return (response.headers ?? []).some(({ name }) => name.toLowerCase() === "grpc-status");
}

function positive(value: number | undefined | null): number {
  return typeof value === "number" && value > 0 ? value : 0;
}

/** The bytes as the recorded chunks (sizes, and with `paced` the times they came at), one push each. */
function chunked(bytes: Buffer, chunks: readonly (readonly [number, number])[] | undefined, paced: boolean, signal: GuestGone): Readable {
  if (chunks === undefined || chunks.length === 0) return Readable.from(bytes.length === 0 ? [] : [bytes], { objectMode: false });
  const pieces: [Buffer, number][] = [];
  let at = 0;
  for (const [size, ms] of chunks) {
    if (at >= bytes.length) break;
    pieces.push([bytes.subarray(at, at + size), ms]);
    at += size;
  }
  if (at < bytes.length) pieces.push([bytes.subarray(at), pieces.at(-1)?.[1] ?? 0]);
  const start = performance.now();
  return Readable.from(
    (async function* () {
      for (const [piece, ms] of pieces) {
        if (paced) await sleep(ms - (performance.now() - start), signal);
        yield piece;
      }
    })(),
    { objectMode: false },
  );
}

function delayEnd(body: Readable, ms: number, signal: GuestGone): Readable {
  if (ms <= 0) return body;
  return Readable.from(
    (async function* () {
      const start = performance.now();
      for await (const chunk of body) yield chunk as Buffer;
      await sleep(ms - (performance.now() - start), signal);
    })(),
    { objectMode: false },
  );
}

/**
 * A pause that ends early (and quietly) when the guest leaves. Each recorded time is at most
 * maxRecordedMs (the load refuses more), but `send` + `wait` may add up past what one
 * setTimeout can wait (it would fire after 1 ms, with a TimeoutOverflowWarning): waited in parts.
 */
function sleep(ms: number, signal: GuestGone): Promise<void> {
  if (ms <= 0 || signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    let timer: NodeJS.Timeout;
    const done = (): void => {
      clearTimeout(timer);
      signal.off("abort", done);
      resolve();
    };
    const end = performance.now() + ms;
    const wait = (): void => {
      const left = end - performance.now();
      if (left <= 0) done();
      else timer = setTimeout(wait, Math.min(left, maxRecordedMs));
    };
    signal.once("abort", done);
    wait();
  });
}
