import { Readable } from "node:stream";
import { describe, expect, it } from "vitest";
import { startH2Upstream, startRawH2Upstream } from "../helpers/h2-upstream.js";
import { fetchVia, startTestProxy } from "../helpers/proxy.js";

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
    // It never answers, and never opens the stream's window past the initial 65,535 bytes.
    const upstream = await startRawH2Upstream();
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
