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

describe("quoteShort: strings from hooks and upstreams in error messages", () => {
  it("quotes a short string whole, and only counts a long one, so no part of a value is shown", () => {
    expect(quoteShort("x-bad name")).toBe('"x-bad name"');
    expect(quoteShort("a".repeat(64))).toBe(`"${"a".repeat(64)}"`);
    expect(quoteShort(`Bearer ${"t".repeat(60)}`)).toBe("of 67 characters (not shown)");
  });
});
