import { describe, expect, it } from "vitest";
import type { CallMessage, CallReply } from "../../src/djs/protocol.js";
import { decodeCalls, decodeReplies, encodeCalls, encodeReplies } from "../../src/djs/wire.js";

const base = { now: 1_700_000_000_123, seed: 4_294_967_295, method: "GET", url: "https://api.test/a?b=1", headers: "accept\n*/*\nhost\napi.test", hasBody: false };

describe("the tier-2 wire format", () => {
  it("calls of every shape come back as they went, in order", () => {
    const calls: CallMessage[] = [
      { ...base, id: 1, cell: 41, phase: "isRequestAllowed" },
      { ...base, id: 2, cell: 42, phase: "isIpAllowed", info: { hostname: "api.test", ip: "::1", family: 6, port: 8443, protocol: "https" } },
      { ...base, id: 3, cell: 43, phase: "onResponse", response: { status: 203, statusText: "", headers: "content-type\ntext/plain", url: base.url, hasBody: true } },
      { ...base, id: 4, cell: 44, phase: "onRequest", method: "POST", hasBody: true, requestBody: new Uint8Array([1, 2, 3]) },
      { ...base, id: 5, cell: 45, phase: "onRequest", headers: "x-odd\nvalue\x1fwith a separator" },
      { ...base, id: 6, cell: 46, phase: "onRequest", headers: "" },
    ];
    const wire = encodeCalls(calls);
    // Only the call with a body and the one with a separator travel as objects.
    expect(wire.objects.map((c) => c.id)).toEqual([4, 5]);
    expect(decodeCalls(wire)).toEqual(calls);
  });

  it("replies with a bare code pack; the rest travel whole", () => {
    const replies: CallReply[] = [
      { id: 7, outcome: { t: "code", v: 2 } },
      { id: 8, outcome: { t: "code", v: 0, logs: [["info", "x"]] } },
      { id: 9, outcome: { t: "blocked", status: 451, message: "no", statusText: "" } },
      { id: 10, outcome: { t: "response", status: 200, statusText: "", headers: [], body: { b: 1 } }, bytes: new Uint8Array([9]) },
      { id: 11, outcome: { t: "code", v: 1 } },
    ];
    const wire = encodeReplies(replies);
    expect(wire.text).toBe("7\x1f2\x1e11\x1f1");
    expect(decodeReplies(wire).sort((a, b) => a.id - b.id)).toEqual(replies);
  });
});
