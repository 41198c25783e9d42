import { phaseNames, type CallMessage, type CallReply, type Outcome } from "./protocol.js";
import { withFields } from "../objects.js";

/**
 * The messages between the proxy and a tier-2 worker, packed as one string per batch. Structured
 * cloning an array of objects cost the proxy's thread more than a no-op policy call itself: a
 * string is copied in one piece. Fields are split by US (0x1f) and calls by RS (0x1e), which no
 * URL, header or method the proxy passes on contains; a call that has one anyway, and every call
 * with a body, travels as an object beside the string.
 */
export interface WireBatch {
  readonly text: string;
  /** Calls that do not pack: with a body, or with a separator in a field. */
  readonly objects: readonly CallMessage[];
}

const US = "\x1f";
const RS = "\x1e";

function packable(m: CallMessage): boolean {
  if (m.requestBody !== undefined || m.responseBody !== undefined) return false;
  // A layer's rerun carries its journal: rare enough to travel as an object.
  if (m.journal !== undefined || m.nextBodies !== undefined || m.replayable !== undefined) return false;
  const r = m.response;
  const i = m.info;
  const text = m.method + m.url + m.headers + (r === undefined ? "" : r.statusText + r.headers + r.url) + (i === undefined ? "" : i.hostname + i.ip + i.protocol);
  return !text.includes(US) && !text.includes(RS);
}

function pack(m: CallMessage): string {
  const head = [m.id, m.cell, phaseNames.indexOf(m.phase), m.now, m.seed, m.method, m.url, m.headers, m.hasBody ? 1 : 0];
  if (m.info !== undefined) return [...head, "i", m.info.hostname, m.info.ip, m.info.family, m.info.port, m.info.protocol].join(US);
  const r = m.response;
  if (r !== undefined) return [...head, "r", r.status, r.statusText, r.headers, r.url, r.hasBody ? 1 : 0].join(US);
  return head.join(US);
}

function unpack(text: string): CallMessage {
  const f = text.split(US);
  const base = {
    id: Number(f[0]),
    cell: Number(f[1]),
    phase: phaseNames[Number(f[2])]!,
    now: Number(f[3]),
    seed: Number(f[4]),
    method: f[5]!,
    url: f[6]!,
    headers: f[7]!,
    hasBody: f[8] === "1",
  };
  if (f[9] === "i") return withFields(base, { info: { hostname: f[10]!, ip: f[11]!, family: Number(f[12]), port: Number(f[13]), protocol: f[14]! } });
  if (f[9] === "r") return withFields(base, { response: { status: Number(f[10]), statusText: f[11]!, headers: f[12]!, url: f[13]!, hasBody: f[14] === "1" } });
  return base;
}

export function encodeCalls(messages: readonly CallMessage[]): WireBatch {
  const packed: string[] = [];
  const objects: CallMessage[] = [];
  for (const m of messages) {
    if (packable(m)) packed.push(pack(m));
    else objects.push(m);
  }
  return { text: packed.join(RS), objects };
}

export function decodeCalls(batch: WireBatch): CallMessage[] {
  const calls = batch.text === "" ? [] : batch.text.split(RS).map(unpack);
  return [...calls, ...batch.objects].sort((a, b) => a.id - b.id);
}

/** Replies: `id US code` for the common outcomes, objects for the rest. */
export interface WireReplies {
  readonly text: string;
  readonly objects: readonly CallReply[];
}

export function encodeReplies(replies: readonly CallReply[]): WireReplies {
  const codes: string[] = [];
  const objects: CallReply[] = [];
  for (const r of replies) {
    if (r.outcome.t === "code" && r.outcome.logs === undefined && r.bytes === undefined) codes.push(`${r.id}${US}${r.outcome.v}`);
    else objects.push(r);
  }
  return { text: codes.join(RS), objects };
}

export function decodeReplies(wire: WireReplies): CallReply[] {
  const replies: CallReply[] = wire.text === "" ? [] : wire.text.split(RS).map((entry) => {
    const at = entry.indexOf(US);
    const outcome: Outcome = { t: "code", v: Number(entry.slice(at + 1)) };
    return { id: Number(entry.slice(0, at)), outcome };
  });
  return [...replies, ...wire.objects];
}
