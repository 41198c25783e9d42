import { Socket } from "node:net";
import { describe, expect, it } from "vitest";
import { EgressError } from "../../src/errors.js";
import { h2OutboundRequest } from "../../src/proxy/h2-request.js";
import { grpcStatusFor, h2HeaderObject } from "../../src/proxy/h2-respond.js";
import type { TunnelTarget } from "../../src/proxy/guest-request.js";

const tunnel: TunnelTarget = { hostname: "api.test", port: 8443, guest: "default", protocol: "https:", connection: new Socket() };
const head = (extra: string[] = [], authority = "api.test:8443"): string[] => [":method", "GET", ":scheme", "https", ":authority", authority, ":path", "/a?b=1", ...extra];

function failure(fn: () => unknown): EgressError {
  try {
    fn();
  } catch (error) {
    if (error instanceof EgressError) return error;
    throw error;
  }
  throw new Error("did not throw");
}

describe("h2OutboundRequest", () => {
  it("builds the destination from the tunnel and :path, and keeps te: trailers", () => {
    const request = h2OutboundRequest(head(["te", "trailers", "x-a", "1"]), tunnel, null);
    expect(request.url.href).toBe("https://api.test:8443/a?b=1");
    expect(request.headers).toEqual(["te", "trailers", "x-a", "1"]);
    expect(request.body).toBeNull();
  });

  it("joins cookie crumbs with '; ' and drops connection-specific fields", () => {
    const request = h2OutboundRequest(head(["cookie", "a=1", "connection", "close", "cookie", "b=2", "host", "api.test:8443"]), tunnel, null);
    expect(request.headers).toEqual(["cookie", "a=1; b=2"]);
  });

  it("an :authority that names another host than the CONNECT target is 421", () => {
    expect(failure(() => h2OutboundRequest(head([], "other.test:8443"), tunnel, null)).status).toBe(421);
    expect(failure(() => h2OutboundRequest(head(["host", "other.test"]), tunnel, null)).status).toBe(421);
  });

  it("CONNECT, TRACE, a missing or non-origin :path are refused", () => {
    expect(failure(() => h2OutboundRequest([":method", "CONNECT", ":authority", "api.test:8443"], tunnel, null)).status).toBe(405);
    expect(failure(() => h2OutboundRequest([":method", "TRACE", ":path", "/", ":authority", "api.test"], tunnel, null)).status).toBe(405);
    expect(failure(() => h2OutboundRequest([":method", "GET", ":authority", "api.test"], tunnel, null)).status).toBe(400);
    expect(failure(() => h2OutboundRequest([":method", "OPTIONS", ":path", "*", ":authority", "api.test"], tunnel, null)).status).toBe(400);
  });

  // HTTP/2 carries any token as a method; HTTP/1.1 guests can send only what Node's parser
  // knows. A policy refusing DELETE did not refuse `delete`, which servers read as DELETE.
  it.each([
    ["delete", 400, /spell it DELETE/],
    ["Patch", 400, /spell it PATCH/],
    ["FROB", 400, /not one the proxy forwards/],
    ["trace", 405, /would echo credentials/],
    ["connect", 405, /CONNECT inside a tunnel/],
  ])("the method %j gets %i", (method, status, reason) => {
    const error = failure(() => h2OutboundRequest([":method", method, ":path", "/", ":authority", "api.test"], tunnel, null));
    expect(error.status).toBe(status);
    expect(error.message).toMatch(reason);
  });

  it("a Content-Length beyond what a number holds exactly is 400 (it went on rounded)", () => {
    expect(failure(() => h2OutboundRequest(head(["content-length", "9007199254740993"]), tunnel, null)).status).toBe(400);
    expect(failure(() => h2OutboundRequest(head(["content-length", "010"]), tunnel, null)).status).toBe(400);
    expect(h2OutboundRequest(head(["content-length", "9007199254740991"]), tunnel, null).headers).toContain("9007199254740991");
  });
});

it("a :path like //evil.test/x stays a path on the tunnel's origin", () => {
  expect(h2OutboundRequest([":method", "GET", ":path", "//evil.test/x", ":authority", "api.test:8443"], tunnel, null).url.host).toBe("api.test:8443");
});

describe("h2 responses", () => {
  it("header lists become Node's object: set-cookie stays a list, other repeats are joined, forbidden fields go", () => {
    expect(h2HeaderObject(["Set-Cookie", "a=1", "set-cookie", "b=2", "Vary", "a", "vary", "b", "connection", "close", "te", "gzip", "Keep-Alive", "x"])).toEqual({
      "set-cookie": ["a=1", "b=2"],
      vary: "a, b",
    });
  });

  it("the proxy's refusals map to gRPC codes (403 PERMISSION_DENIED, 5xx UNAVAILABLE)", () => {
    expect(grpcStatusFor(403)).toBe(7);
    expect(grpcStatusFor(502)).toBe(14);
    expect(grpcStatusFor(504)).toBe(14);
    expect(grpcStatusFor(407)).toBe(16);
    expect(grpcStatusFor(400)).toBe(13);
    // A head past the proxy's bounds, as gRPC servers answer metadata past theirs.
    expect(grpcStatusFor(431)).toBe(8);
  });
});
