import { createHash } from "node:crypto";
import { gzipSync } from "node:zlib";
import { request } from "undici";
import { describe, expect, it, vi } from "vitest";
import type { Layer } from "../../src/index.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { proxyAgent, startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { patternChunk, patternSha256, startUpstream, type Route } from "../helpers/upstream.js";

/**
 * `response.clone()` on the Response a tier-3 layer's next() gave, or on the one an onResponse
 * hook sees: the guest gets every byte, whichever branch it is sent and however the clone is read.
 */

const MiB = 1024 * 1024;
const size = MiB;
const sha256 = (bytes: Buffer): string => createHash("sha256").update(bytes).digest("hex");

/** `n` pattern bytes (a multiple of 64 KiB), framed by Content-Length or chunked. */
function patternRoute(framing: "cl" | "chunked"): Route {
  return (_req, res, _body, url) => {
    const total = Number(url.searchParams.get("n") ?? size);
    const chunk = patternChunk(64 * 1024);
    res.writeHead(200, { "content-type": "application/octet-stream", ...(framing === "cl" ? { "content-length": total } : {}) });
    let sent = 0;
    const pump = (): void => {
      while (sent < total) {
        sent += chunk.length;
        if (!res.write(chunk)) {
          res.once("drain", pump);
          return;
        }
      }
      res.end();
    };
    pump();
  };
}

const routes = { "/cl": patternRoute("cl"), "/chunked": patternRoute("chunked") };

/** The decision lines of a proxy's log. */
function decisions(proxy: TestProxy): Record<string, unknown>[] {
  return proxy.logs.filter((line) => line["msg"] === "request");
}

/** The decision line of the proxy's last request, once written (after the guest has its body). */
async function lastDecision(proxy: TestProxy, count: number): Promise<Record<string, unknown>> {
  await vi.waitFor(() => expect(decisions(proxy).length).toBe(count));
  return decisions(proxy).at(-1)!;
}

/** A GET through the proxy as an HTTP/1.1 or an HTTP/2 guest: status and the body's hash (hashed as it comes). */
async function get(proxy: TestProxy, protocol: "h1" | "h2", url: string): Promise<{ status: number; sha: string; bytes: number }> {
  if (protocol === "h1") {
    const res = await request(url, { dispatcher: proxyAgent(proxy) });
    const hash = createHash("sha256");
    let bytes = 0;
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      hash.update(chunk);
      bytes += chunk.length;
    }
    return { status: res.statusCode, sha: hash.digest("hex"), bytes };
  }
  const target = new URL(url);
  const session = await h2Session(proxy.port, target.host, proxy.caCertPem);
  const answer = await h2Request(session, { ":path": target.pathname + target.search, ":authority": target.host });
  session.close();
  return { status: answer.status, sha: sha256(answer.body), bytes: answer.body.length };
}

/** The three ways a layer uses clone(): the Cache API's idioms. */
const idioms: Record<string, (copies: Promise<Buffer>[]) => Layer> = {
  // cache.put(request, response.clone()) without awaiting it, then return the response.
  "keeps a clone it reads in the background": (copies) => async (request, next) => {
    const response = await next(request);
    copies.push(response.clone().arrayBuffer().then(Buffer.from));
    return response;
  },
  "reads a clone whole, then returns the response": (copies) => async (request, next) => {
    const response = await next(request);
    const copy = Buffer.from(await response.clone().arrayBuffer());
    copies.push(Promise.resolve(copy));
    return response;
  },
  "returns a clone": () => async (request, next) => (await next(request)).clone(),
};

describe("a tier-3 layer that clones next()'s Response", () => {
  const rows = Object.keys(idioms).flatMap((idiom) => (["h1", "h2"] as const).flatMap((protocol) => (["chunked", "cl"] as const).map((framing) => ({ idiom, protocol, framing }))));
  it.each(rows)("$idiom: an $protocol guest gets the whole $framing body, logged 200, and the proxy serves on", async ({ idiom, protocol, framing }) => {
    const upstream = await startUpstream({ routes });
    const copies: Promise<Buffer>[] = [];
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], layers: [idioms[idiom]!(copies)] });
    const url = `https://api.test:${upstream.port}/${framing}`;
    const got = await get(proxy, protocol, url);
    expect(got).toEqual({ status: 200, sha: patternSha256(size), bytes: size });
    for (const copy of await Promise.all(copies)) expect(sha256(copy)).toBe(patternSha256(size));
    const line = await lastDecision(proxy, 1);
    expect(line).toMatchObject({ status: 200, rule: "allowedHosts:api.test" });
    expect(line).not.toHaveProperty("error");
    // And again, on the same proxy.
    expect((await get(proxy, protocol, url)).sha).toBe(patternSha256(size));
    expect(await lastDecision(proxy, 2)).toMatchObject({ status: 200 });
  });

  it("a clone the layer never reads is cancelled when it answers: memory stays flat for a large body, and reading it later fails", async () => {
    const upstream = await startUpstream({ routes });
    const kept: Response[] = [];
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          const response = await next(request);
          kept.push(response.clone());
          return response;
        },
      ],
    });
    const large = 64 * MiB;
    const before = process.memoryUsage().rss;
    const got = await get(proxy, "h1", `https://api.test:${upstream.port}/chunked?n=${large}`);
    const grown = process.memoryUsage().rss - before;
    expect(got).toEqual({ status: 200, sha: patternSha256(large), bytes: large });
    // Uncancelled, its tee branch held all 64 MiB.
    expect(grown).toBeLessThan(32 * MiB);
    await expect(kept[0]!.arrayBuffer()).rejects.toThrow(TypeError);
  });
});

describe("an onResponse hook whose clone is still being read when it returns", () => {
  const rows = (["h1", "h2"] as const).flatMap((protocol) => (["chunked", "cl", "gzip"] as const).map((framing) => ({ protocol, framing })));
  it.each(rows)("an $protocol guest gets the $framing body whole, and the clone reads to its end", async ({ protocol, framing }) => {
    const gzipped = gzipSync(Buffer.alloc(size, 0x61));
    const upstream = await startUpstream({
      routes: {
        ...routes,
        "/gzip": (_req, res) => {
          res.writeHead(200, { "content-encoding": "gzip", "content-length": gzipped.length });
          res.end(gzipped);
        },
      },
    });
    const copies: Promise<Buffer>[] = [];
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      onResponse: (response) => {
        copies.push(response.clone().arrayBuffer().then(Buffer.from));
      },
    });
    const got = await get(proxy, protocol, `https://api.test:${upstream.port}/${framing}`);
    const [copy] = await Promise.all(copies);
    if (framing === "gzip") {
      // The guest gets the bytes as they came; the hook's clone, decoded.
      expect(got).toEqual({ status: 200, sha: sha256(gzipped), bytes: gzipped.length });
      expect(sha256(copy!)).toBe(sha256(Buffer.alloc(size, 0x61)));
    } else {
      expect(got).toEqual({ status: 200, sha: patternSha256(size), bytes: size });
      expect(sha256(copy!)).toBe(patternSha256(size));
    }
    const line = await lastDecision(proxy, 1);
    expect(line).toMatchObject({ status: 200 });
    expect(line).not.toHaveProperty("error");
  });

  it("a clone held by a reader that stops reading fails past maxHttpResponseBodyBytes, and the guest's body goes on whole", async () => {
    const upstream = await startUpstream({ routes });
    let reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
    const proxy = await startTestProxy(
      {
        allowedInternalHosts: ["api.test"],
        onResponse: (response) => {
          reader = response.clone().body!.getReader();
          void reader.read();
        },
      },
      { maxHttpResponseBodyBytes: MiB },
    );
    const large = 16 * MiB;
    const got = await get(proxy, "h1", `https://api.test:${upstream.port}/cl?n=${large}`);
    expect(got).toEqual({ status: 200, sha: patternSha256(large), bytes: large });
    expect(await lastDecision(proxy, 1)).toMatchObject({ status: 200 });
    // What waited for it past the limit was dropped: reading on, it fails.
    const readOn = async (): Promise<void> => {
      for (;;) if ((await reader!.read()).done) return;
    };
    await expect(readOn()).rejects.toThrow(/limit/);
  });
});
