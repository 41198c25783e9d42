import { describe, expect, it } from "vitest";
import { fetchVia, startTestProxy } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";

interface Echo {
  method: string;
  path: string;
  headers: Record<string, string | undefined>;
  bodyBytes: number;
}

function redirect(to: string, status = 302): string {
  return `/redirect?status=${status}&to=${encodeURIComponent(to)}`;
}

describe("redirects are followed by the proxy and checked at every hop", () => {
  it("an allowed chain of redirects is followed to the final response", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}${redirect(redirect("/echo?done=1", 301), 307)}`);
    expect(res.status).toBe(200);
    expect((JSON.parse(res.text) as Echo).path).toBe("/echo?done=1");
    expect(upstream.seen.map((s) => s.url.split("?")[0])).toEqual(["/redirect", "/redirect", "/echo"]);
  });

  it("a hop to a host outside the allowlist gets 403 and that host is never contacted", async () => {
    const upstream = await startUpstream({ names: ["api.test", "other.test"] });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}${redirect(`https://other.test:${upstream.port}/echo`)}`);
    expect(res.status).toBe(403);
    expect(res.text).toMatch(/host "other\.test" is not in allowedHosts/);
    expect(upstream.hits()).toBe(1);
  });

  it("a hop to an internal literal address gets 403", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], allowedHosts: ["*"] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}${redirect(`http://127.1:${upstream.port}/echo`)}`);
    expect(res.status).toBe(403);
    expect(res.text).toMatch(/loopback address/);
    expect(upstream.hits()).toBe(1);
  });

  it("a redirect loop ends with 508 after 10 hops", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/loop`);
    expect(res.status).toBe(508);
    expect(res.text).toMatch(/more than 10 redirects/);
    expect(upstream.hits()).toBe(11);
  });

  it("303 turns POST into GET and drops the body and its headers", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}${redirect("/echo", 303)}`, {
      method: "POST",
      body: "payload",
      headers: { "content-type": "text/plain" },
    });
    expect(res.status).toBe(200);
    const echo = JSON.parse(res.text) as Echo;
    expect(echo.method).toBe("GET");
    expect(echo.bodyBytes).toBe(0);
    expect(echo.headers["content-type"]).toBeUndefined();
    expect(upstream.seen[0]!.bodyBytes).toBe(7);
  });

  it("302 turns POST into GET, but keeps PUT", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const post = await fetchVia(proxy, `https://api.test:${upstream.port}${redirect("/echo", 302)}`, { method: "POST", body: "x" });
    expect((JSON.parse(post.text) as Echo).method).toBe("GET");
    const del = await fetchVia(proxy, `https://api.test:${upstream.port}${redirect("/echo", 302)}`, { method: "DELETE" });
    expect((JSON.parse(del.text) as Echo).method).toBe("DELETE");
  });

  it("307 with a body that was already streamed answers 502 instead of sending an empty body", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}${redirect("/echo", 307)}`, { method: "POST", body: "payload" });
    expect(res.status).toBe(502);
    expect(res.text).toMatch(/already streamed and cannot be re-sent/);
    expect(upstream.hits()).toBe(1);
  });

  it("a cross-origin hop drops Authorization and Cookie, a same-origin hop keeps them", async () => {
    const upstream = await startUpstream({ names: ["api.test", "other.test"] });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test", "other.test"] });
    const headers = { authorization: "Bearer token-1", cookie: "session=1", "x-other": "kept" };
    const same = await fetchVia(proxy, `https://api.test:${upstream.port}${redirect("/echo")}`, { headers });
    const sameEcho = JSON.parse(same.text) as Echo;
    expect(sameEcho.headers["authorization"]).toBe("Bearer token-1");
    expect(sameEcho.headers["cookie"]).toBe("session=1");

    const cross = await fetchVia(proxy, `https://api.test:${upstream.port}${redirect(`https://other.test:${upstream.port}/echo`)}`, { headers });
    expect(cross.status).toBe(200);
    const crossEcho = JSON.parse(cross.text) as Echo;
    expect(crossEcho.headers["host"]).toBe(`other.test:${upstream.port}`);
    expect(crossEcho.headers["authorization"]).toBeUndefined();
    expect(crossEcho.headers["cookie"]).toBeUndefined();
    expect(crossEcho.headers["x-other"]).toBe("kept");
  });

  it("a redirect to a non-HTTP scheme answers 502", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}${redirect("ftp://api.test/file")}`);
    expect(res.status).toBe(502);
    expect(res.text).toMatch(/unsupported scheme/);
  });
});
