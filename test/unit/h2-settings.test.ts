import { describe, expect, it } from "vitest";
import { h2ServerOptions } from "../../src/proxy/h2-settings.js";

describe("h2ServerOptions", () => {
  it("carries limits.h2* into Node's server options and SETTINGS, and never allows push", () => {
    expect(h2ServerOptions({ h2Streams: 3, h2HeaderListBytes: 4096, h2SessionMemoryMiB: 2, h2ResetsPer10s: 5, h2StreamWindowBytes: 262_144, h2ConnectionWindowBytes: 1_048_576, h2ConnectionBufferBytes: 4_194_304 })).toMatchObject({
      maxSessionMemory: 2,
      settings: { maxConcurrentStreams: 3, maxHeaderListSize: 4096, enablePush: false, initialWindowSize: 262_144 },
    });
  });
});
