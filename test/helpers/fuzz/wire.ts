/**
 * Strict readers for the fuzzer's oracles: what an upstream received must be a request the proxy
 * would write for a valid one (RFC 9112 framing with no room for a second reading), and what a
 * guest received must be well-formed responses. Both are deliberately narrower than a server's
 * parser: anything a lenient parser might read two ways is a finding.
 */

const token = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// Field values as the proxy writes them: visible ASCII, SP, HTAB and obs-text, no other control byte.
const fieldValue = /^[\t\x20-\x7e\x80-\xff]*$/;
const targetText = /^[\x21-\x7e]+$/;

export interface UpstreamRequest {
  readonly method: string;
  readonly target: string;
  readonly fields: readonly (readonly [string, string])[];
  readonly body: Buffer;
}

export type Parsed<T> = { readonly kind: "more" } | { readonly kind: "bad"; readonly reason: string } | { readonly kind: "done"; readonly value: T; readonly consumed: number };

const more = { kind: "more" } as const;
const bad = (reason: string): { kind: "bad"; reason: string } => ({ kind: "bad", reason });

function splitHead(buf: Buffer, limit: number): Parsed<{ lines: string[]; bodyStart: number }> {
  const end = buf.indexOf("\r\n\r\n");
  if (end < 0) return buf.length > limit ? bad(`no end of head within ${limit} bytes`) : more;
  const text = buf.subarray(0, end).toString("latin1");
  const lines = text.split("\r\n");
  for (const line of lines) if (/[\r\n]/.test(line)) return bad(`a bare CR or LF in ${JSON.stringify(line.slice(0, 120))}`);
  return { kind: "done", value: { lines, bodyStart: end + 4 }, consumed: end + 4 };
}

function readFields(lines: readonly string[]): { fields: [string, string][] } | { reason: string } {
  const fields: [string, string][] = [];
  for (const line of lines) {
    const colon = line.indexOf(":");
    if (colon <= 0) return { reason: `a field line without a name: ${JSON.stringify(line.slice(0, 120))}` };
    const name = line.slice(0, colon);
    if (!token.test(name)) return { reason: `a field name that is not a token: ${JSON.stringify(name.slice(0, 120))}` };
    // Trimmed by hand: `[ \t]+$` backtracks quadratically over a long run of spaces.
    let from = colon + 1;
    let to = line.length;
    while (from < to && (line[from] === " " || line[from] === "\t")) from++;
    while (to > from && (line[to - 1] === " " || line[to - 1] === "\t")) to--;
    const value = line.slice(from, to);
    if (!fieldValue.test(value)) return { reason: `a control byte in the value of ${name}: ${JSON.stringify(value.slice(0, 120))}` };
    fields.push([name, value]);
  }
  return { fields };
}

function all(fields: readonly (readonly [string, string])[], name: string): string[] {
  return fields.filter(([n]) => n.toLowerCase() === name).map(([, v]) => v);
}

/** A chunked body from `start`: the strict grammar (hex size, no extension), trailers as fields. */
function readChunked(buf: Buffer, start: number): Parsed<Buffer> {
  const parts: Buffer[] = [];
  let at = start;
  for (;;) {
    const lineEnd = buf.indexOf("\r\n", at);
    if (lineEnd < 0) return buf.length - at > 64 ? bad("a chunk-size line over 64 bytes") : more;
    const sizeText = buf.subarray(at, lineEnd).toString("latin1");
    if (!/^[0-9a-fA-F]{1,8}$/.test(sizeText)) return bad(`a chunk size ${JSON.stringify(sizeText)}`);
    const size = Number.parseInt(sizeText, 16);
    const dataStart = lineEnd + 2;
    if (size === 0) {
      // Trailer fields, then the empty line.
      let t = dataStart;
      for (;;) {
        const end = buf.indexOf("\r\n", t);
        if (end < 0) return more;
        if (end === t) return { kind: "done", value: Buffer.concat(parts), consumed: end + 2 };
        const fields = readFields([buf.subarray(t, end).toString("latin1")]);
        if ("reason" in fields) return bad(`trailer: ${fields.reason}`);
        t = end + 2;
      }
    }
    if (buf.length < dataStart + size + 2) return more;
    if (buf[dataStart + size] !== 0x0d || buf[dataStart + size + 1] !== 0x0a) return bad("chunk data not followed by CRLF");
    parts.push(buf.subarray(dataStart, dataStart + size));
    at = dataStart + size + 2;
  }
}

/** One request from the front of what an upstream connection received. */
export function parseUpstreamRequest(buf: Buffer): Parsed<UpstreamRequest> {
  const head = splitHead(buf, 256 * 1024);
  if (head.kind !== "done") return head;
  const [requestLine, ...fieldLines] = head.value.lines;
  const line = /^([^ ]+) ([^ ]+) HTTP\/1\.1$/.exec(requestLine ?? "");
  if (line === null) return bad(`request line ${JSON.stringify((requestLine ?? "").slice(0, 200))}`);
  const [, method, target] = line as unknown as [string, string, string];
  if (!token.test(method)) return bad(`method ${JSON.stringify(method)}`);
  if (!targetText.test(target)) return bad(`request target ${JSON.stringify(target.slice(0, 200))}`);
  if (!target.startsWith("/") && !(method === "OPTIONS" && target === "*")) return bad(`request target not origin-form: ${JSON.stringify(target.slice(0, 200))}`);
  const read = readFields(fieldLines);
  if ("reason" in read) return bad(read.reason);
  const fields = read.fields;
  const hosts = all(fields, "host");
  if (hosts.length !== 1) return bad(`${hosts.length} Host fields`);
  for (const hop of ["proxy-authorization", "proxy-connection", "keep-alive", "te", "trailer"]) {
    if (all(fields, hop).length > 0 && !(hop === "te" && all(fields, hop).every((v) => v === "trailers"))) return bad(`hop-by-hop field ${hop} forwarded`);
  }
  const lengths = all(fields, "content-length");
  const codings = all(fields, "transfer-encoding");
  if (lengths.length > 0 && codings.length > 0) return bad("Content-Length and Transfer-Encoding both");
  if (lengths.length > 1) return bad(`${lengths.length} Content-Length fields`);
  if (codings.length > 1) return bad(`${codings.length} Transfer-Encoding fields`);
  const start = head.value.bodyStart;
  if (codings.length === 1) {
    if (codings[0] !== "chunked") return bad(`Transfer-Encoding ${JSON.stringify(codings[0])}`);
    const body = readChunked(buf, start);
    if (body.kind !== "done") return body;
    return { kind: "done", value: { method, target, fields, body: body.value }, consumed: body.consumed };
  }
  if (lengths.length === 1) {
    if (!/^(0|[1-9][0-9]{0,15})$/.test(lengths[0]!)) return bad(`Content-Length ${JSON.stringify(lengths[0])}`);
    const length = Number(lengths[0]);
    if (buf.length < start + length) return more;
    return { kind: "done", value: { method, target, fields, body: buf.subarray(start, start + length) }, consumed: start + length };
  }
  return { kind: "done", value: { method, target, fields, body: Buffer.alloc(0) }, consumed: start };
}

export interface GuestResponse {
  readonly status: number;
  readonly fields: readonly (readonly [string, string])[];
  readonly body: Buffer;
}

/**
 * One response from the front of what a guest received. `noBody(status)` says the request was a
 * HEAD (or a CONNECT answered 2xx). A body read to the close needs `closed`.
 */
export function parseGuestResponse(buf: Buffer, closed: boolean, noBody: (status: number) => boolean): Parsed<GuestResponse> {
  const head = splitHead(buf, 128 * 1024);
  if (head.kind !== "done") return head;
  const [statusLine, ...fieldLines] = head.value.lines;
  const line = /^HTTP\/1\.1 ([1-5][0-9][0-9]) [\t\x20-\x7e\x80-\xff]*$/.exec(statusLine ?? "");
  if (line === null) return bad(`status line ${JSON.stringify((statusLine ?? "").slice(0, 200))}`);
  const status = Number(line[1]);
  const read = readFields(fieldLines);
  if ("reason" in read) return bad(read.reason);
  const fields = read.fields;
  const start = head.value.bodyStart;
  const done = (body: Buffer, consumed: number): Parsed<GuestResponse> => ({ kind: "done", value: { status, fields, body }, consumed });
  const lengths = all(fields, "content-length");
  const codings = all(fields, "transfer-encoding");
  if (lengths.length > 0 && codings.length > 0) return bad("a response with Content-Length and Transfer-Encoding");
  if (lengths.length > 1) return bad("a response with two Content-Length fields");
  if (status < 200 || status === 204 || status === 304 || noBody(status)) return done(Buffer.alloc(0), start);
  if (codings.length > 0) {
    if (codings.join(",") !== "chunked") return bad(`a response's Transfer-Encoding ${JSON.stringify(codings.join(","))}`);
    const body = readChunked(buf, start);
    return body.kind === "done" ? done(body.value, body.consumed) : body;
  }
  if (lengths.length === 1) {
    if (!/^(0|[1-9][0-9]*)$/.test(lengths[0]!)) return bad(`a response's Content-Length ${JSON.stringify(lengths[0])}`);
    const length = Number(lengths[0]);
    if (buf.length < start + length) return more;
    return done(buf.subarray(start, start + length), start + length);
  }
  return closed ? done(buf.subarray(start), buf.length) : more;
}

export interface RawFrame {
  readonly type: number;
  readonly flags: number;
  readonly streamId: number;
  readonly payload: Buffer;
}

/** HTTP/2 frames (RFC 9113 §4.1) from the front of `buf`; `rest` is an incomplete frame's bytes. */
export function parseFrames(buf: Buffer): { frames: RawFrame[]; rest: Buffer } {
  const frames: RawFrame[] = [];
  let at = 0;
  while (buf.length - at >= 9) {
    const length = buf.readUIntBE(at, 3);
    if (buf.length - at < 9 + length) break;
    frames.push({ type: buf[at + 3]!, flags: buf[at + 4]!, streamId: buf.readUInt32BE(at + 5) & 0x7fffffff, payload: buf.subarray(at + 9, at + 9 + length) });
    at += 9 + length;
  }
  return { frames, rest: buf.subarray(at) };
}

/** What is wrong with a frame the proxy sent, by RFC 9113 §6; undefined if nothing. */
export function badServerFrame(frame: RawFrame, maxFrameSize: number): string | undefined {
  const { type, streamId, payload } = frame;
  if (payload.length > maxFrameSize) return `a frame of ${payload.length} bytes over the guest's SETTINGS_MAX_FRAME_SIZE ${maxFrameSize}`;
  if (type > 0x9) return undefined;
  const onConnection = type === 0x4 || type === 0x6 || type === 0x7;
  if (onConnection && streamId !== 0) return `frame type ${type} on stream ${streamId}`;
  if (!onConnection && type !== 0x8 && streamId === 0) return `frame type ${type} on stream 0`;
  if (type === 0x4 && (frame.flags & 1 ? payload.length !== 0 : payload.length % 6 !== 0)) return `SETTINGS of ${payload.length} bytes`;
  if (type === 0x6 && payload.length !== 8) return `PING of ${payload.length} bytes`;
  if (type === 0x3 && payload.length !== 4) return `RST_STREAM of ${payload.length} bytes`;
  if (type === 0x8 && payload.length !== 4) return `WINDOW_UPDATE of ${payload.length} bytes`;
  if (type === 0x7 && payload.length < 8) return `GOAWAY of ${payload.length} bytes`;
  if (type === 0x1 && streamId % 2 === 0) return `HEADERS on even stream ${streamId} (no push was enabled)`;
  if (type === 0x5) return "PUSH_PROMISE with push disabled";
  return undefined;
}
