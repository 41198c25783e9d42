import { describe, expect, it } from "vitest";
import { h2ServerOptions } from "../../src/proxy/h2-settings.js";
import { emptyStreams, sharedWindow } from "../../src/upstream/h2-window-share.js";

const streamWindow = 1_048_575;
const budget = 16 * 2 ** 20;

describe("sharedWindow", () => {
  it.each([
    [0, 1_048_575],
    [1, 1_048_575],
    [16, 1_048_575],
    [17, 524_287],
    [32, 524_287],
    [33, 262_143],
    [64, 262_143],
    [65, 131_071],
    [100, 131_071],
    [129, 65_535],
    [1_000, 65_535],
  ])("gives %i streams that hold nothing yet a window of %i bytes: together within the budget, never below 65,535", (streams, window) => {
    expect(sharedWindow(streamWindow, budget, emptyStreams(streams))).toBe(window);
    if (window > 65_535) expect(window * streams).toBeLessThanOrEqual(budget);
  });

  it("counts what a stream already holds past the window: 16 full windows leave a 17th stream the least one", () => {
    expect(sharedWindow(streamWindow, budget, [...new Array<number>(16).fill(streamWindow), 0])).toBe(65_535);
    expect(sharedWindow(streamWindow, budget, [...new Array<number>(8).fill(streamWindow), ...emptyStreams(9)])).toBe(524_287);
  });

  it("keeps a configured stream window that is not one byte under a power of two while it fits, and halves from there", () => {
    expect(sharedWindow(300_000, budget, emptyStreams(50))).toBe(300_000);
    expect(sharedWindow(300_000, budget, emptyStreams(60))).toBe(262_143);
  });

  it("never gives more than the budget to one stream", () => {
    expect(sharedWindow(streamWindow, 100_000, emptyStreams(1))).toBe(100_000);
  });
});

describe("the guest side's first SETTINGS", () => {
  it("gives limits.h2Streams streams' share of limits.h2ConnectionBufferBytes, raised once the guest has acknowledged it", () => {
    expect(h2ServerOptions({ h2Streams: 100, h2HeaderListBytes: 65_536, h2SessionMemoryMiB: 10, h2ResetsPer10s: 200, h2StreamWindowBytes: streamWindow, h2ConnectionWindowBytes: 2 ** 30 - 1, h2ConnectionBufferBytes: budget }).settings?.initialWindowSize).toBe(131_071);
  });
});
