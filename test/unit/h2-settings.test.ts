import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { h2GuestWindow, h2ServerOptions } from "../../src/proxy/h2-settings.js";

describe("h2ServerOptions", () => {
  it("carries limits.h2* into Node's server options and SETTINGS, and never allows push", () => {
    expect(h2ServerOptions({ h2Streams: 3, h2HeaderListBytes: 4096, h2SessionMemoryMiB: 2, h2ResetsPer10s: 5, h2StreamWindowBytes: 262_144, h2ConnectionWindowBytes: 1_048_576, h2ConnectionBufferBytes: 4_194_304 })).toMatchObject({
      maxSessionMemory: 2,
      settings: { maxConcurrentStreams: 3, maxHeaderListSize: 4096, enablePush: false, initialWindowSize: 262_144 },
    });
  });

  // Issue 20: older 20.x releases miss the HTTP/2 fixes for CVE-2025-23085 and CVE-2026-21714.
  it("package.json's engines.node is >=20.20.2, and the Node running the tests meets it", () => {
    const engines = (JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")) as { engines?: { node?: string } }).engines;
    expect(engines?.node).toBe(">=20.20.2");
    const [major, minor, patch] = process.versions.node.split(".").map(Number) as [number, number, number];
    expect(major > 20 || (major === 20 && (minor > 20 || (minor === 20 && patch >= 2)))).toBe(true);
  });
});

describe("h2GuestWindow", () => {
  const limits = { h2StreamWindowBytes: 1_048_575, h2ConnectionBufferBytes: 16 * 2 ** 20 };
  it("is h2Streams streams' share of the budget, one byte under a power of two, at most the stream window and never below 65,535", () => {
    expect(h2GuestWindow({ ...limits, h2Streams: 100 })).toBe(131_071);
    expect(h2GuestWindow({ ...limits, h2Streams: 40 })).toBe(262_143);
    expect(h2GuestWindow({ ...limits, h2Streams: 16 })).toBe(1_048_575);
    expect(h2GuestWindow({ ...limits, h2Streams: 1 })).toBe(1_048_575);
    expect(h2GuestWindow({ ...limits, h2Streams: 1000 })).toBe(65_535);
  });
});
