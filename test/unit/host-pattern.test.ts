import { describe, expect, it } from "vitest";
import { compileHostPatterns, normalizeHostname, validateHostPattern } from "../../src/policy/host-pattern.js";

describe("normalizeHostname", () => {
  it.each([
    ["example.com", "example.com"],
    ["Example.COM", "example.com"],
    ["example.com.", "example.com"],
    ["EXAMPLE.COM.", "example.com"],
    ["*.Example.Com.", "*.example.com"],
    ["localhost", "localhost"],
    ["127.0.0.1", "127.0.0.1"],
  ])("%j normalises to %j", (input, expected) => {
    expect(normalizeHostname(input)).toBe(expected);
  });

  it("strips only one trailing dot", () => {
    expect(normalizeHostname("example.com..")).toBe("example.com.");
  });

  it("is idempotent on an already normalised name", () => {
    expect(normalizeHostname(normalizeHostname("A.B.Example.COM."))).toBe("a.b.example.com");
  });
});

describe("validateHostPattern", () => {
  it.each([
    ["example.com", "example.com"],
    ["Example.COM", "example.com"],
    ["example.com.", "example.com"],
    ["*.example.com", "*.example.com"],
    ["*.Example.Com.", "*.example.com"],
    ["*", "*"],
    ["api.*.example.com", "api.*.example.com"],
    ["my_host-1.example", "my_host-1.example"],
    ["localhost", "localhost"],
    ["10.0.0.1", "10.0.0.1"],
    ["  example.com  ", "example.com"],
  ])("accepts %j and returns it normalised as %j", (input, expected) => {
    expect(validateHostPattern(input, "allowedHosts")).toBe(expected);
  });

  it.each(["", " ", "\t\n"])("rejects the empty or blank pattern %j with a TypeError", (input) => {
    expect(() => validateHostPattern(input, "allowedHosts")).toThrow(TypeError);
    expect(() => validateHostPattern(input, "allowedHosts")).toThrow(/non-empty host pattern/);
  });

  it.each([undefined, null, 42, true, ["example.com"], { host: "example.com" }])(
    "rejects the non-string %j with a TypeError",
    (input) => {
      expect(() => validateHostPattern(input, "allowedHosts")).toThrow(TypeError);
    },
  );

  it.each(["https://x", "http://example.com", "https://*.example.com", "ws://example.com"])(
    "rejects the URL with a scheme %j",
    (input) => {
      expect(() => validateHostPattern(input, "allowedHosts")).toThrow(TypeError);
      expect(() => validateHostPattern(input, "allowedHosts")).toThrow(/is not a host pattern/);
    },
  );

  it.each(["x/y", "example.com/", "example.com/path", "/example.com", "*.example.com/*"])(
    "rejects the pattern with a path %j",
    (input) => {
      expect(() => validateHostPattern(input, "allowedHosts")).toThrow(TypeError);
      expect(() => validateHostPattern(input, "allowedHosts")).toThrow(/is not a host pattern/);
    },
  );

  it.each(["example.com:8080", "*.example.com:443", "localhost:3000"])(
    "rejects the pattern with a port %j, as its error message promises",
    (input) => {
      expect(() => validateHostPattern(input, "allowedHosts")).toThrow(TypeError);
    },
  );

  it.each([
    "a+b.test",
    "(x).test",
    "a|b",
    "a?b",
    "^example.com$",
    "a\\d.test",
    "example com",
    "user@example.com",
    "example.com?x=1",
    "example.com#frag",
    "exa%6dple.com",
    "{a,b}.test",
  ])("rejects %j, which has characters no hostname has", (input) => {
    expect(() => validateHostPattern(input, "allowedHosts")).toThrow(TypeError);
  });

  it.each([
    ["allowedHosts", ""],
    ["allowedInternalHosts", "https://x"],
    ["secrets.GITHUB_TOKEN.hosts", "x/y"],
    ["allowedHosts[2]", undefined],
  ])("names the option %j in the TypeError message for %j", (optionName, input) => {
    let error: unknown;
    try {
      validateHostPattern(input, optionName);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(TypeError);
    expect((error as TypeError).message.startsWith(`${optionName}: `)).toBe(true);
  });

  it("quotes the offending pattern in the TypeError message", () => {
    expect(() => validateHostPattern("https://x", "allowedHosts")).toThrow('"https://x"');
  });
});

describe("address patterns in other spellings", () => {
  // Accepted at start before, and never matched: the proxy matches the URL parser's spelling.
  it.each([
    ["127.1", "127.0.0.1"],
    ["2130706433", "127.0.0.1"],
    ["0x7f.0.0.1", "127.0.0.1"],
    ["0:0:0:0:0:0:0:1", "[::1]"],
    ["[0:0:0:0:0:0:0:1]", "[::1]"],
    ["::ffff:127.0.0.1", "[::ffff:7f00:1]"],
    ["::FFFF:7F00:1", "[::ffff:7f00:1]"],
  ])("%s matches the host a URL naming it has, %s", (pattern, host) => {
    // The pattern matched as the URL parser spells it (brackets of an IPv6 literal aside).
    const spelled = host.replace(/^\[(.*)\]$/, "$1");
    expect(compileHostPatterns([pattern]).match(host)).toBe(spelled);
    expect(compileHostPatterns([validateHostPattern(pattern, "allowedInternalHosts[0]")]).match(host)).toBe(spelled);
  });

  // An IPv4 address and its IPv4-mapped form are one address (RFC 4291 §2.5.5.2); allowing one
  // spelling refused the other (carried from an earlier session). The line names the pattern.
  it.each([
    ["127.0.0.1", "[::ffff:7f00:1]", "127.0.0.1"],
    ["127.0.0.1", "::FFFF:127.0.0.1", "127.0.0.1"],
    ["::ffff:127.0.0.1", "127.0.0.1", "::ffff:7f00:1"],
    ["127.0.0.*", "[::ffff:7f00:9]", "127.0.0.*"],
    ["10.0.0.0", "[::ffff:a00:0]", "10.0.0.0"],
  ])("%s matches the same address written %s, naming %s", (pattern, host, named) => {
    expect(compileHostPatterns([pattern]).match(host)).toBe(named);
  });

  it.each([
    ["127.1", "127.0.0.2"],
    ["*.test", "127.0.0.1"],
    ["api.test", "api.test.evil"],
    // Other addresses that carry an IPv4 one: IPv4-compatible, NAT64, SIIT, and a mapped neighbour.
    ["127.0.0.1", "[::7f00:1]"],
    ["127.0.0.1", "[64:ff9b::7f00:1]"],
    ["127.0.0.1", "[::ffff:0:7f00:1]"],
    ["127.0.0.1", "[::ffff:7f00:2]"],
    ["::ffff:127.0.0.1", "127.0.0.2"],
    // A wildcard is never globbed against the `::ffff:HHHH:HHHH` spelling of an IPv4 address,
    // whose hex digits matched patterns the dotted form does not (review finding).
    ["*f*", "8.8.8.8"],
    ["*0", "10.0.0.16"],
    ["*cafe", "171.18.202.254"],
    ["*ad", "93.184.26.173"],
  ])("%s still does not match %s", (pattern, host) => {
    expect(compileHostPatterns([pattern]).match(host)).toBeUndefined();
  });
});

describe("compileHostPatterns", () => {
  it("exposes the patterns lowercased and without a trailing dot, in the order given", () => {
    const matcher = compileHostPatterns(["Example.COM.", "*.Foo.test", "*"]);
    expect(matcher.patterns).toEqual(["example.com", "*.foo.test", "*"]);
  });

  it("an empty pattern list matches nothing", () => {
    const matcher = compileHostPatterns([]);
    expect(matcher.patterns).toEqual([]);
    expect(matcher.match("example.com")).toBeUndefined();
    expect(matcher.match("localhost")).toBeUndefined();
  });

  describe("an exact pattern is anchored at both ends", () => {
    const matcher = compileHostPatterns(["example.com"]);

    it("matches the same name and returns the pattern", () => {
      expect(matcher.match("example.com")).toBe("example.com");
    });

    it.each([
      "evilexample.com",
      "example.com.evil.net",
      "sub.example.com",
      "example.co",
      "example.comx",
      "xexample.com",
      "example",
      "com",
      "",
      "example.com:443",
    ])("does not match %j", (host) => {
      expect(matcher.match(host)).toBeUndefined();
    });
  });

  describe("* matches any run of characters, dots included", () => {
    const matcher = compileHostPatterns(["*.example.com"]);

    it.each(["a.example.com", "a.b.example.com", "a.b.c.d.example.com", "x-y_z.example.com", "www.example.com"])(
      "*.example.com matches %j",
      (host) => {
        expect(matcher.match(host)).toBe("*.example.com");
      },
    );

    it.each([
      "example.com",
      "evilexample.com",
      "a-example.com",
      "aexample.com",
      "example.com.evil.net",
      "a.example.com.evil.net",
      "a.example.comx",
      "a.example.co",
      "a.example.org",
    ])("*.example.com does not match %j", (host) => {
      expect(matcher.match(host)).toBeUndefined();
    });

    it("a wildcard in the middle spans one or more labels but stays anchored", () => {
      const middle = compileHostPatterns(["api.*.example.com"]);
      expect(middle.match("api.eu.example.com")).toBe("api.*.example.com");
      expect(middle.match("api.eu.west.example.com")).toBe("api.*.example.com");
      expect(middle.match("api.example.com")).toBeUndefined();
      expect(middle.match("www.eu.example.com")).toBeUndefined();
      expect(middle.match("xapi.eu.example.com")).toBeUndefined();
      expect(middle.match("api.eu.example.com.evil.net")).toBeUndefined();
    });

    it("a trailing wildcard is anchored at the start", () => {
      const prefix = compileHostPatterns(["foo*"]);
      expect(prefix.match("foo")).toBe("foo*");
      expect(prefix.match("foobar.com")).toBe("foo*");
      expect(prefix.match("foo.bar.com")).toBe("foo*");
      expect(prefix.match("xfoo")).toBeUndefined();
      expect(prefix.match("a.foo.com")).toBeUndefined();
    });

    it("a wildcard may match an empty run", () => {
      const bare = compileHostPatterns(["*example.com"]);
      expect(bare.match("example.com")).toBe("*example.com");
      expect(bare.match("evilexample.com")).toBe("*example.com");
      expect(bare.match("example.com.evil.net")).toBeUndefined();
    });

    it("several wildcards in one pattern each match a run", () => {
      const several = compileHostPatterns(["*.*.test"]);
      expect(several.match("a.b.test")).toBe("*.*.test");
      expect(several.match("a.b.c.test")).toBe("*.*.test");
      expect(several.match("a.test")).toBeUndefined();
    });
  });

  describe("* alone matches anything", () => {
    const matcher = compileHostPatterns(["*"]);

    it.each(["example.com", "a.b.c.example.com", "localhost", "127.0.0.1", "::1", "xn--bcher-kva.example"])(
      "* matches %j",
      (host) => {
        expect(matcher.match(host)).toBe("*");
      },
    );

    it("*. is the same pattern as * because the trailing dot is ignored", () => {
      const dotted = compileHostPatterns(["*."]);
      expect(dotted.patterns).toEqual(["*"]);
      expect(dotted.match("anything.example")).toBe("*");
    });
  });

  describe("matching is case-insensitive", () => {
    it.each([
      ["example.com", "EXAMPLE.COM"],
      ["example.com", "Example.Com"],
      ["EXAMPLE.COM", "example.com"],
      ["Example.Com", "eXAMPLE.cOM"],
      ["*.example.com", "WWW.EXAMPLE.COM"],
      ["*.EXAMPLE.COM", "www.example.com"],
      ["API.*.Example.com", "api.EU.example.COM"],
    ])("pattern %j matches host %j and reports the lowercased pattern", (pattern, host) => {
      expect(compileHostPatterns([pattern]).match(host)).toBe(pattern.toLowerCase());
    });
  });

  describe("a trailing dot is ignored on both the pattern and the host", () => {
    it.each([
      ["example.com", "example.com."],
      ["example.com.", "example.com"],
      ["example.com.", "example.com."],
      ["*.example.com", "a.example.com."],
      ["*.example.com.", "a.example.com"],
      ["*.example.com.", "a.example.com."],
      ["EXAMPLE.COM.", "example.com."],
    ])("pattern %j matches host %j", (pattern, host) => {
      expect(compileHostPatterns([pattern]).match(host)).toBe(normalizeHostname(pattern));
    });

    it("the trailing dot does not let a name escape an exact pattern", () => {
      const matcher = compileHostPatterns(["example.com"]);
      expect(matcher.match("evilexample.com.")).toBeUndefined();
      expect(matcher.match("example.com.evil.net.")).toBeUndefined();
    });

    it("only one trailing dot is ignored", () => {
      expect(compileHostPatterns(["example.com"]).match("example.com..")).toBeUndefined();
    });
  });

  describe("regex metacharacters in patterns are literal", () => {
    it.each([
      ["a+b.test", "a+b.test", ["aab.test", "aaab.test", "ab.test", "b.test"]],
      ["(x).test", "(x).test", ["x.test", "(x)xtest"]],
      ["a.c", "a.c", ["abc", "a-c", "axc"]],
      ["[ab].test", "[ab].test", ["a.test", "b.test"]],
      ["a|b", "a|b", ["a", "b"]],
      ["a?b", "a?b", ["b", "ab"]],
      ["^a$", "^a$", ["a"]],
      ["a{2}", "a{2}", ["aa"]],
      ["a\\d", "a\\d", ["a1"]],
      ["a$.test", "a$.test", ["a.test"]],
      ["a-z.test", "a-z.test", ["a.test"]],
    ])("pattern %j matches only the literal %j", (pattern, literal, others) => {
      const matcher = compileHostPatterns([pattern]);
      expect(matcher.match(literal)).toBe(pattern);
      for (const other of others) expect(matcher.match(other)).toBeUndefined();
    });

    it.each([
      ["a+b.*", "a+b.x", ["aab.x", "ab.x"]],
      ["*.(x).test", "a.(x).test", ["a.x.test"]],
      ["*.a.c", "x.a.c", ["x.abc"]],
      ["[ab]*", "[ab]", ["a", "b", "ab"]],
      ["*|*", "a|b", ["a", "b"]],
      ["*.a?b", "x.a?b", ["x.b", "x.ab"]],
    ])("wildcard pattern %j matches %j but keeps its metacharacters literal", (pattern, host, others) => {
      const matcher = compileHostPatterns([pattern]);
      expect(matcher.match(host)).toBe(pattern);
      for (const other of others) expect(matcher.match(other)).toBeUndefined();
    });

    it.each(["(", ")", "[", "\\", "*(", "*[", "*\\", "(*", "a{*", "*+"])(
      "compiling %j, which is not a valid regular expression, does not throw",
      (pattern) => {
        expect(() => compileHostPatterns([pattern])).not.toThrow();
      },
    );
  });

  describe("a matcher with several patterns", () => {
    const matcher = compileHostPatterns(["example.com", "*.example.org", "API.Test."]);

    it.each([
      ["example.com", "example.com"],
      ["www.example.org", "*.example.org"],
      ["api.test", "api.test"],
      ["API.TEST.", "api.test"],
    ])("%j matches %j", (host, pattern) => {
      expect(matcher.match(host)).toBe(pattern);
    });

    it.each(["www.example.com", "example.org", "test", "api.test.evil"])("%j matches none of them", (host) => {
      expect(matcher.match(host)).toBeUndefined();
    });

    // The decision log names the most specific rule: an exact name, then wildcards in order, then "*".
    it.each([
      [["*.example.com", "a.example.com"], "a.example.com", "a.example.com"],
      [["*", "example.com"], "example.com", "example.com"],
      [["b*", "*"], "bb", "b*"],
      [["*", "*.test"], "a.test", "*.test"],
      [["*.test", "a*.test"], "ab.test", "*.test"],
    ])("patterns %j match %j with the most specific pattern, %j", (patterns, host, expected) => {
      expect(compileHostPatterns(patterns).match(host)).toBe(expected);
    });
  });

  it("compiling does not mutate the input array", () => {
    const input = ["Example.COM.", "*.Foo.test"];
    compileHostPatterns(input);
    expect(input).toEqual(["Example.COM.", "*.Foo.test"]);
  });
});

describe("globs with several stars", () => {
  it.each([
    ["a*b*c", "abc", true],
    ["a*b*c", "axxbyyc", true],
    ["a*b*c", "acb", false],
    ["a*b*c", "abcb", false],
    ["*.s3.*.amazonaws.com", "bucket.s3.eu-west-1.amazonaws.com", true],
    ["*.s3.*.amazonaws.com", "s3.eu-west-1.amazonaws.com", false],
    ["*ab*ab*", "abab", true],
    ["*ab*ab*", "aba", false],
    ["x*x", "x", false],
  ])("%j against %j matches: %s", (pattern, host, expected) => {
    expect(compileHostPatterns([pattern]).match(host) !== undefined).toBe(expected);
  });

  it("a long hostile hostname against a two-star pattern is answered (without backtracking)", () => {
    const hostile = `${"a.s3.".repeat(9000)}x`;
    expect(compileHostPatterns(["*.s3.*.amazonaws.com"]).match(hostile)).toBeUndefined();
  });
});
