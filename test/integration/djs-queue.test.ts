import { describe, expect, it, vi } from "vitest";
import type { AuditRecord } from "../../src/index.js";
import { loadPolicy } from "../helpers/djs.js";
import { basic, credentialsOf, startGuestsProxy } from "../helpers/guests.js";
import { openRaw, type RawClient } from "../helpers/raw.js";
import { startUpstream } from "../helpers/upstream.js";

// Tier-2 calls wait for the policy's workers, which run them one at a time. A call whose request
// had ended still ran when its turn came, and a wait had no bound but limits.maxCalls ×
// limits.timeoutMs: every guest of a shared policy (a profile, one --hooks-script) waited
// behind a gone guest's calls, one time limit each (black-box finding). One worker is held by a
// call that loops to its time limit, long enough for the calls behind it to be seen waiting.
// What ran is counted by the policy's console lines, which only a call that ran can write, and
// by the time failures /metrics counts; no timing is asserted.
const holdMs = 4_000;

const policy = `export function isRequestAllowed(r) {
  const path = new URL(r.url).pathname;
  console.log("ran " + path);
  if (path === "/hold") for (;;) {}
  return true;
}`;

/** Two guests sharing one policy on one worker, as profiles or one --hooks-script share it. */
async function sharedPolicy(hookMs?: number) {
  const ok = (_req: unknown, res: { end: (text: string) => void }): void => res.end("ok");
  const upstream = await startUpstream({ tls: false, names: ["a.test"], routes: { "/queued": ok, "/late": ok, "/after": ok } });
  const djsHooks = loadPolicy({ source: policy, limits: { timeoutMs: holdMs }, workers: 1 });
  const records: AuditRecord[] = [];
  const proxy = await startGuestsProxy(
    { a: { allowedInternalHosts: ["a.test"], djsHooks }, b: { allowedInternalHosts: ["a.test"], djsHooks } },
    { metrics: true, onDecision: (record) => void records.push(record), ...(hookMs !== undefined ? { timeouts: { hookMs } } : {}) },
  );
  const authority = `a.test:${upstream.port}`;
  return {
    proxy,
    records,
    inFlight: () => djsHooks.engine.callsInFlight,
    async send(guest: string, path: string): Promise<RawClient> {
      const client = await openRaw(proxy.port);
      client.write(`GET http://${authority}${path} HTTP/1.1\r\nHost: ${authority}\r\nProxy-Authorization: ${basic(guest, credentialsOf(proxy, guest).token)}\r\n\r\n`);
      return client;
    },
    /** How many calls for `path` ran: each writes its line as it starts. */
    ran: (path: string) => proxy.logs.filter((line) => line["msg"] === "policy console" && line["text"] === `ran ${path}`).length,
    async timeFailures(): Promise<number> {
      const line = (await proxy.metrics()).split("\n").find((l) => l.startsWith("egressgate_hook_failures_total{") && l.includes('kind="time"'));
      return line === undefined ? 0 : Number(line.split(" ").pop());
    },
  };
}

const tier2 = (record: AuditRecord | undefined) => record?.sources.find((source) => source.tier === "tier2");

describe("tier-2 calls waiting for a worker", () => {
  it("calls still waiting when their guest leaves are dropped, never run, and every request is logged 499 at once", async () => {
    const shared = await sharedPolicy();
    const hold = await shared.send("a", "/hold");
    await vi.waitFor(() => expect(shared.inFlight()).toBe(1));
    const queued: RawClient[] = [];
    for (let i = 0; i < 3; i++) queued.push(await shared.send("a", "/queued"));
    await vi.waitFor(() => expect(shared.inFlight()).toBe(4));
    for (const client of queued) client.socket.destroy();
    hold.socket.destroy();
    await vi.waitFor(() => expect(shared.records).toHaveLength(4), { timeout: 4 * holdMs });
    const gone = [...shared.records];
    // The other guest's call runs once the one running (let go, not stopped) reaches its limit:
    // one worker, calls in order, so the dropped ones were passed by first.
    const after = await shared.send("b", "/after");
    expect((await after.readResponse({ timeoutMs: 4 * holdMs })).status).toBe(200);
    expect(shared.ran("/after")).toBe(1);
    expect(shared.ran("/queued")).toBe(0);
    expect(await shared.timeFailures()).toBe(0);
    await vi.waitFor(() => expect(shared.inFlight()).toBe(0));
    // As a tier-3 hook's call is: the request ended (a block with 499), not a failure of the policy.
    for (const record of gone) {
      expect(record).toMatchObject({ guest: "a", status: 499 });
      expect(tier2(record)).toMatchObject({ decision: "block", status: 499 });
      expect(tier2(record)).not.toHaveProperty("failure");
    }
  }, 30_000);

  it("a call that waits past timeouts.hookMs gets 504 EG_HOOK_TIMEOUT, as a tier-3 hook does, and never runs", async () => {
    const shared = await sharedPolicy(1_000);
    const hold = await shared.send("a", "/hold");
    await vi.waitFor(() => expect(shared.inFlight()).toBe(1));
    const late = await shared.send("b", "/late");
    const answer = await late.readResponse({ timeoutMs: 4 * holdMs });
    expect(answer.status).toBe(504);
    expect(answer.headers["x-egressgate-error"]).toBe("EG_HOOK_TIMEOUT");
    expect(answer.body).toContain("the isRequestAllowed policy did not settle within 1000 ms: it waited that long for a worker");
    const record = shared.records.find((r) => r.url.endsWith("/late"));
    expect(record).toMatchObject({ guest: "b", status: 504, code: "EG_HOOK_TIMEOUT" });
    expect(tier2(record)).toMatchObject({ decision: "error", failure: "time" });
    // The call running had its own time limit, past hookMs.
    expect((await hold.readResponse({ timeoutMs: 4 * holdMs })).status).toBe(502);
    const after = await shared.send("b", "/after");
    expect((await after.readResponse({ timeoutMs: 4 * holdMs })).status).toBe(200);
    expect(shared.ran("/after")).toBe(1);
    expect(shared.ran("/late")).toBe(0);
    expect(await shared.timeFailures()).toBe(2);
  }, 30_000);
});
