import { describe, expect, it, onTestFinished, vi } from "vitest";
import { request } from "undici";
import type { AuditRecord, HttpHooksOptions } from "../../src/index.js";
import { json, startDecisionServer } from "../helpers/deciders.js";
import { loadPolicy } from "../helpers/djs.js";
import { proxyAgent, startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { openRaw } from "../helpers/raw.js";
import { startUpstream, type Route } from "../helpers/upstream.js";

/**
 * Bodies a source reads whole: a tier-2 policy (the proxy loads the body between its runs) and an
 * external decider with `includeBody` (the proxy reads it for the document), beside tier 3, whose
 * hook reads the body itself within its call. A body that never ends is held to the same
 * deadline in all three, and a body an earlier hook's Response made is that hook's when it fails.
 */

type Hooks = NonNullable<HttpHooksOptions["hooks"]>;
type Kind = "tier2" | "tier3" | "decider";

/** An allow for every document. */
async function allowingDecider(): Promise<string> {
  const server = await startDecisionServer((_body, _req, res) => json(res, 200, { decision: "allow" }));
  return `${server.url}/decide`;
}

/** A source of `kind` that reads the whole body in `phase`, and the label the log gives it. */
async function bodyReader(kind: Kind, phase: "request" | "response", index: number): Promise<{ source: Hooks[number]; label: string }> {
  if (kind === "tier3") {
    const source = phase === "request" ? { onRequest: async (r: Request) => void (await r.clone().text()) } : { onResponse: async (r: Response) => void (await r.text()) };
    return { source, label: `hooks[${index}]` };
  }
  if (kind === "tier2") {
    const policy =
      phase === "request"
        ? loadPolicy({ source: `export async function onRequest(r) { await r.clone().text(); }`, filename: "reads-request.mjs" })
        : loadPolicy({ source: `export async function onResponse(r) { await r.text(); }`, filename: "reads-response.mjs" });
    return { source: policy, label: policy.engine.filename };
  }
  const url = await allowingDecider();
  return { source: { webhook: url, includeBody: true, phases: [phase] }, label: `webhook:${url}` };
}

/** A route that sends a byte every 200 ms and never ends: never silent long enough for upstreamBodyMs. */
const trickle: Route = (_req, res) => {
  res.writeHead(200, { "content-type": "text/plain" });
  const timer = setInterval(() => res.write("a"), 200);
  res.on("close", () => clearInterval(timer));
};

/** The decision line of the proxy's only request. */
function decision(proxy: TestProxy): Record<string, unknown> | undefined {
  return proxy.logs.find((line) => line["msg"] === "request");
}

describe.each([
  { kind: "tier3" as const, timeout: /onRequest hook did not settle within 1000 ms/ },
  { kind: "tier2" as const, timeout: /onRequest policy did not settle within 1000 ms: the request body it reads had not ended/ },
  { kind: "decider" as const, timeout: /did not settle within 1000 ms: the request body it reads had not ended/ },
])("a request body that never ends, read whole by a $kind source", ({ kind, timeout }) => {
  it("is answered 504 EG_HOOK_TIMEOUT at timeouts.hookMs and the connection closed, though the guest keeps sending", async () => {
    const upstream = await startUpstream({ tls: false });
    const { source, label } = await bodyReader(kind, "request", 0);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [source] }, { timeouts: { hookMs: 1000 } });
    const guest = await openRaw(proxy.port);
    const target = `api.test:${upstream.port}`;
    guest.write(`POST http://${target}/echo HTTP/1.1\r\nhost: ${target}\r\ntransfer-encoding: chunked\r\n\r\n`);
    // A byte every 200 ms: never idle for idleMs, never silent, never done.
    const timer = setInterval(() => guest.write("1\r\na\r\n"), 200);
    onTestFinished(() => clearInterval(timer));
    const started = Date.now();
    const res = await guest.readResponse({ timeoutMs: 8000 });
    expect(res.status).toBe(504);
    expect(res.body).toMatch(timeout);
    expect(Date.now() - started).toBeGreaterThanOrEqual(900);
    expect(await guest.closesWithin(5000)).toBe(true);
    expect(upstream.hits()).toBe(0);
    await vi.waitFor(() => expect(decision(proxy)).toMatchObject({ status: 504, code: "EG_HOOK_TIMEOUT", source: label }));
  });
});

describe.each([
  { kind: "tier3" as const, timeout: /onResponse hook did not settle within 1000 ms/ },
  { kind: "tier2" as const, timeout: /onResponse policy did not settle within 1000 ms: the response body it reads had not ended/ },
  { kind: "decider" as const, timeout: /did not settle within 1000 ms: the response body it reads had not ended/ },
])("an upstream body that trickles in for ever, read whole by a $kind source", ({ kind, timeout }) => {
  it("is answered 504 EG_HOOK_TIMEOUT at timeouts.hookMs, though upstreamBodyMs never fires", async () => {
    const upstream = await startUpstream({ routes: { "/trickle": trickle } });
    const { source, label } = await bodyReader(kind, "response", 0);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [source] }, { timeouts: { hookMs: 1000 } });
    const res = await request(`https://api.test:${upstream.port}/trickle`, { dispatcher: proxyAgent(proxy), headersTimeout: 8000 });
    expect(res.statusCode).toBe(504);
    expect(await res.body.text()).toMatch(timeout);
    await vi.waitFor(() => expect(decision(proxy)).toMatchObject({ status: 504, code: "EG_HOOK_TIMEOUT", source: label }));
  });
});

/** A tier-3 onResponse (hooks[0]) answering with a body that sends "part" and then breaks, or falls silent. */
function maker(failure: "breaks" | "falls silent"): Hooks[number] {
  const encoder = new TextEncoder();
  return {
    onResponse: () =>
      new Response(
        new ReadableStream<Uint8Array>({
          start(controller) {
            controller.enqueue(encoder.encode("part"));
            if (failure === "breaks") setTimeout(() => controller.error(new Error("the hook's stream broke")), 20);
          },
        }),
        { status: 200, headers: { "content-type": "text/plain" } },
      ),
  };
}

describe.each([
  // Silent for upstreamBodyMs first, or unfinished at hookMs first (tier 3's reader is its own call, timed as a whole).
  ...(["tier3", "tier2", "decider"] as const).flatMap((kind) => [
    { kind, failure: "breaks" as const, timeouts: {}, status: 502, code: "EG_HOOK_FAILED", kindOfFailure: "throw", reason: /^the body of the Response onResponse returned failed while .+ read it \(see the proxy log\)$/ },
    {
      kind,
      failure: "falls silent" as const,
      timeouts: { upstreamBodyMs: 500, hookMs: 20_000 },
      status: 504,
      code: "EG_HOOK_TIMEOUT",
      kindOfFailure: "time",
      reason: /^the body of the Response onResponse returned produced nothing for 500 ms \(timeouts\.upstreamBodyMs\) while .+ read it$/,
    },
  ]),
  ...(["tier2", "decider"] as const).map((kind) => ({
    kind,
    failure: "falls silent" as const,
    timeouts: { upstreamBodyMs: 60_000, hookMs: 800 },
    status: 504,
    code: "EG_HOOK_TIMEOUT",
    kindOfFailure: "time",
    reason: /^the body of the Response onResponse returned had not ended within 800 ms \(timeouts\.hookMs\) while .+ read it$/,
  })),
])("the body of an earlier hook's Response that $failure while a $kind source reads it ($timeouts)", ({ kind, failure, timeouts, status, code, kindOfFailure, reason }) => {
  it(`is that hook's failure (${status} ${code}), not the upstream's, in the answer, the log and the audit record`, async () => {
    const upstream = await startUpstream();
    const { source, label } = await bodyReader(kind, "response", 1);
    const records: AuditRecord[] = [];
    const proxy = await startTestProxy(
      { allowedInternalHosts: ["api.test"], hooks: [maker(failure), source] },
      { timeouts, onDecision: (record) => void records.push(record) },
    );
    const res = await request(`https://api.test:${upstream.port}/echo`, { dispatcher: proxyAgent(proxy), headersTimeout: 8000 });
    expect(res.statusCode).toBe(status);
    const text = (await res.body.text()).trim();
    expect(text).not.toMatch(/upstream response|was cut/);
    await vi.waitFor(() => expect(records).toHaveLength(1));
    const [record] = records;
    expect(record).toMatchObject({ status, code, source: "hooks[0]" });
    expect(record!.reason).toMatch(reason);
    expect(record!.reason).toContain(kind === "tier3" ? "the onResponse hook" : kind === "tier2" ? "the onResponse policy" : label);
    // The hook's entry holds the failure; the reader, which decided nothing, has none.
    const onResponse = record!.sources.filter((entry) => entry.phase === "onResponse");
    expect(onResponse).toEqual([expect.objectContaining({ source: "hooks[0]", decision: "error", status, failure: kindOfFailure })]);
    expect(decision(proxy)).toMatchObject({ status, code, source: "hooks[0]" });
  });
});
