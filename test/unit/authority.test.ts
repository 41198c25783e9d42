import { describe, expect, it } from "vitest";
import { normalizeHost } from "../../src/hostname.js";
import { parseAuthority, parsePort } from "../../src/proxy/authority.js";

describe("normalizeHost", () => {
  it.each([
    ["API.Example.TEST", "api.example.test"],
    ["api.example.test.", "api.example.test"],
    ["2130706433", "127.0.0.1"],
    ["127.1", "127.0.0.1"],
    ["[::FFFF:127.0.0.1]", "[::ffff:7f00:1]"],
  ])("%s is %s", (raw, expected) => {
    expect(normalizeHost(raw)).toBe(expected);
  });

  // One trailing dot is the root; more, or an empty label anywhere, is not a host name. Two
  // dots passed, and the name went upstream as `api.example.test.` in Host.
  it.each(["api.example.test..", "api..example.test", ".api.example.test", "..", "."])("%s is refused with 400", (raw) => {
    expect(() => normalizeHost(raw)).toThrow(expect.objectContaining({ status: 400 }));
  });

  it("a label over 63 characters is named as such", () => {
    expect(() => normalizeHost(`${"a".repeat(70)}.test`)).toThrow(/label of 70 characters; at most 63/);
  });
});

describe("parsePort", () => {
  // RFC 3986's port is any run of digits, so `0443` is 443 (curl and the URL parser agree).
  it.each([["443", 443], ["1", 1], ["65535", 65535], ["0443", 443]])("%s is port %d", (raw, port) => {
    expect(parsePort(raw, "CONNECT target")).toBe(port);
  });

  it.each(["0", "00000", "65536", "+443", "", "44 3", "99999", "0x1bb"])("%s is refused with 400", (raw) => {
    expect(() => parsePort(raw, "CONNECT target")).toThrow(expect.objectContaining({ status: 400 }));
  });

  it("parseAuthority normalises the host and checks the port", () => {
    expect(() => parseAuthority("api.test:0", "CONNECT target")).toThrow(expect.objectContaining({ status: 400 }));
    expect(() => parseAuthority("api..test:443", "CONNECT target")).toThrow(expect.objectContaining({ status: 400 }));
    expect(parseAuthority("[::1]:8443", "CONNECT target")).toEqual({ hostname: "[::1]", port: 8443 });
  });
});
