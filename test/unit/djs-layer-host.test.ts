import { Readable } from "node:stream";
import { describe, expect, it } from "vitest";
import type { DjsEngine } from "../../src/djs/engine.js";
import type { CallFields, CallReply, Outcome } from "../../src/djs/protocol.js";
import { EgressError } from "../../src/errors.js";
import { djsHandle, maxLayerEffects } from "../../src/pipeline/djs-layer.js";
import type { OutboundRequest } from "../../src/pipeline/exchange.js";
import type { HookedResponse } from "../../src/pipeline/hook-phases.js";
import type { LayerNext } from "../../src/pipeline/hook-source.js";

const limits = { requestBodyBytes: 1 << 20, responseBodyBytes: 1 << 20, hookMs: 1000 };
const request: OutboundRequest = { method: "GET", url: new URL("https://api.test/x"), headers: [], body: null };

/** An engine whose policy answers with `script(message)`, recording every call it gets. */
function scripted(script: (message: CallFields, run: number) => Outcome): { engine: DjsEngine; calls: CallFields[] } {
  const calls: CallFields[] = [];
  const engine = {
    filename: "/policies/fake.mjs",
    limits: { timeoutMs: 100, memoryBytes: 32 << 20, stackBytes: 256 << 10, returnBytes: 16 << 20, maxCalls: 512 },
    call: async (message: CallFields): Promise<CallReply> => {
      calls.push(message);
      return { id: calls.length, outcome: script(message, calls.length - 1) };
    },
  } as unknown as DjsEngine;
  return { engine, calls };
}

/** A LayerNext whose descents answer 200 with a body, recording the responses it gave. */
function descents(): { layer: LayerNext; given: HookedResponse[]; sleeps: number[] } {
  const given: HookedResponse[] = [];
  const sleeps: number[] = [];
  const layer: LayerNext = {
    next: async () => {
      const response = { status: 200, headers: ["content-type", "text/plain"], body: Readable.from([Buffer.from("body")]) };
      given.push(response);
      return response;
    },
    sleep: async (ms) => void sleeps.push(ms),
  };
  return { layer, given, sleeps };
}

const nextEffect = (i: number): Outcome => ({ t: "effect", k: "next", i, sig: `next ${i}`, method: "GET", url: "https://api.test/x", headers: [], body: null });

describe("the proxy's side of a tier-2 layer", () => {
  it("performs each effect once, hands the journal to every rerun, and passes next()'s own response through", async () => {
    const { engine, calls } = scripted((message) => {
      const done = message.journal?.length ?? 0;
      return done < 2 ? nextEffect(done) : { t: "passed", i: 1 };
    });
    const { layer, given } = descents();
    const answer = await djsHandle({ engine, log: undefined, requestId: 1 }, request, undefined, layer, limits);
    expect(given).toHaveLength(2);
    expect(answer).toBe(given[1]);
    expect(calls.map((c) => c.journal?.map((e) => e.sig) ?? [])).toEqual([[], ["next 0"], ["next 0", "next 1"]]);
    // Every rerun keeps the first run's clock and seed.
    expect(new Set(calls.map((c) => `${c.now}/${c.seed}`)).size).toBe(1);
    // The response nobody returned went back.
    expect(given[0]!.body!.destroyed).toBe(true);
    expect(given[1]!.body!.destroyed).toBe(false);
  });

  it("a rerun that diverged fails closed with 502, and discards what next() brought back", async () => {
    const { engine } = scripted((message) => (message.journal === undefined ? nextEffect(0) : { t: "diverged", what: "its effect number 0 was a and is b now" }));
    const { layer, given } = descents();
    const failure = djsHandle({ engine, log: undefined, requestId: 2 }, request, undefined, layer, limits);
    await expect(failure).rejects.toMatchObject({ status: 502, message: "the policy's rerun diverged from its first run" });
    expect(given[0]!.body!.destroyed).toBe(true);
  });

  it(`more than ${maxLayerEffects} effects in one call fail closed`, async () => {
    const { engine } = scripted((message) => {
      const i = message.journal?.length ?? 0;
      return { t: "effect", k: "sleep", i, sig: `sleep ${i}`, ms: 0 };
    });
    const { layer, sleeps } = descents();
    await expect(djsHandle({ engine, log: undefined, requestId: 3 }, request, undefined, layer, limits)).rejects.toMatchObject({
      status: 502,
      message: expect.stringMatching(/more than 32 times/),
    });
    expect(sleeps).toHaveLength(maxLayerEffects);
  });

  it("a next() failure the policy throws on is the guest's answer, as the descent gave it", async () => {
    const refusal = new EgressError("EG_DENIED", 403, 'host "x.test" is not in allowedHosts');
    const { engine, calls } = scripted((message) => {
      if (message.journal === undefined) return nextEffect(0);
      return { t: "blocked", status: 403, message: refusal.message, statusText: "Forbidden", from: 0 };
    });
    const layer: LayerNext = { next: () => Promise.reject(refusal), sleep: async () => undefined };
    await expect(djsHandle({ engine, log: undefined, requestId: 4 }, request, undefined, layer, limits)).rejects.toBe(refusal);
    expect(calls[1]!.journal![0]!.rej).toMatchObject({ blocked: true, status: 403, name: "HttpRequestBlockedError" });
  });

  it("a Response the policy rebuilt around next()'s body keeps that body's stream", async () => {
    const { engine } = scripted((message) =>
      message.journal === undefined ? nextEffect(0) : { t: "response", status: 203, statusText: "", headers: ["x-layer", "1"], body: { n: 0 } },
    );
    const { layer, given } = descents();
    const answer = await djsHandle({ engine, log: undefined, requestId: 5 }, request, undefined, layer, limits);
    expect(answer).not.toBe(given[0]);
    expect(answer).toMatchObject({ status: 203, headers: ["x-layer", "1"] });
    expect(answer.body).toBe(given[0]!.body);
    expect(answer.body!.destroyed).toBe(false);
  });
});
