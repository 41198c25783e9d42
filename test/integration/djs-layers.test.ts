import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { djsHooksOptionsFromFile, type DjsHooksOptions } from "../../src/index.js";
import { loadPolicy } from "../helpers/djs.js";
import { fetchVia, startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { patternBody, patternChunk, patternSha256, startUpstream, type Echo, type Route, type Upstream } from "../helpers/upstream.js";

const policiesDir = fileURLToPath(new URL("../../policies/", import.meta.url));

/** A route that answers each status in turn (the last one from then on), with extra headers. */
function statuses(list: readonly number[], headers: Record<string, string> = {}): Route {
  let calls = 0;
  return (_req, res) => {
    const status = list[Math.min(calls++, list.length - 1)]!;
    res.writeHead(status, { "content-type": "text/plain", ...headers });
    res.end(`answer ${calls} (${status})`);
  };
}

/** A route that answers after `ms`. */
function slow(ms: number): Route {
  return (_req, res) => {
    const timer = setTimeout(() => {
      res.writeHead(200, { "content-type": "text/plain" });
      res.end("slow but sure");
    }, ms);
    res.on("close", () => clearTimeout(timer));
  };
}

/** A route that drops the connection without an answer the first `drops` times, then answers 200. */
function dropping(drops: number): Route {
  let calls = 0;
  return (req, res) => {
    if (calls++ < drops) {
      req.socket.destroy();
      return;
    }
    res.writeHead(200, { "content-type": "text/plain" });
    res.end(`answered on attempt ${calls}`);
  };
}

/**
 * A layer policy from the body of its `handle(request, next)`. Requests for `?plain` pass
 * straight through, so the proxy can be seen still serving after each unusual row.
 */
function layer(body: string, extra = ""): string {
  return `${extra}
    export async function handle(request, next) {
      if (request.url.endsWith("?plain")) return next(request);
      ${body}
    }`;
}

/** A layer policy behind a proxy that allows api.test (other.test resolves, but is not allowed). */
async function layerProxy(
  policy: string | DjsHooksOptions,
  options: { routes?: Record<string, Route>; requestMs?: number } = {},
): Promise<{ upstream: Upstream; proxy: TestProxy; base: string }> {
  const upstream = await startUpstream({ names: ["api.test", "other.test"], ...(options.routes !== undefined ? { routes: options.routes } : {}) });
  const djsHooks = loadPolicy(typeof policy === "string" ? { source: policy, filename: "layer.mjs" } : policy);
  const proxy = await startTestProxy(
    { allowedInternalHosts: ["api.test"], djsHooks },
    options.requestMs !== undefined ? { timeouts: { requestMs: options.requestMs } } : {},
  );
  return { upstream, proxy, base: `https://api.test:${upstream.port}` };
}

/** After an unusual request, the proxy is still up and serves a plain one. */
async function stillServes(proxy: TestProxy, base: string): Promise<void> {
  const res = await fetchVia(proxy, `${base}/echo?plain`);
  expect(res.status).toBe(200);
  expect((JSON.parse(res.text) as Echo).path).toBe("/echo?plain");
}

/** The decision lines of a proxy's log. */
function decisions(proxy: TestProxy): Record<string, unknown>[] {
  return proxy.logs.filter((line) => line["msg"] === "request");
}

const upload = 256 * 1024;

describe("tier-2 layers: next() runs the rest of the path", () => {
  it("a retry layer makes 3 attempts that each pass the checks and reach the upstream (503, 503, 200)", async () => {
    const { upstream, proxy, base } = await layerProxy(
      layer(`
        let response;
        for (let attempt = 1; attempt <= 3; attempt++) {
          response = await next(request);
          if (response.status !== 503) break;
        }
        return response;`),
      { routes: { "/flaky": statuses([503, 503, 200]) } },
    );
    const res = await fetchVia(proxy, `${base}/flaky`);
    expect(res.status).toBe(200);
    expect(res.text).toBe("answer 3 (200)");
    expect(upstream.seen.map((s) => s.url)).toEqual(["/flaky", "/flaky", "/flaky"]);
    // Passed through as it came: the descent's own decision is the one logged.
    expect(decisions(proxy).at(-1)).toMatchObject({ status: 200 });
    await stillServes(proxy, base);
  });

  it("a next() to a host off the allowlist rejects with HttpRequestBlockedError (403), which the layer catches and answers", async () => {
    const { upstream, proxy, base } = await layerProxy(
      layer(`
        try {
          await next(new Request(request.url.replace("api.test", "other.test"), request));
          return new Response("reached other.test", { status: 500 });
        } catch (error) {
          const kind = error instanceof HttpRequestBlockedError ? "blocked" : "other";
          return new Response(kind + " " + error.status + ": " + error.message, { status: 299 });
        }`),
    );
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(299);
    expect(res.text).toMatch(/^blocked 403: .*host "other\.test" is not in allowedHosts/);
    expect(upstream.hits()).toBe(0);
    expect(decisions(proxy).at(-1)).toMatchObject({ status: 299, source: expect.stringMatching(/layer\.mjs$/) });
    await stillServes(proxy, base);
  });

  it("a refusal the layer throws on is the guest's answer, as the check gave it", async () => {
    const { upstream, proxy, base } = await layerProxy(layer(`return await next(new Request(request.url.replace("api.test", "other.test"), request));`));
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(403);
    expect(res.text).toMatch(/host "other\.test" is not in allowedHosts/);
    expect(upstream.hits()).toBe(0);
    await stillServes(proxy, base);
  });

  it("a mock layer that never calls next answers itself, and no request reaches the upstream", async () => {
    const { upstream, proxy, base } = await layerProxy(layer(`return Response.json({ mocked: request.method }, { status: 203 });`));
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(203);
    expect(JSON.parse(res.text)).toEqual({ mocked: "GET" });
    expect(upstream.hits()).toBe(0);
    expect(decisions(proxy).at(-1)).toMatchObject({ status: 203, source: expect.stringMatching(/layer\.mjs$/) });
    await stillServes(proxy, base);
  });

  it("a layer that rewrites the response's headers keeps the upstream's body", async () => {
    const { proxy, base } = await layerProxy(
      layer(`
        const response = await next();
        response.headers.set("x-layer", "seen " + response.status);
        return response;`),
    );
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(200);
    expect(res.headers["x-layer"]).toBe("seen 200");
    expect((JSON.parse(res.text) as Echo).path).toBe("/echo");
  });
});

describe("tier-2 layers: bodies", () => {
  it("next twice after streaming the guest's body rejects, and no empty body reaches the upstream", async () => {
    const { upstream, proxy, base } = await layerProxy(
      layer(`
        const first = new Request(request);
        const second = new Request(request);
        const response = await next(first);
        let again = "none";
        try { await next(second); again = "sent"; } catch (error) { again = error.name + ": " + error.message; }
        let same = "none";
        try { await next(first); same = "sent"; } catch (error) { same = error.name + ": " + error.message; }
        response.headers.set("x-again", again);
        response.headers.set("x-same", same);
        return response;`),
    );
    const res = await fetchVia(proxy, `${base}/echo`, { method: "POST", body: patternBody(upload) });
    expect(res.status).toBe(200);
    expect(res.headers["x-again"]).toMatch(/^TypeError: .*already streamed upstream; pass request\.clone\(\)/);
    expect(res.headers["x-same"]).toMatch(/^TypeError: .*already read or sent; pass request\.clone\(\)/);
    expect(upstream.seen).toHaveLength(1);
    expect(upstream.seen[0]).toMatchObject({ method: "POST", bodyBytes: upload, bodySha256: patternSha256(upload) });
    await stillServes(proxy, base);
  });

  it("with request.clone(), two next() each deliver the whole body", async () => {
    const { upstream, proxy, base } = await layerProxy(
      layer(`
        const one = await next(request.clone());
        const two = await next(request.clone());
        const echoes = [await one.json(), await two.json()];
        return Response.json(echoes.map((e) => e.bodyBytes + ":" + e.bodySha256));`),
    );
    const res = await fetchVia(proxy, `${base}/echo`, { method: "PUT", body: patternBody(upload) });
    expect(res.status).toBe(200);
    const whole = `${upload}:${patternSha256(upload)}`;
    expect(JSON.parse(res.text)).toEqual([whole, whole]);
    expect(upstream.seen.map((s) => `${s.bodyBytes}:${s.bodySha256}`)).toEqual([whole, whole]);
    await stillServes(proxy, base);
  });

  it("a clone's body is held by the proxy, not the sandbox: an upload larger than the policy may read still goes twice", async () => {
    const big = 4 * 1024 * 1024;
    const { upstream, proxy, base } = await layerProxy({
      source: layer(`
        const one = await next(request.clone());
        return one.status === 200 ? next(request.clone()) : one;`),
      filename: "small-heap.mjs",
      // A policy may read a quarter of its heap: 2 MiB here, half the upload.
      limits: { memoryBytes: 8 * 1024 * 1024 },
    });
    const res = await fetchVia(proxy, `${base}/echo`, { method: "PUT", body: patternBody(big) });
    expect(res.status).toBe(200);
    const whole = `${big}:${patternSha256(big)}`;
    expect(upstream.seen.map((s) => `${s.bodyBytes}:${s.bodySha256}`)).toEqual([whole, whole]);
  });

  it("after reading the body, the layer can send it in new Requests as often as it likes", async () => {
    const { upstream, proxy, base } = await layerProxy(
      layer(`
        const text = await request.text();
        await next(new Request(request.url, { method: "POST", headers: request.headers, body: text }));
        return next(new Request(request.url, { method: "POST", headers: request.headers, body: text + "!" }));`),
    );
    const res = await fetchVia(proxy, `${base}/echo`, { method: "POST", body: "x".repeat(1000), headers: { "content-type": "text/plain" } });
    expect(res.status).toBe(200);
    expect((JSON.parse(res.text) as Echo).bodyBytes).toBe(1001);
    expect(upstream.seen.map((s) => s.bodyBytes)).toEqual([1000, 1001]);
  });

  it("reading next()'s response body reruns the call, and still makes exactly one upstream request", async () => {
    const { upstream, proxy, base } = await layerProxy(
      layer(`
        console.log("handle ran");
        const response = await next(request);
        const echo = await response.json();
        return new Response("upstream saw " + echo.path, { status: 202, headers: { "x-status": String(response.status) } });`),
    );
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(202);
    expect(res.text).toBe("upstream saw /echo");
    expect(res.headers["x-status"]).toBe("200");
    expect(upstream.hits()).toBe(1);
    // The runs before the last stopped at next() or the body: only the last run's lines are logged.
    expect(proxy.logs.filter((line) => line["text"] === "handle ran")).toHaveLength(1);
    await stillServes(proxy, base);
  });

  it("a layer that read a clone of the response passes the original on, whole", async () => {
    const { upstream, proxy, base } = await layerProxy(
      layer(`
        const response = await next(request);
        const peek = await response.clone().json();
        return peek.path === "/echo" ? response : new Response("not the echo", { status: 500 });`),
    );
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(200);
    expect(res.headers["content-type"]).toBe("application/json");
    expect((JSON.parse(res.text) as Echo).path).toBe("/echo");
    expect(upstream.hits()).toBe(1);
    await stillServes(proxy, base);
  });
});

describe("tier-2 layers: discarded responses", () => {
  it("the bodies of responses a retry layer did not return are cancelled, so their connections come back", async () => {
    const big = 16 * 1024 * 1024;
    const cut: Promise<boolean>[] = [];
    let calls = 0;
    const route: Route = (_req, res) => {
      if (++calls > 2) {
        res.writeHead(200, { "content-type": "text/plain" });
        res.end("third time");
        return;
      }
      // Far more than socket buffers hold: only a reader or a cancel ends this response.
      cut.push(new Promise((resolve) => res.on("close", () => resolve(!res.writableFinished))));
      res.writeHead(503, { "content-type": "application/octet-stream", "content-length": big });
      const chunk = patternChunk(64 * 1024);
      let sent = 0;
      const pump = (): void => {
        while (sent < big && !res.destroyed) {
          sent += chunk.length;
          if (!res.write(chunk)) return void res.once("drain", pump);
        }
        res.end();
      };
      pump();
    };
    const { proxy, base } = await layerProxy(
      layer(`
        for (let attempt = 1; ; attempt++) {
          const response = await next(request);
          if (response.status !== 503 || attempt === 3) return response;
        }`),
      { routes: { "/heavy": route } },
    );
    const res = await fetchVia(proxy, `${base}/heavy`);
    expect(res.status).toBe(200);
    expect(res.text).toBe("third time");
    // Both unread 503 bodies were cancelled (cut short), not left holding their connections.
    expect(await Promise.all(cut)).toEqual([true, true]);
    await stillServes(proxy, base);
  });
});

describe("tier-2 layers: bounds", () => {
  it("a layer whose next() takes 2 s still works under a 100 ms policy time limit", async () => {
    const { upstream, proxy, base } = await layerProxy(
      {
        source: layer(`
          const response = await next(request);
          return new Response((await response.text()) + " (through the layer)", response);`),
        filename: "slow-layer.mjs",
        limits: { timeoutMs: 100 },
      },
      { routes: { "/slow": slow(2000) } },
    );
    const res = await fetchVia(proxy, `${base}/slow`);
    expect(res.status).toBe(200);
    expect(res.text).toBe("slow but sure (through the layer)");
    expect(upstream.hits()).toBe(1);
  });

  it("11 descents get 502, after 10 reached the upstream", async () => {
    const { upstream, proxy, base } = await layerProxy(
      layer(`
        let response;
        for (let i = 0; i < 11; i++) response = await next(request);
        return response;`),
    );
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(502);
    expect(res.text).toMatch(/more than 10 times/);
    expect(upstream.hits()).toBe(10);
    await stillServes(proxy, base);
  });

  it("catching the 11th descent's failure does not help: the 502 sticks", async () => {
    const { proxy, base } = await layerProxy(
      layer(`
        let response;
        for (let i = 0; i < 11; i++) {
          try { response = await next(request); } catch { return new Response("caught", { status: 200 }); }
        }
        return response;`),
    );
    expect((await fetchVia(proxy, `${base}/echo`)).status).toBe(502);
    await stillServes(proxy, base);
  });

  it("a layer that returns nothing gets 502", async () => {
    const { upstream, proxy, base } = await layerProxy(layer(`await next(request);`));
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(502);
    expect(upstream.hits()).toBe(1);
    expect(proxy.logs.some((line) => /handle policy returned undefined, not a Response/.test(JSON.stringify(line)))).toBe(true);
    await stillServes(proxy, base);
  });

  it("sleep(ms) waits inside handle", async () => {
    const { upstream, proxy, base } = await layerProxy(
      layer(`
        const before = Date.now();
        await sleep(20);
        await sleep(0);
        const response = await next(request);
        response.headers.set("x-slept", "yes, clock still " + (Date.now() - before));
        return response;`),
    );
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(200);
    // Every run sees the clock of the call's start.
    expect(res.headers["x-slept"]).toBe("yes, clock still 0");
    expect(upstream.hits()).toBe(1);
  });

  it("a sleep past timeouts.requestMs gets 504 at once, and the upstream is not asked", async () => {
    const { upstream, proxy, base } = await layerProxy(layer(`await sleep(60_000); return next(request);`), { requestMs: 5_000 });
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.status).toBe(504);
    // The layer's own wait, named as such: no upstream was asked (review finding).
    expect(res.headers["x-egressgate-error"]).toBe("EG_HOOK_TIMEOUT");
    expect(res.text).toMatch(/a handle layer asked to sleep 60000 ms, past timeouts\.requestMs \(5000 ms\)/);
    expect(upstream.hits()).toBe(0);
    await stillServes(proxy, base);
  });

  it("requestMs ends a retry loop that keeps sleeping", async () => {
    const { upstream, proxy, base } = await layerProxy(
      layer(`
        for (;;) {
          const response = await next(request);
          if (response.status !== 503) return response;
          try { await sleep(400); } catch { return new Response("gave up", { status: 200 }); }
        }`),
      { routes: { "/down": statuses([503]) }, requestMs: 1_000 },
    );
    const res = await fetchVia(proxy, `${base}/down`);
    expect(res.status).toBe(504);
    expect(upstream.hits()).toBeGreaterThan(0);
    expect(upstream.hits()).toBeLessThan(10);
    await stillServes(proxy, base);
  });

  it("sleep() with a bad argument rejects inside the policy", async () => {
    const { proxy, base } = await layerProxy(
      layer(`
        const errors = [];
        try { await sleep(-1); } catch (error) { errors.push(error.name); }
        try { await sleep("soon"); } catch (error) { errors.push(error.name); }
        return new Response(errors.join(","));`),
    );
    const res = await fetchVia(proxy, `${base}/echo`);
    expect(res.text).toBe("RangeError,RangeError");
  });
});

describe("policies/retry.ts", () => {
  const retry = (): DjsHooksOptions => djsHooksOptionsFromFile(path.join(policiesDir, "retry.ts"));

  it("retries a GET on 503 and 503, and answers the third attempt's 200", async () => {
    const { upstream, proxy, base } = await layerProxy(retry(), { routes: { "/flaky": statuses([503, 503, 200]) } });
    const res = await fetchVia(proxy, `${base}/flaky`);
    expect(res.status).toBe(200);
    expect(res.text).toBe("answer 3 (200)");
    expect(upstream.hits()).toBe(3);
  });

  it("gives up after 3 attempts and answers the last one", async () => {
    const { upstream, proxy, base } = await layerProxy(retry(), { routes: { "/down": statuses([502]) } });
    const res = await fetchVia(proxy, `${base}/down`);
    expect(res.status).toBe(502);
    expect(res.text).toBe("answer 3 (502)");
    expect(upstream.hits()).toBe(3);
  });

  it("honours Retry-After on a 429", async () => {
    const { upstream, proxy, base } = await layerProxy(retry(), { routes: { "/limited": statuses([429, 200], { "retry-after": "1" }) } });
    const res = await fetchVia(proxy, `${base}/limited`);
    expect(res.status).toBe(200);
    expect(upstream.hits()).toBe(2);
  });

  it("answers at once when Retry-After asks for longer than it waits", async () => {
    const { upstream, proxy, base } = await layerProxy(retry(), { routes: { "/limited": statuses([429, 200], { "retry-after": "3600" }) } });
    const res = await fetchVia(proxy, `${base}/limited`);
    expect(res.status).toBe(429);
    expect(upstream.hits()).toBe(1);
  });

  it("retries when the upstream drops the connection (a thrown 502)", async () => {
    const { upstream, proxy, base } = await layerProxy(retry(), { routes: { "/drop": dropping(1) } });
    const res = await fetchVia(proxy, `${base}/drop`);
    expect(res.status).toBe(200);
    expect(res.text).toBe("answered on attempt 2");
    expect(upstream.hits()).toBe(2);
  });

  it("retries a PUT with its whole body on each attempt, and never a POST", async () => {
    const { upstream, proxy, base } = await layerProxy(retry(), { routes: { "/flaky": statuses([503, 200]), "/post": statuses([503, 200]) } });
    const put = await fetchVia(proxy, `${base}/flaky`, { method: "PUT", body: patternBody(upload) });
    expect(put.status).toBe(200);
    expect(upstream.seen.map((s) => `${s.method} ${s.bodyBytes}:${s.bodySha256}`)).toEqual(Array(2).fill(`PUT ${upload}:${patternSha256(upload)}`));
    const post = await fetchVia(proxy, `${base}/post`, { method: "POST", body: "once" });
    expect(post.status).toBe(503);
    expect(upstream.seen.filter((s) => s.url === "/post")).toHaveLength(1);
  });

  it("does not retry a refusal", async () => {
    const { upstream, proxy } = await layerProxy(retry());
    const res = await fetchVia(proxy, `https://other.test:${upstream.port}/echo`);
    expect(res.status).toBe(403);
    expect(upstream.hits()).toBe(0);
  });
});
