import { describe, expect, it } from "vitest";
import { checkCidr } from "../../src/config/nodes.js";
import { cidrContains, cidrsOverlap, parseCidr, plainAddress } from "../../src/policy/cidr.js";
import { checkSourcesApart } from "../../src/proxy/options.js";

// Pure unit tests on address text: a socket reports an IPv4 guest on a dual-stack listener as
// `::ffff:a.b.c.d`, and plainAddress turns that into IPv4, so a range must be IPv4 to match it.

/** Does the range `text` hold the connection whose socket reports `remote`? */
function holds(text: string, remote: string): boolean {
  return cidrContains(parseCidr(text, "sources[0]"), plainAddress(remote)!);
}

describe("parseCidr", () => {
  it.each([
    { text: "10.88.0.2/32", family: 4, prefix: 32 },
    { text: "10.88.0.0/24", family: 4, prefix: 24 },
    { text: "127.0.0.6", family: 4, prefix: 32 },
    { text: "fd00::/64", family: 6, prefix: 64 },
    { text: "::1", family: 6, prefix: 128 },
  ])("$text is a family-$family range of prefix $prefix", ({ text, family, prefix }) => {
    expect(parseCidr(text, "sources[0]")).toMatchObject({ text, family, prefix });
  });

  it.each(["nope", "10.0.0.0/33", "fd00::/129", "10.0.0.0/-1", "10.0.0.0/"])("%j is refused with a TypeError naming the path", (text) => {
    expect(() => parseCidr(text, "guests.ci.sources[0]")).toThrow(TypeError);
    expect(() => parseCidr(text, "guests.ci.sources[0]")).toThrow(/^guests\.ci\.sources\[0\]: /);
  });
});

describe("an IPv4-mapped range (::ffff:a.b.c.d/N, N >= 96) is the IPv4 range a.b.c.d/(N-96)", () => {
  it.each([
    { text: "::ffff:127.0.0.6/128", same: "127.0.0.6/32" },
    { text: "::ffff:127.0.0.6", same: "127.0.0.6/32" },
    { text: "::ffff:127.0.0.0/104", same: "127.0.0.0/8" },
    { text: "::FFFF:127.0.0.6/128", same: "127.0.0.6/32" },
    { text: "::ffff:7f00:6/128", same: "127.0.0.6/32" },
    { text: "0:0:0:0:0:ffff:127.0.0.6/128", same: "127.0.0.6/32" },
    { text: "::ffff:127.0.0.6/96", same: "0.0.0.0/0" },
  ])("$text reads as $same, keeping its own spelling for messages", ({ text, same }) => {
    const { family, first, last, prefix } = parseCidr(same, "same");
    expect(parseCidr(text, "sources[0]")).toEqual({ text, family, first, last, prefix });
  });

  it.each([
    { text: "::ffff:127.0.0.6/128", remote: "127.0.0.6", holds: true },
    { text: "::ffff:127.0.0.6/128", remote: "::ffff:127.0.0.6", holds: true },
    { text: "::ffff:127.0.0.6/128", remote: "127.0.0.7", holds: false },
    { text: "::ffff:127.0.0.0/104", remote: "::ffff:127.0.0.9", holds: true },
    { text: "::ffff:127.0.0.0/104", remote: "128.0.0.1", holds: false },
    { text: "127.0.0.6/32", remote: "::ffff:127.0.0.6", holds: true },
  ])("$text holds a connection from $remote: $holds", ({ text, remote, holds: expected }) => {
    expect(holds(text, remote)).toBe(expected);
  });

  it("a mapped range and the IPv4 range it maps overlap, both ways round", () => {
    const mapped = parseCidr("::ffff:127.0.0.6/128", "a");
    const plain = parseCidr("127.0.0.0/29", "b");
    expect(cidrsOverlap(mapped, plain)).toBe(true);
    expect(cidrsOverlap(plain, mapped)).toBe(true);
    expect(cidrsOverlap(parseCidr("::ffff:127.0.0.0/104", "a"), parseCidr("127.0.0.6", "b"))).toBe(true);
    expect(cidrsOverlap(mapped, parseCidr("127.0.0.7/32", "b"))).toBe(false);
  });

  it("two guests, one with the mapped spelling and one with the IPv4 one, are refused as overlapping", () => {
    const guests = [
      { name: "x", sources: [parseCidr("::ffff:127.0.0.6/128", "x")] },
      { name: "y", sources: [parseCidr("127.0.0.6/32", "y")] },
    ];
    expect(() => checkSourcesApart(guests)).toThrow(/guests\.y\.sources overlaps guests\.x\.sources \(::ffff:127\.0\.0\.6\/128\) with "127\.0\.0\.6\/32"/);
  });

  // Under /96 a mapped range reaches past ::ffff:0:0/96 into IPv6 addresses, which no IPv4 range
  // can say: refused at parse time rather than half matched.
  it.each(["::ffff:127.0.0.0/95", "::ffff:127.0.0.6/64", "::ffff:0:0/80", "::ffff:127.0.0.6/0"])("%j (prefix under 96) is refused with a message that says why", (text) => {
    expect(() => parseCidr(text, "guests.ci.sources[0]")).toThrow(TypeError);
    expect(() => parseCidr(text, "guests.ci.sources[0]")).toThrow(/^guests\.ci\.sources\[0\]: .*IPv4-mapped.*prefix under 96/);
    // The config file's check (check-config) says the same, not just "not an address range".
    expect(checkCidr(text)).toMatch(/IPv4-mapped.*prefix under 96/);
  });

  it("an IPv6 range outside the mapped block stays IPv6 and never holds an IPv4 guest", () => {
    expect(parseCidr("::/0", "a").family).toBe(6);
    expect(holds("::/0", "::ffff:127.0.0.6")).toBe(false);
    expect(holds("::/0", "::1")).toBe(true);
    expect(cidrsOverlap(parseCidr("::/0", "a"), parseCidr("::ffff:127.0.0.6/128", "b"))).toBe(false);
  });
});

describe("checkCidr (the config file's check)", () => {
  it.each(["10.88.0.2/32", "fd00::/64", "::ffff:127.0.0.6/128", "::ffff:127.0.0.0/104"])("accepts %j", (text) => {
    expect(checkCidr(text)).toBeUndefined();
  });

  it.each(["nope", "10.0.0.0/33"])("refuses %j naming the value", (text) => {
    expect(checkCidr(text)).toContain(JSON.stringify(text));
  });
});
