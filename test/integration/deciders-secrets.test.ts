import type { ServerResponse } from "node:http";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { ProxyAgent, request } from "undici";
import { describe, expect, it } from "vitest";
import { json, loggedDocuments, shellDecider, startDecisionServer } from "../helpers/deciders.js";
import { startGuestsProxy } from "../helpers/guests.js";
import { createHttpHooks } from "../../src/index.js";
import { fetchVia, startTestProxy, tempDir } from "../helpers/proxy.js";
import { startUpstream, type Echo, type Route } from "../helpers/upstream.js";

const value = "gh-s3cr3t-VALUE-0123456789";
const rotated = "gh-r0tated-VALUE-9876543210";

/** Every decider kind at once, asked in both phases, each recording the documents it was sent. */
async function everyKind(extra: { includeBody?: boolean } = {}, routes?: Record<string, Route>) {
  const log = join(tempDir(), "docs.jsonl");
  const allow = (_doc: unknown, _req: unknown, res: ServerResponse): void => json(res, 200, { decision: "allow" });
  const webhook = await startDecisionServer(allow);
  const opa = await startDecisionServer((_doc, _req, res) => json(res, 200, { result: true }));
  const upstream = await startUpstream(routes === undefined ? {} : { routes });
  const phases = ["request", "response"] as const;
  const proxy = await startTestProxy({
    allowedInternalHosts: ["api.test"],
    secrets: { GH_TOKEN: { hosts: ["api.test"], value } },
    hooks: [
      { command: [shellDecider, log], phases: [...phases], ...extra },
      { webhook: webhook.url, phases: [...phases], ...extra },
      { opa: `${opa.url}/v1/data/egress`, phases: [...phases], ...extra },
    ],
  });
  const placeholder = proxy.guestEnv()["GH_TOKEN"]!;
  /** Every document every source was sent, as raw text. */
  const sent = (): string[] => [...loggedDocuments(log).map((d) => JSON.stringify(d)), ...webhook.raw, ...opa.raw];
  return { proxy, upstream, placeholder, sent, webhook, log, base: `https://api.test:${upstream.port}` };
}

function base64(text: string): string {
  return Buffer.from(text).toString("base64");
}

describe("deciders never see a real secret value", () => {
  it("the request phase sees the placeholder; the response phase, after substitution, sees it too", async () => {
    const { proxy, upstream, placeholder, sent, webhook, base } = await everyKind();
    const res = await fetchVia(proxy, `${base}/echo`, { headers: { authorization: `Bearer ${placeholder}` } });
    expect(res.status).toBe(200);
    // The upstream did get the value: the documents are mapped, not the request.
    expect((JSON.parse(res.text) as Echo).headers["authorization"]).toBe(`Bearer ${value}`);
    expect(upstream.hits()).toBe(1);
    const docs = sent();
    expect(docs).toHaveLength(6);
    for (const doc of docs) {
      expect(doc).not.toContain(value);
      expect(doc).toContain(`Bearer ${placeholder}`);
    }
    expect(webhook.received.map((d) => d["phase"])).toEqual(["request", "response"]);
  });

  it("on a redirect hop, whose request already carries the value, every source gets the placeholder back (Basic credentials too)", async () => {
    const { proxy, upstream, placeholder, sent, log, base } = await everyKind();
    const res = await fetchVia(proxy, `${base}/redirect?to=/echo%3Fhop%3D2`, {
      headers: { authorization: `Basic ${base64(`user:${placeholder}`)}`, "x-token": placeholder },
    });
    expect(res.status).toBe(200);
    const echo = JSON.parse(res.text) as Echo;
    expect(echo.headers["x-token"]).toBe(value);
    expect(echo.headers["authorization"]).toBe(`Basic ${base64(`user:${value}`)}`);
    expect(upstream.hits()).toBe(2);
    const docs = sent();
    // Each source: the first hop's request, the second hop's request, and the response.
    expect(docs).toHaveLength(9);
    for (const doc of docs) {
      expect(doc).not.toContain(value);
      expect(doc).not.toContain(base64(`user:${value}`));
    }
    const hop = loggedDocuments(log).find((d) => (d["request"] as { url: string }).url.endsWith("hop=2"));
    expect(hop).toMatchObject({ phase: "request", request: { headers: { "x-token": placeholder, authorization: `Basic ${base64(`user:${placeholder}`)}` } } });
  });

  it("with includeBody, a response body that echoes the value carries the placeholder instead", async () => {
    const { proxy, placeholder, sent, webhook, base } = await everyKind({ includeBody: true });
    const res = await fetchVia(proxy, `${base}/echo`, { headers: { "x-token": placeholder } });
    expect(res.status).toBe(200);
    expect(res.text).toContain(value);
    for (const doc of sent()) expect(doc).not.toContain(value);
    const response = webhook.received.find((d) => d["phase"] === "response") as { response: { body: { data: string } } };
    expect(response.response.body.data).toContain(placeholder);
  });

  // The header values were mapped, and the names went as they came: an upstream that echoed the
  // token it was sent into a field's name showed it to every decider (black-box finding).
  it("a response field whose name echoes the value reaches no decider with it, in any letter case", async () => {
    const named: Route = (req, res) => {
      res.setHeader(`x-seen-${String(req.headers["x-token"])}`, "1");
      res.end("ok");
    };
    const { proxy, placeholder, sent, webhook, base } = await everyKind({}, { "/named": named });
    const res = await fetchVia(proxy, `${base}/named`, { headers: { "x-token": placeholder } });
    expect(res.status).toBe(200);
    // The guest gets the response as it came: responses are never mapped.
    expect(res.headers[`x-seen-${value.toLowerCase()}`]).toBe("1");
    const docs = sent();
    expect(docs).toHaveLength(6);
    for (const doc of docs) expect(doc.toLowerCase()).not.toContain(value.toLowerCase());
    const response = webhook.received.find((d) => d["phase"] === "response") as { response: { headers: Record<string, string> } };
    expect(response.response.headers).toHaveProperty(["x-seen-[REDACTED:GH_TOKEN]"], "1");
  });

  it("with includeBody, a response body in a coding the proxy cannot undo is refused (502), not sent to any decider; one it can undo shows the placeholder", async () => {
    /** `/coded?codings=a,b`: "you sent <x-token>", gzipped once per `gzip` and labelled with every name given. */
    const coded: Route = (req, res, _body, url) => {
      const codings = url.searchParams.get("codings")!.split(",");
      let body = Buffer.from(`you sent ${String(req.headers["x-token"])}`);
      for (const coding of codings) if (coding === "gzip") body = gzipSync(body);
      res.writeHead(200, { "content-type": "text/plain", "content-encoding": codings.join(", "), "content-length": body.length });
      res.end(body);
    };
    const { proxy, placeholder, sent, webhook, base } = await everyKind({ includeBody: true }, { "/coded": coded });
    for (const codings of ["gzip,gzip,gzip,gzip", "gzip,x-custom", "x-custom"]) {
      const res = await fetchVia(proxy, `${base}/coded?codings=${codings}`, { headers: { "x-token": placeholder } });
      expect(res.status, codings).toBe(502);
      expect(res.text).toMatch(/content coding the proxy cannot undo .*cannot be searched for secret values/);
    }
    expect(webhook.received.filter((d) => d["phase"] === "response")).toHaveLength(0);
    const undone = await fetchVia(proxy, `${base}/coded?codings=gzip,gzip`, { headers: { "x-token": placeholder } });
    expect(undone.status).toBe(200);
    const response = webhook.received.find((d) => d["phase"] === "response") as { response: { body: { data: string } } };
    expect(response.response.body.data).toBe(`you sent ${placeholder}`);
    for (const doc of sent()) expect(doc).not.toContain(value);
  });

  it("a retired value the guest sends is redacted in the document, and the request is refused", async () => {
    const { proxy, upstream, sent, base } = await everyKind();
    proxy.secretManager.updateSecret("GH_TOKEN", { value: rotated });
    const res = await fetchVia(proxy, `${base}/echo?x=${value}`, { headers: { "x-old": `token ${value}` } });
    expect(res.status).toBe(403);
    expect(upstream.hits()).toBe(0);
    const docs = sent();
    expect(docs.length).toBeGreaterThan(0);
    for (const doc of docs) {
      expect(doc).not.toContain(value);
      expect(doc).not.toContain(rotated);
      expect(doc).toContain("[REDACTED:GH_TOKEN]");
    }
  });
});

describe("deciders after a reload", () => {
  it("a value the reload removed with every other secret is redacted in the documents, and refused", async () => {
    const webhook = await startDecisionServer((_doc, _req, res) => json(res, 200, { decision: "allow" }));
    const upstream = await startUpstream();
    const hooks = [{ webhook: webhook.url }];
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], secrets: { GH_TOKEN: { hosts: ["api.test"], value } }, hooks });
    const next = createHttpHooks({ allowedInternalHosts: ["api.test"], hooks });
    await proxy.reload({ httpHooks: next.httpHooks, env: next.env, resolve: { "api.test": ["127.0.0.1"] } });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`, { headers: { "x-old": `token ${value}` } });
    expect(res.status).toBe(403);
    expect(upstream.hits()).toBe(0);
    expect(webhook.raw.length).toBe(1);
    expect(webhook.raw[0]).not.toContain(value);
    expect(webhook.raw[0]).toContain("[REDACTED:GH_TOKEN]");
  });
});

describe("deciders with several guests", () => {
  it("each guest's documents name it, and each guest's answers are cached apart", async () => {
    const upstream = await startUpstream({ names: ["api.test"] });
    const hook = await startDecisionServer((doc, _req, res) => {
      if (doc["guest"] === "b") return json(res, 200, { decision: "block", reason: "not for b" });
      json(res, 200, { decision: "allow" });
    });
    const shared = { webhook: hook.url, cacheMs: 60_000 };
    const proxy = await startGuestsProxy({
      a: { allowedInternalHosts: ["api.test"], hooks: [shared] },
      b: { allowedInternalHosts: ["api.test"], hooks: [shared] },
    });
    const get = async (guest: string): Promise<number> => {
      const agent = new ProxyAgent({ uri: proxy.guestEnv(guest)["HTTPS_PROXY"]!, requestTls: { ca: proxy.caCertPem } });
      try {
        const res = await request(`https://api.test:${upstream.port}/echo`, { dispatcher: agent });
        await res.body.dump();
        return res.statusCode;
      } finally {
        await agent.close();
      }
    };
    expect(await get("a")).toBe(200);
    expect(await get("b")).toBe(403);
    expect(await get("a")).toBe(200);
    expect(await get("b")).toBe(403);
    // One ask per guest, each answer kept for that guest only.
    expect(hook.received.map((d) => d["guest"])).toEqual(["a", "b"]);
    expect(upstream.hits()).toBe(2);
  });
});
