import { onTestFinished } from "vitest";
import { createDjsHooks, type DjsHooks, type DjsHooksOptions } from "../../src/index.js";
import type { CallFields, Outcome, PhaseName } from "../../src/djs/protocol.js";

/**
 * The time limit a test's policy gets unless the test is about the time limit: the default
 * (100 ms of wall clock) is about a healthy machine, and on a loaded one a call that merely
 * waits for a core would end as "time" instead of what the test checks.
 */
export const unhurriedMs = 30_000;

/** Loads a policy (with {@link unhurriedMs} unless it sets a time limit) and stops its workers when the test ends. */
export function loadPolicy(policy: string | DjsHooksOptions): DjsHooks {
  const options = typeof policy === "string" ? { source: policy } : policy;
  const { djsHooks } = createDjsHooks({ ...options, limits: { timeoutMs: unhurriedMs, ...options.limits } });
  onTestFinished(() => djsHooks.close());
  return djsHooks;
}

const defaults = {
  now: 1_700_000_000_000,
  seed: 42,
  method: "GET",
  url: "https://api.test/path?q=1",
  headers: "accept\n*/*\nhost\napi.test",
  hasBody: false,
};

/** One call straight to the policy's workers, as the pipeline makes it. */
export async function callPhase(
  djsHooks: DjsHooks,
  phase: PhaseName,
  fields: Partial<Omit<CallFields, "phase">> = {},
): Promise<Outcome & { bytes?: Uint8Array }> {
  const reply = await djsHooks.engine.call({ ...defaults, ...fields, phase });
  return reply.bytes === undefined ? reply.outcome : { ...reply.outcome, bytes: reply.bytes };
}

/** The header list a `continue` outcome carries, as an object. */
export function headersOf(outcome: Outcome): Record<string, string> {
  const list = (outcome as { headers?: string[] | null }).headers ?? [];
  const out: Record<string, string> = {};
  for (let i = 0; i < list.length; i += 2) out[list[i]!] = list[i + 1]!;
  return out;
}
