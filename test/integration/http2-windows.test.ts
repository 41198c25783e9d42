import { once } from "node:events";
import { describe, expect, it } from "vitest";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { flag, frame, frameType, indexed } from "../helpers/h2-frames.js";
import { startH2Upstream, startRawH2Upstream } from "../helpers/h2-upstream.js";
import { fetchVia, startTestProxy } from "../helpers/proxy.js";

/** RFC 9113 §6.5.2 SETTINGS_INITIAL_WINDOW_SIZE, and the window every stream and connection starts with (§6.9.2). */
const initialWindowSize = 0x4;
const rfcWindow = 65_535;
/** The defaults (README, docs/config.md): one byte under 1 MiB and 1 GiB, as RFC 9113's is under 64 KiB. */
const defaultStream = 1_048_575;
const defaultConnection = 1_073_741_823;

/** What a hand-written upstream read of the proxy's first frames on a connection. */
async function upstreamSees(limits: { h2StreamWindowBytes?: number; h2ConnectionWindowBytes?: number }): Promise<{ streamWindow: number | undefined; connectionIncrements: number[] }> {
  let streamWindow: number | undefined;
  const connectionIncrements: number[] = [];
  const upstream = await startRawH2Upstream({
    onFrame: (type, flags, stream, payload) => {
      if (type === frameType.settings && (flags & flag.ack) === 0) {
        for (let at = 0; at + 6 <= payload.length; at += 6) if (payload.readUInt16BE(at) === initialWindowSize) streamWindow = payload.readUInt32BE(at + 2);
      }
      if (type === frameType.windowUpdate && stream === 0) connectionIncrements.push(payload.readUInt32BE(0) & 0x7fffffff);
    },
    // HPACK static table entry 8 is `:status: 200`.
    onHeaders: (socket, stream) => void socket.write(frame(frameType.headers, flag.endStream | flag.endHeaders, stream, indexed(8))),
  });
  const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, Object.keys(limits).length > 0 ? { limits } : {});
  // The frames before the request's HEADERS have been read once its answer is back.
  expect((await fetchVia(proxy, `https://api.test:${upstream.port}/`)).status).toBe(200);
  return { streamWindow, connectionIncrements };
}

// Node's 65,535-byte windows let an h2 upstream's response move 64 KiB per round trip through the
// proxy's event loop: on a busy machine, downloads from h2-only upstreams at a tenth of HTTP/1.1's
// pace (docs/performance.md, "HTTP/2 flow-control windows").
describe("limits.h2StreamWindowBytes and limits.h2ConnectionWindowBytes", () => {
  it("an h2 upstream is told the default stream window in the proxy's SETTINGS and given the default connection window at once", async () => {
    const seen = await upstreamSees({});
    expect(seen.streamWindow).toBe(defaultStream);
    expect(seen.connectionIncrements).toEqual([defaultConnection - rfcWindow]);
  });

  it("an h2 upstream is told the configured windows", async () => {
    const seen = await upstreamSees({ h2StreamWindowBytes: 300_000, h2ConnectionWindowBytes: 5_000_000 });
    expect(seen.streamWindow).toBe(300_000);
    expect(seen.connectionIncrements).toEqual([5_000_000 - rfcWindow]);
  });

  // A guest connection's stream window is its limits.h2Streams streams' share of
  // limits.h2ConnectionBufferBytes, at most limits.h2StreamWindowBytes (h2GuestWindow).
  it.each([
    ["the defaults (100 streams' share of 16 MiB)", {}, 131_071, defaultConnection],
    ["configured windows", { h2StreamWindowBytes: 300_000, h2ConnectionWindowBytes: 5_000_000, h2Streams: 10 }, 300_000, 5_000_000],
    ["the default stream window, with a budget for 100 of them", { h2ConnectionBufferBytes: 100 * 2 ** 20 }, defaultStream, defaultConnection],
  ] as const)("an HTTP/2 guest may send uploads ahead to %s", async (_name, limits, stream, connection) => {
    const upstream = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, Object.keys(limits).length > 0 ? { limits } : {});
    const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
    if (session.remoteSettings.initialWindowSize !== stream) await once(session, "remoteSettings");
    // The proxy's WINDOW_UPDATE for the connection went out with its SETTINGS, before any answer.
    expect((await h2Request(session, { ":path": "/echo" })).status).toBe(200);
    expect(session.remoteSettings.initialWindowSize).toBe(stream);
    expect(session.state.remoteWindowSize).toBe(connection);
  });

  it("a window past what HTTP/2 can say is refused with the option's name", async () => {
    await expect(startTestProxy({ allowedInternalHosts: ["api.test"] }, { limits: { h2StreamWindowBytes: 2 ** 31 } })).rejects.toThrow("limits.h2StreamWindowBytes must be an integer from 65535 to 2147483647 (got 2147483648)");
    await expect(startTestProxy({ allowedInternalHosts: ["api.test"] }, { limits: { h2ConnectionWindowBytes: 1000 } })).rejects.toThrow("limits.h2ConnectionWindowBytes must be an integer from 65535 to 2147483647 (got 1000)");
  });
});
