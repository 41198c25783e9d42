import { describe, expect, it } from "vitest";
import { startAllowlistProxy } from "../../examples/allowlist.js";
import { curlVia } from "../helpers/curl.js";
import { tempDir } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { startUpstream } from "../helpers/upstream.js";

describe("examples", () => {
  it("examples/allowlist.ts lets its hosts through and refuses the rest", async () => {
    const upstream = await startUpstream({ tls: false });
    const ca = await testCa();
    const options = {
      caDir: tempDir(),
      logLevel: "silent" as const,
      upstreamCa: [ca.certPem],
      resolve: { "api.test": ["127.0.0.1"], "other.test": ["127.0.0.1"], "local.test": ["127.0.0.1"] },
    };
    const proxy = await startAllowlistProxy({ allowedHosts: ["api.test"], allowedInternalHosts: ["local.test"] }, options);
    try {
      const denied = await curlVia(proxy.url, "/dev/null", `http://other.test:${upstream.port}/echo`);
      expect(denied.status).toBe(403);
      // api.test is allowed, but it resolves to loopback, which only allowedInternalHosts opens.
      const internal = await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`);
      expect(internal.status).toBe(403);
      expect(internal.body).toMatch(/loopback address/);
      expect(upstream.hits()).toBe(0);
      const allowed = await curlVia(proxy.url, "/dev/null", `http://local.test:${upstream.port}/echo`);
      expect(allowed.status).toBe(200);
      expect(upstream.hits()).toBe(1);
    } finally {
      await proxy.close();
    }
  });
});
