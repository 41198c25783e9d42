/**
 * The soak's HTTP/2 guests: node:http2 sessions inside CONNECT tunnels through the proxy (TLS to
 * the proxy's CA, ALPN `h2`), as curl --http2 or grpc-js reach it. A few sessions per target,
 * shared by every lane and kept for the whole run, so the proxy's per-session bookkeeping sees
 * thousands of streams on one connection, resets among them.
 *
 * A guest that resets its streams does so on sessions of its own, each retired (closed
 * gracefully) after {@link resetsPerSession} resets: the proxy closes a connection that resets
 * more than `limits.h2ResetsPer10s` streams in 10 s (200 by default) as a rapid-reset flood, and
 * the soak looks for leaks, not for that limit.
 */
import { createHash } from "node:crypto";
import { constants, connect as h2Connect, type ClientHttp2Session, type ClientHttp2Stream, type IncomingHttpHeaders, type OutgoingHttpHeaders } from "node:http2";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { connectThrough } from "./h2-load.js";

/** Sessions per target that ordinary streams share. */
const sessionsPerTarget = 4;
/** Sessions per target for the streams the guest resets, and the resets each takes before it is retired. */
const resetSessionsPerTarget = 2;
const resetsPerSession = 50;

/** What one request over HTTP/2 came to, for the soak client to judge. */
export interface H2Transfer {
  readonly status: number | undefined;
  readonly received: number;
  readonly sha256: string;
  /** The first bytes of the body, to show a refusal's reason. */
  readonly head: string;
  /** END_STREAM came, the stream closed with NO_ERROR and nothing failed, and the body has the length its head declared. */
  readonly clean: boolean;
  /** Why it was not clean. */
  readonly failure: string | undefined;
  readonly trailers: IncomingHttpHeaders | undefined;
  /** The guest reset the stream itself (read "abort"). */
  readonly cancelled: boolean;
  readonly timedOut: boolean;
}

export interface H2Request {
  readonly authority: string;
  readonly path: string;
  readonly method: "GET" | "POST";
  readonly headers: Readonly<Record<string, string>>;
  readonly upload: Buffer | undefined;
  /** Reset the stream (CANCEL) after the first chunk of the body. */
  readonly cancel: boolean;
  /** Stop reading for this long after the first chunk, then read on. */
  readonly pauseMs: number | undefined;
  readonly deadlineMs: number;
}

interface Slot {
  session: Promise<ClientHttp2Session> | undefined;
  resets: number;
}

export class H2GuestSessions {
  private readonly slots = new Map<string, Slot[]>();
  private readonly every = new Set<ClientHttp2Session>();
  private turn = 0;
  /** Sessions opened: more than the slots means some closed under the soak and were opened again. */
  opened = 0;
  /** GOAWAYs the proxy sent on sessions the soak had not closed itself, by error code. */
  readonly goaways: Record<string, number> = {};
  /** Sessions the soak closed (retired, or at the end of the run): the proxy's GOAWAY on them is an answer. */
  private readonly closing = new WeakSet<ClientHttp2Session>();

  constructor(
    private readonly proxyUrl: string,
    private readonly caPem: string,
  ) {}

  private async open(authority: string): Promise<ClientHttp2Session> {
    const tunnel = await connectThrough(this.proxyUrl, authority);
    const servername = authority.slice(0, authority.lastIndexOf(":"));
    const socket: TLSSocket = await new Promise((resolve, reject) => {
      const tls = tlsConnect({ socket: tunnel, servername, ca: this.caPem, ALPNProtocols: ["h2"] });
      tls.once("error", (error) => {
        tls.destroy();
        reject(error);
      });
      tls.once("secureConnect", () => {
        tls.removeAllListeners("error");
        tls.on("error", () => undefined);
        if (tls.alpnProtocol === "h2") resolve(tls);
        else {
          tls.destroy();
          reject(new Error(`ALPN gave ${JSON.stringify(tls.alpnProtocol)}, not h2`));
        }
      });
    });
    const session = h2Connect(`https://${authority}`, { createConnection: () => socket });
    session.on("error", () => undefined);
    this.opened += 1;
    this.every.add(session);
    session.once("close", () => this.every.delete(session));
    session.once("goaway", (code: number) => {
      if (!this.closing.has(session)) this.goaways[code] = (this.goaways[code] ?? 0) + 1;
    });
    return session;
  }

  /** A session to `authority`: the next of the shared ones, or one of those for resets. */
  private async session(authority: string, forResets: boolean): Promise<{ session: ClientHttp2Session; slot: Slot }> {
    const key = `${authority}${forResets ? "|resets" : ""}`;
    let slots = this.slots.get(key);
    if (slots === undefined) {
      slots = Array.from({ length: forResets ? resetSessionsPerTarget : sessionsPerTarget }, () => ({ session: undefined, resets: 0 }));
      this.slots.set(key, slots);
    }
    const slot = slots[this.turn++ % slots.length]!;
    let session = slot.session === undefined ? undefined : await slot.session.catch(() => undefined);
    if (session === undefined || session.closed || session.destroyed) {
      const opening = this.open(authority);
      slot.session = opening;
      slot.resets = 0;
      // A failed opening is opened again by the next request for the slot.
      opening.catch(() => {
        if (slot.session === opening) slot.session = undefined;
      });
      session = await opening;
    }
    return { session, slot };
  }

  /** One request on a shared session, judged by the caller. */
  async exchange(request: H2Request): Promise<H2Transfer> {
    const { session, slot } = await this.session(request.authority, request.cancel);
    const transfer = await exchangeOn(session, request);
    if (transfer.cancelled && ++slot.resets >= resetsPerSession && slot.session !== undefined) {
      // Retired: its streams in flight finish, the next request for the slot opens another.
      slot.session = undefined;
      this.closing.add(session);
      session.close();
    }
    return transfer;
  }

  /** Closes every session gracefully (destroyed if it has not closed within `ms`). */
  async close(ms = 5_000): Promise<void> {
    const sessions = [...this.every];
    this.slots.clear();
    await Promise.all(
      sessions.map(
        (session) =>
          new Promise<void>((resolve) => {
            if (session.destroyed) {
              resolve();
              return;
            }
            this.closing.add(session);
            const timer = setTimeout(() => session.destroy(), ms);
            session.once("close", () => {
              clearTimeout(timer);
              resolve();
            });
            session.close();
          }),
      ),
    );
  }
}

function exchangeOn(session: ClientHttp2Session, request: H2Request): Promise<H2Transfer> {
  return new Promise((resolve) => {
    const headers: OutgoingHttpHeaders = { ":method": request.method, ":path": request.path, ...request.headers };
    const hash = createHash("sha256");
    let status: number | undefined;
    let declared: number | undefined;
    let received = 0;
    let head = "";
    let ended = false;
    let failure: string | undefined;
    let trailers: IncomingHttpHeaders | undefined;
    let cancelled = false;
    let timedOut = false;
    const settle = (rstCode: number | undefined): void => {
      if (failure === undefined && !ended) failure = `the stream closed (code ${rstCode}) before its end`;
      if (failure === undefined && rstCode !== constants.NGHTTP2_NO_ERROR) failure = `the stream ended, then closed with code ${rstCode}`;
      if (failure === undefined && declared !== undefined && declared !== received) failure = `${received} bytes against a content-length of ${declared}`;
      resolve({ status, received, sha256: hash.digest("hex"), head, clean: failure === undefined, failure, trailers, cancelled, timedOut });
    };
    let stream: ClientHttp2Stream;
    try {
      stream = session.request(headers, { endStream: request.upload === undefined });
    } catch (error) {
      failure = `${(error as { code?: string }).code ?? "error"}: ${(error as Error).message}`;
      settle(undefined);
      return;
    }
    const deadline = setTimeout(() => {
      timedOut = true;
      failure ??= "soak deadline";
      stream.close(constants.NGHTTP2_CANCEL);
    }, request.deadlineMs);
    stream.on("response", (fields: IncomingHttpHeaders) => {
      status = Number(fields[":status"]);
      const length = fields["content-length"];
      if (length !== undefined) declared = Number(length);
    });
    stream.on("trailers", (fields: IncomingHttpHeaders) => (trailers = fields));
    stream.on("data", (chunk: Buffer) => {
      if (cancelled) return;
      if (head.length < 300) head += chunk.subarray(0, 300 - head.length).toString("latin1");
      received += chunk.length;
      hash.update(chunk);
      if (request.cancel) {
        cancelled = true;
        stream.close(constants.NGHTTP2_CANCEL);
      } else if (request.pauseMs !== undefined && received === chunk.length) {
        stream.pause();
        setTimeout(() => stream.resume(), request.pauseMs);
      }
    });
    stream.on("end", () => (ended = true));
    stream.on("error", (error: Error & { code?: string }) => (failure ??= `${error.code ?? "error"}: ${error.message}`));
    stream.once("close", () => {
      clearTimeout(deadline);
      settle(stream.rstCode);
    });
    if (request.upload !== undefined) stream.end(request.upload);
  });
}
