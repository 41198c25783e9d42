import { describe, expect, it } from "vitest";
import { canonical, fieldsOf, matchKey, nearest } from "../../src/record/match.js";
import { LiteralScanner } from "../../src/record/leak-scan.js";

const none = { matchHeaders: [], ignoreQuery: [], ignoreBodyPaths: [] };

describe("replay match key", () => {
  it("sorts the query and canonicalises a JSON body, so order never decides a match", () => {
    const a = fieldsOf("post", new URL("https://API.test/x?b=2&a=1"), [], { bytes: Buffer.from('{"b":1,"a":[1,{"d":2,"c":3}]}') }, none);
    const b = fieldsOf("POST", new URL("https://api.test:443/x?a=1&b=2"), [], { bytes: Buffer.from('{"a":[1,{"c":3,"d":2}],"b":1}') }, none);
    expect(matchKey(a)).toBe(matchKey(b));
    expect(canonical({ z: 1, a: null })).toBe('{"a":null,"z":1}');
  });

  it("leaves out ignored query parameters and JSON pointers, and only named headers count", () => {
    const options = { matchHeaders: ["x-tenant"], ignoreQuery: ["ts"], ignoreBodyPaths: ["/meta/nonce", "/list/0"] };
    const a = fieldsOf("POST", new URL("https://a.test/?ts=1"), [["X-Tenant", "t1"], ["date", "x"]], { bytes: Buffer.from('{"meta":{"nonce":"1"},"list":["a","b"]}') }, options);
    const b = fieldsOf("POST", new URL("https://a.test/?ts=2"), [["x-tenant", "t1"]], { bytes: Buffer.from('{"meta":{"nonce":"2"},"list":["c","b"]}') }, options);
    expect(matchKey(a)).toBe(matchKey(b));
    const c = fieldsOf("POST", new URL("https://a.test/?ts=2"), [["x-tenant", "t2"]], { bytes: Buffer.from('{"meta":{"nonce":"2"},"list":["c","b"]}') }, options);
    expect(matchKey(c)).not.toBe(matchKey(a));
  });

  it("a non-JSON body is keyed by its SHA-256, and the nearest entry names the first field that differs", () => {
    const x = fieldsOf("PUT", new URL("https://a.test/p"), [], { bytes: Buffer.from([0, 1, 2]) }, none);
    expect(x.body).toMatch(/^sha256:[0-9a-f]{64}$/);
    const wanted = fieldsOf("GET", new URL("https://a.test/p?q=2"), [], null, none);
    const candidates = [fieldsOf("GET", new URL("https://b.test/p?q=2"), [], null, none), fieldsOf("GET", new URL("https://a.test/p?q=1"), [], null, none)];
    expect(nearest(candidates, wanted)).toEqual({ index: 1, field: "query" });
  });
});

describe("literal search of large bodies", () => {
  const value = "s3cr3t-Value/with+chars";

  it.each([
    ["as it is, in another case", value.toUpperCase()],
    ["base64 at every alignment", Buffer.from(`x${value}`).toString("base64")],
    ["base64 at offset two", Buffer.from(`xy${value}`).toString("base64")],
    ["hex", Buffer.from(value).toString("hex")],
    ["percent-encoded", encodeURIComponent(value)],
  ])("finds a value %s, even split across two chunks", (_name, spelled) => {
    const scanner = new LiteralScanner([{ name: "S", value }]);
    const text = Buffer.from(`${"a".repeat(1000)}${spelled}${"b".repeat(1000)}`);
    const cut = 1000 + Math.floor(spelled.length / 2);
    scanner.push(text.subarray(0, cut));
    expect(scanner.found).toBeUndefined();
    scanner.push(text.subarray(cut));
    expect(scanner.found).toBe("S");
  });

  it("finds nothing in a body without the value", () => {
    const scanner = new LiteralScanner([{ name: "S", value }]);
    scanner.push(Buffer.alloc(1 << 20, 7));
    expect(scanner.found).toBeUndefined();
  });
});
