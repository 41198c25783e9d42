import { describe, expect, it } from "vitest";
import { endToEndHeaders, headerObjectToList, upstreamResponseFields } from "../../src/headers.js";

// The one-pass rewrites of 2026-12-05 (docs/performance.md, "The fifteenth session's changes")
// keep what the two-pass versions did: these pin it.
describe("endToEndHeaders", () => {
  it("drops hop-by-hop fields in any case and keeps the order of the rest", () => {
    expect(endToEndHeaders(["A", "1", "Keep-Alive", "timeout=5", "b", "2", "Transfer-Encoding", "chunked", "Upgrade", "h2c", "c", "3"])).toEqual(["A", "1", "b", "2", "c", "3"]);
  });

  it("drops the fields a Connection names, before or after it, and keeps te: trailers even when named", () => {
    const raw = ["X-Before", "1", "te", " Trailers ", "Connection", "keep-alive, X-Before, x-after ,TE", "x-after", "2", "x-kept", "3"];
    expect(endToEndHeaders(raw)).toEqual(["te", "trailers", "x-kept", "3"]);
  });

  it("drops what it is told to, te included, and a te other than trailers", () => {
    expect(endToEndHeaders(["te", "trailers", "host", "a", "x", "1"], new Set(["te", "host"]))).toEqual(["x", "1"]);
    expect(endToEndHeaders(["te", "gzip", "x", "1"])).toEqual(["x", "1"]);
  });

  // Node's HTTP/2 client refuses a te that is not the one value "trailers": two lines were an
  // HTTP/1.1 guest's 502 at an h2 upstream, and a list naming trailers among others lost it.
  it("keeps one te: trailers for every TE line or list that names trailers, and nothing else of them", () => {
    expect(endToEndHeaders(["TE", "trailers", "x", "1", "te", "trailers"])).toEqual(["TE", "trailers", "x", "1"]);
    expect(endToEndHeaders(["te", "gzip;q=0.5, Trailers", "x", "1"])).toEqual(["te", "trailers", "x", "1"]);
    expect(endToEndHeaders(["te", "deflate", "te", "trailers"])).toEqual(["te", "trailers"]);
    expect(endToEndHeaders(["te", "trailersx, gzip"])).toEqual([]);
  });
});

describe("upstreamResponseFields", () => {
  it("spells a Content-Length as a number and leaves a plain one as it is", () => {
    expect(upstreamResponseFields(["content-length", " 002 ", "x", "1"])).toEqual(["content-length", "2", "x", "1"]);
    expect(upstreamResponseFields(["Content-Length", "000", "x", "1"])).toEqual(["Content-Length", "0", "x", "1"]);
    expect(upstreamResponseFields(["content-length", "100", "connection", "keep-alive", "keep-alive", "timeout=5"])).toEqual(["content-length", "100"]);
  });

  it("refuses two Content-Length fields, or one that is not a number, even one a Connection names", () => {
    expect(upstreamResponseFields(["content-length", "1", "Content-Length", "1"])).toBeUndefined();
    expect(upstreamResponseFields(["content-length", "1a"])).toBeUndefined();
    expect(upstreamResponseFields(["content-length", ""])).toBeUndefined();
    expect(upstreamResponseFields(["connection", "content-length", "content-length", "+1"])).toBeUndefined();
    expect(upstreamResponseFields(["connection", "content-length", "content-length", "01"])).toEqual([]);
  });

  it("drops hop-by-hop fields and the ones a Connection names, and keeps te: trailers", () => {
    expect(upstreamResponseFields(["x-gone", "1", "Connection", "close, X-Gone", "Trailer", "x", "te", "trailers", "date", "d"])).toEqual(["te", "trailers", "date", "d"]);
  });
});

describe("headerObjectToList", () => {
  it("lists fields in the object's order, a repeated one once per value, and skips undefined ones", () => {
    expect(headerObjectToList({ a: "1", "set-cookie": ["x=1", "y=2"], b: undefined, c: "3" })).toEqual(["a", "1", "set-cookie", "x=1", "set-cookie", "y=2", "c", "3"]);
  });
});
