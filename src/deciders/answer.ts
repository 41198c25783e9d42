import { validateHeaderName, validateHeaderValue } from "node:http";
import type { DeciderPhase } from "./options.js";

/**
 * What a decider answered, in the one contract all three kinds share (DESIGN §2):
 * - `{"decision":"allow"}`, or nothing at all, allows;
 * - `{"decision":"block","reason":"…","status":403}` blocks (status 400–599, default 403);
 * - `{"decision":"allow","set_headers":{…},"remove_headers":[…]}` rewrites (request phase only).
 * Anything else is malformed, which the caller turns into 502 (or an allow, with failOpen).
 */
export type Verdict =
  | { readonly decision: "allow" }
  | { readonly decision: "block"; readonly status: number; readonly reason: string }
  | { readonly decision: "rewrite"; readonly setHeaders: readonly (readonly [string, string])[]; readonly removeHeaders: readonly string[] };

export const allowVerdict: Verdict = Object.freeze({ decision: "allow" });

/** An answer that breaks the contract; its message goes to the proxy's log. */
export class MalformedAnswer extends Error {
  override readonly name = "MalformedAnswer";
}

/** How much of a reason a guest is sent. */
export const maxReasonBytes = 1024;

/** The first KiB of `text`, trimmed, cut on a character boundary. */
export function reasonText(text: string): string {
  const trimmed = text.trim();
  if (Buffer.byteLength(trimmed) <= maxReasonBytes) return trimmed;
  return Buffer.from(trimmed).subarray(0, maxReasonBytes).toString("utf8").replace(/\uFFFD+$/, "").trimEnd();
}

/** Headers a rewrite may not touch: the destination and the framing are the proxy's. */
const untouchable = new Set(["host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "keep-alive", "proxy-connection", "proxy-authorization"]);
/**
 * Nor `Expect`: the proxy answers the guest's itself and never sends one upstream (undici refuses
 * to). Set by a rewrite, it reached undici, and the guest got 502 `EG_UPSTREAM` blaming the upstream.
 */
const proxyAnswersExpect = "expect";

function blockStatus(value: unknown): number {
  if (value === undefined) return 403;
  if (typeof value !== "number" || !Number.isInteger(value) || value < 400 || value > 599) {
    throw new MalformedAnswer(`status must be an integer from 400 to 599 (got ${JSON.stringify(value) ?? String(value)})`);
  }
  return value;
}

function reasonOf(value: unknown): string {
  if (value === undefined || value === null) return "";
  if (typeof value !== "string") throw new MalformedAnswer("reason must be a string");
  return reasonText(value);
}

function rewrite(setHeaders: unknown, removeHeaders: unknown, phase: DeciderPhase): Verdict {
  if (setHeaders === undefined && removeHeaders === undefined) return allowVerdict;
  if (phase !== "request") throw new MalformedAnswer("set_headers and remove_headers are for the request phase only");
  const set: [string, string][] = [];
  if (setHeaders !== undefined) {
    if (typeof setHeaders !== "object" || setHeaders === null || Array.isArray(setHeaders)) throw new MalformedAnswer("set_headers must be an object of header names to strings");
    for (const [name, value] of Object.entries(setHeaders as Record<string, unknown>)) {
      if (typeof value !== "string") throw new MalformedAnswer(`set_headers.${name} must be a string`);
      checkName(name, "set_headers");
      try {
        validateHeaderValue(name, value);
      } catch {
        throw new MalformedAnswer(`set_headers.${name} is not a valid header value`);
      }
      set.push([name.toLowerCase(), value]);
    }
  }
  const remove: string[] = [];
  if (removeHeaders !== undefined) {
    if (!Array.isArray(removeHeaders)) throw new MalformedAnswer("remove_headers must be a list of header names");
    for (const name of removeHeaders as unknown[]) {
      if (typeof name !== "string") throw new MalformedAnswer("remove_headers must be a list of header names");
      checkName(name, "remove_headers");
      remove.push(name.toLowerCase());
    }
  }
  return { decision: "rewrite", setHeaders: set, removeHeaders: remove };
}

function checkName(name: string, where: string): void {
  try {
    validateHeaderName(name);
  } catch {
    throw new MalformedAnswer(`${where} names an invalid header ${JSON.stringify(name)}`);
  }
  const lower = name.toLowerCase();
  if (untouchable.has(lower)) throw new MalformedAnswer(`${where} may not change ${lower}: the destination and the framing are the proxy's`);
  if (lower === proxyAnswersExpect) throw new MalformedAnswer(`${where} may not change expect: the proxy answers Expect itself and never sends it upstream`);
}

/** The answer object of a command or a webhook. */
export function parseAnswer(value: unknown, phase: DeciderPhase): Verdict {
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new MalformedAnswer("the answer must be a JSON object");
  const answer = value as Record<string, unknown>;
  for (const key of Object.keys(answer)) {
    if (!answerKeys.has(key)) throw new MalformedAnswer(`the answer has an unknown key ${JSON.stringify(key)} (known: ${[...answerKeys].join(", ")})`);
  }
  // Only a missing key defaults to allow: `"decision": null` is an answer, and not one of the two.
  const decision = Object.hasOwn(answer, "decision") ? answer["decision"] : "allow";
  if (decision === "block") {
    if (answer["set_headers"] !== undefined || answer["remove_headers"] !== undefined) throw new MalformedAnswer("a block cannot also rewrite headers");
    return { decision: "block", status: blockStatus(answer["status"]), reason: reasonOf(answer["reason"]) };
  }
  if (decision !== "allow") throw new MalformedAnswer(`decision must be "allow" or "block" (got ${JSON.stringify(decision)})`);
  // A status or a reason explains a refusal: without "block" the answer says two things.
  if (Object.hasOwn(answer, "status")) throw new MalformedAnswer("status belongs to a block");
  if (Object.hasOwn(answer, "reason")) throw new MalformedAnswer("reason belongs to a block");
  return rewrite(answer["set_headers"], answer["remove_headers"], phase);
}

const answerKeys = new Set(["decision", "reason", "status", "set_headers", "remove_headers"]);

/**
 * An answer's bytes as text, without a UTF-8 byte order mark before it (RFC 8259 §8.1 lets a
 * parser ignore one). undici's `text()`, which reads a webhook's answer of declared length,
 * drops it; a chunked answer, and a command's stdout, kept it, so the same block answer failed
 * there, and a `failOpen` decider let the request through (black-box finding).
 */
export function answerText(bytes: Buffer): string {
  const bom = bytes.length >= 3 && bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf;
  return bytes.toString("utf8", bom ? 3 : 0);
}

/**
 * The text of an answer: empty (or blank) allows, JSON is parsed by the contract, and anything
 * else is malformed.
 */
export function parseAnswerText(text: string, phase: DeciderPhase): Verdict {
  if (text.trim() === "") return allowVerdict;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new MalformedAnswer("the answer is not JSON");
  }
  return parseAnswer(value, phase);
}

/**
 * OPA's `result` (its Data API answer): a boolean, or `{allow, reason, status, set_headers,
 * remove_headers}`. An undefined result (the document `{}`: no rule matched, or a wrong path)
 * denies, as OPA's own integrations do.
 */
export function opaVerdict(body: unknown, phase: DeciderPhase): Verdict {
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw new MalformedAnswer("OPA's answer must be a JSON object");
  const result = (body as Record<string, unknown>)["result"];
  if (result === undefined) return { decision: "block", status: 403, reason: "OPA returned no result (the decision is undefined)" };
  if (result === true) return allowVerdict;
  if (result === false) return { decision: "block", status: 403, reason: "" };
  if (typeof result !== "object" || result === null || Array.isArray(result)) throw new MalformedAnswer("OPA's result must be a boolean or an object with allow");
  const r = result as Record<string, unknown>;
  const allow = r["allow"];
  if (allow !== true) {
    if (allow !== false && allow !== undefined) throw new MalformedAnswer("OPA's result.allow must be a boolean");
    return { decision: "block", status: blockStatus(r["status"]), reason: reasonOf(r["reason"]) };
  }
  return rewrite(r["set_headers"], r["remove_headers"], phase);
}
