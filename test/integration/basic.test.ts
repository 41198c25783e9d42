import { describe, expect, it } from "vitest";
import { fetchVia, startTestProxy } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";

describe("forwarding through the proxy", () => {
  it("an allowed HTTPS host reached through CONNECT answers through the proxy", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo?x=1`);
    expect(res.status).toBe(200);
    const body = JSON.parse(res.text) as { path: string; headers: Record<string, string> };
    expect(body.path).toBe("/echo?x=1");
    expect(body.headers["host"]).toBe(`api.test:${upstream.port}`);
    expect(upstream.hits()).toBe(1);
  });
});
