import { createHash } from "node:crypto";
import { ProxyAgent, request } from "undici";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createDjsHooks, createHttpHooks, HttpRequestBlockedError, startProxy, type Layer, type RunningProxy } from "../../src/index.js";
import { testCa } from "../helpers/test-ca.js";
import { brokenBehaviours, startFaultUpstream, upstreamBehaviours, type FaultUpstream, type UpstreamBehaviour } from "../helpers/fault-upstream.js";
import { fetchVia, proxyAgent, startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { startUpstream, type Echo, type Route } from "../helpers/upstream.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { startH2Upstream } from "../helpers/h2-upstream.js";

/** The decision lines of a proxy's log. */
function decisions(proxy: TestProxy): Record<string, unknown>[] {
  return proxy.logs.filter((line) => line["msg"] === "request");
}

/** A route answering the statuses in turn (the last one for ever after). */
function statusesRoute(statuses: number[], headers: Record<string, string> = {}): Route {
  let i = 0;
  return (_req, res) => {
    const status = statuses[Math.min(i++, statuses.length - 1)]!;
    res.writeHead(status, { "content-type": "text/plain", ...headers });
    res.end(`attempt ${i} got ${status}`);
  };
}

/** A route sending `size` bytes, counting the responses it opened and those that closed. */
function countedBigRoute(size: number): { route: Route; opened: () => number; closed: () => number } {
  let opened = 0;
  let closed = 0;
  const route: Route = (_req, res) => {
    opened++;
    res.once("close", () => closed++);
    res.writeHead(200, { "content-length": size });
    res.end(Buffer.alloc(size, 0x62));
  };
  return { route, opened: () => opened, closed: () => closed };
}

const sha256 = (text: string | Buffer): string => createHash("sha256").update(text).digest("hex");

describe("tier-3 layers: handle(request, next)", () => {
  it("a layer that calls next once passes the upstream's response through, with the descent's decision", async () => {
    const upstream = await startUpstream();
    const seen: string[] = [];
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          const response = await next(request);
          seen.push(`${request.method} ${new URL(request.url).pathname} ${response.status}`);
          return response;
        },
      ],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(200);
    expect((JSON.parse(res.text) as Echo).path).toBe("/echo");
    expect(seen).toEqual(["GET /echo 200"]);
    expect(decisions(proxy).at(-1)).toMatchObject({ status: 200, rule: "allowedHosts:api.test" });
  });

  it("layers run outermost first, and each next() sees what the layer outside it passed", async () => {
    const upstream = await startUpstream();
    const trail: string[] = [];
    const tagging = (name: string): Layer => async (request, next) => {
      trail.push(`${name} in`);
      const headers = new Headers(request.headers);
      headers.set("x-trail", `${request.headers.get("x-trail") ?? ""}${name}`);
      const response = await next(new Request(request, { headers }));
      trail.push(`${name} out`);
      return response;
    };
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], layers: [tagging("a"), tagging("b")] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect((JSON.parse(res.text) as Echo).headers["x-trail"]).toBe("ab");
    expect(trail).toEqual(["a in", "b in", "b out", "a out"]);
  });

  it("a mock layer answers without calling next: no upstream request, and the log says a layer answered", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], layers: [() => new Response("mocked", { status: 203, headers: { "x-mock": "1" } })] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(203);
    expect(res.text).toBe("mocked");
    expect(res.headers["x-mock"]).toBe("1");
    expect(upstream.hits()).toBe(0);
    expect(decisions(proxy).at(-1)).toMatchObject({ status: 203, rule: "handle", source: "hooks" });
  });

  it("a retry layer makes 3 attempts, each passing the checks and reaching the upstream", async () => {
    const upstream = await startUpstream({ routes: { "/flaky": statusesRoute([503, 503, 200]) } });
    let checks = 0;
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      // Every attempt is checked again: an isRequestAllowed hook counts them.
      hooks: [
        { isRequestAllowed: () => ((checks += 1), true) },
        {
          handle: async (request, next) => {
            let response = await next(request);
            for (let attempt = 1; attempt < 5 && response.status === 503; attempt++) {
              await response.body?.cancel();
              response = await next(request);
            }
            return response;
          },
        },
      ],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/flaky`);
    expect(res.status).toBe(200);
    expect(res.text).toBe("attempt 3 got 200");
    expect(upstream.hits()).toBe(3);
    expect(checks).toBe(3);
  });

  it("a descent the allowlist refuses rejects with HttpRequestBlockedError (403), which the layer may catch", async () => {
    const upstream = await startUpstream({ names: ["api.test", "other.test"] });
    let caught: unknown;
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          try {
            return await next(new Request(request.url.replace("api.test", "other.test"), request));
          } catch (error) {
            caught = error;
            return next(request);
          }
        },
      ],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(200);
    expect(caught).toBeInstanceOf(HttpRequestBlockedError);
    expect((caught as HttpRequestBlockedError).status).toBe(403);
    expect((caught as Error).message).toMatch(/host "other\.test" is not in allowedHosts/);
    expect(upstream.seen.map((s) => s.url)).toEqual(["/echo"]);
  });

  it("a refusal a layer does not catch reaches the guest as the descent's own 403", async () => {
    const upstream = await startUpstream({ names: ["api.test", "other.test"] });
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [(request, next) => next(new Request(request.url.replace("api.test", "other.test"), request))],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(403);
    expect(res.text).toMatch(/host "other\.test" is not in allowedHosts/);
    expect(upstream.hits()).toBe(0);
  });

  it("next twice with a body already streamed rejects, and no empty body reaches the upstream", async () => {
    const upstream = await startUpstream();
    let second: unknown;
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          const first = await next(request);
          try {
            await next(request);
          } catch (error) {
            second = error;
          }
          return first;
        },
      ],
    });
    const body = "x".repeat(100_000);
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`, { method: "POST", body });
    expect(res.status).toBe(200);
    expect(String(second)).toMatch(/already streamed.*request\.clone\(\)/);
    expect(upstream.seen).toHaveLength(1);
    expect(upstream.seen[0]).toMatchObject({ bodyBytes: body.length, bodySha256: sha256(body) });
  });

  it("with request.clone(), each next() sends the whole body", async () => {
    const upstream = await startUpstream({ routes: { "/flaky": statusesRoute([503, 200]) } });
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          const first = await next(request.clone());
          if (first.status !== 503) return first;
          await first.body?.cancel();
          return next(request);
        },
      ],
    });
    const body = Buffer.alloc(300_000, 0x61);
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/flaky`, { method: "PUT", body });
    expect(res.status).toBe(200);
    expect(upstream.seen.map((s) => [s.bodyBytes, s.bodySha256])).toEqual([
      [body.length, sha256(body)],
      [body.length, sha256(body)],
    ]);
  });

  it("11 descents get 502, even when the layer catches the refusal of the 11th", async () => {
    const upstream = await startUpstream();
    let rejected: unknown;
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          let last: Response | undefined;
          try {
            for (let i = 0; i < 11; i++) {
              await last?.body?.cancel();
              last = await next(request);
            }
          } catch (error) {
            rejected = error;
          }
          return last!;
        },
      ],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(502);
    expect(res.text).toMatch(/more than 10 times/);
    expect(String(rejected)).toMatch(/more than 10 times/);
    expect(upstream.hits()).toBe(10);
  });

  it("timeouts.requestMs ends a retry loop with 504", async () => {
    const upstream = await startUpstream({ routes: { "/down": statusesRoute([503]) } });
    const proxy = await startTestProxy(
      {
        allowedInternalHosts: ["api.test"],
        layers: [
          async (request, next) => {
            for (;;) {
              const response = await next(request);
              if (response.status !== 503) return response;
              await response.body?.cancel();
              // Ten attempts take at least a second: far past the 300 ms deadline.
              await new Promise((resolve) => setTimeout(resolve, 100));
            }
          },
        ],
      },
      { timeouts: { requestMs: 300 } },
    );
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/down`);
    expect(res.status).toBe(504);
    expect(res.text).toMatch(/timeouts\.requestMs \(300 ms\)/);
    expect(upstream.hits()).toBeLessThan(10);
  });

  // A layer that never settled got EG_UPSTREAM_TIMEOUT at the deadline, with no upstream contacted
  // (black-box finding): the deadline now names what was waited on.
  it.each([
    ["a layer that never settles", "/echo", 0, "EG_HOOK_TIMEOUT", /handle hook \(hooks\) did not settle within timeouts\.requestMs \(300 ms\) while no descent was under way/],
    ["a layer that waits on a timer of its own past the deadline", "/echo", 1, "EG_HOOK_TIMEOUT", /handle hook \(hooks\) did not settle within timeouts\.requestMs \(300 ms\) while no descent was under way/],
    ["a layer waiting on an upstream that never answers", "/hang", 2, "EG_UPSTREAM_TIMEOUT", /did not complete within timeouts\.requestMs \(300 ms\) over all its layers' descents/],
    // The head arrives, then the body trickles: the layer reading it waits on the upstream (review finding).
    ["a layer reading a body the upstream trickles", "/trickle", 3, "EG_UPSTREAM_TIMEOUT", /did not complete within timeouts\.requestMs \(300 ms\) over all its layers' descents/],
  ])("timeouts.requestMs: %s gets 504 %s", async (_label, path, how, code, message) => {
    const upstream = await startUpstream({
      routes: {
        "/hang": () => undefined,
        "/trickle": (_req, res) => {
          res.writeHead(200, { "content-type": "text/plain" });
          res.write("a");
          const drip = setInterval(() => res.write("b"), 50);
          res.once("close", () => clearInterval(drip));
        },
      },
    });
    const proxy = await startTestProxy(
      {
        allowedInternalHosts: ["api.test"],
        layers: [
          (request, next) =>
            how === 0
              ? new Promise<Response>(() => undefined)
              : how === 1
                ? new Promise<void>((resolve) => setTimeout(resolve, 2_000).unref()).then(() => next(request))
                : how === 3
                  ? next(request).then(async (response) => new Response(await response.text()))
                  : next(request),
        ],
      },
      { timeouts: { requestMs: 300, upstreamHeadersMs: 60_000 } },
    );
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}${path}`);
    expect(res.status, res.text).toBe(504);
    expect(res.headers["x-egressgate-error"]).toBe(code);
    expect(res.text).toMatch(message);
    expect(upstream.hits()).toBe(how >= 2 ? 1 : 0);
  });

  it("a guest that leaves ends its request at once, even while a layer has yet to settle", async () => {
    const upstream = await startUpstream();
    let entered!: () => void;
    const inLayer = new Promise<void>((resolve) => (entered = resolve));
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        () => {
          entered();
          return new Promise<Response>(() => undefined);
        },
      ],
    });
    const controller = new AbortController();
    const pending = request(`https://api.test:${upstream.port}/echo`, { dispatcher: proxyAgent(proxy), signal: controller.signal });
    await inLayer;
    controller.abort();
    await expect(pending).rejects.toThrow();
    // With the default timeouts.requestMs (300 s), only the guest's leaving can end it this soon.
    await expect.poll(() => decisions(proxy).at(-1), { timeout: 10_000 }).toMatchObject({ status: 499, reason: "guest closed the connection" });
  });

  it("a layer that returns nothing gets 502, not a pass-through", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          await next(request);
          return undefined as unknown as Response;
        },
      ],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(502);
    expect(res.text).toMatch(/handle returned undefined, not a Response/);
  });

  it("a body the layer streams into its own answer (pipeThrough) reaches the guest whole", async () => {
    const big = countedBigRoute(8 * 1024 * 1024);
    const upstream = await startUpstream({ routes: { "/big": big.route } });
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          const response = await next(request);
          const upper = new TransformStream<Uint8Array, Uint8Array>({ transform: (chunk, controller) => controller.enqueue(chunk.map((b) => b - 0x20)) });
          return new Response(response.body!.pipeThrough(upper), { status: 200 });
        },
      ],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/big`);
    expect(res.text).toBe("B".repeat(8 * 1024 * 1024));
  });

  it("a body the layer began to read and then released with reader.cancel() goes back", async () => {
    const big = countedBigRoute(8 * 1024 * 1024);
    const upstream = await startUpstream({ routes: { "/big": big.route } });
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          const response = await next(request);
          const reader = response.body!.getReader();
          await reader.read();
          await reader.cancel();
          return new Response("looked at the first chunk", { status: 200 });
        },
      ],
    });
    for (let i = 0; i < 3; i++) expect((await fetchVia(proxy, `https://api.test:${upstream.port}/big`)).text).toBe("looked at the first chunk");
    expect(big.opened()).toBe(3);
    await expect.poll(() => big.closed(), { timeout: 10_000 }).toBe(3);
  });

  it("responses a layer discards go back: their upstream bodies are cancelled, not held", async () => {
    const size = 4 * 1024 * 1024;
    const big = countedBigRoute(size);
    const upstream = await startUpstream({ routes: { "/big": big.route } });
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          // Two responses nobody reads, then one for the guest.
          await next(request);
          await next(request);
          return next(request);
        },
      ],
    });
    for (let i = 0; i < 4; i++) {
      const res = await fetchVia(proxy, `https://api.test:${upstream.port}/big`);
      expect(res.text.length).toBe(size);
    }
    expect(big.opened()).toBe(12);
    // Held bodies would keep their responses open until the body timeout (120 s); cancelled
    // ones close their connections at once.
    await expect.poll(() => big.closed(), { timeout: 10_000 }).toBe(12);
  });

  it("a layer's own response may carry a descent's body: new Response(response.body, response)", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          const response = await next(request);
          const headers = new Headers(response.headers);
          headers.set("x-layer", "seen");
          return new Response(response.body, { status: response.status, headers });
        },
      ],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(200);
    expect(res.headers["x-layer"]).toBe("seen");
    expect((JSON.parse(res.text) as Echo).path).toBe("/echo");
  });

  it("a header a layer sets in place on next()'s response reaches the guest", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      layers: [
        async (request, next) => {
          const response = await next(request);
          response.headers.set("x-timing", "12");
          return response;
        },
      ],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.headers["x-timing"]).toBe("12");
    expect((JSON.parse(res.text) as Echo).path).toBe("/echo");
  });

  it("layers see placeholders, never secret values; each descent substitutes them", async () => {
    const upstream = await startUpstream();
    const seenByLayer: string[] = [];
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      secrets: { TOKEN: { hosts: ["api.test"], value: "real-secret-value" } },
      layers: [
        async (request, next) => {
          seenByLayer.push(request.headers.get("authorization") ?? "");
          const first = await next(request);
          await first.body?.cancel();
          return next(request);
        },
      ],
    });
    const placeholder = proxy.guestEnv()["TOKEN"]!;
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`, { headers: { authorization: `Bearer ${placeholder}` } });
    expect(res.status).toBe(200);
    expect(seenByLayer).toEqual([`Bearer ${placeholder}`]);
    expect(upstream.seen.map((s) => s.headers["authorization"])).toEqual(["Bearer real-secret-value", "Bearer real-secret-value"]);
  });

  it("a layer's request to another host gets that host's checks, and onRequest runs on every descent", async () => {
    const upstream = await startUpstream({ names: ["api.test", "other.test"] });
    let onRequests = 0;
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test", "other.test"],
      hooks: [
        { onRequest: () => void onRequests++ },
        {
          handle: async (request, next) => {
            const primary = await next(request);
            if (primary.status === 200) return primary;
            await primary.body?.cancel();
            return next(new Request(request.url.replace("api.test", "other.test"), request));
          },
        },
      ],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/missing`);
    // Both descents reach the same upstream (404 twice): the fallback's answer is the guest's.
    expect(res.status).toBe(404);
    expect(upstream.seen.map((s) => s.headers["host"])).toEqual([`api.test:${upstream.port}`, `other.test:${upstream.port}`]);
    expect(onRequests).toBe(2);
  });
});

// Every answer shape of a layer, in both tiers × every upstream behaviour: after each row the
// proxy must still be serving. The tables generate the rows.
type Answer = "passthrough" | "rebuilt" | "own" | "throw" | "blocked" | "undefined" | "never" | "twice";
const answers: Record<Answer, Layer> = {
  passthrough: (request, next) => next(request),
  rebuilt: async (request, next) => {
    const response = await next(request);
    return new Response(response.body, response);
  },
  own: async (request, next) => {
    const response = await next(request);
    await response.arrayBuffer().catch(() => undefined);
    return new Response("own answer", { status: 200 });
  },
  throw: async (request, next) => {
    await next(request);
    throw new Error("layer broke");
  },
  blocked: () => {
    throw new HttpRequestBlockedError("layer says no", 451);
  },
  undefined: async (request, next) => {
    await next(request);
    return undefined as unknown as Response;
  },
  never: () => new Promise<Response>(() => undefined),
  twice: async (request, next) => {
    const first = await next(request);
    return first.status === 200 ? next(request) : first;
  },
};

/** The same answers as a tier-2 policy's handle, chosen by the same header. */
const policyLayer = `
export async function handle(request, next) {
  switch (request.headers.get("x-layer")) {
    case "rebuilt": { const r = await next(request); return new Response(r.body, r); }
    case "own": { const r = await next(request); try { await r.arrayBuffer(); } catch {} return new Response("own answer", { status: 200 }); }
    case "throw": { await next(request); throw new Error("layer broke"); }
    case "blocked": throw new HttpRequestBlockedError("layer says no", 451);
    case "undefined": { await next(request); return undefined; }
    case "never": return new Promise(() => {});
    case "twice": { const first = await next(request); return first.status === 200 ? next(request) : first; }
    default: return next(request);
  }
}`;

function expectedStatus(tier: 2 | 3, answer: Answer, behaviour: UpstreamBehaviour): number | "body" {
  if (answer === "blocked") return 451;
  // A policy's body read is the proxy's: a body that breaks fails the call, which the policy cannot catch.
  if (answer === "own" && tier === 2 && brokenBehaviours.has(behaviour)) return 502;
  // Tier 3 waits for timeouts.requestMs (504); a tier-2 call that never settles ends with its run (502).
  if (answer === "never") return tier === 3 ? 504 : 502;
  if (answer === "throw" || answer === "undefined") return 502;
  if (answer === "own") return 200;
  return "body";
}

describe("the layer matrix: every tier × answer × upstream behaviour", () => {
  let upstream: FaultUpstream;
  const proxies = new Map<2 | 3, { proxy: RunningProxy; agent: ProxyAgent; caDir: string; close?: () => Promise<void> }>();
  beforeAll(async () => {
    upstream = await startFaultUpstream(["api.test"]);
    for (const tier of [2, 3] as const) {
      const caDir = mkdtempSync(join(tmpdir(), "egressgate-layers-"));
      const policy = tier === 2 ? createDjsHooks({ source: policyLayer, filename: "matrix-layer.mjs", limits: { timeoutMs: 5_000 } }) : undefined;
      const { httpHooks } = createHttpHooks({
        allowedInternalHosts: ["api.test"],
        ...(policy !== undefined ? policy : { layers: [(request, next) => answers[(request.headers.get("x-layer") ?? "passthrough") as Answer](request, next)] }),
      });
      const proxy = await startProxy({
        httpHooks,
        listen: { host: "127.0.0.1", port: 0 },
        caDir,
        upstreamCa: [(await testCa()).certPem],
        logLevel: "silent",
        resolve: { "api.test": ["127.0.0.1"] },
        // Far above what a row takes on a loaded machine: only the tier-3 "never" rows reach it.
        timeouts: { requestMs: tier === 3 ? 5_000 : 30_000, upstreamBodyMs: 500 },
      });
      const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caCertPem } });
      proxies.set(tier, { proxy, agent, caDir, ...(policy !== undefined ? { close: () => policy.djsHooks.close() } : {}) });
    }
  });
  afterAll(async () => {
    for (const { proxy, agent, caDir, close } of proxies.values()) {
      await agent.close();
      await proxy.close();
      await close?.();
      rmSync(caDir, { recursive: true, force: true });
    }
    await upstream?.close();
  });

  const rows = ([2, 3] as const).flatMap((tier) =>
    (Object.keys(answers) as Answer[]).flatMap((answer) => upstreamBehaviours.map((upstream) => [`tier ${tier}: ${answer} × ${upstream}`, tier, answer, upstream] as const)),
  );

  it.concurrent.each(rows)("%s: the guest gets a clear answer and the proxy keeps serving", async (_name, tier, answer, behaviour) => {
    const { agent } = proxies.get(tier)!;
    const res = await request(upstream.url("api.test", behaviour), { dispatcher: agent, headers: { "x-layer": answer } });
    let bytes: Buffer | "broken";
    try {
      bytes = Buffer.from(await res.body.arrayBuffer());
    } catch {
      bytes = "broken";
    }
    const want = expectedStatus(tier, answer, behaviour);
    if (want === "body") {
      if (brokenBehaviours.has(behaviour)) {
        // The head goes before the body breaks: a cut body, or 502 when the break came first.
        if (bytes !== "broken") expect(res.statusCode).toBe(502);
      } else {
        expect(bytes).not.toBe("broken");
        expect(res.statusCode, String(bytes)).toBe(200);
        expect(createHash("sha256").update(bytes as Buffer).digest("hex")).toBe(upstream.sha256(behaviour));
      }
    } else {
      expect(res.statusCode, String(bytes)).toBe(want);
    }
    const control = await request(upstream.url("api.test", "cl"), { dispatcher: agent });
    expect(control.statusCode).toBe(200);
    expect(createHash("sha256").update(Buffer.from(await control.body.arrayBuffer())).digest("hex")).toBe(upstream.sha256("cl"));
  });
});

// Black-box finding (eighteenth session): a tier-3 layer whose read of the guest's body passed
// maxHttpBodyBytes got 502 "handle hook failed", where onRequest's read gets 413; to a gRPC
// client that was UNAVAILABLE, which it retries, instead of RESOURCE_EXHAUSTED.
describe("a tier-3 layer reading the guest's body past maxHttpBodyBytes", () => {
  const layers: Record<string, Layer> = {
    "reads it": async (request) => new Response(`read ${(await request.text()).length}`),
    "sends a clone": async (request, next) => next(request.clone()),
    "catches the failure and answers itself": async (request) => {
      try {
        await request.arrayBuffer();
      } catch {
        // the layer goes on as if nothing happened
      }
      return new Response("fallback");
    },
  };
  it.each(Object.keys(layers))("that %s gets 413 over HTTP/1.1 and HTTP/2, RESOURCE_EXHAUSTED to gRPC, and nothing goes upstream", async (kind) => {
    const upstream = await startH2Upstream();
    const authority = `api.test:${upstream.port}`;
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], layers: [layers[kind]!] }, { maxHttpBodyBytes: 1000 });
    const big = Buffer.alloc(5000, 0x61);
    const viaH1 = await fetchVia(proxy, `https://${authority}/echo`, { method: "POST", body: big });
    expect([viaH1.status, viaH1.text]).toEqual([413, expect.stringContaining("larger than maxHttpBodyBytes (1000)")]);
    const session = await h2Session(proxy.port, authority, proxy.caCertPem);
    const viaH2 = await h2Request(session, { ":method": "POST", ":path": "/echo", ":authority": authority }, big);
    expect([viaH2.status, viaH2.body.toString()]).toEqual([413, expect.stringContaining("larger than maxHttpBodyBytes (1000)")]);
    const grpc = await h2Request(session, { ":method": "POST", ":path": "/pkg.Svc/Put", ":authority": authority, "content-type": "application/grpc", te: "trailers" }, big);
    expect(grpc.headers).toMatchObject({ ":status": 200, "grpc-status": "8", "x-egressgate-error": "EG_TOO_LARGE" });
    expect(upstream.seen).toEqual([]);
    await vi.waitFor(() => expect(decisions(proxy).map((line) => line["code"])).toEqual(["EG_TOO_LARGE", "EG_TOO_LARGE", "EG_TOO_LARGE"]));
    // A body within the limit still goes, on the same connection.
    const small = await h2Request(session, { ":method": "POST", ":path": "/echo", ":authority": authority }, "hello");
    expect(small.status).toBe(200);
  });
});
