import { describe, expect, it } from "vitest";
import { quoteShort } from "../../src/errors.js";
import { consoleLineChars, consoleSandboxChars, consoleText } from "../../src/pipeline/djs-phases.js";
import { SecretStore } from "../../src/policy/secrets.js";

function store(value: string): SecretStore {
  return new SecretStore({ T: { hosts: ["api.test"], value } }, false, (hosts) => hosts as string[]);
}

// A policy's console line was cut to 8192 characters before the log redacted it: a value the cut
// went through lost its end, and what was left of it was logged (black-box finding).
describe("consoleText: a policy's console line is redacted, then cut", () => {
  const value = "S3cr3t-V4lue-0123456789abcdefghij";
  const secrets = store(value);
  const forms: Record<string, string> = {
    raw: value,
    base64: Buffer.from(value).toString("base64"),
    hex: Buffer.from(value).toString("hex"),
    "JSON \\u": [...value].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`).join(""),
  };
  for (const [name, form] of Object.entries(forms)) {
    it(`${name}: at every place the cut can go through the value, it is redacted whole and nothing of it is kept`, () => {
      for (let inside = 1; inside < form.length; inside++) {
        const pad = "x".repeat(consoleLineChars - inside);
        expect(consoleText(`${pad}${form} and more`, secrets), `${inside} characters inside`).toBe(`${pad}[REDACTED:T]`);
      }
    });
  }

  it("a line that ends before the cut is redacted and kept whole; without secrets a line is only cut", () => {
    expect(consoleText(`token ${value}.`, secrets)).toBe("token [REDACTED:T].");
    expect(consoleText("y".repeat(consoleLineChars + 5), undefined)).toBe("y".repeat(consoleLineChars));
    expect(consoleText("y".repeat(consoleLineChars + 5), store("z".repeat(20)))).toBe("y".repeat(consoleLineChars));
  });

  it("a line the sandbox cut, where a value's longest encoding could run past that cut, is not written", () => {
    const long = store("L".repeat(16 * 1024));
    expect(long.reach()).toBeGreaterThan(consoleSandboxChars - consoleLineChars);
    expect(consoleText("q".repeat(consoleSandboxChars), long)).toMatch(/^\[REDACTED:UNSCANNED\] \(a console line over 65536 characters, too long to redact\)$/);
    // A short value's encodings all fit between the two cuts: the line is redacted and cut as usual.
    expect(consoleText("q".repeat(consoleSandboxChars), secrets)).toBe("q".repeat(consoleLineChars));
  });
});

// The line was redacted with the calling guest's values before the cut; another guest's value the
// cut went through was left for the log's own pass over every guest, which came after the cut and
// no longer knew the value's first part (review finding).
describe("consoleText: a line the log cuts is redacted with every guest's values", () => {
  const own = store("own-guest-value-0123456789");
  const other = "other-guest-value-ABCDEFGHIJKLMNO"; // 33 bytes: base64 with no padding
  const neighbour = new SecretStore({ B: { hosts: ["b.test"], value: other } }, false, (hosts) => hosts as string[]);
  const forms: Record<string, string> = { raw: other, base64: Buffer.from(other).toString("base64"), hex: Buffer.from(other).toString("hex") };
  for (const [name, form] of Object.entries(forms)) {
    it(`${name}: another guest's value the cut goes through is redacted whole`, () => {
      for (let inside = 1; inside < form.length; inside++) {
        const pad = "x".repeat(consoleLineChars - inside);
        expect(consoleText(`${pad}${form} and more`, own, [undefined, neighbour]), `${inside} characters inside`).toBe(`${pad}[REDACTED:B]`);
      }
    });
  }

  it("with no secrets of its own, the neighbours' still count; a line kept whole is left to the log's pass", () => {
    const pad = "x".repeat(consoleLineChars - 5);
    expect(consoleText(`${pad}${other}`, undefined, [neighbour])).toBe(`${pad}[REDACTED:B]`);
    expect(consoleText(`short ${other}`, own, [neighbour])).toBe(`short ${other}`);
  });

  it("a neighbour's long value makes a line the sandbox cut too long to redact", () => {
    const long = new SecretStore({ L: { hosts: ["l.test"], value: "L".repeat(16 * 1024) } }, false, (hosts) => hosts as string[]);
    expect(consoleText("q".repeat(consoleSandboxChars), own, [long])).toMatch(/^\[REDACTED:UNSCANNED\] /);
  });
});

describe("quoteShort: strings from hooks and upstreams in error messages", () => {
  it("quotes a short string whole, and only counts a long one, so no part of a value is shown", () => {
    expect(quoteShort("x-bad name")).toBe('"x-bad name"');
    expect(quoteShort("a".repeat(64))).toBe(`"${"a".repeat(64)}"`);
    expect(quoteShort(`Bearer ${"t".repeat(60)}`)).toBe("of 67 characters (not shown)");
  });
});
