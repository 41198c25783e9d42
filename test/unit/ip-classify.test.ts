import { isIPv6 } from "node:net";
import { describe, expect, it } from "vitest";
import { classifyIp, type IpCategory } from "../../src/policy/ip-classify.js";

// Pure unit tests: classifyIp works on address text that a resolver already produced, so none
// of these open a socket or do a lookup.

interface V4Row {
  readonly input: string;
  readonly category: IpCategory;
}

interface EmbeddedRow {
  readonly input: string;
  readonly embedded: string;
  readonly category: IpCategory;
}

function expectPlainV4(input: string, category: IpCategory): void {
  const result = classifyIp(input);
  expect(result).toEqual({
    ip: input,
    family: 4,
    category,
    internal: category !== "public",
    metadata: category === "metadata",
  });
  expect(result).not.toHaveProperty("embeddedIPv4");
}

function expectPlainV6(input: string, category: IpCategory): void {
  const result = classifyIp(input);
  expect(result.family).toBe(6);
  expect(result.category).toBe(category);
  expect(result.internal).toBe(category !== "public");
  expect(result.metadata).toBe(category === "metadata");
  expect(result).not.toHaveProperty("embeddedIPv4");
}

function expectEmbedded({ input, embedded, category }: EmbeddedRow): void {
  const result = classifyIp(input);
  expect(result.family).toBe(6);
  expect(result.embeddedIPv4).toBe(embedded);
  expect(result.category).toBe(category);
  expect(result.internal).toBe(category !== "public");
  expect(result.metadata).toBe(category === "metadata");
  // The embedded address is judged exactly as the bare IPv4 address would be.
  const bare = classifyIp(embedded);
  expect(result.category).toBe(bare.category);
  expect(result.internal).toBe(bare.internal);
  expect(result.metadata).toBe(bare.metadata);
}

describe("classifyIp: IPv4", () => {
  it.each<V4Row>([
    { input: "127.0.0.1", category: "loopback" },
    { input: "127.0.0.0", category: "loopback" },
    { input: "127.1.2.3", category: "loopback" },
    { input: "127.255.255.254", category: "loopback" },
    { input: "127.255.255.255", category: "loopback" },
  ])("$input is loopback and internal", ({ input, category }) => {
    expectPlainV4(input, category);
  });

  it.each<V4Row>([
    { input: "0.0.0.0", category: "unspecified" },
    { input: "0.0.0.1", category: "unspecified" },
    { input: "0.1.2.3", category: "unspecified" },
    { input: "0.255.255.255", category: "unspecified" },
  ])("$input in 0.0.0.0/8 is unspecified and internal", ({ input, category }) => {
    expectPlainV4(input, category);
  });

  it.each<V4Row>([
    { input: "10.0.0.0", category: "private" },
    { input: "10.0.0.1", category: "private" },
    { input: "10.255.255.255", category: "private" },
    { input: "172.16.0.0", category: "private" },
    { input: "172.20.10.5", category: "private" },
    { input: "172.31.255.255", category: "private" },
    { input: "192.168.0.0", category: "private" },
    { input: "192.168.1.1", category: "private" },
    { input: "192.168.255.255", category: "private" },
  ])("$input in RFC 1918 space is private and internal", ({ input, category }) => {
    expectPlainV4(input, category);
  });

  it.each<V4Row>([
    { input: "100.64.0.0", category: "cgnat" },
    { input: "100.64.0.1", category: "cgnat" },
    { input: "100.100.0.1", category: "cgnat" },
    { input: "100.127.255.255", category: "cgnat" },
  ])("$input in CGNAT 100.64.0.0/10 is cgnat and internal", ({ input, category }) => {
    expectPlainV4(input, category);
  });

  it.each<V4Row>([
    { input: "169.254.0.0", category: "link-local" },
    { input: "169.254.0.1", category: "link-local" },
    { input: "169.254.169.1", category: "link-local" },
    { input: "169.254.255.255", category: "link-local" },
  ])("$input in 169.254.0.0/16 is link-local and internal", ({ input, category }) => {
    expectPlainV4(input, category);
  });

  it.each<V4Row>([
    { input: "224.0.0.0", category: "multicast" },
    { input: "224.0.0.1", category: "multicast" },
    { input: "232.1.2.3", category: "multicast" },
    { input: "239.255.255.255", category: "multicast" },
  ])("$input in 224.0.0.0/4 is multicast and internal", ({ input, category }) => {
    expectPlainV4(input, category);
  });

  it("255.255.255.255 is the limited broadcast address and internal", () => {
    expectPlainV4("255.255.255.255", "broadcast");
  });

  it.each<V4Row>([
    { input: "240.0.0.0", category: "reserved" },
    { input: "240.0.0.1", category: "reserved" },
    { input: "250.1.2.3", category: "reserved" },
    { input: "255.255.255.254", category: "reserved" },
    { input: "192.0.0.0", category: "reserved" },
    { input: "192.0.0.8", category: "reserved" },
    { input: "192.0.0.255", category: "reserved" },
    { input: "192.0.2.0", category: "reserved" },
    { input: "192.0.2.1", category: "reserved" },
    { input: "192.0.2.255", category: "reserved" },
    { input: "198.51.100.1", category: "reserved" },
    { input: "198.51.100.255", category: "reserved" },
    { input: "203.0.113.0", category: "reserved" },
    { input: "203.0.113.1", category: "reserved" },
    { input: "198.18.0.0", category: "reserved" },
    { input: "198.18.0.1", category: "reserved" },
    { input: "198.19.255.255", category: "reserved" },
    { input: "192.88.99.1", category: "reserved" },
  ])("$input in reserved, TEST-NET or benchmarking space is reserved and internal", ({ input, category }) => {
    expectPlainV4(input, category);
  });

  it.each<V4Row>([
    { input: "169.254.169.254", category: "metadata" },
    { input: "169.254.170.2", category: "metadata" },
    { input: "169.254.169.253", category: "metadata" },
    { input: "100.100.100.200", category: "metadata" },
    { input: "192.0.0.192", category: "metadata" },
  ])("$input is a cloud metadata address: metadata, internal and not merely link-local or cgnat", ({ input, category }) => {
    expectPlainV4(input, category);
  });

  it.each<V4Row>([
    { input: "8.8.8.8", category: "public" },
    { input: "1.1.1.1", category: "public" },
    { input: "9.255.255.255", category: "public" },
    { input: "11.0.0.0", category: "public" },
    { input: "172.15.255.255", category: "public" },
    { input: "172.32.0.0", category: "public" },
    { input: "192.167.255.255", category: "public" },
    { input: "192.169.0.0", category: "public" },
    { input: "100.63.255.255", category: "public" },
    { input: "100.128.0.0", category: "public" },
    { input: "126.255.255.255", category: "public" },
    { input: "128.0.0.0", category: "public" },
    { input: "169.253.255.255", category: "public" },
    { input: "169.255.0.0", category: "public" },
    { input: "192.0.1.0", category: "public" },
    { input: "192.0.3.0", category: "public" },
    { input: "198.17.255.255", category: "public" },
    { input: "198.20.0.0", category: "public" },
    { input: "198.51.99.255", category: "public" },
    { input: "198.51.101.0", category: "public" },
    { input: "203.0.112.255", category: "public" },
    { input: "203.0.114.0", category: "public" },
    { input: "223.255.255.255", category: "public" },
    { input: "1.0.0.0", category: "public" },
  ])("$input is public and not internal", ({ input, category }) => {
    expectPlainV4(input, category);
  });
});

describe("classifyIp: IPv6", () => {
  it.each(["::", "0:0:0:0:0:0:0:0", "0000:0000:0000:0000:0000:0000:0000:0000", "[::]"])(
    "%s is the unspecified address and internal",
    (input) => {
      expectPlainV6(input, "unspecified");
    },
  );

  it.each(["::1", "0:0:0:0:0:0:0:1", "0000:0000:0000:0000:0000:0000:0000:0001", "[::1]"])(
    "%s is loopback and internal",
    (input) => {
      expectPlainV6(input, "loopback");
    },
  );

  it.each(["fc00::", "fc00::1", "fd00::1", "fd12:3456:789a::1", "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"])(
    "%s in fc00::/7 is unique-local and internal",
    (input) => {
      expectPlainV6(input, "unique-local");
    },
  );

  it.each(["fe80::", "fe80::1", "fe80::1%eth0", "fe80::1%25eth0", "[fe80::1%eth0]", "FE80::1", "febf:ffff::1"])(
    "%s in fe80::/10 is link-local and internal",
    (input) => {
      expectPlainV6(input, "link-local");
    },
  );

  it("a zone index does not survive into the canonical ip", () => {
    expect(classifyIp("fe80::1%eth0").ip).toBe(classifyIp("fe80::1").ip);
  });

  it.each(["ff02::1", "ff00::", "ff05::1:3", "ff0e::101", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"])(
    "%s in ff00::/8 is multicast and internal",
    (input) => {
      expectPlainV6(input, "multicast");
    },
  );

  it.each([
    "2001:db8::",
    "2001:db8::1",
    "2001:0db8:85a3::8a2e:370:7334",
    "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff",
    "3fff::1",
    "fec0::1",
    "100::1",
    "fbff::1",
    "4000::1",
  ])("%s in documentation, site-local or unassigned space is reserved and internal", (input) => {
    expectPlainV6(input, "reserved");
  });

  it.each(["fd00:ec2::254", "FD00:EC2::254", "fd00:0ec2:0000:0000:0000:0000:0000:0254", "[fd00:ec2::254]"])(
    "%s is AWS's IPv6 metadata address in any spelling: metadata and internal",
    (input) => {
      expectPlainV6(input, "metadata");
    },
  );

  it("a neighbour of the IPv6 metadata address is unique-local but not metadata", () => {
    expectPlainV6("fd00:ec2::255", "unique-local");
  });

  it.each(["2606:4700::1111", "2606:4700:4700::1111", "2001:4860:4860::8888", "2a00:1450:4001:80b::200e", "2001:db7::1", "2001:db9::1"])(
    "%s is global unicast, public and not internal",
    (input) => {
      expectPlainV6(input, "public");
    },
  );
});

describe("classifyIp: IPv6 forms that embed IPv4 are judged by the IPv4 inside", () => {
  it.each<EmbeddedRow>([
    { input: "::ffff:127.0.0.1", embedded: "127.0.0.1", category: "loopback" },
    { input: "::ffff:7f00:1", embedded: "127.0.0.1", category: "loopback" },
    { input: "[::ffff:7f00:1]", embedded: "127.0.0.1", category: "loopback" },
    { input: "::FFFF:7F00:0001", embedded: "127.0.0.1", category: "loopback" },
    { input: "0:0:0:0:0:ffff:127.0.0.1", embedded: "127.0.0.1", category: "loopback" },
    { input: "::ffff:10.0.0.1", embedded: "10.0.0.1", category: "private" },
    { input: "::ffff:c0a8:101", embedded: "192.168.1.1", category: "private" },
    { input: "::ffff:100.64.0.1", embedded: "100.64.0.1", category: "cgnat" },
    { input: "::ffff:0.0.0.0", embedded: "0.0.0.0", category: "unspecified" },
    { input: "::ffff:255.255.255.255", embedded: "255.255.255.255", category: "broadcast" },
    { input: "::ffff:169.254.169.254", embedded: "169.254.169.254", category: "metadata" },
    { input: "::ffff:8.8.8.8", embedded: "8.8.8.8", category: "public" },
  ])("IPv4-mapped $input is judged as $embedded", (row) => {
    expectEmbedded(row);
  });

  it.each<EmbeddedRow>([
    { input: "::127.0.0.1", embedded: "127.0.0.1", category: "loopback" },
    { input: "::7f00:1", embedded: "127.0.0.1", category: "loopback" },
    { input: "::10.1.2.3", embedded: "10.1.2.3", category: "private" },
    { input: "::169.254.169.254", embedded: "169.254.169.254", category: "metadata" },
    { input: "::8.8.8.8", embedded: "8.8.8.8", category: "public" },
  ])("IPv4-compatible $input is judged as $embedded", (row) => {
    expectEmbedded(row);
  });

  it.each<EmbeddedRow>([
    { input: "64:ff9b::7f00:1", embedded: "127.0.0.1", category: "loopback" },
    { input: "64:ff9b::127.0.0.1", embedded: "127.0.0.1", category: "loopback" },
    { input: "64:ff9b::c0a8:1", embedded: "192.168.0.1", category: "private" },
    { input: "64:ff9b::a9fe:a9fe", embedded: "169.254.169.254", category: "metadata" },
    { input: "64:ff9b::808:808", embedded: "8.8.8.8", category: "public" },
  ])("NAT64 $input is judged as $embedded", (row) => {
    expectEmbedded(row);
  });

  it.each<EmbeddedRow>([
    { input: "2002:7f00:1::1", embedded: "127.0.0.1", category: "loopback" },
    { input: "2002:a00:1::1", embedded: "10.0.0.1", category: "private" },
    { input: "2002:c0a8:101:1:2:3:4:5", embedded: "192.168.1.1", category: "private" },
    { input: "2002:a9fe:a9fe::", embedded: "169.254.169.254", category: "metadata" },
    { input: "2002:808:808::1", embedded: "8.8.8.8", category: "public" },
  ])("6to4 $input is judged as $embedded", (row) => {
    expectEmbedded(row);
  });

  it.each<EmbeddedRow>([
    // The client address is the last 32 bits, bit-inverted: ~0x80fffffe === 0x7f000001.
    { input: "2001:0:4136:e378:8000:63bf:80ff:fffe", embedded: "127.0.0.1", category: "loopback" },
    { input: "2001:0:4136:e378:8000:63bf:f5ff:fffe", embedded: "10.0.0.1", category: "private" },
    { input: "2001:0:4136:e378:8000:63bf:5601:5601", embedded: "169.254.169.254", category: "metadata" },
    { input: "2001:0:4136:e378:8000:63bf:f7f7:f7f7", embedded: "8.8.8.8", category: "public" },
  ])("Teredo $input is judged as its client address $embedded", (row) => {
    expectEmbedded(row);
  });

  it("an embedded form keeps its IPv6 text in ip and reports the IPv4 separately", () => {
    const result = classifyIp("::ffff:127.0.0.1");
    expect(isIPv6(result.ip)).toBe(true);
    expect(result.ip).toBe(classifyIp("::ffff:7f00:1").ip);
    expect(result.embeddedIPv4).toBe("127.0.0.1");
  });

  it.each<EmbeddedRow>([
    { input: "::ffff:0:7f00:1", embedded: "127.0.0.1", category: "loopback" },
    { input: "::ffff:0:127.0.0.1", embedded: "127.0.0.1", category: "loopback" },
    { input: "::ffff:0:a9fe:a9fe", embedded: "169.254.169.254", category: "metadata" },
    { input: "::ffff:0:a83f:8110", embedded: "168.63.129.16", category: "metadata" },
    { input: "::ffff:0:808:808", embedded: "8.8.8.8", category: "public" },
  ])("IPv4-translated (SIIT, ::ffff:0:0/96) $input is judged as $embedded", (row) => {
    expectEmbedded(row);
  });

  // RFC 8215's local-use prefix may be cut at any RFC 6052 length from /48 to /96, so the IPv4
  // address may sit in any of four places: each is looked at, and a metadata address in any is refused.
  it.each([
    ["/96", "64:ff9b:1::a9fe:a9fe", "169.254.169.254"],
    ["/96, dotted", "64:ff9b:1::169.254.169.254", "169.254.169.254"],
    ["/96, Azure WireServer", "64:ff9b:1::a83f:8110", "168.63.129.16"],
    ["/64 (bits 72..103)", "64:ff9b:1:0:a9:fea9:fe00:0", "169.254.169.254"],
    ["/56 (bits 56..63, 72..95)", "64:ff9b:1:a9:fe:a9fe::", "169.254.169.254"],
    ["/48 (bits 48..63, 72..87)", "64:ff9b:1:a9fe:a9:fe00::", "169.254.169.254"],
  ])("local-use NAT64 (64:ff9b:1::/48) with a metadata address at %s, %s, is metadata", (_where, input, embedded) => {
    const result = classifyIp(input);
    expect(result).toMatchObject({ category: "metadata", metadata: true, internal: true, embeddedIPv4: embedded });
  });

  it("NAT64 outside the well-known /96 (64:ff9b:1::/48, local use) is not public", () => {
    const result = classifyIp("64:ff9b:1::808:808");
    expect(result.internal).toBe(true);
    expect(result.category).not.toBe("public");
  });
});

describe("classifyIp: result shape", () => {
  const samples = [
    "127.0.0.1",
    "8.8.8.8",
    "169.254.169.254",
    "::",
    "::1",
    "fe80::1%eth0",
    "fd00:ec2::254",
    "2606:4700::1111",
    "::ffff:127.0.0.1",
    "64:ff9b::808:808",
    "2002:a00:1::1",
    "2001:0:4136:e378:8000:63bf:80ff:fffe",
  ];

  it.each(samples)("internal is true exactly when %s is not public", (input) => {
    const result = classifyIp(input);
    expect(result.internal).toBe(result.category !== "public");
  });

  it.each(samples)("metadata is true exactly when %s is in the metadata category", (input) => {
    const result = classifyIp(input);
    expect(result.metadata).toBe(result.category === "metadata");
  });

  it.each(samples)("classifying the canonical ip of %s again gives the same answer", (input) => {
    const first = classifyIp(input);
    const second = classifyIp(first.ip);
    expect(second).toEqual(first);
  });

  it.each([
    ["::1", "0:0:0:0:0:0:0:1"],
    ["[::1]", "0000:0000:0000:0000:0000:0000:0000:0001"],
    ["2606:4700::1111", "2606:4700:0:0:0:0:0:1111"],
    ["::ffff:127.0.0.1", "::FFFF:7F00:1"],
    ["fd00:ec2::254", "FD00:0EC2::0254"],
  ])("%s and %s are the same address with the same canonical ip", (a, b) => {
    expect(classifyIp(a).ip).toBe(classifyIp(b).ip);
  });

  it("a bracketed IPv6 literal is classified like the bare address", () => {
    expect(classifyIp("[::ffff:7f00:1]")).toEqual(classifyIp("::ffff:7f00:1"));
    expect(classifyIp("[2606:4700::1111]")).toEqual(classifyIp("2606:4700::1111"));
  });
});

describe("classifyIp: input that is not an IP address", () => {
  it.each([
    "",
    "example.com",
    "localhost",
    "1.2.3",
    "1.2.3.4.5",
    "256.0.0.1",
    "1.2.3.04",
    "-1.0.0.0",
    " 127.0.0.1",
    "127.0.0.1 ",
    "127.0.0.1:80",
    "[::1]:80",
    "[127.0.0.1",
    "::1]",
    "http://127.0.0.1/",
    "::1::1",
    "gggg::1",
    "1:2:3:4:5:6:7:8:9",
    "::ffff:127.0.0.256",
    "[]",
  ])("%j throws a TypeError", (input) => {
    expect(() => classifyIp(input)).toThrow(TypeError);
    expect(() => classifyIp(input)).toThrow(/not an IP address/);
  });

  // DESIGN §4: addresses are judged after resolution, never as text. The classifier only accepts
  // resolved addresses; these shorthand spellings must go through the resolver first.
  it.each(["127.1", "0x7f000001", "2130706433", "017700000001", "0177.0.0.1"])(
    "the unresolved loopback spelling %j throws a TypeError instead of being judged as text",
    (input) => {
      expect(() => classifyIp(input)).toThrow(TypeError);
    },
  );
});

describe("metadata endpoints beyond 169.254.169.254", () => {
  it.each(["169.254.169.123", "169.254.42.42", "168.63.129.16", "fd20:ce::254", "fd00:42::42", "fe80::a9fe:a9fe", "::ffff:168.63.129.16"])(
    "%s is a metadata address",
    (ip) => {
      const c = classifyIp(ip);
      expect(c.metadata).toBe(true);
      expect(c.internal).toBe(true);
    },
  );
});
