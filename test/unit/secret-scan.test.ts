import { describe, expect, it } from "vitest";
import { decoders, eachView, findFirst, needle, NeedleSet, redactText } from "../../src/policy/secret-scan.js";

const VALUE = "S3cr3t V4lue_abc-XYZ.123";
const set = new NeedleSet([needle("T", VALUE)]);

function b64(text: string): string {
  return Buffer.from(text).toString("base64");
}

describe("the secret scan decodes, then searches", () => {
  it.each([
    ["as it is", VALUE, []],
    ["upper-case", VALUE.toUpperCase(), []],
    ["percent-encoded", encodeURIComponent(VALUE), ["percent"]],
    ["percent-encoded twice", encodeURIComponent(encodeURIComponent(VALUE)), ["percent", "percent"]],
    ["with + for space", VALUE.replaceAll(" ", "+"), ["plus"]],
    ["JSON-escaped", JSON.stringify(VALUE.replace(" ", "\t")).slice(1, -1).replace("\\t", "\\u0020"), ["json"]],
    ["base64, padded", b64(VALUE), ["base64"]],
    ["base64url, unpadded", Buffer.from(VALUE).toString("base64url"), ["base64"]],
    ["base64 at byte offset 1", b64(`x${VALUE}`), ["base64"]],
    ["base64 at byte offset 2", b64(`xy${VALUE}`), ["base64"]],
    ["base64 of the upper-cased value", b64(VALUE.toUpperCase()), ["base64"]],
    ["base64 after other base64 characters (a path)", `/echo/prefix${b64(VALUE)}`, ["base64"]],
    ["base64, then percent-encoded", encodeURIComponent(b64(`ab${VALUE}`)), ["percent", "base64"]],
    ["base64 twice", b64(b64(VALUE)), ["base64", "base64"]],
    ["base64, then percent-encoded twice (three deep)", encodeURIComponent(encodeURIComponent(b64(`ab${VALUE}`))), ["percent", "percent", "base64"]],
    ["lower-case hex", Buffer.from(VALUE).toString("hex"), ["hex"]],
    ["upper-case hex at an odd offset", `a${Buffer.from(VALUE).toString("hex").toUpperCase()}`, ["hex"]],
  ])("finds the value %s", (_what, text, via) => {
    const match = findFirst(`before/${text}&after`, set);
    expect(match?.needle.name).toBe("T");
    expect(match?.via).toEqual(via);
  });

  it.each([
    ["another value", "S3cr3t V4lue_abc-XYZ.124"],
    ["a cut of the value", VALUE.slice(1)],
    ["the base64 of a cut", b64(VALUE.slice(2))],
    ["a presigned URL", `X-Amz-Signature=${"9f2c".repeat(16)}&X-Amz-Credential=AKIA%2F20240101%2Fus-east-1`],
  ])("does not find it in %s", (_what, text) => {
    expect(findFirst(text, set)).toBeUndefined();
  });

  it("finds a non-ASCII value as characters and as its UTF-8 bytes, percent-encoded or base64", () => {
    const s = new NeedleSet([needle("U", "pässwörd-ünïcode")]);
    expect(findFirst("x pässwörd-ünïcode y", s)).toBeDefined();
    expect(findFirst(encodeURIComponent("pässwörd-ünïcode"), s)?.via).toEqual(["percent"]);
    expect(findFirst(b64("pässwörd-ünïcode"), s)?.via).toEqual(["base64"]);
  });

  it("maps a match back to the span of the original text it came from", () => {
    const text = `a=1&state=${encodeURIComponent(b64(`ab${VALUE}`))}&z=2`;
    const match = findFirst(text, set)!;
    const span = text.slice(match.start, match.end);
    expect(text.slice(0, match.start).startsWith("a=1&state=")).toBe(true);
    expect(span.length).toBeGreaterThan(VALUE.length);
    expect(text.slice(match.end)).toMatch(/&z=2$/);
  });

  it("every decoder leaves a text it cannot decode alone", () => {
    const view = { text: "plain words, nothing encoded", start: undefined, end: undefined, via: [] };
    for (const decoder of decoders) expect(decoder.decode(view, set.context), decoder.name).toEqual([]);
  });

  it("a text full of every encoding's characters makes a bounded number of views", () => {
    const nasty = `/${"%2B%41".repeat(40)}+${"ab12".repeat(60)}${"QUJD".repeat(60)}\\u0041${b64("%41%42+QUJD").repeat(10)}`;
    let views = 0;
    eachView(nasty, new NeedleSet([needle("S", "zz")]).context, () => {
      views++;
      return false;
    });
    expect(views).toBeGreaterThan(5);
    // 1 + 9 + 9² + 9³ would be the bound without the text check; noise is not decoded again.
    expect(views).toBeLessThan(400);
  });
});

describe("redactText", () => {
  const odd = new NeedleSet([needle("ODD", "p@ss word|x")]);

  it.each([
    ["the URL parser's path encoding", "/loop/p@ss%20word|x", "/loop/[REDACTED:ODD]"],
    ["a query with + for space", "?v=p%40ss+word%7Cx&n=1", "?v=[REDACTED:ODD]&n=1"],
    ["a value spanning a raw and a decoded part", "p@ss%20word%7cx!", "[REDACTED:ODD]!"],
    ["a JSON-escaped, percent-encoded log field", JSON.stringify({ target: "/a/p@ss%20word|x" }), '{"target":"/a/[REDACTED:ODD]"}'],
    ["a value in another letter case", "P@SS WORD|X", "[REDACTED:ODD]"],
    ["two copies", "p@ss word|x and p@ss%20word|x", "[REDACTED:ODD] and [REDACTED:ODD]"],
  ])("redacts %s in the original text", (_what, text, expected) => {
    expect(redactText(text, odd)).toBe(expected);
  });

  it("redacts base64 copies, cutting whole 4-character groups", () => {
    const text = `token=${b64(`user:${VALUE}`)};`;
    const out = redactText(text, set);
    expect(out).toMatch(/^token=.*\[REDACTED:T\].*;$/);
    expect(out).not.toContain(b64(VALUE).slice(4, 20));
  });

  it("leaves text without a value as it was", () => {
    const line = JSON.stringify({ msg: "request", target: "https://api.test/echo?x=%20", reason: 'host "api.test"' });
    expect(redactText(line, set)).toBe(line);
  });
});
