import { describe, expect, it, onTestFinished } from "vitest";
import { closeRaw, runRawRate, type RawRateRun } from "../../bench/raw-load.js";
import { startTestProxy } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";

/**
 * The bench's minimal HTTP/1.1 and HTTP/2 clients (bench/raw-load.ts): the h2 goal's rows are
 * read from their counts, so a client that took a refusal or a short body for a success would
 * make the figures wrong. Each runs through a real egressgate to a real upstream.
 */
describe("the bench's minimal clients", () => {
  const cases = [
    { what: "a 200 with the expected length", path: "/bytes?n=100", expectedBytes: 100, succeeds: true },
    { what: "a 200 of another length", path: "/bytes?n=99", expectedBytes: 100, succeeds: false },
    // The same length as the expected body: only the status tells it apart.
    { what: "a 404 with the expected length", path: "/status404", expectedBytes: 13, succeeds: false },
    // Node sends it chunked: for HTTP/1.1, a response without Content-Length.
    { what: "a chunked 404", path: "/missing", expectedBytes: 13, succeeds: false },
    { what: "a refusal by the proxy (403)", path: "/bytes?n=100", expectedBytes: 100, succeeds: false, refused: true },
  ];
  for (const protocol of ["h1", "h2"] as const) {
    for (const c of cases) {
      it(`${protocol}: ${c.what} counts as ${c.succeeds ? "a success" : "an error"}, and the proxy still serves afterwards`, async () => {
        onTestFinished(() => closeRaw());
        const upstream = await startUpstream({
          names: ["origin.bench.test", "refused.bench.test"],
          routes: { "/status404": (_req, res) => res.writeHead(404, { "content-length": 13 }).end("no such route") },
        });
        const proxy = await startTestProxy(
          { allowedInternalHosts: ["origin.bench.test"] },
          { resolve: { "origin.bench.test": ["127.0.0.1"], "refused.bench.test": ["127.0.0.1"] } },
        );
        const setup = { upstreamCaPem: "", proxies: { egressgate: { url: proxy.url, caPem: proxy.caCertPem } } };
        const host = c.refused === true ? "refused.bench.test" : "origin.bench.test";
        const run = (path: string, expectedBytes: number, lane: string): Promise<{ ok: number; errors: number; firstError: string | undefined }> =>
          runRawRate(setup, {
            kind: "rawrate",
            id: 1,
            lane,
            target: "egressgate",
            protocol,
            url: `https://${host}:${upstream.port}${path}`,
            expectedBytes,
            concurrency: 4,
            connections: protocol === "h2" ? 2 : 4,
            durationMs: 300,
            record: false,
          } satisfies RawRateRun);
        const result = await run(c.path, c.expectedBytes, `${protocol}-${c.path}-${host}`);
        if (c.succeeds) {
          expect(result.errors, result.firstError).toBe(0);
          expect(result.ok).toBeGreaterThan(0);
        } else {
          expect(result.ok).toBe(0);
          expect(result.errors).toBeGreaterThan(0);
        }
        // A CONNECT refused by the allowlist fails before TLS; the others reached the upstream.
        if (c.refused !== true) expect(upstream.hits()).toBeGreaterThan(0);
        else expect(upstream.hits()).toBe(0);
        const after = await runRawRate(setup, {
          kind: "rawrate",
          id: 2,
          lane: `${protocol}-after`,
          target: "egressgate",
          protocol,
          url: `https://origin.bench.test:${upstream.port}/bytes?n=100`,
          expectedBytes: 100,
          concurrency: 2,
          connections: protocol === "h2" ? 1 : 2,
          durationMs: 200,
          record: false,
        });
        expect(after.errors, after.firstError).toBe(0);
        expect(after.ok).toBeGreaterThan(0);
      });
    }
  }
});
