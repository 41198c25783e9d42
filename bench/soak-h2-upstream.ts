/**
 * The soak's HTTP/2-only upstreams (bench/soak-upstream.ts starts them, in its process): a
 * node:http2 secure server on 127.0.0.1 that offers ALPN `h2` alone, as a gRPC server does, so
 * the proxy's HTTP/2 client (src/upstream/h2-*.ts) carries every request to it. Routes:
 *
 *   GET  /bytes?o=OFF&n=N            the slice, with Content-Length
 *   POST /upload                     {"bytes":N,"sha256":"…"} of what arrived
 *   GET  /trailers?o&n               the slice, then a trailer section with its sha256 (digestTrailer)
 *   GET  /reset?o&n&at=K&code=C      head with Content-Length N, K bytes, then RST_STREAM(C)
 *
 * With `goaway`, each session ends after a few dozen streams (20 to 60, a fixed sequence): a
 * graceful GOAWAY naming the last stream it took (Node's session.close()), or first a GOAWAY
 * naming 2³¹−1 and a moment later that one (a graceful shutdown in two steps, RFC 9113 §6.8).
 * Streams it took are answered; the proxy must send any later ones again on a fresh session.
 */
import { createHash } from "node:crypto";
import { constants, createSecureServer, type IncomingHttpHeaders, type ServerHttp2Session, type ServerHttp2Stream } from "node:http2";
import type { Socket } from "node:net";

export interface H2UpstreamDeps {
  readonly tls: { readonly key: string; readonly cert: string };
  /** Counts the request and checks both tiers' marks (soak-upstream.ts). */
  readonly checkMarks: (target: string, get: (name: string) => string | undefined) => void;
  readonly slice: (url: URL) => Buffer;
  readonly track: (socket: Socket) => void;
  readonly digestTrailer: string;
  readonly uploadAborted: () => void;
}

export interface H2UpstreamCounts {
  /** Sessions this server ended with GOAWAY. */
  goaways: number;
  /** Streams reset mid-body on purpose (/reset). */
  resets: number;
  /** Streams the proxy reset (RST_STREAM with an error code), /reset's aside: responses it let go of. */
  cancelled: number;
}

const maxStreamId = 2 ** 31 - 1;

/** Writes `body` in 16 KiB pieces, honouring flow control, then `done` (not called if the stream goes first). */
function pump(stream: ServerHttp2Stream, body: Buffer, done: () => void): void {
  let at = 0;
  const next = (): void => {
    while (at < body.length) {
      if (stream.destroyed) return;
      const piece = body.subarray(at, at + 16_384);
      at += piece.length;
      if (!stream.write(piece)) {
        stream.once("drain", next);
        return;
      }
    }
    done();
  };
  next();
}

export function startH2Upstream(deps: H2UpstreamDeps, goaway: boolean, counts: H2UpstreamCounts): ReturnType<typeof createSecureServer> {
  const server = createSecureServer({ ...deps.tls, allowHTTP1: false });
  server.on("secureConnection", deps.track);
  server.on("tlsClientError", () => undefined);
  let sessions = 0;
  server.on("session", (session: ServerHttp2Session) => {
    session.on("error", () => undefined);
    const serial = sessions++;
    // 20 to 60 streams, from a fixed sequence: the GOAWAY lands at a different point of each session.
    const lastOf = 20 + ((serial * 7_919) % 41);
    let streams = 0;
    if (goaway) {
      session.on("stream", () => {
        if (++streams !== lastOf) return;
        counts.goaways += 1;
        // Out of nghttp2's read of the stream's HEADERS (see src/proxy/h2-guest.ts calm()).
        setImmediate(() => {
          if (session.closed || session.destroyed) return;
          if (serial % 2 === 0) {
            session.close();
            return;
          }
          session.goaway(constants.NGHTTP2_NO_ERROR, maxStreamId);
          setTimeout(() => {
            if (!session.closed && !session.destroyed) session.close();
          }, 10);
        });
      });
    }
  });
  server.on("stream", (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => onStream(stream, headers, deps, counts));
  return server;
}

function onStream(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, deps: H2UpstreamDeps, counts: H2UpstreamCounts): void {
  stream.on("error", () => undefined);
  const url = new URL(String(headers[":path"] ?? "/"), "https://upstream");
  // The request is read (to its end: these are GETs) before anything is answered. A Node server
  // stream whose request was never read is closed with RST_STREAM(NO_ERROR) a turn after its
  // writable side finishes (core.js callStreamClose), and that can overtake the last DATA frame
  // and END_STREAM while they wait for the proxy's WINDOW_UPDATE: every 65,536-byte body (one
  // byte past the default window) reached the proxy cut, which the proxy then rightly passed on
  // to the guest as a cut. A Node upstream that does this truncates its own responses.
  if (url.pathname !== "/upload") stream.resume();
  deps.checkMarks(`h2 ${headers[":method"]} ${url.pathname}`, (name) => headers[name] as string | undefined);
  stream.once("close", () => {
    if (url.pathname !== "/reset" && stream.rstCode !== undefined && stream.rstCode !== constants.NGHTTP2_NO_ERROR) counts.cancelled += 1;
  });
  switch (url.pathname) {
    case "/bytes": {
      const body = deps.slice(url);
      stream.respond({ ":status": 200, "content-type": "application/octet-stream", "content-length": body.length });
      pump(stream, body, () => stream.end());
      return;
    }
    case "/trailers": {
      const body = deps.slice(url);
      stream.respond({ ":status": 200, "content-type": "application/octet-stream" }, { waitForTrailers: true });
      stream.once("wantTrailers", () => {
        stream.sendTrailers({ [deps.digestTrailer]: createHash("sha256").update(body).digest("hex") });
      });
      pump(stream, body, () => stream.end());
      return;
    }
    case "/upload": {
      const hash = createHash("sha256");
      let bytes = 0;
      stream.on("data", (chunk: Buffer) => {
        hash.update(chunk);
        bytes += chunk.length;
      });
      stream.once("aborted", deps.uploadAborted);
      stream.once("end", () => {
        const answer = JSON.stringify({ bytes, sha256: hash.digest("hex") });
        if (stream.destroyed) return;
        stream.respond({ ":status": 200, "content-type": "application/json", "content-length": Buffer.byteLength(answer) });
        stream.end(answer);
      });
      return;
    }
    case "/reset": {
      const body = deps.slice(url);
      const at = Number(url.searchParams.get("at"));
      const code = Number(url.searchParams.get("code"));
      stream.respond({ ":status": 200, "content-type": "application/octet-stream", "content-length": body.length });
      stream.write(body.subarray(0, at), () => {
        counts.resets += 1;
        // A moment for the DATA to leave before the RST_STREAM.
        setTimeout(() => stream.close(code), 5);
      });
      return;
    }
    default:
      stream.respond({ ":status": 404, "content-length": "0" }, { endStream: true });
  }
}
