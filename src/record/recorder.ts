import { contentCodingList, getHeader } from "../headers.js";
import type { Logger } from "../log.js";
import type { Executor, ExecutorResponse, OutboundRequest, SendInfo } from "../pipeline/exchange.js";
import type { SecretStore } from "../policy/secrets.js";
import { BodyCapture, teeBody, type CapturedBody } from "./body-capture.js";
import { decodeBody } from "./decode-body.js";
import { buildEntry, type Exchange } from "./entry.js";
import { sidecarDir, singleGuest } from "./har.js";
import { LiteralScanner } from "./leak-scan.js";
import { RecordedValues } from "./recorded-values.js";
import { hiddenCopies } from "../policy/hidden-url.js";
import type { Recording } from "./recording.js";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import type { Readable } from "node:stream";
import { withFields } from "../objects.js";

export interface RecorderDeps {
  readonly recording: Recording;
  readonly guest: string;
  /**
   * Whether the guest is a named one though called `default` (one of several), asked at each
   * exchange: its entries are marked so, to answer only it on replay (har.ts, `named`).
   */
  readonly named: () => boolean;
  /** The guest's secrets, asked at each exchange (they can rotate). */
  readonly secrets: () => SecretStore | undefined;
  /** Every other guest's secrets, asked at each exchange: their values are kept out of this guest's entries too. */
  readonly neighbours: () => Iterable<SecretStore | undefined>;
  readonly cookies: boolean;
  readonly log: Logger;
}

const redirectStatuses = new Set([301, 302, 303, 307, 308]);

/**
 * Wraps the upstream: each exchange (one redirect hop) is sent as usual and, once its response
 * body has streamed to the guest, becomes one HAR entry. Bodies are copied as they pass, so
 * recording adds no buffering the guest would wait for beyond the disk's own pace.
 */
export function recordingExecutor(upstream: Executor, deps: RecorderDeps): Executor {
  return {
    async send(request, address, signal, info) {
      const seq = deps.recording.nextSeq();
      const named = deps.guest === singleGuest && deps.named();
      const started = new Date();
      const t0 = performance.now();
      const store = deps.secrets();
      // A hidden hop's path and query, which its response can quote, are kept out of its entry as values are.
      const values = RecordedValues.of(store, deps.neighbours(), request.hiddenPath === undefined ? [] : hiddenCopies(request.url, request.hiddenPath));
      const scanner = (): LiteralScanner | undefined => (values === undefined ? undefined : new LiteralScanner(values.valuesToFind()));
      let requestBody: { capture: BodyCapture; done: Promise<boolean>; scanner: LiteralScanner | undefined } | undefined;
      let sent: OutboundRequest = request;
      if (request.body !== null) {
        const requestScanner = scanner();
        const capture = new BodyCapture(sidecarDir(deps.recording.path), { scanner: requestScanner });
        if (request.body instanceof Uint8Array) {
          void capture.write(Buffer.from(request.body));
          requestBody = { capture, done: Promise.resolve(true), scanner: requestScanner };
        } else {
          const tee = teeBody(request.body, capture);
          requestBody = { capture, done: tee.done, scanner: requestScanner };
          sent = withFields(request, { body: tee.body });
        }
      }
      let response: ExecutorResponse;
      try {
        response = await upstream.send(sent, address, signal, info);
      } catch (error) {
        void requestBody?.capture.discard();
        throw error;
      }
      const head = performance.now();
      const finish = async (body: CapturedBody | null, responseScanner: LiteralScanner | undefined, decodedBody?: CapturedBody): Promise<void> => {
        // Read once the body has ended, as the guest's side reads them.
        const trailers = body === null ? undefined : response.trailers?.();
        let requestCaptured: CapturedBody | null = null;
        if (requestBody !== undefined) {
          if (!(await requestBody.done)) {
            await requestBody.capture.discard();
            throw new Error("the request body did not arrive whole");
          }
          requestCaptured = await requestBody.capture.finish();
        }
        const exchange: Exchange = {
          seq,
          hop: info.hop,
          guest: deps.guest,
          named,
          started,
          request,
          requestBody: requestCaptured,
          serverIPAddress: address.ip,
          httpVersion: response.httpVersion ?? "HTTP/1.1",
          status: response.status,
          headers: response.headers,
          trailers,
          responseBody: body,
          decodedBody,
          sidecarLeak: responseScanner?.found,
          requestLeak: requestBody?.scanner?.found,
          timings: { send: 0, wait: Math.round(head - t0), receive: Math.round(performance.now() - head) },
        };
        write(exchange, store, values, deps, info);
      };
      const location = redirectStatuses.has(response.status) ? response.location : undefined;
      if (response.body === null || location !== undefined) {
        // A redirect's body is thrown away by the pipeline: recorded empty, and left to undici to dump.
        deps.recording.track(finish(null, undefined).catch((error: unknown) => skipped(deps, seq, error)));
        return response;
      }
      const encoding = contentCodingList(response.headers).join(", ");
      const framed = getHeader(response.headers, "content-length") !== undefined;
      // A sidecar body is searched as it streams; an encoded one kept inline is searched as it is
      // decoded, and whole when it decodes small enough to stay inline (entry.ts).
      const responseScanner = encoding === "" || encoding === "identity" ? scanner() : undefined;
      const capture = new BodyCapture(sidecarDir(deps.recording.path), { chunks: !framed && encoding === "", scanner: responseScanner });
      const tee = teeBody(response.body as Readable, capture);
      deps.recording.track(
        (async () => {
          if (!(await tee.done)) {
            await capture.discard();
            deps.log.debug("exchange not recorded: its body did not arrive whole", { code: "EG_RECORD_INCOMPLETE", seq, guest: deps.guest });
            return;
          }
          // Still compressed on disk, a sidecar body cannot be searched: with values to look for, its
          // bytes are never decrypted to disk.
          const unsearchable = encoding !== "" && values !== undefined;
          const body = await capture.finish({ withhold: unsearchable });
          if (body.file !== undefined && unsearchable) {
            // Still compressed on disk, so it cannot be searched: not written (fail closed).
            await finish(body, { found: "(compressed sidecar body, not searchable)" } as LiteralScanner);
            return;
          }
          if (body.bytes !== undefined && encoding !== "") {
            const decodedScanner = scanner();
            const decoded = await decodeBody(body.bytes, contentCodingList(response.headers), sidecarDir(deps.recording.path), decodedScanner);
            await finish(body, decodedScanner, decoded);
            return;
          }
          await finish(body, responseScanner);
        })().catch((error: unknown) => skipped(deps, seq, error)),
      );
      return withFields(response, { body: tee.body });
    },
  };
}

function write(exchange: Exchange, store: SecretStore | undefined, values: RecordedValues | undefined, deps: RecorderDeps, info: SendInfo): void {
  const built = buildEntry(exchange, store, values, { cookies: deps.cookies });
  if ("leak" in built) {
    deps.log.error("exchange not recorded: it holds a secret's value", {
      code: "EG_RECORD_LEAK",
      seq: exchange.seq,
      id: info.id,
      guest: deps.guest,
      secret: built.leak.secret,
      where: built.leak.where,
    });
    // Its sidecar files are what may hold the value: they go too. A withheld body was never
    // written, and its name (its bytes' SHA-256) can only be a file an earlier, clean entry
    // wrote and still points at: that one stays.
    for (const body of [exchange.requestBody, exchange.responseBody, exchange.decodedBody]) {
      if (body?.file !== undefined && body.withheld !== true) void rm(join(sidecarDir(deps.recording.path), body.file), { force: true }).catch(() => undefined);
    }
    return;
  }
  deps.recording.append(built.entry);
}

function skipped(deps: RecorderDeps, seq: number, error: unknown): void {
  deps.log.warn("exchange not recorded", { code: "EG_RECORD_FAILED", seq, guest: deps.guest, error });
}
