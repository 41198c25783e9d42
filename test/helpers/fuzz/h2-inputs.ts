import { hpackInteger as hpackInt, literal as literalNotIndexed, literalIndexed } from "../h2-frames.js";
import { fuzzPath, mutateBytes, splitWrites } from "./h1-inputs.js";
import type { Rng } from "./rng.js";
import { hostName, type FuzzWorld, type UpstreamName } from "./world.js";

/**
 * HTTP/2 inputs for the fuzzer (RFC 9113, RFC 7541), written by hand as bytes: requests whose
 * header blocks are literal HPACK (some split into CONTINUATION, padded, with priority), DATA,
 * PRIORITY, SETTINGS at the edges of their ranges, WINDOW_UPDATE of 0 and past 2^31-1, frames of
 * random types, flags, lengths and streams, broken HPACK, and CONTINUATION out of order.
 */
export interface H2Case {
  readonly connect: { readonly name: UpstreamName; readonly authority: string };
  /** The bytes after the TLS handshake, preface included, in writes. */
  readonly writes: readonly Buffer[];
  /** Streams whose request was sent whole (END_STREAM), which the harness waits for. */
  readonly streams: readonly number[];
  /** Whether the client acknowledges the server's SETTINGS (a client that does not gets GOAWAY SETTINGS_TIMEOUT). */
  readonly ackSettings: boolean;
  /** The SETTINGS_MAX_FRAME_SIZE this client announced last (frames larger are a finding). */
  readonly maxFrameSize: number;
  readonly steps: readonly string[];
}

export const preface = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

export const type = { data: 0, headers: 1, priority: 2, rst: 3, settings: 4, push: 5, ping: 6, goaway: 7, window: 8, continuation: 9 } as const;

export function frame(frameType: number, flags: number, streamId: number, payload: Buffer = Buffer.alloc(0), length = payload.length): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(length & 0xffffff, 0, 3);
  head[3] = frameType & 0xff;
  head[4] = flags & 0xff;
  head.writeUInt32BE(streamId >>> 0, 5);
  return Buffer.concat([head, payload]);
}

function u32(value: number): Buffer {
  const out = Buffer.alloc(4);
  out.writeUInt32BE(value >>> 0, 0);
  return out;
}

export function settingsFrame(pairs: readonly (readonly [number, number])[]): Buffer {
  const payload = Buffer.alloc(pairs.length * 6);
  pairs.forEach(([id, value], i) => {
    payload.writeUInt16BE(id & 0xffff, i * 6);
    payload.writeUInt32BE(value >>> 0, i * 6 + 2);
  });
  return frame(type.settings, 0, 0, payload);
}

/** A literal field without indexing, new name (§6.2.2), or with incremental indexing (§6.2.1). */
export function literal(name: string, value: string, indexing = false): Buffer {
  return indexing ? literalIndexed(name, value) : literalNotIndexed(name, value);
}

/** Header blocks HPACK must refuse, or that decode to something a server must refuse. */
const brokenHpack: readonly (readonly [string, Buffer])[] = [
  ["indexed 0", Buffer.from([0x80])],
  ["index past the tables", hpackInt(5000, 7, 0x80)],
  ["table size update past the limit", hpackInt(1 << 20, 5, 0x20)],
  ["table size update after a field", Buffer.concat([literal("a", "b"), Buffer.from([0x20])])],
  ["integer overflow", Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f])],
  ["string past the block", Buffer.from([0x00, 0x7f, 0x10, 0x61])],
  ["bad huffman", Buffer.from([0x00, 0x81, 0xff, 0x81, 0x00])],
  ["huffman EOS", Buffer.from([0x00, 0x84, 0xff, 0xff, 0xff, 0xff, 0x01, 0x61])],
  ["literal with indexed name 0", Buffer.from([0x40, 0x00, 0x01, 0x61])],
  ["upper-case name", literal("X-Upper", "1")],
  ["name with colon", literal("x:y", "1")],
  ["pseudo after regular", literal(":path", "/again")],
  ["unknown pseudo", literal(":protocol", "websocket")],
  ["connection field", literal("connection", "keep-alive")],
  ["te gzip", literal("te", "gzip")],
  ["CR in value", literal("x-a", "a\r\nx-b: c")],
  ["NUL in value", literal("x-a", "a\u0000b")],
  ["empty name", literal("", "v")],
  ["space in name", literal("x a", "v")],
  ["huge value", literal("x-big", "v".repeat(70_000))],
  ["duplicate :path", Buffer.concat([literal(":path", "/1"), literal(":path", "/2")])],
  ["host and :authority differ", literal("host", "denied.test")],
  ["content-length word", literal("content-length", "five")],
  ["content-length negative", literal("content-length", "-1")],
  ["transfer-encoding", literal("transfer-encoding", "chunked")],
];

interface Request {
  readonly streamId: number;
  readonly block: Buffer;
  readonly endStream: boolean;
  readonly body?: Buffer;
}

function requestBlock(rng: Rng, world: FuzzWorld, authority: string, steps: string[]): { block: Buffer; hasBody: boolean } {
  const p = world.placeholder;
  const method = rng.pick(["GET", "GET", "POST", "PUT", "HEAD", "OPTIONS", "CONNECT", "TRACE", "DELETE"]);
  const pseudo: [string, string][] = [
    [":method", method],
    [":scheme", rng.chance(0.95) ? "https" : rng.pick(["http", "ftp", ""])],
    [":authority", rng.chance(0.9) ? authority : rng.pick([`${hostName("denied")}:${world.ports.denied.tls}`, "api.test", "API.TEST.", `u:${p}@${authority}`, "", "[::1]:1"])],
    [":path", rng.chance(0.9) ? fuzzPath(rng, world) : rng.pick(["", "*", "a", `/${p}`, `//denied.test/x`, "/\u00e9", `/?q=${p}`, "/a b"])],
  ];
  if (rng.chance(0.1)) pseudo.splice(rng.int(pseudo.length), 1);
  if (rng.chance(0.1)) pseudo.sort(() => rng.next() - 0.5);
  const regular: [string, string][] = [["user-agent", "fuzz/2"]];
  if (rng.chance(0.5)) regular.push(["authorization", rng.chance(0.5) ? `Bearer ${p}` : `Basic ${Buffer.from(`u:${p}`).toString("base64")}`]);
  if (rng.chance(0.4)) regular.push(["x-token", p]);
  if (rng.chance(0.2)) regular.push(["cookie", `a=${p}`], ["cookie", "b=2"]);
  if (rng.chance(0.1)) regular.push(["proxy-authorization", `Basic ${Buffer.from(`default:${p}`).toString("base64")}`]);
  const hasBody = method === "POST" || method === "PUT" ? rng.chance(0.8) : rng.chance(0.1);
  if (hasBody && rng.chance(0.5)) regular.push(["content-length", rng.pick(["5", "5", "0", "6", "4", "99999999999999999999"])]);
  if (rng.chance(0.1)) regular.push(["expect", "100-continue"]);
  steps.push(`${method} ${pseudo.find(([n]) => n === ":path")?.[1]?.slice(0, 40) ?? "(no :path)"}`);
  const parts = [...pseudo, ...regular].map(([n, v]) => literal(n, v, rng.chance(0.2)));
  if (rng.chance(0.15)) {
    const [label, bytes] = rng.pick(brokenHpack);
    parts.splice(rng.int(parts.length + 1), 0, bytes);
    steps.push(`hpack: ${label}`);
  }
  if (rng.chance(0.1)) {
    // Indexed fields of the static table (RFC 7541 Appendix A): :method GET, :path /, :scheme https.
    parts.splice(rng.int(parts.length + 1), 0, Buffer.from([rng.pick([0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0xbe, 0xbf])]));
    steps.push("hpack: indexed field");
  }
  return { block: Buffer.concat(parts), hasBody };
}

function padded(rng: Rng, payload: Buffer): { flags: number; payload: Buffer } {
  const pad = rng.pick([0, 1, 10, 255]);
  // A pad length past the payload is a PROTOCOL_ERROR the server must catch.
  const declared = rng.chance(0.1) ? rng.pick([payload.length + pad + 1, 255]) : pad;
  return { flags: 0x8, payload: Buffer.concat([Buffer.from([declared]), payload, Buffer.alloc(pad)]) };
}

function headersFrames(rng: Rng, request: Request, steps: string[]): Buffer[] {
  let flags = request.endStream ? 0x1 : 0;
  let block = request.block;
  let prefix = Buffer.alloc(0);
  if (rng.chance(0.15)) {
    // PRIORITY flag: exclusive bit, dependency (sometimes itself), weight.
    const dependsOn = rng.chance(0.3) ? request.streamId : rng.pick([0, 1, 3, 0x7fffffff]);
    prefix = Buffer.concat([u32((rng.chance(0.5) ? 0x80000000 : 0) | dependsOn), Buffer.from([rng.int(256)])]);
    flags |= 0x20;
    steps.push(`priority on ${dependsOn}`);
  }
  const pieces: Buffer[] = [];
  if (rng.chance(0.2) && block.length > 2) {
    const cut = rng.range(1, block.length - 1);
    pieces.push(block.subarray(cut));
    block = block.subarray(0, cut);
    steps.push("CONTINUATION");
  }
  let payload: Buffer = Buffer.concat([prefix, block]);
  if (rng.chance(0.1)) {
    const p = padded(rng, payload);
    flags |= p.flags;
    payload = p.payload;
    steps.push("padded HEADERS");
  }
  const out = [frame(type.headers, flags | (pieces.length === 0 ? 0x4 : 0), request.streamId, payload)];
  for (const [i, piece] of pieces.entries()) {
    const last = i === pieces.length - 1;
    const streamId = rng.chance(0.05) ? request.streamId + 2 : request.streamId;
    if (rng.chance(0.05)) {
      out.push(frame(type.data, 0, request.streamId, Buffer.from("x")));
      steps.push("DATA inside a header block");
    }
    out.push(frame(type.continuation, last ? 0x4 : 0, streamId, piece));
  }
  if (rng.chance(0.03)) {
    out.push(frame(type.continuation, 0x4, request.streamId, literal("x-late", "1")));
    steps.push("CONTINUATION after END_HEADERS");
  }
  return out;
}

function dataFrames(rng: Rng, streamId: number, body: Buffer, endStream: boolean, steps: string[]): Buffer[] {
  const out: Buffer[] = [];
  const cut = body.length > 1 && rng.chance(0.3) ? rng.range(1, body.length - 1) : body.length;
  const parts = cut === body.length ? [body] : [body.subarray(0, cut), body.subarray(cut)];
  for (const [i, part] of parts.entries()) {
    let flags = endStream && i === parts.length - 1 ? 0x1 : 0;
    let payload: Buffer = part;
    if (rng.chance(0.1)) {
      const p = padded(rng, payload);
      flags |= p.flags;
      payload = p.payload;
      steps.push("padded DATA");
    }
    out.push(frame(type.data, flags, streamId, payload));
  }
  return out;
}

const settingEdges: readonly (readonly [number, readonly number[]])[] = [
  [0x1, [0, 1, 4096, 0xffffffff]],
  [0x2, [0, 1, 2]],
  [0x3, [0, 1, 100, 0x7fffffff, 0xffffffff]],
  [0x4, [0, 1, 65535, 0x7fffffff, 0x80000000]],
  [0x5, [16383, 16384, 16777215, 16777216]],
  [0x6, [0, 1, 100, 0xffffffff]],
  [0x8, [0, 1, 2]],
  [0x9, [0, 1]],
  [0xffff, [0, 12345]],
];

function randomSettings(rng: Rng, steps: string[]): { pairs: [number, number][]; maxFrameSize: number | undefined } {
  const pairs: [number, number][] = [[0x2, 0]];
  let maxFrameSize: number | undefined;
  for (let n = rng.range(0, 3); n > 0; n--) {
    const [id, values] = rng.pick(settingEdges);
    const value = rng.pick(values);
    pairs.push([id, value]);
    if (id === 0x5 && value >= 16384 && value <= 16777215) maxFrameSize = value;
    steps.push(`SETTINGS ${id}=${value}`);
  }
  return { pairs, maxFrameSize };
}

/** A frame of a random type, flags, stream and length (the declared length sometimes not the payload's). */
function randomFrame(rng: Rng, streams: readonly number[], steps: string[]): Buffer {
  const frameType = rng.chance(0.8) ? rng.int(10) : rng.range(10, 255);
  const flags = rng.int(256);
  const streamId = rng.pick([0, 1, 2, 3, 5, 0x7fffffff, 0x80000001, ...streams]);
  const payload = rng.bytes(rng.pick([0, 1, 4, 5, 8, 9, 13, 64]));
  steps.push(`random frame type ${frameType} flags ${flags} stream ${streamId} length ${payload.length}`);
  return frame(frameType, flags, streamId, payload);
}

function controlFrame(rng: Rng, streams: readonly number[], steps: string[]): Buffer {
  const streamId = rng.pick([0, ...streams, 99]);
  switch (rng.int(8)) {
    case 0: {
      const increment = rng.pick([0, 1, 0x7fffffff, 0x80000000, 0xffffffff]);
      steps.push(`WINDOW_UPDATE ${increment} on ${streamId}`);
      return frame(type.window, 0, streamId, u32(increment));
    }
    case 1: {
      steps.push(`two WINDOW_UPDATEs of 2^31-1 on ${streamId}`);
      return Buffer.concat([frame(type.window, 0, streamId, u32(0x7fffffff)), frame(type.window, 0, streamId, u32(0x7fffffff))]);
    }
    case 2: {
      const dependsOn = rng.chance(0.3) ? streamId : rng.pick([0, 1, 3]);
      steps.push(`PRIORITY ${streamId} on ${dependsOn}`);
      const payload = Buffer.concat([u32(dependsOn), Buffer.from([rng.int(256)])]);
      return frame(type.priority, 0, streamId, rng.chance(0.1) ? payload.subarray(0, 4) : payload);
    }
    case 3: {
      steps.push(`RST_STREAM on ${streamId}`);
      return frame(type.rst, 0, streamId, u32(rng.pick([0, 1, 2, 8, 0xffffffff])));
    }
    case 4: {
      steps.push("PING");
      return frame(type.ping, rng.pick([0, 1]), rng.pick([0, 0, 1]), rng.bytes(rng.pick([8, 8, 7])));
    }
    case 5: {
      steps.push("SETTINGS ACK or bad SETTINGS");
      return rng.chance(0.5) ? frame(type.settings, 1, 0) : frame(type.settings, rng.pick([0, 1]), rng.pick([0, 1]), rng.bytes(rng.pick([5, 6, 7])));
    }
    case 6: {
      steps.push("GOAWAY");
      return frame(type.goaway, 0, 0, Buffer.concat([u32(rng.pick([0, 1, 0x7fffffff])), u32(rng.pick([0, 1, 2]))]));
    }
    default: {
      steps.push("PUSH_PROMISE from the client");
      return frame(type.push, 0x4, rng.pick([1, 3]), Buffer.concat([u32(2), literal(":path", "/")]));
    }
  }
}

/** Target `h2`: HTTP/2 after ALPN h2 inside a CONNECT tunnel to `api.test` or `secret.test`. */
export function h2Case(rng: Rng, world: FuzzWorld): H2Case {
  const name: UpstreamName = rng.chance(0.5) ? "api" : "secret";
  const authority = `${hostName(name)}:${world.ports[name].tls}`;
  const steps: string[] = [`h2 tunnel to ${authority}`];
  const settings = randomSettings(rng, steps);
  const frames: Buffer[] = [rng.chance(0.97) ? preface : Buffer.from("PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"), settingsFrame(settings.pairs)];
  if (rng.chance(0.5)) frames.push(frame(type.window, 0, 0, u32(1 << 20)));
  const complete: number[] = [];
  const opened: number[] = [];
  let next = 1;
  for (let n = rng.range(1, 4); n > 0; n--) {
    if (rng.chance(0.3)) frames.push(rng.chance(0.5) ? controlFrame(rng, opened, steps) : randomFrame(rng, opened, steps));
    const streamId = rng.chance(0.95) ? next : rng.pick([Math.max(1, next - 2), 2, 0, next + 100]);
    next += 2;
    opened.push(streamId);
    const { block, hasBody } = requestBlock(rng, world, authority, steps);
    const body = hasBody ? Buffer.from(rng.chance(0.3) ? `a=${world.placeholder}` : "hello") : undefined;
    const finish = rng.chance(0.9);
    frames.push(...headersFrames(rng, { streamId, block, endStream: body === undefined && finish }, steps));
    if (body !== undefined) frames.push(...dataFrames(rng, streamId, body, finish, steps));
    if (finish) complete.push(streamId);
  }
  if (rng.chance(0.3)) frames.push(rng.chance(0.5) ? controlFrame(rng, opened, steps) : randomFrame(rng, opened, steps));
  let bytes = Buffer.concat(frames);
  // Bytes flipped past the preface only now and then: most flips end the connection at once.
  if (rng.chance(0.15)) bytes = Buffer.concat([bytes.subarray(0, preface.length), mutateBytes(rng, bytes.subarray(preface.length), steps, 2)]);
  const ackSettings = rng.chance(0.95);
  if (!ackSettings) steps.push("server's SETTINGS not acknowledged");
  return { connect: { name, authority }, writes: splitWrites(rng, bytes, steps), streams: complete, ackSettings, maxFrameSize: settings.maxFrameSize ?? 16384, steps };
}
