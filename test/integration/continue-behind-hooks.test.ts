import { describe, expect, it, vi } from "vitest";
import { openTlsTunnel } from "../helpers/raw.js";
import { startTestProxy } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";

// An HTTP/1.1 guest that asked for `100 Continue` sends nothing until it comes (RFC 9110
// §10.1.1). Behind hooks slower than timeouts.idleMs the proxy closed its connection as "the
// guest sent nothing of its request", though the proxy was the one waiting: curl got "Empty reply
// from server" (last session's "left alone"; the HTTP/2 side is in http2-continue.test.ts).
describe("HTTP/1.1: Expect: 100-continue behind hooks slower than idleMs", () => {
  const slowMs = 2_000;
  const idleMs = 700;

  async function slowProxy(): Promise<{ proxy: Awaited<ReturnType<typeof startTestProxy>>; target: string }> {
    const upstream = await startUpstream();
    const proxy = await startTestProxy(
      { allowedInternalHosts: ["api.test"], isRequestAllowed: async () => (await new Promise((resolve) => setTimeout(resolve, slowMs)), true) },
      { timeouts: { hookMs: 10_000, idleMs } },
    );
    return { proxy, target: `api.test:${upstream.port}` };
  }

  const head = (target: string): string => `POST /echo HTTP/1.1\r\nHost: ${target}\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n`;

  it("the 100 comes once the hooks are done, the body follows it, and the answer is the upstream's", async () => {
    const { proxy, target } = await slowProxy();
    const guest = await openTlsTunnel(proxy.port, target, { ca: proxy.caCertPem });
    const started = performance.now();
    guest.write(head(target));
    const continued = await guest.readResponse({ timeoutMs: 15_000 });
    expect(continued.status).toBe(100);
    expect(performance.now() - started).toBeGreaterThanOrEqual(slowMs - 50);
    guest.write("hello");
    const answer = await guest.readResponse({ timeoutMs: 15_000 });
    expect(answer.status).toBe(200);
    expect(JSON.parse(answer.body)).toMatchObject({ method: "POST", bodyBytes: 5 });
    // The connection serves on.
    guest.write(`GET /echo HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
    expect((await guest.readResponse({ timeoutMs: 15_000 })).status).toBe(200);
  });

  it("a guest that gets its 100 and then sends nothing is still cut, idleMs after the 100, and logged as the proxy's cut", async () => {
    const { proxy, target } = await slowProxy();
    const guest = await openTlsTunnel(proxy.port, target, { ca: proxy.caCertPem });
    guest.write(head(target));
    expect((await guest.readResponse({ timeoutMs: 15_000 })).status).toBe(100);
    const continuedAt = performance.now();
    expect(await guest.closesWithin(15_000)).toBe(true);
    expect(performance.now() - continuedAt).toBeGreaterThanOrEqual(idleMs - 50);
    const line = await vi.waitFor(() => {
      const found = proxy.logs.find((l) => l["msg"] === "request");
      expect(found).toBeDefined();
      return found!;
    });
    expect(line).toMatchObject({ status: 499, reason: `the proxy closed the connection: the guest sent nothing of its request for timeouts.idleMs (${idleMs} ms)` });
    expect(line["ms"]).toBeGreaterThanOrEqual(slowMs + idleMs - 50);
  });
});
