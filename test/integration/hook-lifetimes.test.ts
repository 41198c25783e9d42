import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, expect, it, vi } from "vitest";
import type { AuditRecord, HttpHooksOptions } from "../../src/index.js";
import { basic, credentialsOf, startGuestsProxy } from "../helpers/guests.js";
import { startTestProxy, tempDir } from "../helpers/proxy.js";
import { openRaw } from "../helpers/raw.js";
import { startUpstream } from "../helpers/upstream.js";

// A tier-3 hook that never settles was held by its hookMs timer alone: nothing tied the call to
// the request's end. A guest that left was logged (499, and onDecision) only at hookMs, with ms
// = hookMs; a request cut in a removed guest's tunnel likewise; and after close() the timer kept
// the embedding process alive for hookMs (black-box finding). Layers (`handle`) already ended
// with their request. No timing is asserted beyond generous bounds: the line's own ms is far
// below hookMs, and the process's timers are counted.
const hookMs = 20_000;

/** Each phase's hook that never settles, calling `called` when it runs. */
function hanging(called: () => void): Record<string, HttpHooksOptions> {
  const never = (): Promise<never> => {
    called();
    return new Promise<never>(() => undefined);
  };
  return {
    onRequest: { onRequest: never },
    onResponse: { onResponse: never },
    isRequestAllowed: { isRequestAllowed: never },
    isIpAllowed: { isIpAllowed: never },
    // The body of the Request it returned never ends: it is read within hookMs, as the hook's answer.
    "onRequest's Request body": {
      onRequest: (request) => {
        called();
        return new Request(request.url, { method: "POST", body: new ReadableStream<Uint8Array>(), duplex: "half" } as RequestInit);
      },
    },
    handle: { handle: never },
  };
}

const phases = Object.keys(hanging(() => undefined));

describe("a tier-3 hook that never settles, when its request ends", () => {
  it.each(phases)("%s: a guest that leaves is logged 499 at once, with its true ms, and the hook's call is let go", async (phase) => {
    const upstream = await startUpstream({ tls: false });
    let called!: () => void;
    const inHook = new Promise<void>((resolve) => (called = resolve));
    const records: AuditRecord[] = [];
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], ...hanging(called)[phase] }, { timeouts: { hookMs, requestMs: hookMs }, onDecision: (record) => void records.push(record) });
    const guest = await openRaw(proxy.port);
    const authority = `api.test:${upstream.port}`;
    guest.write(`GET http://${authority}/echo HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
    await inHook;
    guest.socket.destroy();
    await vi.waitFor(() => expect(records).toHaveLength(1), { timeout: 5_000 });
    const line = proxy.logs.find((l) => l["msg"] === "request");
    expect(line).toMatchObject({ status: 499, reason: "guest closed the connection" });
    expect(line?.["ms"]).toBeLessThan(hookMs / 4);
    expect(records[0]).toMatchObject({ status: 499 });
    expect(records[0]!.ms).toBeLessThan(hookMs / 4);
    // The hook did not fail: its request ended (a block with nginx's 499, as a decider's call that its guest left).
    const phaseName = phase === "onRequest's Request body" ? "onRequest" : phase;
    expect(records[0]!.sources.find((s) => s.phase === phaseName)).toMatchObject({ decision: "block", status: 499 });
    expect(records[0]!.sources.find((s) => s.phase === phaseName)).not.toHaveProperty("failure");
  });

  it.each(phases)("%s: a request in the tunnel of a guest removed meanwhile is logged 499 as the proxy's cut, at once", async (phase) => {
    const upstream = await startUpstream({ tls: false, names: ["a.test"] });
    let called!: () => void;
    const inHook = new Promise<void>((resolve) => (called = resolve));
    const proxy = await startGuestsProxy({ a: { allowedInternalHosts: ["a.test"], ...hanging(called)[phase] }, b: {} }, { timeouts: { hookMs, requestMs: hookMs } });
    const target = `a.test:${upstream.port}`;
    const tunnel = await openRaw(proxy.port);
    tunnel.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: ${basic("a", credentialsOf(proxy, "a").token)}\r\n\r\n`);
    expect((await tunnel.readResponse({ forConnect: true })).status).toBe(200);
    tunnel.write(`GET /echo HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
    await inHook;
    await proxy.removeGuest("a");
    await vi.waitFor(() => expect(proxy.logs.find((l) => l["msg"] === "request" && l["method"] === "GET")).toBeDefined(), { timeout: 5_000 });
    const line = proxy.logs.find((l) => l["msg"] === "request" && l["method"] === "GET")!;
    expect(line).toMatchObject({ guest: "a", status: 499 });
    expect(line["reason"]).toMatch(/the proxy closed the connection: the guest "a" was removed/);
    expect(line["ms"]).toBeLessThan(hookMs / 4);
  });

  it.each(phases)("%s: close() decides it at the drain's end as the proxy's cut, and its entry in the record is no hook failure", async (phase) => {
    const upstream = await startUpstream({ tls: false });
    let called!: () => void;
    const inHook = new Promise<void>((resolve) => (called = resolve));
    const records: AuditRecord[] = [];
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], ...hanging(called)[phase] }, { timeouts: { hookMs, requestMs: hookMs, drainMs: 200 }, onDecision: (record) => void records.push(record) });
    const guest = await openRaw(proxy.port);
    const authority = `api.test:${upstream.port}`;
    guest.write(`GET http://${authority}/echo HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
    await inHook;
    await proxy.close();
    expect(records).toHaveLength(1);
    expect(records[0]).toMatchObject({ status: 499, reason: "the proxy closed the connection at the end of its drain (timeouts.drainMs, 200 ms)" });
    const phaseName = phase === "onRequest's Request body" ? "onRequest" : phase;
    // It was "did not settle", of kind time: a hook failure counted for every request the drain cut.
    expect(records[0]!.sources.find((s) => s.phase === phaseName)).toMatchObject({ decision: "block", status: 499 });
  });

  // In a process of its own: the embedding process must be free to exit once close() resolves.
  it.each(phases)("%s: close() cuts it at the drain's end, and leaves no timer to hold the process (it exits on its own)", { timeout: 150_000 }, async (phase) => {
    expect(await runExitFixture(phase)).toEqual({
      code: 0,
      lines: [JSON.stringify({ status: 499, farBelowHookMs: true }), JSON.stringify({ timers: 0 }), "done"],
    });
  });
});

const fixture = join(import.meta.dirname, "..", "fixtures", "hook-close-exit.ts");

/** Runs hook-close-exit.ts for `phase` (and `kind`): its exit code and the lines it printed. */
async function runExitFixture(phase: string, kind?: "upgrade"): Promise<{ code: number | null; lines: string[] }> {
  let code: number | null = 0;
  let out: string;
  try {
    ({ stdout: out } = await promisify(execFile)(process.execPath, ["--import", "tsx", fixture, phase, tempDir(), ...(kind === undefined ? [] : [kind])], { timeout: 120_000 }));
  } catch (error) {
    const failed = error as { code: number | null; stdout?: string; stderr?: string };
    code = typeof failed.code === "number" ? failed.code : null;
    out = `${failed.stdout ?? ""}${failed.stderr ?? ""}`;
  }
  return { code, lines: out.trim().split("\n") };
}

// A WebSocket upgrade's hooks were called with no signal: a call still pending when the guest
// left kept its hookMs timer, which held the embedding process that long after close(), and the
// record named it a hook that "did not settle" (of kind time, a hook failure in the metrics).
describe("a tier-3 hook that never settles, when its WebSocket upgrade's guest leaves", () => {
  const upgradePhases = ["onRequest", "isRequestAllowed", "isIpAllowed"];

  it.each(upgradePhases)("%s: logged 499 at once, and the hook's call is let go: a block with 499 in the record, no failure", async (phase) => {
    const upstream = await startUpstream({ tls: false });
    let called!: () => void;
    const inHook = new Promise<void>((resolve) => (called = resolve));
    const records: AuditRecord[] = [];
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], ...hanging(called)[phase] }, { timeouts: { hookMs, requestMs: hookMs }, onDecision: (record) => void records.push(record) });
    const guest = await openRaw(proxy.port);
    const authority = `api.test:${upstream.port}`;
    guest.write(`GET http://${authority}/ws HTTP/1.1\r\nHost: ${authority}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`);
    await inHook;
    guest.socket.destroy();
    await vi.waitFor(() => expect(records).toHaveLength(1), { timeout: 5_000 });
    expect(records[0]).toMatchObject({ status: 499, upgrade: true });
    expect(records[0]!.ms).toBeLessThan(hookMs / 4);
    expect(records[0]!.sources.find((s) => s.phase === phase)).toMatchObject({ decision: "block", status: 499 });
    expect(records[0]!.sources.find((s) => s.phase === phase)).not.toHaveProperty("failure");
    expect(upstream.hits()).toBe(0);
  });

  it.each(upgradePhases)("%s: close() cuts it at the drain's end, and leaves no timer to hold the process (it exits on its own)", { timeout: 150_000 }, async (phase) => {
    expect(await runExitFixture(phase, "upgrade")).toEqual({
      code: 0,
      lines: [JSON.stringify({ status: 499, farBelowHookMs: true }), JSON.stringify({ timers: 0 }), "done"],
    });
  });
});
