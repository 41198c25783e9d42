import { describe, expect, it } from "vitest";
import { EgressError, asEgressError, guestError, secretDenied } from "../../src/errors.js";
import { errorFields } from "../../src/proxy/decision-log.js";

// Requests, HTTP/2 streams, CONNECTs and upgrades wrote an error's fields into their decision
// lines each in its own copy, and the copies had drifted (the CONNECT line left `source` out).
describe("errorFields: an error answer's fields in a decision line", () => {
  const cases: { name: string; err: () => EgressError; fields: Record<string, unknown> }[] = [
    { name: "plain", err: () => new EgressError("EG_DENIED", 403, "host not allowed"), fields: { status: 403, reason: "host not allowed", code: "EG_DENIED" } },
    {
      name: "with detail",
      err: () => new EgressError("EG_UPSTREAM", 502, "upstream failed", { detail: "ECONNRESET at 127.0.0.1:9" }),
      fields: { status: 502, reason: "upstream failed", code: "EG_UPSTREAM", detail: "ECONNRESET at 127.0.0.1:9" },
    },
    {
      name: "with source",
      err: () => Object.assign(new EgressError("EG_HOOK_FAILED", 502, "hook failed"), { source: "policy.js" }),
      fields: { status: 502, reason: "hook failed", code: "EG_HOOK_FAILED", source: "policy.js" },
    },
    {
      name: "with both, source first",
      err: () => Object.assign(new EgressError("EG_HOOK_FAILED", 502, "hook failed", { detail: "TypeError: x" }), { source: "hooks[1]" }),
      fields: { status: 502, reason: "hook failed", code: "EG_HOOK_FAILED", source: "hooks[1]", detail: "TypeError: x" },
    },
  ];
  for (const { name, err, fields } of cases) {
    it(name, () => {
      const got = errorFields(err());
      expect(got).toStrictEqual(fields);
      // The log line keeps the keys in this order.
      expect(Object.keys(got)).toEqual(Object.keys(fields));
    });
  }

  it("what the proxy's own code threw becomes a 502 that keeps the message for the log only", () => {
    const err = asEgressError(new TypeError("cannot read x of undefined"));
    expect(errorFields(err)).toStrictEqual({ status: 502, reason: "internal error (see the proxy log)", code: "EG_UPSTREAM", detail: "cannot read x of undefined" });
    const thrownString = asEgressError("odd");
    expect(thrownString.detail).toBe("odd");
    const own = new EgressError("EG_DENIED", 403, "no");
    expect(asEgressError(own)).toBe(own);
  });
});

describe("guestError: the copy a guest sees keeps what the log and metrics read", () => {
  it("keeps source, detail, failure and the secret when it redacts", () => {
    const err = secretDenied("GH_TOKEN", "value of GH_TOKEN sent to other.test: hunter2hunter2", "placeholder in header x-token");
    err.source = "secrets";
    const copy = guestError(err, (text) => text.replaceAll("hunter2hunter2", "[REDACTED:GH_TOKEN]"));
    expect(copy).not.toBe(err);
    expect(copy.message).toBe("value of GH_TOKEN sent to other.test: [REDACTED:GH_TOKEN]");
    expect(copy.secret).toBe("GH_TOKEN");
    expect(copy.source).toBe("secrets");
    expect(copy.detail).toBe("placeholder in header x-token");
  });
});
