import { describe, expect, it } from "vitest";
import type { CallMessage, JournalEntry, Outcome } from "../../src/djs/protocol.js";
import { decodeCalls, encodeCalls } from "../../src/djs/wire.js";
import { callPhase, loadPolicy } from "../helpers/djs.js";

/** The journal entry the proxy writes after performing `effect`, with the response it got. */
function answered(effect: Outcome, res: Partial<NonNullable<JournalEntry["res"]>> = {}): JournalEntry {
  if (effect.t !== "effect") throw new Error(`expected an effect, got ${JSON.stringify(effect)}`);
  if (effect.k === "sleep") return { k: "sleep", sig: effect.sig };
  return { k: "next", sig: effect.sig, res: { status: 200, statusText: "", headers: "content-type\ntext/plain", url: effect.url, hasBody: true, ...res } };
}

const refused = (effect: Outcome): JournalEntry => ({
  k: "next",
  sig: (effect as { sig: string }).sig,
  rej: { blocked: true, name: "HttpRequestBlockedError", message: 'host "x.test" is not in allowedHosts', status: 403, statusText: "Forbidden", code: "EG_DENIED" },
});

const policy = (body: string): ReturnType<typeof loadPolicy> =>
  loadPolicy({ filename: "layer.mjs", source: `export async function handle(request, next) { ${body} }` });

describe("tier-2 layers in the sandbox: next() and sleep() as journalled effects", () => {
  it("the first next() ends the run with the effect to perform: method, URL, headers and body", async () => {
    const layer = policy(`
      const headers = new Headers(request.headers);
      headers.set("x-layer", "1");
      return next(new Request("https://api.test/other", { method: "POST", headers, body: "made here" }));`);
    const outcome = await callPhase(layer, "handle");
    expect(outcome).toMatchObject({ t: "effect", k: "next", i: 0, method: "POST", url: "https://api.test/other", body: { b: 9 } });
    expect((outcome as { headers: string[] }).headers).toEqual(expect.arrayContaining(["x-layer", "1"]));
    expect(new TextDecoder().decode(outcome.bytes)).toBe("made here");
  });

  it("with the effect in the journal, next() resolves to the recorded response, and returning it unchanged passes it through", async () => {
    const layer = policy(`return next(request);`);
    const first = await callPhase(layer, "handle");
    expect(first).toMatchObject({ t: "effect", k: "next", i: 0, body: null });
    expect(await callPhase(layer, "handle", { journal: [answered(first)] })).toMatchObject({ t: "passed", i: 0 });
  });

  it("a response whose headers the layer changed comes back as a Response with next()'s body", async () => {
    const layer = policy(`const r = await next(); r.headers.set("x-seen", String(r.status)); return r;`);
    const first = await callPhase(layer, "handle");
    const outcome = await callPhase(layer, "handle", { journal: [answered(first, { status: 201 })] });
    expect(outcome).toMatchObject({ t: "response", status: 201, body: { n: 0 } });
    expect((outcome as { headers: string[] }).headers).toEqual(expect.arrayContaining(["x-seen", "201"]));
  });

  it("reading next()'s response body asks for it by effect index, and reads it once loaded", async () => {
    const layer = policy(`const r = await next(); return new Response("got " + (await r.text()));`);
    const first = await callPhase(layer, "handle");
    const journal = [answered(first)];
    expect(await callPhase(layer, "handle", { journal })).toMatchObject({ t: "need", which: [0] });
    const done = await callPhase(layer, "handle", { journal, nextBodies: [new TextEncoder().encode("upstream bytes")] });
    expect(done).toMatchObject({ t: "response", status: 200, body: { b: 18 } });
    expect(new TextDecoder().decode(done.bytes)).toBe("got upstream bytes");
  });

  it("effects are performed one at a time, in the order they were made", async () => {
    const layer = policy(`
      const [a, b] = await Promise.all([next(new Request("https://api.test/a")), next(new Request("https://api.test/b"))]);
      return new Response(a.url + " " + b.url);`);
    const first = await callPhase(layer, "handle");
    expect(first).toMatchObject({ t: "effect", i: 0, url: "https://api.test/a" });
    const second = await callPhase(layer, "handle", { journal: [answered(first)] });
    expect(second).toMatchObject({ t: "effect", i: 1, url: "https://api.test/b" });
    const done = await callPhase(layer, "handle", { journal: [answered(first), answered(second)] });
    expect(new TextDecoder().decode(done.bytes)).toBe("https://api.test/a https://api.test/b");
  });

  it("a refusal reaches the layer as HttpRequestBlockedError, and one thrown on names its effect", async () => {
    const catching = policy(`
      try { await next(); } catch (error) {
        return new Response([error instanceof HttpRequestBlockedError, error.status, error.statusText, error.message].join("|"));
      }`);
    const first = await callPhase(catching, "handle");
    const caught = await callPhase(catching, "handle", { journal: [refused(first)] });
    expect(new TextDecoder().decode(caught.bytes)).toBe('true|403|Forbidden|host "x.test" is not in allowedHosts');

    const throwing = policy(`await next(); return new Response("unreachable");`);
    const thrown = await callPhase(throwing, "handle", { journal: [refused(await callPhase(throwing, "handle"))] });
    expect(thrown).toMatchObject({ t: "blocked", status: 403, from: 0 });
  });

  it("another failure reaches the layer as an Error with its status and code", async () => {
    const layer = policy(`
      try { await next(); } catch (error) {
        return new Response([error instanceof HttpRequestBlockedError, error.name, error.status, error.code, error.message].join("|"));
      }`);
    const first = await callPhase(layer, "handle");
    const rej = { blocked: false, name: "Error", message: "upstream timed out", status: 504, statusText: "Gateway Timeout", code: "EG_UPSTREAM_TIMEOUT" };
    const outcome = await callPhase(layer, "handle", { journal: [{ k: "next", sig: (first as { sig: string }).sig, rej }] });
    expect(new TextDecoder().decode(outcome.bytes)).toBe("false|Error|504|EG_UPSTREAM_TIMEOUT|upstream timed out");
  });

  it("sleep(ms) is an effect too, and resolves once journalled", async () => {
    const layer = policy(`await sleep(250); return new Response("awake");`);
    const first = await callPhase(layer, "handle");
    expect(first).toMatchObject({ t: "effect", k: "sleep", i: 0, ms: 250 });
    expect(await callPhase(layer, "handle", { journal: [answered(first)] })).toMatchObject({ t: "response", status: 200 });
  });

  it("sleep() outside handle is refused", async () => {
    const onRequest = loadPolicy(`export async function onRequest() { await sleep(1); }`);
    expect(await callPhase(onRequest, "onRequest")).toMatchObject({ t: "throw", name: "TypeError", message: expect.stringMatching(/only available while handle/) });
  });
});

describe("tier-2 layers in the sandbox: reruns that diverge fail closed", () => {
  it("a rerun whose effect differs from the journal's at the same place diverges", async () => {
    const layer = policy(`return next(new Request("https://api.test/" + Math.floor(Math.random() * 1e9)));`);
    const first = await callPhase(layer, "handle", { seed: 7 });
    const journal = [answered(first)];
    // Same seed: the same effect, replayed.
    expect(await callPhase(layer, "handle", { seed: 7, journal })).toMatchObject({ t: "passed", i: 0 });
    // Another seed stands for a policy that is not deterministic: it asks for another URL.
    const diverged = await callPhase(layer, "handle", { seed: 8, journal });
    expect(diverged).toMatchObject({ t: "diverged", what: expect.stringMatching(/effect number 0 was .*api\.test.* and is .*api\.test/) });
  });

  it("a rerun that makes a sleep where the journal holds a next() diverges", async () => {
    const layer = policy(`await sleep(10); return new Response("x");`);
    const fake: JournalEntry = { k: "next", sig: JSON.stringify(["next", "GET", "https://api.test/path?q=1", [], null]), res: { status: 200, statusText: "", headers: "", url: "", hasBody: false } };
    expect(await callPhase(layer, "handle", { journal: [fake] })).toMatchObject({ t: "diverged" });
  });

  it("a rerun that answers before reaching every journalled effect diverges, even when it throws", async () => {
    const answering = policy(`return new Response("early");`);
    const fake: JournalEntry = { k: "sleep", sig: JSON.stringify(["sleep", 5]) };
    expect(await callPhase(answering, "handle", { journal: [fake] })).toMatchObject({ t: "diverged", what: expect.stringMatching(/after 0 of the 1/) });
    const throwing = policy(`throw new Error("early");`);
    expect(await callPhase(throwing, "handle", { journal: [fake] })).toMatchObject({ t: "diverged" });
  });
});

describe("tier-2 layers in the sandbox: request bodies", () => {
  it("the guest's body goes once as its stream; a second next() with it rejects", async () => {
    const layer = policy(`
      const a = new Request(request);
      const b = new Request(request);
      const first = await next(a);
      try { await next(b); return new Response("sent twice"); } catch (error) { return new Response(error.message); }`);
    const first = await callPhase(layer, "handle", { method: "POST", hasBody: true });
    expect(first).toMatchObject({ t: "effect", k: "next", body: { h: "request" } });
    const done = await callPhase(layer, "handle", { method: "POST", hasBody: true, journal: [answered(first)] });
    expect(new TextDecoder().decode(done.bytes)).toMatch(/already streamed upstream; pass request\.clone\(\)/);
  });

  it("request.clone() in handle has the proxy hold the body first (not the sandbox), so each next() can send its bytes", async () => {
    const layer = policy(`await next(request.clone()); return next(request.clone());`);
    expect(await callPhase(layer, "handle", { method: "PUT", hasBody: true })).toMatchObject({ t: "need", which: ["held"] });
    const first = await callPhase(layer, "handle", { method: "PUT", hasBody: true, replayable: true });
    expect(first).toMatchObject({ t: "effect", i: 0, body: { h: "request" } });
    const second = await callPhase(layer, "handle", { method: "PUT", hasBody: true, replayable: true, journal: [answered(first)] });
    expect(second).toMatchObject({ t: "effect", i: 1, body: { h: "request" } });
  });

  it("a body the policy read is held too: no further load for a clone", async () => {
    const layer = policy(`const text = await request.clone().text(); return next(new Request(request, { headers: { "x-length": String(text.length) } }));`);
    const requestBody = new TextEncoder().encode("payload");
    expect(await callPhase(layer, "handle", { method: "PUT", hasBody: true, requestBody })).toMatchObject({ t: "effect", body: { h: "request" }, headers: ["x-length", "7"] });
  });

  it("a body the proxy already holds as bytes is not loaded for a clone", async () => {
    const layer = policy(`return next(request.clone());`);
    expect(await callPhase(layer, "handle", { method: "PUT", hasBody: true, replayable: true })).toMatchObject({ t: "effect", body: { h: "request" } });
  });

  it("request.clone() outside handle still costs nothing until read", async () => {
    const onRequest = loadPolicy(`export function onRequest(request) { request.clone(); }`);
    expect(await callPhase(onRequest, "onRequest", { method: "POST", hasBody: true })).toMatchObject({ t: "code", v: 2 });
  });
});

describe("tier-2 layers on the wire", () => {
  it("a call with a journal travels whole, as an object", () => {
    const base = { now: 1, seed: 2, method: "GET", url: "https://api.test/", headers: "", hasBody: false };
    const calls: CallMessage[] = [
      { ...base, id: 1, cell: 0, phase: "handle" },
      { ...base, id: 2, cell: 1, phase: "handle", journal: [{ k: "sleep", sig: "[\"sleep\",1]" }], nextBodies: [undefined] },
      { ...base, id: 3, cell: 2, phase: "handle", replayable: true },
    ];
    const wire = encodeCalls(calls);
    expect(wire.objects.map((c) => c.id)).toEqual([2, 3]);
    expect(decodeCalls(wire)).toEqual(calls);
  });
});
