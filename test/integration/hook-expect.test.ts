import { describe, expect, it, vi } from "vitest";
import type { HttpHooksOptions } from "../../src/index.js";
import { json, startDecisionServer } from "../helpers/deciders.js";
import { loadPolicy } from "../helpers/djs.js";
import { fetchVia, startTestProxy } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";

/**
 * `Expect` is the proxy's to answer, and never goes upstream (undici refuses to send it). A
 * rewrite that sets it, in any tier, is the rewriting source's failure, 502 `EG_HOOK_FAILED`
 * naming the header, and nothing leaves: it got 502 `EG_UPSTREAM` "UND_ERR_NOT_SUPPORTED: expect
 * header not supported", blamed on the upstream.
 */

type Source = NonNullable<HttpHooksOptions["hooks"]>[number];

/** A decider answering every document with `answer`. */
async function decider(answer: Record<string, unknown>): Promise<{ source: Source; label: string }> {
  const server = await startDecisionServer((_body, _req, res) => json(res, 200, answer));
  const url = `${server.url}/decide`;
  return { source: { webhook: url }, label: `webhook:${url}` };
}

function policy(source: string): { source: Source; label: string } {
  const djsHooks = loadPolicy({ source, filename: "sets-expect.mjs" });
  return { source: djsHooks, label: djsHooks.engine.filename };
}

const callback = (source: Source): { source: Source; label: string } => ({ source, label: "hooks[0]" });

describe.each([
  { how: "a decider's set_headers", make: () => decider({ set_headers: { expect: "100-continue" } }) },
  { how: "a decider's remove_headers", make: () => decider({ remove_headers: ["Expect"] }) },
  { how: "a tier-3 onRequest, in place", make: async () => callback({ onRequest: (r: Request) => void r.headers.set("expect", "100-continue") }) },
  { how: "a tier-3 onRequest's new Request", make: async () => callback({ onRequest: (r: Request) => new Request(r.url, { headers: { expect: "100-continue" } }) }) },
  { how: "a tier-3 layer's next()", make: async () => callback({ handle: (r: Request, next: (r: Request) => Promise<Response>) => next(new Request(r.url, { headers: { expect: "100-continue" } })) }) },
  { how: "a tier-2 onRequest, in place", make: async () => policy(`export function onRequest(r) { r.headers.set("expect", "100-continue"); }`) },
  { how: "a tier-2 onRequest's new Request", make: async () => policy(`export function onRequest(r) { return new Request(r.url, { headers: { expect: "100-continue" } }); }`) },
  { how: "a tier-2 layer's next()", make: async () => policy(`export function handle(r, next) { return next(new Request(r.url, { headers: { expect: "100-continue" } })); }`) },
])("an expect header from $how", ({ how, make }) => {
  it("is that source's failure, 502 EG_HOOK_FAILED naming expect, and nothing goes upstream", async () => {
    const upstream = await startUpstream();
    const { source, label } = await make();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [source] });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo`);
    expect(res.status).toBe(502);
    expect(upstream.hits()).toBe(0);
    const line = await vi.waitFor(() => {
      const found = proxy.logs.find((l) => l["msg"] === "request");
      if (found === undefined) throw new Error("no decision line yet");
      return found;
    });
    expect(line).toMatchObject({ status: 502, code: "EG_HOOK_FAILED", source: label });
    // A decider's answer is malformed (its detail says why); a hook's failure names the header to the guest.
    expect(how.includes("decider") ? String(line["detail"]) : res.text).toMatch(/may not change expect|has an "expect" header/);
  });
});
