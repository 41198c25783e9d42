import { describe, expect, it } from "vitest";
import { FormIndex, type IndexedForm } from "../../src/policy/needle-index.js";
import { guestToken } from "../../src/proxy/auth.js";
import { GuestRedactor, type RedactedGuest } from "../../src/proxy/redactor.js";
import { SecretStore } from "../../src/policy/secrets.js";

const key = "k".repeat(40);

interface TestGuest extends RedactedGuest {
  readonly secrets: SecretStore;
  readonly value: string;
}

function store(name: string, value: string): SecretStore {
  return new SecretStore({ [name]: { hosts: ["api.test"], value } }, false, (hosts) => hosts as string[]);
}

/**
 * Guest i, with secret S<i>. Values of several lengths (so of several key lengths in the index),
 * each with a space and a quote, so that `+` for space and JSON escapes apply to it.
 */
function guest(i: number, value = `v${i} "${(i * 7919).toString(36)}"${"x".repeat((i % 5) * 20)}-${i}`): TestGuest {
  const name = `g${i}`;
  const secrets = store(`S${i}`, value);
  return { name, token: guestToken(key, name), policy: { config: { secrets } }, secrets, value };
}

function registry(guests: readonly RedactedGuest[], open = false): { open: boolean; all(): Iterable<RedactedGuest> } {
  return { open, all: () => guests };
}

const b64 = (text: string): string => Buffer.from(text).toString("base64");
const hex = (text: string): string => Buffer.from(text).toString("hex");

/** Every form a value was redacted in before the redactor was indexed: what the scan decodes. */
const valueForms: [string, (value: string) => string][] = [
  ["as it is", (v) => v],
  ["upper-case", (v) => v.toUpperCase()],
  ["percent-encoded", (v) => encodeURIComponent(v)],
  ["percent-encoded twice", (v) => encodeURIComponent(encodeURIComponent(v))],
  ["with + for space", (v) => v.replaceAll(" ", "+")],
  ["JSON-escaped", (v) => JSON.stringify(v).slice(1, -1)],
  ["JSON-escaped with \\u", (v) => JSON.stringify(v).slice(1, -1).replace(" ", "\\u0020")],
  ["base64", (v) => b64(v)],
  ["base64url at byte offset 1", (v) => Buffer.from(`x${v}`).toString("base64url")],
  ["base64 at byte offset 2, then percent-encoded", (v) => encodeURIComponent(b64(`xy${v}`))],
  ["hex", (v) => hex(v)],
  ["upper-case hex at an odd offset", (v) => `a${hex(v).toUpperCase()}`],
];

const tokenForms: [string, (g: RedactedGuest) => string][] = [
  ["bare", (g) => g.token],
  ["upper-case", (g) => g.token.toUpperCase()],
  ["in its Basic form", (g) => `Proxy-Authorization: Basic ${b64(`${g.name}:${g.token}`)}`],
  ["in its Basic form, lower-cased", (g) => b64(`${g.name}:${g.token}`).toLowerCase()],
];

describe("GuestRedactor with many guests", () => {
  const guests = Array.from({ length: 400 }, (_, i) => guest(i));
  const redactor = new GuestRedactor();
  redactor.update(registry(guests));

  it.each(valueForms)("redacts every guest's value %s, as the guest's own store does", (_what, form) => {
    for (const g of guests) {
      const text = `{"msg":"request","target":"https://api.test/before/${form(g.value)}&after"}`;
      const out = redactor.redact(text);
      expect(out, g.name).toBe(g.secrets.redact(text));
      expect(out, g.name).toContain(`[REDACTED:S${g.name.slice(1)}]`);
      expect(out, g.name).not.toContain(form(g.value));
    }
  });

  it.each(tokenForms)("redacts every guest's token %s", (_what, form) => {
    for (const g of guests) {
      const out = redactor.redact(`"error":"x ${form(g)} y"`);
      expect(out, g.name).toContain("[REDACTED:GUEST_TOKEN]");
      expect(out.toLowerCase(), g.name).not.toContain(g.token);
      expect(out.toLowerCase(), g.name).not.toContain(b64(`${g.name}:${g.token}`).toLowerCase());
    }
  });

  it("redacts many guests' values and tokens in one line, and leaves the rest of it as it was", () => {
    // A few a line: a line of 20 encoded values and tokens is already too complex to scan within
    // its budget (and is written as "[REDACTED:UNSCANNED]", as each guest's store alone did).
    for (let from = 0; from < guests.length; from += 4) {
      const some = guests.slice(from, from + 4);
      const parts = some.map((g, i) => `${i}:${valueForms[(from + i) % valueForms.length]![1](g.value)};${tokenForms[(from + i) % tokenForms.length]![1](g)}`);
      const out = redactor.redact(parts.join(" | "));
      for (const g of some) {
        expect(out).not.toContain(g.value);
        expect(out.toLowerCase()).not.toContain(g.token);
      }
      expect(out.split(" | ").map((part) => part.split(":")[0])).toEqual(some.map((_, i) => String(i)));
    }
    expect(redactor.redact("nothing to hide here: GET https://api.test/x 200")).toBe("nothing to hide here: GET https://api.test/x 200");
  });

  it("a guest added later is redacted from its update on; one removed is redacted while its store is held", () => {
    const local = new GuestRedactor();
    const late = guest(1000);
    local.update(registry(guests.slice(0, 10)));
    expect(local.redact(late.value)).toBe(late.value);
    local.update(registry([...guests.slice(0, 10), late]));
    expect(local.redact(late.value)).toBe(`[REDACTED:S1000]`);
    expect(local.redact(late.token)).toBe("[REDACTED:GUEST_TOKEN]");
    // Removed: a request of its still under way holds its store, so its values stay redacted.
    local.update(registry(guests.slice(0, 10)));
    expect(local.redact(b64(late.value))).toBe(`[REDACTED:S1000]`);
    // And back again.
    local.update(registry([...guests.slice(0, 10), late]));
    expect(local.redact(late.value)).toBe(`[REDACTED:S1000]`);
  });

  it("a rotated value is redacted, and so is the value it replaced; a deleted one too", () => {
    const local = new GuestRedactor();
    const mine = Array.from({ length: 50 }, (_, i) => guest(2000 + i));
    local.update(registry(mine));
    const target = mine[17]!;
    target.secrets.update("S2017", { value: "the-rotated-value-2017" });
    expect(local.redact("a the-rotated-value-2017 b")).toBe("a [REDACTED:S2017] b");
    expect(local.redact(`a ${encodeURIComponent(target.value)} b`)).toBe("a [REDACTED:S2017] b");
    mine[3]!.secrets.delete("S2003");
    expect(local.redact(hex(mine[3]!.value))).toBe("[REDACTED:S2003]");
  });

  it("a store two guests share is redacted once; an open proxy's single guest has no token to hide", () => {
    const shared = guest(3000);
    const twin: RedactedGuest = { name: "twin", token: guestToken(key, "twin"), policy: shared.policy };
    const local = new GuestRedactor();
    local.update(registry([shared, twin]));
    expect(local.redact(`${shared.value} ${twin.token}`)).toBe("[REDACTED:S3000] [REDACTED:GUEST_TOKEN]");
    // A proxy never turns open at a reload (it is refused), so a redactor that served it with credentials is not asked.
    const open = new GuestRedactor();
    open.update(registry([shared], true));
    expect(open.redact(`${shared.value} ${shared.token}`)).toBe(`[REDACTED:S3000] ${shared.token}`);
  });

  // Dropped with its guest, a token another guest's request carried was logged in clear.
  it("a removed guest's token stays redacted, in both forms, up to a bound on how many are kept; the oldest goes first", () => {
    const local = new GuestRedactor({ maxRetiredTokens: 2 });
    const mine = Array.from({ length: 5 }, (_, i) => guest(4000 + i));
    const hidden = (g: RedactedGuest): boolean =>
      local.redact(`${g.token.toUpperCase()} ${b64(`${g.name}:${g.token}`)}`) === "[REDACTED:GUEST_TOKEN] [REDACTED:GUEST_TOKEN]";
    local.update(registry(mine));
    // One removed at each update: g4000 first.
    for (let left = 4; left >= 0; left--) local.update(registry(mine.slice(5 - left)));
    expect(mine.map(hidden)).toEqual([false, false, false, true, true]);
    // A guest given a kept token's name again is current again: it no longer counts against the bound.
    local.update(registry([mine[3]!]));
    const other = guest(4100);
    local.update(registry([mine[3]!, other]));
    local.update(registry([mine[3]!]));
    expect([mine[3]!, mine[4]!, other].map(hidden)).toEqual([true, true, true]);
    // Back to the bound: the oldest kept (g4004) goes.
    local.update(registry([]));
    expect([mine[3]!, mine[4]!, other].map(hidden)).toEqual([true, false, true]);
  });
});

// Redacted one guest's store after another, a value that began with another guest's value lost
// only that part: "[REDACTED:A]" and the rest of it in clear, in the log and in error bodies.
describe("GuestRedactor: one guest's value inside another's", () => {
  const a = guest(1, "shared-start-0123456789");
  const b = guest(2, "shared-start-0123456789-and-the-rest-of-b");
  const c = guest(3, "prefix-of-c-then-shared-start-0123456789");

  it.each([
    ["a first", [a, b, c]],
    ["b first", [b, a, c]],
    ["c first", [c, b, a]],
  ])("redacts each value whole whichever guest comes first (%s)", (_order, order) => {
    const redactor = new GuestRedactor();
    redactor.update(registry(order));
    for (const g of [a, b, c]) {
      for (const [what, form] of [["as it is", (v: string) => v], ["base64", b64], ["percent-encoded base64", (v: string) => encodeURIComponent(b64(`:${v}`))]] as const) {
        const out = redactor.redact(`before ${form(g.value)} after`);
        expect(out, `${g.name} ${what}`).toMatch(/^before \[REDACTED:S\d\](=|%3D)* after$/);
      }
    }
  });
});

describe("FormIndex", () => {
  it("finds every occurrence of every string, of any length, as indexOf does, and none once it is removed", () => {
    let seed = 7;
    const random = (n: number): number => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) >>> 8) % n;
    const word = (length: number): string => Array.from({ length }, () => "abc"[random(3)]).join("");
    // Lengths 1 to 100 (every key length), from a three-letter alphabet: many share their start.
    const entries: IndexedForm<number>[] = Array.from({ length: 300 }, (_, i) => ({ form: word(1 + random(100)), value: i }));
    const index = new FormIndex<number>();
    for (const entry of entries) index.add(entry);
    const expected = (text: string, live: readonly IndexedForm<number>[]): string[] =>
      live.flatMap((e) => {
        const at: string[] = [];
        for (let i = text.indexOf(e.form); i >= 0; i = text.indexOf(e.form, i + 1)) at.push(`${e.value}@${i}`);
        return at;
      });
    const found = (text: string): string[] => {
      const out: string[] = [];
      index.find(text, (e, at) => {
        out.push(`${e.value}@${at}`);
        return false;
      });
      return out;
    };
    const texts = Array.from({ length: 20 }, () => word(random(400)));
    for (const text of [...texts, ...entries.slice(0, 20).map((e) => e.form)]) expect(found(text).sort()).toEqual(expected(text, entries).sort());
    for (const entry of entries.filter((e) => e.value % 2 === 0)) index.remove(entry);
    const left = entries.filter((e) => e.value % 2 === 1);
    expect(index.size).toBe(left.length);
    for (const text of texts) expect(found(text).sort()).toEqual(expected(text, left).sort());
    // A few left: searched one by one.
    for (const entry of left.slice(5)) index.remove(entry);
    for (const text of texts) expect(found(text).sort()).toEqual(expected(text, left.slice(0, 5)).sort());
  });
});
