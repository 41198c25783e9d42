import { createHash } from "node:crypto";
import type { WsStep } from "./hostile-websocket.js";
import type { Rng } from "./rng.js";
import type { UpstreamRequest } from "./wire.js";
import type { FuzzWorld } from "./world.js";

/**
 * Cases of the `websocket` target: a WebSocket upgrade through the proxy (`ws://` as an
 * absolute-form request, `wss://` inside a CONNECT tunnel) to an upstream that answers it
 * badly (hostile-websocket.ts): a 101 with a wrong accept key or odd fields, garbage or half a
 * frame right after it, a close mid-frame, a frame of a megabyte, heads Node's client refuses
 * (README, "WebSocket upgrades"), too many 1xx, silence. The guest misbehaves too: bytes before
 * the 101 (within the 64 KiB the proxy holds, and past it), garbage and huge frames after it,
 * a cut mid-frame. What the guest may get: a 101 and then exactly what the upstream sent after
 * its head (its echo of the guest's bytes included), or a proxy error and nothing forwarded.
 */
export interface WsOutcome {
  /** Whether the guest gets the upstream's 101 relayed. */
  readonly switched: "yes" | "no" | "either";
  /** Proxy errors (`X-Egressgate-Error`) it may get when not switched, or any. */
  readonly errors: readonly string[] | "any";
  /**
   * After the 101's head, while the guest stays: exactly these bytes (the upstream echoes and
   * stays open), or these bytes first (it closed, cut or went silent after them).
   */
  readonly after?: { readonly exact: boolean; readonly bytes: Buffer };
}

export interface WsCase {
  readonly name: "api" | "secret";
  readonly via: "plain" | "tunnel";
  /** The upgrade request's target (origin-form) and fields, Host and the upgrade's own included. */
  readonly target: string;
  readonly fields: readonly (readonly [string, string])[];
  /** Bytes the guest sends with its head, before any 101. */
  readonly early: Buffer;
  /** Bytes it sends once the 101 came. */
  readonly late: Buffer;
  /** It cuts its connection right after its late bytes, instead of reading the echo and ending. */
  readonly cut: boolean;
  readonly script: (request: UpstreamRequest) => WsStep[];
  readonly expect: WsOutcome;
  readonly steps: readonly string[];
}

const bytes = (text: string): Buffer => Buffer.from(text, "latin1");

/** A WebSocket frame (RFC 6455 §5.2), masked as a client's must be, or not. */
export function wsFrame(opcode: number, payload: Buffer, mask: Buffer | undefined, fin = true): Buffer {
  const length = payload.length;
  const head = length < 126 ? Buffer.from([0, length]) : length < 65_536 ? Buffer.from([0, 126, length >> 8, length & 0xff]) : Buffer.concat([Buffer.from([0, 127, 0, 0, 0, 0]), Buffer.from([(length >>> 24) & 0xff, (length >>> 16) & 0xff, (length >>> 8) & 0xff, length & 0xff])]);
  head[0] = (fin ? 0x80 : 0) | opcode;
  if (mask === undefined) return Buffer.concat([head, payload]);
  head[1] = head[1]! | 0x80;
  const masked = Buffer.from(payload);
  for (let i = 0; i < masked.length; i++) masked[i] = masked[i]! ^ mask[i % 4]!;
  return Buffer.concat([head, mask, masked]);
}

export function acceptKey(key: string): string {
  return createHash("sha1").update(`${key}258EAFA5-E914-47DA-95CA-C5AB0DC11D65`).digest("base64");
}

function fieldOf(request: UpstreamRequest, name: string): string {
  return request.fields.find(([n]) => n.toLowerCase() === name)?.[1] ?? "";
}

type Answer = readonly [label: string, script: (request: UpstreamRequest) => WsStep[], outcome: WsOutcome];

/** The upstream's answers: each with what the guest may get (the tail after the 101 is checked against `after`). */
function answers(rng: Rng): Answer[] {
  const head101 = (request: UpstreamRequest, extra = ""): string => `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${acceptKey(fieldOf(request, "sec-websocket-key"))}\r\n${extra}\r\n`;
  // A cut (the upstream's reset) is relayed as one: what the proxy had not yet written to the guest may go with it, so nothing after the 101 is promised.
  const relay = (after: Buffer = Buffer.alloc(0), exact = true): WsOutcome => ({ switched: "yes", errors: [], after: { exact, bytes: after } });
  const refused = (errors: readonly string[] = ["EG_UPSTREAM"]): WsOutcome => ({ switched: "no", errors });
  const garbage = rng.bytes(rng.pick([1, 7, 200, 5000]));
  const serverFrame = wsFrame(0x2, rng.bytes(rng.pick([10, 70_000])), undefined);
  const huge = wsFrame(0x2, Buffer.alloc(1024 * 1024 + 3, 0x5a), undefined);
  const half = serverFrame.subarray(0, Math.max(1, Math.floor(serverFrame.length / 2)));
  return [
    ["a good 101, then an echo", (r) => [{ write: bytes(head101(r)) }, "echo"], relay()],
    ["a 101 with a wrong accept key", () => [{ write: bytes("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: d3JvbmcgYWNjZXB0IGtleSE=\r\n\r\n") }, "echo"], relay()],
    ["a 101 without Sec-WebSocket-Accept", () => [{ write: bytes("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n") }, "echo"], relay()],
    ["a 101 with Content-Length and Transfer-Encoding", (r) => [{ write: bytes(head101(r, "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n")) }, "echo"], relay()],
    ["a 101 with Set-Cookie and a protocol", (r) => [{ write: bytes(head101(r, "Set-Cookie: a=1\r\nSec-WebSocket-Protocol: chat\r\nKeep-Alive: timeout=5\r\n")) }, "echo"], relay()],
    // Not the request's Authorization: a 101 that quotes a secret's value hands it to the guest by design (README, "Responses are never scrubbed").
    ["a 101 quoting the request's key and protocol", (r) => [{ write: bytes(head101(r, `X-Echo: ${fieldOf(r, "sec-websocket-key")}\r\nSec-WebSocket-Protocol: ${fieldOf(r, "sec-websocket-protocol").split(",")[0] ?? ""}\r\n`)) }, "echo"], relay()],
    ["a 101 of 15 KiB", (r) => [{ write: bytes(head101(r, `Set-Cookie: big=${"c".repeat(15_000)}\r\n`)) }, "echo"], relay()],
    ["a 101 in upper case", (r) => [{ write: bytes(`HTTP/1.1 101 SWITCHING\r\nUPGRADE: WebSocket\r\nCONNECTION: UPGRADE\r\nSec-WebSocket-Accept: ${acceptKey(fieldOf(r, "sec-websocket-key"))}\r\n\r\n`) }, "echo"], relay()],
    ["a 101 without a reason", (r) => [{ write: bytes(head101(r).replace("101 Switching Protocols", "101")) }, "echo"], { ...relay(), switched: "either", errors: ["EG_UPSTREAM"] }],
    ["a 101 without Connection", (r) => [{ write: bytes(head101(r).replace("Connection: Upgrade\r\n", "")) }, "echo"], { ...relay(), switched: "either", errors: ["EG_UPSTREAM"] }],
    ["a 101 without Upgrade", (r) => [{ write: bytes(head101(r).replace("Upgrade: websocket\r\n", "")) }, "echo"], refused()],
    ["a 101 to h2c", (r) => [{ write: bytes(head101(r).replace("Upgrade: websocket", "Upgrade: h2c")) }, "echo"], refused()],
    ["a 101 to websocket and h2c", (r) => [{ write: bytes(head101(r).replace("Upgrade: websocket", "Upgrade: websocket, h2c")) }, "echo"], { ...relay(), switched: "either", errors: ["EG_UPSTREAM"] }],
    ["a 101 naming two Upgrade fields", (r) => [{ write: bytes(head101(r, "Upgrade: h2c\r\n")) }, "echo"], { ...relay(), switched: "either", errors: ["EG_UPSTREAM"] }],
    ["a 200 with a body", () => [{ write: bytes("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello") }, "echo"], refused()],
    ["a 403", () => [{ write: bytes("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n") }, "echo"], refused()],
    ["a 302", () => [{ write: bytes("HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n") }, "echo"], refused()],
    ["a 101 of HTTP/1.0", (r) => [{ write: bytes(head101(r).replace("HTTP/1.1", "HTTP/1.0")) }, "echo"], refused()],
    ["a 101 of HTTP/2", (r) => [{ write: bytes(head101(r).replace("HTTP/1.1", "HTTP/2")) }, "echo"], refused()],
    ["a 101 with bare LFs", (r) => [{ write: bytes(head101(r).replace(/\r\n/g, "\n")) }, "echo"], refused()],
    ["a 101 with an obs-fold", (r) => [{ write: bytes(head101(r, "X-Fold: a\r\n b\r\n")) }, "echo"], refused()],
    ["a 101 with a space before a colon", (r) => [{ write: bytes(head101(r, "X-Space : a\r\n")) }, "echo"], refused()],
    ["a 101 with a NUL in a value", (r) => [{ write: bytes(head101(r, "X-Nul: a\u0000b\r\n")) }, "echo"], refused()],
    ["a 101 with a CR in a value", (r) => [{ write: bytes(head101(r, "X-Cr: a\rb\r\n")) }, "echo"], refused()],
    ["a 101 over 16 KiB", (r) => [{ write: bytes(head101(r, `Set-Cookie: big=${"c".repeat(17_000)}\r\n`)) }, "echo"], refused()],
    ["a 100, then a 101", (r) => [{ write: bytes("HTTP/1.1 100 Continue\r\n\r\n") }, { write: bytes(head101(r)) }, "echo"], relay()],
    ["three 103s, then a 101", (r) => [{ write: bytes("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n".repeat(3)) }, { write: bytes(head101(r)) }, "echo"], relay()],
    ["17 103s, then a 101", (r) => [{ write: bytes("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n".repeat(17)) }, { write: bytes(head101(r)) }, "echo"], refused()],
    ["1xx heads over 64 KiB", (r) => [{ write: bytes(`HTTP/1.1 103 Early Hints\r\nLink: </${"a".repeat(12_000)}>\r\n\r\n`.repeat(6)) }, { write: bytes(head101(r)) }, "echo"], refused()],
    ["a 102 without end", () => [{ write: bytes("HTTP/1.1 102 Processing\r\n\r\n") }, "stall"], refused(["EG_UPSTREAM_TIMEOUT"])],
    ["no answer", () => ["stall"], refused(["EG_UPSTREAM_TIMEOUT"])],
    ["half a head, then silence", () => [{ write: bytes("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n") }, "stall"], refused(["EG_UPSTREAM_TIMEOUT"])],
    ["a close before any byte", () => ["destroy"], refused()],
    ["a FIN before any byte", () => ["end"], refused()],
    ["a close inside the head", () => [{ write: bytes("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n") }, "destroy"], refused()],
    ["garbage instead of a head", () => [{ write: bytes("\u0016\u0003\u0001garbage\r\n\r\n") }, "echo"], refused()],
    ["a 101 with garbage behind it", (r) => [{ write: Buffer.concat([bytes(head101(r)), garbage]) }, "echo"], relay(garbage)],
    ["a 101, then garbage later", (r) => [{ write: bytes(head101(r)) }, { pause: rng.pick([0, 5]) }, { write: garbage }, "echo"], relay(garbage)],
    ["a 101 with a server frame behind it", (r) => [{ write: Buffer.concat([bytes(head101(r)), serverFrame]) }, "echo"], relay(serverFrame)],
    ["a 101, then a frame of 1 MiB", (r) => [{ write: bytes(head101(r)) }, { write: huge }, "echo"], relay(huge)],
    ["a 101, then the close", (r) => [{ write: bytes(head101(r)) }, "end"], relay(Buffer.alloc(0), false)],
    ["a 101, then a cut", (r) => [{ write: bytes(head101(r)) }, "destroy"], { switched: "yes", errors: [] }],
    ["a 101, half a frame, then a cut", (r) => [{ write: Buffer.concat([bytes(head101(r)), half]) }, { pause: 2 }, "destroy"], { switched: "yes", errors: [] }],
    ["a 101, half a frame, then the close", (r) => [{ write: Buffer.concat([bytes(head101(r)), half]) }, "end"], relay(half, false)],
    ["a 101, then silence", (r) => [{ write: bytes(head101(r)) }, "stall"], relay(Buffer.alloc(0), false)],
    ["two 101s", (r) => [{ write: bytes(head101(r) + head101(r)) }, "echo"], { switched: "yes", errors: [] }],
    [
      "a 101 in pieces",
      (r) => {
        const whole = bytes(head101(r));
        const at = rng.range(1, whole.length - 1);
        return [{ write: whole.subarray(0, at) }, { pause: rng.pick([0, 1, 5]) }, { write: whole.subarray(at) }, "echo"];
      },
      relay(),
    ],
  ];
}

/** Target `websocket`: one upgrade to a hostile WebSocket upstream, with bytes of the guest's own on both sides of the 101. */
export function websocketCase(rng: Rng, world: FuzzWorld): WsCase {
  const steps: string[] = [];
  const tag = world.tag ?? "websocket-0";
  const name = rng.chance(0.6) ? "api" : "secret";
  const via = rng.chance(0.5) ? "plain" : "tunnel";
  const placeholder = name === "secret" && rng.chance(0.6);
  const key = rng.bytes(16).toString("base64");
  const fields: [string, string][] = [
    ["upgrade", rng.pick(["websocket", "websocket", "WebSocket"])],
    ["connection", rng.pick(["Upgrade", "Upgrade", "keep-alive, Upgrade"])],
    ["sec-websocket-key", key],
    ["sec-websocket-version", "13"],
  ];
  if (rng.chance(0.3)) fields.push(["sec-websocket-protocol", "chat, superchat"]);
  if (placeholder) fields.push(["authorization", `Bearer ${world.placeholder}`]);
  steps.push(`upgrade ${via} to ${name}${placeholder ? " with the placeholder" : ""}`);
  // A hostile guest's head: framing an upgrade cannot have, a second protocol, an old version.
  const odd = rng.chance(0.2)
    ? rng.pick<readonly [string, [string, string][]]>([
        ["Content-Length: 5", [["content-length", "5"]]],
        ["Transfer-Encoding: chunked", [["transfer-encoding", "chunked"]]],
        ["a second Upgrade: h2c", [["upgrade", "h2c"]]],
        ["Upgrade: websocket, h2c", [["upgrade", "websocket, h2c"]]],
        ["Sec-WebSocket-Version: 8", [["sec-websocket-version", "8"]]],
        ["Expect: 100-continue", [["expect", "100-continue"]]],
        ["a second Host", [["host", "denied.test"]]],
      ])
    : undefined;
  if (odd !== undefined) {
    if (odd[0] === "Upgrade: websocket, h2c") fields[0] = odd[1][0]!;
    else fields.push(...odd[1]);
    steps.push(`the guest's head has ${odd[0]}`);
  }
  const [label, script, answered] = rng.pick(answers(rng));
  steps.push(label);
  const mask = rng.bytes(4);
  const early = rng.chance(0.7) ? Buffer.alloc(0) : rng.pick([wsFrame(0x1, bytes("early hello"), mask), rng.bytes(1000), Buffer.alloc(70_000, 0x41)]);
  const late = rng.pick([
    wsFrame(0x1, bytes(`hello ${tag}`), mask),
    wsFrame(0x1, bytes(`hello ${tag}`), mask),
    Buffer.concat([wsFrame(0x9, bytes("ping"), mask), wsFrame(0x8, Buffer.from([0x03, 0xe8]), mask)]),
    rng.bytes(rng.pick([1, 100, 3000])),
    wsFrame(0x2, Buffer.alloc(rng.pick([70_000, 1024 * 1024]), 0x61), mask),
    wsFrame(0x1, bytes(`unmasked ${tag}`), undefined),
    Buffer.alloc(0),
  ]);
  const cut = rng.chance(0.15);
  if (early.length > 0) steps.push(`${early.length} bytes before the 101`);
  steps.push(`${late.length} bytes after it${cut ? ", then a cut" : ""}`);
  let outcome = answered;
  // An odd head may be refused (400, 417, 501) or passed on: either way, nothing unchecked goes through.
  if (odd !== undefined) outcome = { switched: "either", errors: "any" };
  // Past what the proxy holds before a 101, it closes the connection: no promise of what comes.
  else if (early.length > 64 * 1024) outcome = { switched: "either", errors: "any" };
  else if (placeholder && via === "plain") outcome = { switched: "no", errors: ["EG_DENIED"] };
  else if (outcome.after !== undefined && outcome.after.exact) outcome = { ...outcome, after: { exact: true, bytes: Buffer.concat([outcome.after.bytes, early, late]) } };
  return { name, via, target: `/ws?c=${tag}`, fields, early, late, cut, script, expect: outcome, steps };
}
