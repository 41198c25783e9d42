import type { AddressInfo } from "node:net";
import { Readable } from "node:stream";
import { createServer as createTlsServer } from "node:tls";
import { describe, expect, it, onTestFinished } from "vitest";
import { clientPreface, flag, frame, frameType, settings } from "../helpers/h2-frames.js";
import { startH2Upstream } from "../helpers/h2-upstream.js";
import { fetchVia, startTestProxy } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";

/** `count` chunks of `size` bytes, one every `everyMs`: a guest uploading over a slow link. */
function slowBody(count: number, size: number, everyMs: number): Readable {
  return Readable.from(
    (async function* () {
      for (let i = 0; i < count; i++) {
        await new Promise((resolve) => setTimeout(resolve, everyMs));
        yield Buffer.alloc(size, 117);
      }
    })(),
  );
}

/**
 * An h2-only upstream that answers SETTINGS and PINGs and nothing else: it never opens a stream's
 * flow-control window (no WINDOW_UPDATE), so an upload stops at the initial 65,535 bytes.
 */
async function windowShutUpstream(): Promise<{ port: number }> {
  const ca = await testCa();
  const context = (await ca.serverContexts(["api.test"])).get("api.test")!;
  const server = createTlsServer({ SNICallback: (_name, cb) => cb(null, context), ALPNProtocols: ["h2"] }, (socket) => {
    socket.on("error", () => undefined);
    socket.write(settings());
    let buffered = Buffer.alloc(0);
    let prefaceSeen = false;
    socket.on("data", (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      if (!prefaceSeen) {
        if (buffered.length < clientPreface.length) return;
        buffered = buffered.subarray(clientPreface.length);
        prefaceSeen = true;
      }
      while (buffered.length >= 9) {
        const length = buffered.readUIntBE(0, 3);
        if (buffered.length < 9 + length) return;
        const type = buffered[3]!;
        const flags = buffered[4]!;
        const payload = buffered.subarray(9, 9 + length);
        buffered = buffered.subarray(9 + length);
        if (type === frameType.settings && (flags & flag.ack) === 0) socket.write(frame(frameType.settings, flag.ack, 0));
        if (type === frameType.ping && (flags & flag.ack) === 0) socket.write(frame(frameType.ping, flag.ack, 0, payload));
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return { port: (server.address() as AddressInfo).port };
}

// upstreamHeadersMs ran from the opening of an HTTP/2 upstream stream, so it counted the upload:
// an 8 MiB upload at 1 MiB/s got 504 from an h2 upstream and 200 from an HTTP/1.1 one, and gRPC
// client streams longer than the timeout were cut (black-box finding). It now runs from the end
// of the request, as undici's headersTimeout does.
describe("upstreamHeadersMs and an upload to an h2 upstream", () => {
  const timeouts = { upstreamHeadersMs: 400 };

  it("an upload that takes longer than upstreamHeadersMs is answered: the head's timer starts once the body has been sent", async () => {
    const upstream = await startH2Upstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`, { method: "POST", body: slowBody(8, 10_000, 150) });
    expect(res.status, res.text).toBe(200);
    expect((JSON.parse(res.text) as { bodyBytes: number }).bodyBytes).toBe(80_000);
  });

  it("an upstream that reads the whole upload and never answers gets 504 upstreamHeadersMs after the body's end, not its start", async () => {
    const upstream = await startH2Upstream({ "/never": () => undefined });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
    const started = performance.now();
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/never`, { method: "POST", body: slowBody(5, 1000, 150) });
    const ms = performance.now() - started;
    expect(res.status).toBe(504);
    expect(res.text).toContain(`no response head within ${timeouts.upstreamHeadersMs} ms`);
    // The body takes 750 ms; the head's 400 ms follow it.
    expect(ms).toBeGreaterThan(750 + timeouts.upstreamHeadersMs - 50);
    expect(ms).toBeLessThan(5_000);
  });

  it("an upload the h2 upstream stops taking (its window shut) still gets 504 after upstreamHeadersMs without progress", async () => {
    const upstream = await windowShutUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts });
    const started = performance.now();
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/stuck`, { method: "POST", body: Buffer.alloc(1_000_000, 117) });
    expect(res.status).toBe(504);
    expect(res.text).toContain(`took none of the request body for ${timeouts.upstreamHeadersMs} ms`);
    expect(performance.now() - started).toBeLessThan(5_000);
    const line = proxy.logs.find((l) => l["msg"] === "request" && String(l["target"]).endsWith("/stuck"));
    expect(line?.["code"]).toBe("EG_UPSTREAM_TIMEOUT");
  });
});
