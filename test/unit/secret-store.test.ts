import { describe, expect, it } from "vitest";
import { parseCli, UsageError } from "../../src/cli/args.js";
import { createHttpHooks, declarativeConfigOf } from "../../src/hooks/http-hooks.js";
import { OptionError } from "../../src/option-error.js";
import type { EgressError } from "../../src/errors.js";
import { maxExpansion } from "../../src/policy/secret-scan.js";
import { SecretStore, type SecretOptions, type SecretRedirectOptions } from "../../src/policy/secrets.js";

function store(secrets: Record<string, SecretOptions>, defaults: SecretRedirectOptions = {}): SecretStore {
  return new SecretStore(secrets, false, (hosts) => hosts as string[], undefined, defaults);
}

const VALUE = "S3cr3t-V4lue_for.redirects";

function hop(to: string, headers: string[] = [], location = to): Parameters<SecretStore["checkRedirect"]>[0] {
  return { from: new URL("https://api.test/start"), url: new URL(to), location, headers };
}

function thrown(f: () => void): EgressError {
  try {
    f();
  } catch (error) {
    return error as EgressError;
  }
  throw new Error("expected a refusal");
}

describe("SecretStore.checkRedirect", () => {
  const secrets = store({ T: { hosts: ["api.test"], value: VALUE } });
  const sent = new Set(["T"]);

  it("refuses a hop whose headers carry the value in some encoding, naming the header", () => {
    const basic = `Basic ${Buffer.from(`user:${VALUE}`).toString("base64")}`;
    expect(() => secrets.checkRedirect(hop("https://other.test/x", ["X-Forwarded-Auth", basic]), sent)).toThrow(
      /header x-forwarded-auth carries the value of secret T to host "other\.test".*found base64-encoded in the header x-forwarded-auth/,
    );
  });

  it("refuses a hop whose host carries the value without naming the host", () => {
    const label = Buffer.from(VALUE).toString("hex");
    let message = "";
    try {
      secrets.checkRedirect(hop(`https://${label}.other.test/`), sent);
    } catch (error) {
      message = (error as Error).message;
    }
    expect(message).toMatch(/carries the value of secret T to a host outside its hosts; it was found hex-encoded in the host/);
    expect(message).not.toContain(label);
  });

  it("scans the Location as sent, where the URL parser would have lowercased a base64 host label, and never names that host", () => {
    const label = Buffer.from(VALUE).toString("base64url");
    const to = `https://${label}.other.test/`;
    const error = thrown(() => secrets.checkRedirect(hop(to.toLowerCase(), [], to), sent));
    expect(error.message).toMatch(/found base64-encoded in the Location header/);
    // Lowercased base64 is no longer a copy redaction can see, but it gives most of the value away.
    expect(error.message).not.toContain(label.toLowerCase());
    expect(error.message).not.toContain("other.test");
    // Nor does a copy in the path make the host nameable while the host holds one too.
    const both = `https://${label}.other.test/${VALUE}`;
    const second = thrown(() => secrets.checkRedirect(hop(both.toLowerCase(), [], both), sent));
    expect(second.message).toMatch(/carries the value of secret T to a host outside its hosts/);
    expect(second.message).not.toContain(label.toLowerCase());
  });

  it('in "refuse" mode, neither the message nor the log detail names a host that holds a copy', () => {
    const strict = store({ T: { hosts: ["api.test"], value: VALUE, secretRedirects: "refuse" } });
    const label = Buffer.from(VALUE).toString("base64url");
    const to = `https://${label}.other.test/`;
    const error = thrown(() => strict.checkRedirect(hop(to.toLowerCase(), [], to), sent));
    expect(error.message).toMatch(/secretRedirects "refuse"/);
    expect(`${error.message} ${error.detail ?? ""}`).not.toContain(label.toLowerCase());
    // A host with no copy is named in the detail, for the operator's followRedirectsTo.
    expect(thrown(() => strict.checkRedirect(hop("https://cdn.other.test/blob"), sent)).detail).toBe('redirect to host "cdn.other.test"');
  });

  it('in "refuse" mode a hop to plain http:// is refused even to its own hosts, naming the host only when it holds no copy', () => {
    const strict = store({ T: { hosts: ["*.api.test"], value: VALUE, secretRedirects: "refuse", followRedirectsTo: ["*.test"] } });
    const clean = thrown(() => strict.checkRedirect(hop("http://api.test/blob"), sent));
    expect(clean.message).toMatch(/plain http:\/\/ .*secretRedirects "refuse"/);
    expect(clean.detail).toBe('redirect over plain http:// to host "api.test"');
    const label = Buffer.from(VALUE).toString("base64url");
    const to = `http://${label}.api.test/`;
    const copy = thrown(() => strict.checkRedirect(hop(to.toLowerCase(), [], to), sent));
    expect(`${copy.message} ${copy.detail ?? ""}`).not.toContain(label.toLowerCase());
  });

  it("never quotes the host the redirect came from: an earlier hop's host may hold a lowercased copy", () => {
    const wild = store({ T: { hosts: ["*.api.test"], value: VALUE } });
    const label = Buffer.from(VALUE).toString("base64url").toLowerCase();
    const from = new URL(`https://${label}.api.test/start`);
    const scanning = thrown(() => wild.checkRedirect({ from, url: new URL(`https://other.test/?v=${VALUE}`), location: `https://other.test/?v=${VALUE}`, headers: [] }, sent));
    const refusing = store({ T: { hosts: ["*.api.test"], value: VALUE, secretRedirects: "refuse" } });
    const refused = thrown(() => refusing.checkRedirect({ from, url: new URL("https://other.test/x"), location: "https://other.test/x", headers: [] }, sent));
    for (const error of [scanning, refused]) expect(`${error.message} ${error.detail ?? ""}`).not.toContain(label);
  });

  it("refuses a hop too complex to scan within its budget", () => {
    // Every view of this text decodes to text again, so the views multiply at each depth.
    const piece = (k: number): string => {
      const text = Array.from({ length: 60 }, (_, i) => "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789%+-_"[(i * 7 + k) % 66]).join("") + "%41%2541+";
      const b64 = (t: string): string => Buffer.from(t).toString("base64");
      return [b64(text), "x" + b64(text), "xy" + b64(text), "xyz" + b64(text), Buffer.from(text).toString("hex"), encodeURIComponent(text), text.replaceAll("%", "+")].join("~");
    };
    const path = Array.from({ length: 40 }, (_, k) => piece(k)).join("~");
    expect(() => secrets.checkRedirect(hop(`https://other.test/${path}`), sent)).toThrow(/too complex to scan for secrets/);
  });

  it("refuses a copy sent back to the secret's own host over plain http://", () => {
    expect(() => secrets.checkRedirect(hop(`http://api.test/?v=${VALUE.toUpperCase()}`), sent)).toThrow(/over plain http:\/\//);
  });

  it("lets a hop through when it stays in the secret's hosts, when the secret was not sent, or when it holds no copy", () => {
    expect(() => secrets.checkRedirect(hop(`https://api.test/?v=${VALUE}`), sent)).not.toThrow();
    expect(() => secrets.checkRedirect(hop(`https://other.test/?v=${VALUE}`), new Set())).not.toThrow();
    expect(() => secrets.checkRedirect(hop("https://cdn.other.test/blob?sig=0123abcd"), sent)).not.toThrow();
  });

  it('in "refuse" mode refuses any hop out of the secret\'s hosts, except to followRedirectsTo', () => {
    const strict = store({ T: { hosts: ["api.test"], value: VALUE, secretRedirects: "refuse", followRedirectsTo: ["*.cdn.test"] } });
    expect(() => strict.checkRedirect(hop("https://other.test/blob"), sent)).toThrow(/secretRedirects "refuse"/);
    expect(() => strict.checkRedirect(hop("https://objects.cdn.test/blob"), sent)).not.toThrow();
    expect(() => strict.checkRedirect(hop(`https://objects.cdn.test/${VALUE}`), sent)).toThrow(/carries the value of secret T/);
    expect(() => strict.checkRedirect(hop("https://api.test/again"), sent)).not.toThrow();
  });
});

describe("SecretStore.checkRedirectHost", () => {
  const VALUE_IN_HOST = "Tok3nValue-4f9a2c71Qz";
  const wide = store({ T: { hosts: ["api.test", "*.api.test"], value: VALUE_IN_HOST } });
  const b64 = Buffer.from(VALUE_IN_HOST).toString("base64url");
  const lower = (location: string): string => new URL(location).href;

  // The Location as the upstream wrote it, and what the parser made of its host.
  it.each([
    ["base64 in its own letter case", `https://${b64}.api.test/x`],
    ["base64 behind a userinfo that repeats the host lowercased", `https://${b64.toLowerCase()}.api.test:${b64.toLowerCase()}.api.test@${b64}.api.test/x`],
    ["base64, percent-encoded", `https://${[...Buffer.from(b64)].map((c) => `%${c.toString(16)}`).join("")}.api.test/x`],
    ["base64, with a tab the parser drops", `https://${b64.slice(0, 9)}\t${b64.slice(9)}.api.test/x`],
    ["hex", `https://${Buffer.from(VALUE_IN_HOST).toString("hex").toUpperCase()}.api.test/x`],
    ["as it is", `https://${VALUE_IN_HOST}.api.test/x`],
  ])("refuses a hop to a host in the secret's own hosts whose name holds the value: %s", (_name, location) => {
    const error = thrown(() => wide.checkRedirectHost(hop(lower(location), [], location)));
    expect(error.status).toBe(403);
    expect(error.message).toMatch(/^a redirect's host name carries the value of secret T \(found .*\); a host name leaves in the clear/);
    expect(error.message.toLowerCase()).not.toContain(b64.toLowerCase().slice(0, 12));
  });

  it("passes a host that holds nothing of the value, and the value in the path or query", () => {
    expect(() => wide.checkRedirectHost(hop("https://cdn.api.test/x", [], "https://CDN.api.test/x"))).not.toThrow();
    expect(() => wide.checkRedirectHost(hop(lower(`https://cdn.api.test/${b64}?s=${b64}`), [], `https://cdn.api.test/${b64}?s=${b64}`))).not.toThrow();
  });
});

describe("SecretStore substitution", () => {
  it("substitutes a value holding $&, $', $` and $$ as written", () => {
    const value = "a$&b$'c$`d$$e";
    const secrets = new SecretStore({ T: { hosts: ["api.test"], value } }, false, (hosts) => hosts as string[]);
    const placeholder = secrets.env()["T"]!;
    const out = secrets.apply({ url: new URL("https://api.test/"), headers: ["x-token", `[${placeholder}]`] }, "api.test");
    expect(out?.headers).toEqual(["x-token", `[${value}]`]);
  });

  it("reports the names of the secrets it substituted", () => {
    const secrets = new SecretStore(
      { A: { hosts: ["api.test"], value: "value-a-123" }, B: { hosts: ["api.test"], value: "value-b-456" } },
      false,
      (hosts) => hosts as string[],
    );
    const substituted = new Set<string>();
    secrets.apply({ url: new URL("https://api.test/"), headers: ["authorization", `Bearer ${secrets.env()["B"]!}`] }, "api.test", substituted);
    expect([...substituted]).toEqual(["B"]);
  });
});

// A header holds bytes, one Latin-1 character each; a value went in as its JavaScript string
// (black-box finding, sixth session).
describe("SecretStore: a value outside ASCII", () => {
  const value = "pässwörd-€-🔑";
  const wire = Buffer.from(value, "utf8").toString("latin1");

  it("goes into a header as its UTF-8 bytes, into Basic credentials as UTF-8, and into the query percent-encoded", () => {
    const secrets = new SecretStore({ T: { hosts: ["api.test"], value } }, true, (hosts) => hosts as string[]);
    const placeholder = secrets.env()["T"]!;
    const out = secrets.apply(
      { url: new URL(`https://api.test/?k=${placeholder}`), headers: ["x-k", `<${placeholder}>`, "authorization", `Basic ${Buffer.from(`u:${placeholder}`).toString("base64")}`] },
      "api.test",
    );
    expect(out?.headers[1]).toBe(`<${wire}>`);
    expect(Buffer.from(out!.headers[3]!.slice(6), "base64").toString("utf8")).toBe(`u:${value}`);
    expect(out?.url.search).toBe(`?k=${encodeURIComponent(value)}`);
  });

  it("is refused to another host as text or as a header's bytes, and after a rotation in either form", () => {
    const secrets = store({ T: { hosts: ["api.test"], value } });
    const to = (text: string): (() => unknown) => () => secrets.apply({ url: new URL("https://other.test/"), headers: ["x-k", text] }, "other.test");
    expect(thrown(to(wire)).message).toContain("carries the value of secret T");
    expect(thrown(to(value)).message).toContain("carries the value of secret T");
    secrets.update("T", { value: "next-value-1234" });
    expect(thrown(to(wire)).message).toContain("retired value of secret T");
  });

  it("is redacted, and turned back into its placeholder for a decider, in a header's bytes and in a Node echo of them", () => {
    const secrets = store({ T: { hosts: ["api.test"], value } });
    const placeholder = secrets.env()["T"]!;
    const twice = Buffer.from(Buffer.from(wire, "utf8").toString("base64"), "base64").toString("latin1");
    for (const text of [value, wire, twice, Buffer.from(wire, "utf8").toString("base64")]) expect(secrets.redact(`x ${text} y`)).toBe("x [REDACTED:T] y");
    expect(secrets.placeholdersFor(`Bearer ${wire}`, "x-k")).toBe(`Bearer ${placeholder}`);
    expect(secrets.placeholdersFor(`Basic ${Buffer.from(`u:${value}`).toString("base64")}`, "authorization")).toBe(`Basic ${Buffer.from(`u:${placeholder}`).toString("base64")}`);
  });
});

// A 60 KB head repeating one placeholder became a 15 MB head with a 16 KiB value, built for each
// request: 30 such requests on one connection took 700 MB (black-box finding).
describe("SecretStore: the substituted head is bounded", () => {
  const value = "v".repeat(16 * 1024);
  const secrets = new SecretStore({ T: { hosts: ["api.test"], value } }, true, (hosts) => hosts as string[]);
  const placeholder = secrets.env()["T"]!;
  const url = new URL("https://api.test/");
  const basic = (n: number): string => `Basic ${Buffer.from(`user:${placeholder.repeat(n)}`).toString("base64")}`;
  const cases: { name: string; headers: string[]; url?: URL; fits: boolean }[] = [
    { name: "one header, 900 placeholders (a 60 KB head)", headers: ["x-key", placeholder.repeat(900)], fits: false },
    { name: "one header, 7 placeholders (112 KiB)", headers: ["x-key", placeholder.repeat(7)], fits: true },
    { name: "one header, 8 placeholders (128 KiB and more)", headers: ["x-key", placeholder.repeat(8)], fits: false },
    { name: "8 headers of one placeholder each", headers: Array.from({ length: 8 }, (_, i) => [`x-key-${i}`, placeholder]).flat(), fits: false },
    { name: "a 60 KB head of other fields and one placeholder", headers: ["x-pad", "p".repeat(60_000), "x-key", placeholder], fits: true },
    { name: "Basic credentials, 900 placeholders", headers: ["authorization", basic(900)], fits: false },
    { name: "Basic credentials, 1 placeholder", headers: ["authorization", basic(1)], fits: true },
    { name: "a query of 900 placeholders (replaceSecretsInQuery)", headers: [], url: new URL(`https://api.test/?k=${placeholder.repeat(900)}`), fits: false },
    { name: "a query of one placeholder", headers: [], url: new URL(`https://api.test/?k=${placeholder}`), fits: true },
    // A head large by itself (a hook's header) is not substitution's doing: only what grows is refused.
    { name: "a 200 KB header with no placeholder, then one placeholder", headers: ["x-big", "b".repeat(200_000), "x-key", placeholder], fits: false },
  ];
  it("a head over 128 KiB with no placeholder in it is left alone", () => {
    expect(secrets.apply({ url, headers: ["x-big", "b".repeat(200_000)] }, "api.test")).toBeUndefined();
  });
  it.each(cases)("$name: fits $fits", ({ headers, url: target, fits }) => {
    const apply = (): unknown => secrets.apply({ url: target ?? url, headers }, "api.test");
    if (fits) {
      const out = secrets.apply({ url: target ?? url, headers }, "api.test");
      // Substituted: the placeholder is gone and the value's 16 KiB are in the head (base64 in Basic credentials).
      const sent = out === undefined ? "" : [...out.headers, out.url.href].join("\n");
      expect(sent).not.toContain(placeholder);
      expect(sent.length).toBeGreaterThan(value.length);
      return;
    }
    const error = thrown(apply);
    expect(error.status).toBe(431);
    expect(error.code).toBe("EG_HEADERS_TOO_LARGE");
    expect(error.message).toMatch(/larger than 131072 bytes once its secrets are substituted/);
    expect(error.message).not.toContain(value.slice(0, 32));
  });
});

// Each character of a value was spread into the scanner's tables: 1 MB took 7 s to start, and
// 133 MB aborted the process (black-box finding). No header field takes more than 16 KiB.
describe("SecretStore: a value's length", () => {
  it("a value of 16 KiB is taken; one byte more, at start or in an update, is refused without quoting it", () => {
    const longest = "v".repeat(16 * 1024 - 2) + "é";
    const secrets = store({ T: { hosts: ["api.test"], value: longest } });
    const tooLong = `${longest}w`;
    expect(() => store({ T: { hosts: ["api.test"], value: tooLong } })).toThrow(/^secrets\.T\.value: is longer than 16 KiB \(16384 bytes\)/);
    const update = thrown(() => secrets.update("T", { value: tooLong }));
    expect(update.message).toMatch(/is longer than 16 KiB/);
    expect(update.message).not.toContain("vvvv");
    expect(() => createHttpHooks({ allowedHosts: ["api.test"], secrets: { T: { hosts: ["api.test"], value: "x".repeat(1_000_000) } } })).toThrow(/secrets\.T\.value is longer than 16 KiB/);
  });

  // createHttpHooks checked every other fault of a value itself, but left the length to the store,
  // whose plain TypeError had no code and no path (carried-defect session).
  it("createHttpHooks refuses a value over 16 KiB with an OptionError naming the path, never quoted", () => {
    const error = thrown(() => createHttpHooks({ allowedHosts: ["api.test"], secrets: { T: { hosts: ["api.test"], value: "ghp_".padEnd(16 * 1024 + 1, "v") } } }));
    expect(error).toBeInstanceOf(OptionError);
    expect(error).toMatchObject({ code: "EG_INVALID_OPTION", path: "secrets.T.value" });
    expect(error.message).toMatch(/^createHttpHooks: secrets\.T\.value is longer than 16 KiB \(16384 bytes\)/);
    expect(error.message).not.toContain("ghp_");
  });
});

/**
 * `value` (which holds "ghp_before") is refused for `reason` (a message from its start) by
 * createHttpHooks, as an OptionError naming its path, by updateSecret, as a TypeError, and by the
 * store, each without quoting it; the secret refused an update keeps its value.
 */
function expectRefused(value: string, reason: RegExp): void {
  const error = thrown(() => createHttpHooks({ allowedHosts: ["api.test"], secrets: { T: { hosts: ["api.test"], value } } })) as unknown as OptionError;
  expect(error).toBeInstanceOf(OptionError);
  expect(error).toMatchObject({ code: "EG_INVALID_OPTION", path: "secrets.T.value" });
  expect(error.reason).toMatch(reason);
  expect(error.message).not.toContain("ghp_before");

  const { secretManager } = createHttpHooks({ allowedHosts: ["api.test"], secrets: { T: { hosts: ["api.test"], value: "ghp_current" } } });
  const update = thrown(() => secretManager.updateSecret("T", { value }));
  expect(update).toBeInstanceOf(TypeError);
  expect(update.message).toMatch(new RegExp(`^updateSecret: value: ${reason.source}`));
  expect(update.message).not.toContain("ghp_before");
  const secrets = store({ T: { hosts: ["api.test"], value: "ghp_current" } });
  expect(() => secrets.update("T", { value })).toThrow(reason);
  expect(secrets.apply({ url: new URL("https://api.test/"), headers: ["x-k", secrets.env()["T"]!] }, "api.test")?.headers).toEqual(["x-k", "ghp_current"]);
}

// A value goes only into header fields (DESIGN §4: never a body), and no field carries a control
// character other than tab: one with ESC or DEL was taken, then every request that used it was a
// 502 "invalid x-key header" behind an HTTP/1.1 upstream, and lost the field behind an HTTP/2 one.
describe("SecretStore: a value with a control character", () => {
  const controls = { "U+0001": "\x01", ESC: "\x1b", DEL: "\x7f", "U+001F": "\x1f" };

  it.each(Object.entries(controls))("one holding %s is refused by createHttpHooks (an OptionError naming the path) and updateSecret, never quoted", (_, control) => {
    expectRefused(`ghp_before${control}after`, /must not contain a control character other than tab/);
  });

  it("a tab, which a field value may carry, is taken", () => {
    expect(() => createHttpHooks({ allowedHosts: ["api.test"], secrets: { T: { hosts: ["api.test"], value: "a\tb" } } })).not.toThrow();
  });
});

// A value goes out as its UTF-8 bytes: U+FFFD (a decoder's stand-in for bytes that were not UTF-8)
// and a lone surrogate both went out as EF BF BD, and a byte order mark as three bytes before the
// value. env: and file: values were refused for these (thirteenth session); the API took them.
describe("SecretStore: a value that is not what would be sent", () => {
  const values = {
    "U+FFFD": ["p\uFFFDss-ghp_before", /must not contain U\+FFFD, the character a decoder puts in place of bytes that are not UTF-8/],
    "a lone high surrogate": ["ghp_before\uD83D", /must not contain a lone surrogate \(U\+D800 to U\+DFFF outside a pair\)/],
    "a lone low surrogate": ["ghp_before\uDC00x", /must not contain a lone surrogate/],
    "a byte order mark at its start": ["\uFEFFghp_before", /must not start with a byte order mark, U\+FEFF/],
  } as const;

  it.each(Object.entries(values))("one holding %s is refused by createHttpHooks (an OptionError naming the path) and updateSecret, never quoted", (_, [value, reason]) => {
    expectRefused(value, reason);
  });

  it("UTF-8 past ASCII, a surrogate pair and U+FEFF past the start are taken", () => {
    for (const value of ["pässwörd-€", "key-🔑", "a\uFEFFb"]) {
      expect(() => createHttpHooks({ allowedHosts: ["api.test"], secrets: { T: { hosts: ["api.test"], value } } })).not.toThrow();
    }
  });
});

describe("SecretStore: retired values", () => {
  // Every retired value is looked for in every request and log line: a token refreshed hourly
  // (a file: secret under --watch) would add one an hour for the life of the process.
  it("the last 64 of a secret are kept and refused; older ones are let go", () => {
    const secrets = store({ T: { hosts: ["api.test"], value: "value-number-0000" } });
    const values = Array.from({ length: 70 }, (_, i) => `value-number-${String(i).padStart(4, "0")}`);
    for (const value of values.slice(1)) secrets.update("T", { value });
    const to = (value: string): (() => unknown) => () => secrets.apply({ url: new URL("https://other.test/"), headers: ["x-old", value] }, "other.test");
    // values[69] is current; values[5..68] are the 64 retired ones.
    expect(to(values[4]!)).not.toThrow();
    expect(thrown(to(values[5]!)).message).toContain("retired value of secret T");
    expect(thrown(to(values[68]!)).message).toContain("retired value of secret T");
  });
});

describe("SecretStore: a placeholder in the URL", () => {
  // Only headers (and, with replaceSecretsInQuery, the query) are substituted; a placeholder
  // anywhere in the URL to a host outside its secret's hosts is refused like one in a header.
  const secrets = store({ T: { hosts: ["api.test"], value: VALUE } });
  const placeholder = secrets.env()["T"]!;
  const encoded = placeholder.replace(/_/g, "%5F");
  it.each([
    ["the path", `https://other.test/x/${placeholder}`],
    ["the path, percent-encoded", `https://other.test/x/${encoded}`],
    ["the query", `https://other.test/?t=${placeholder}`],
    ["the query, percent-encoded", `https://other.test/?t=${encoded}`],
    ["the fragment", `https://other.test/#${placeholder}`],
    ["the userinfo", `https://${placeholder}:x@other.test/`],
    ["a label of the host (which the URL parser lowercases)", `https://${placeholder}.other.test/`],
  ])("refuses it in %s to another host, naming the secret", (_where, url) => {
    const hostname = new URL(url).hostname;
    const error = thrown(() => secrets.apply({ url: new URL(url), headers: [] }, hostname));
    expect(error.status).toBe(403);
    expect(error.message).toContain("the URL carries the placeholder of secret T");
  });

  it("leaves it alone in the URL of a request to the secret's own hosts (the path is never substituted)", () => {
    expect(secrets.apply({ url: new URL(`https://api.test/x/${placeholder}?t=${placeholder}`), headers: [] }, "api.test")).toBeUndefined();
    expect(secrets.apply({ url: new URL(`http://api.test/x/${placeholder}`), headers: [] }, "api.test")).toBeUndefined();
  });
});

describe("secretRedirects and followRedirectsTo options", () => {
  it("createHttpHooks takes them globally and per secret", () => {
    const { httpHooks } = createHttpHooks({
      secretRedirects: "refuse",
      followRedirectsTo: ["objects.githubusercontent.com"],
      secrets: { A: { hosts: ["api.test"], value: "a-value-1" }, B: { hosts: ["api.test"], value: "b-value-2", secretRedirects: "scan" } },
    });
    expect(declarativeConfigOf(httpHooks)?.secrets?.size).toBe(2);
  });

  it.each([
    [{ secretRedirects: "sometimes" }, /secretRedirects must be "scan" or "refuse" \(got "sometimes"\)/],
    [{ followRedirectsTo: ["a.test"] }, /followRedirectsTo only applies with secretRedirects: "refuse"/],
    [{ secretRedirects: "refuse", followRedirectsTo: ["https://a.test"] }, /followRedirectsTo\[0\]/],
    [{ secrets: { T: { hosts: ["a.test"], value: "v-123", followRedirectsTo: ["b.test"] } } }, /secrets\.T\.followRedirectsTo only applies with secretRedirects: "refuse"/],
    [{ secrets: { T: { hosts: ["a.test"], value: "v-123", secretRedirects: "no" } } }, /secrets\.T\.secretRedirects must be "scan" or "refuse"/],
  ])("%j is refused", (options, message) => {
    expect(() => createHttpHooks(options as Parameters<typeof createHttpHooks>[0])).toThrow(message);
  });

  it("the CLI takes --secret-redirects and --follow-redirects-to", () => {
    const command = parseCli(
      ["--allow-host", "api.test", "--host-secret", "T@api.test=v-123", "--secret-redirects", "refuse", "--follow-redirects-to", "cdn.test", "--follow-redirects-to", "*.cdn.test"],
      {},
    );
    expect(command.kind).toBe("serve");
    expect(() => parseCli(["--secret-redirects", "maybe"], {})).toThrow(UsageError);
    expect(() => parseCli(["--follow-redirects-to", "cdn.test"], {})).toThrow(/--follow-redirects-to: only applies with --secret-redirects refuse/);
    expect(() => parseCli(["--secret-redirects", "refuse", "--follow-redirects-to", "https://cdn.test"], {})).toThrow(/^--follow-redirects-to/);
  });
});

describe("SecretStore.reach", () => {
  // A value outside ASCII is looked for upper- and lower-cased too, and upper case can be longer
  // (`ΐ` is three code points upper-cased): a cut that keeps a match starting before it must
  // reach past the longest copy the scan recognises, or a copy across the cut is kept in part.
  it("covers the longest spelling the scan looks for, the upper-cased one included", () => {
    const value = "ΐΐΐΐ-ŉŉ-token";
    const longest = Math.max(...[value, value.toUpperCase(), value.toLowerCase()].map((v) => Buffer.byteLength(Buffer.from(v, "utf8").toString("latin1"))));
    expect(Buffer.byteLength(Buffer.from(value.toUpperCase(), "utf8").toString("latin1"))).toBe(longest);
    expect(store({ T: { hosts: ["api.test"], value } }).reach()).toBeGreaterThanOrEqual(maxExpansion * longest);
  });
});
