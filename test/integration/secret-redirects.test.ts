import type { IncomingMessage, ServerResponse } from "node:http";
import { describe, expect, it } from "vitest";
import type { HttpHooksOptions } from "../../src/index.js";
import { fetchVia, startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { startUpstream, type Upstream } from "../helpers/upstream.js";

/**
 * Issue 14: an in-scope upstream that echoes what it received can re-encode a substituted value
 * into a redirect's Location. The value has mixed case, a space, and characters that URL
 * encoders treat differently.
 */
const VALUE = "S3cr3t V4lue_abc-XYZ.123";

/** The ways an upstream might write the value into a URL. */
const forms: Record<string, (value: string) => string> = {
  raw: (v) => v,
  "upper-case": (v) => v.toUpperCase(),
  "lower-case": (v) => v.toLowerCase(),
  base64: (v) => Buffer.from(v).toString("base64"),
  "base64 after a prefix, at another byte alignment": (v) => Buffer.from(`id:${v}`).toString("base64"),
  "base64url without padding": (v) => Buffer.from(`x${v}`).toString("base64url"),
  "base64, then percent-encoded": (v) => encodeURIComponent(Buffer.from(`ab${v}`).toString("base64")),
  // Line-wrapped base64 (a black-box run's echo: MIME and openssl wrap long tokens).
  "base64 with a percent-encoded space inside": (v) => {
    const e = Buffer.from(v).toString("base64");
    return `${e.slice(0, 20)}%20${e.slice(20)}`;
  },
  "base64 wrapped with a percent-encoded line break": (v) => {
    const e = Buffer.from(`id:${v}`).toString("base64");
    return `${e.slice(0, 16)}%0D%0A${e.slice(16)}`;
  },
  "base64 twice": (v) => Buffer.from(Buffer.from(v).toString("base64")).toString("base64"),
  "lower-case hex": (v) => Buffer.from(v).toString("hex"),
  "upper-case hex": (v) => Buffer.from(v).toString("hex").toUpperCase(),
  "percent-encoded": (v) => encodeURIComponent(v),
  "percent-encoded twice": (v) => encodeURIComponent(encodeURIComponent(v)),
  "percent-encoded with + for space": (v) => encodeURIComponent(v).replaceAll("%20", "+"),
  "every byte percent-encoded, in upper case": (v) => [...Buffer.from(v.toUpperCase())].map((b) => `%${b.toString(16).padStart(2, "0")}`).join(""),
};

/** Where in the next hop's URL the upstream puts it. */
const places: Record<string, (encoded: string, origin: string) => string> = {
  path: (e, origin) => `${origin}/echo/${e}`,
  query: (e, origin) => `${origin}/echo?state=${e}`,
  // A black-box run (fifth session): percent, wrapped, base64 of this URL makes the same bytes as
  // base64 alone, and the scan met them first with no pass left, so base64 twice went through.
  "query, after a base64 run with a %20 in it": (e, origin) => `${origin}/echo?a=QUFBQUFBQUFBQUFBQUFBQUFB%20QUFB&state=${e}`,
  userinfo: (e, origin) => origin.replace("://", `://${e}:pw@`),
  fragment: (e, origin) => `${origin}/echo#${e}`,
};

interface Setup {
  readonly proxy: TestProxy;
  readonly upstream: Upstream;
  readonly placeholder: string;
  readonly base: string;
  readonly foreign: string;
  /** Requests other.test received. */
  readonly foreignHits: () => number;
}

/**
 * api.test (the secret's host) answers `/reencode?form=F&place=P` with a 302 to other.test
 * quoting the Bearer token it received, encoded as F, at P. `/to-cdn` redirects to other.test
 * with a presigned-style URL that holds no copy of the value.
 */
async function setup(extra: Partial<HttpHooksOptions> = {}, secret: Record<string, unknown> = {}): Promise<Setup> {
  let port = 0;
  const foreignOrigin = (): string => `https://other.test:${port}`;
  const upstream = await startUpstream({
    names: ["api.test", "other.test"],
    routes: {
      "/reencode": (req: IncomingMessage, res: ServerResponse, _body: Buffer, url: URL) => {
        const token = String(req.headers["authorization"] ?? "").replace(/^Bearer /, "");
        const encoded = forms[url.searchParams.get("form")!]!(token);
        res.writeHead(302, { location: places[url.searchParams.get("place")!]!(encoded, foreignOrigin()) });
        res.end();
      },
      "/to-cdn": (_req: IncomingMessage, res: ServerResponse) => {
        const signature = "9f2c".repeat(16);
        res.writeHead(302, {
          location: `${foreignOrigin()}/echo?X-Amz-Credential=AKIAEXAMPLE%2F20240101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Expires=300&X-Amz-Signature=${signature}`,
        });
        res.end();
      },
    },
  });
  port = upstream.port;
  const proxy = await startTestProxy({
    allowedInternalHosts: ["api.test", "other.test"],
    secrets: { TOKEN: { hosts: ["api.test"], value: VALUE, ...secret } },
    ...extra,
  });
  return {
    proxy,
    upstream,
    placeholder: proxy.guestEnv()["TOKEN"]!,
    base: `https://api.test:${port}`,
    foreign: foreignOrigin(),
    foreignHits: () => upstream.seen.filter((s) => String(s.headers["host"]).startsWith("other.test")).length,
  };
}

describe("secretRedirects: scan (the default)", () => {
  it.each(Object.keys(forms))("a value re-encoded %s into the path, query, userinfo or fragment of a redirect to another host gets 403 at that hop", async (form) => {
    const s = await setup();
    for (const place of Object.keys(places)) {
      const res = await fetchVia(s.proxy, `${s.base}/reencode?form=${encodeURIComponent(form)}&place=${encodeURIComponent(place)}`, {
        headers: { authorization: `Bearer ${s.placeholder}` },
      });
      expect(res.status, `${form} in the ${place}: ${res.text}`).toBe(403);
      expect(res.text).toMatch(/carries the value of secret TOKEN .*the redirect is not followed|URL carries the value of secret TOKEN/);
      // The 3xx is not passed on: its Location holds the value.
      expect(res.headers["location"]).toBeUndefined();
      expect(res.text).not.toContain(forms[form]!(VALUE));
    }
    expect(s.foreignHits()).toBe(0);
    expect(s.upstream.hits()).toBe(Object.keys(places).length);
  });

  it("the refusal says how the value was encoded and where it was found", async () => {
    const s = await setup();
    const res = await fetchVia(s.proxy, `${s.base}/reencode?form=base64&place=query`, { headers: { authorization: `Bearer ${s.placeholder}` } });
    expect(res.status).toBe(403);
    // The host is not named: the Location that named it holds the value (and a host can hold a copy
    // that the URL parser lowercased beyond recognition).
    expect(res.text).toMatch(/a redirect's URL carries the value of secret TOKEN to a host outside its hosts; it was found base64-encoded in the query/);
    expect(res.text).not.toContain("other.test");
  });

  it("a redirect that leaves the secret's hosts with no copy of the value (a presigned CDN URL) is followed", async () => {
    const s = await setup();
    const res = await fetchVia(s.proxy, `${s.base}/to-cdn`, { headers: { authorization: `Bearer ${s.placeholder}` } });
    expect(res.status, res.text).toBe(200);
    expect(JSON.parse(res.text).path).toMatch(/^\/echo\?X-Amz-Credential=/);
    expect(s.foreignHits()).toBe(1);
    // The cross-origin hop dropped Authorization, as before.
    expect(JSON.stringify(s.upstream.seen.at(-1))).not.toContain("S3cr3t");
  });

  it("a redirect that stays within the secret's hosts may carry the value", async () => {
    const s = await setup();
    const res = await fetchVia(s.proxy, `${s.base}/redirect?to=${encodeURIComponent(`/echo?copy=${Buffer.from(VALUE).toString("base64")}`)}`, {
      headers: { authorization: `Bearer ${s.placeholder}` },
    });
    expect(res.status, res.text).toBe(200);
  });
});

describe("secretRedirects: refuse", () => {
  it("a redirect that leaves the secret's hosts is refused even with no copy of the value, and the other host sees nothing", async () => {
    const s = await setup({ secretRedirects: "refuse" });
    const res = await fetchVia(s.proxy, `${s.base}/to-cdn`, { headers: { authorization: `Bearer ${s.placeholder}` } });
    expect(res.status).toBe(403);
    expect(res.text).toMatch(/leaves the hosts of secret TOKEN, which this request carried; with secretRedirects "refuse"/);
    expect(res.text).not.toContain("other.test");
    expect(s.foreignHits()).toBe(0);
  });

  it("a host named in followRedirectsTo is followed", async () => {
    const s = await setup({ secretRedirects: "refuse", followRedirectsTo: ["other.test"] });
    const res = await fetchVia(s.proxy, `${s.base}/to-cdn`, { headers: { authorization: `Bearer ${s.placeholder}` } });
    expect(res.status, res.text).toBe(200);
    expect(s.foreignHits()).toBe(1);
  });

  it("a host named in followRedirectsTo is still scanned for the value", async () => {
    const s = await setup({ secretRedirects: "refuse", followRedirectsTo: ["other.test"] });
    const res = await fetchVia(s.proxy, `${s.base}/reencode?form=${encodeURIComponent("lower-case hex")}&place=path`, {
      headers: { authorization: `Bearer ${s.placeholder}` },
    });
    expect(res.status).toBe(403);
    expect(s.foreignHits()).toBe(0);
  });

  it("the mode can be set per secret, and applies only to requests that carried that secret", async () => {
    const s = await setup({}, { secretRedirects: "refuse" });
    const withSecret = await fetchVia(s.proxy, `${s.base}/to-cdn`, { headers: { authorization: `Bearer ${s.placeholder}` } });
    expect(withSecret.status).toBe(403);
    const without = await fetchVia(s.proxy, `${s.base}/to-cdn`, { headers: { authorization: "Bearer something-else" } });
    expect(without.status, without.text).toBe(200);
    const sameHost = await fetchVia(s.proxy, `${s.base}/redirect?to=%2Fecho`, { headers: { authorization: `Bearer ${s.placeholder}` } });
    expect(sameHost.status, sameHost.text).toBe(200);
    expect(s.foreignHits()).toBe(1);
  });
});
