import { createServer as createH2Server, type IncomingHttpHeaders } from "node:http2";
import type { Socket } from "node:net";
import { Duplex } from "node:stream";
import { literal } from "../h2-frames.js";
import { frame, preface, settingsFrame, type } from "./h2-inputs.js";
import { listenRaw } from "./recorder.js";
import { parseUpstreamRequest, type UpstreamRequest } from "./wire.js";

/**
 * An upstream that misbehaves on cue (test/helpers/fuzz/upstream-inputs.ts writes the cues): for
 * the request a case names (its `c=TAG` and `seq=N`), it answers with the case's script, bytes or
 * HTTP/2 frames written as they are, with pauses, a close or a cut; every other request is
 * answered well, with a body that names the path, so the guest can tell whose answer it got.
 *
 * HTTP/1.1 requests are read with the fuzzer's strict parser (a request it cannot read is a
 * finding, as at the recording upstreams). HTTP/2 requests are read by a shadow `node:http2`
 * server fed only the connection's header blocks: it decodes their HPACK (Huffman, dynamic
 * table) as the real peer would, while everything this upstream sends is written by hand.
 */
export type HostileStep =
  | { readonly write: Buffer }
  /** HTTP/2 only: a frame on the request's stream (its id passed in). */
  | { readonly frame: (stream: number) => Buffer }
  | { readonly pause: number }
  /** HTTP/1.1 only: a second whole response, `SMUGGLED <tag> auth=<the request's Authorization>`. */
  | { readonly smuggle: string }
  /** Half-close (FIN after what was written), cut (destroy), or say nothing more. */
  | "end"
  | "destroy"
  | "stall";

export interface HostileRequest {
  readonly method: string;
  readonly target: string;
  readonly fields: readonly (readonly [string, string])[];
}

export interface HostileUpstream {
  readonly label: string;
  readonly port: number;
  /** Strict-parse failures (HTTP/1.1): the reason and the connection's last bytes. */
  readonly malformed: { reason: string; bytes: Buffer }[];
  /** Bytes received since the harness last took them (for the secret scan), in order. */
  readonly received: Buffer[];
  connections: number;
  close(): Promise<void>;
}

export interface HostileOptions {
  readonly label: string;
  readonly host: string;
  readonly tls?: { readonly key: string; readonly cert: string };
  /** ALPN h2 (TLS only): HTTP/2 frames; otherwise HTTP/1.1. */
  readonly h2?: boolean;
  /** The script for a request, or undefined for a well-behaved answer. */
  readonly script: (request: HostileRequest) => readonly HostileStep[] | undefined;
  /** Each request read, and whether it was answered with a script. */
  readonly onRequest?: (request: HostileRequest, scripted: boolean) => void;
  /** HTTP/2: the proxy sent GOAWAY with this error code (not NO_ERROR: its client refused a frame of ours). */
  readonly onGoaway?: (code: number) => void;
}

/** The body of a well-behaved answer: the label and the path, never a field (which may carry a secret's value). */
export function normalBody(label: string, target: string): string {
  return `hostile ${label} ${target.slice(0, 200)}\n`;
}

function fieldOf(fields: readonly (readonly [string, string])[], name: string): string | undefined {
  return fields.find(([n]) => n.toLowerCase() === name)?.[1];
}

/**
 * With `echo=1` in the query, the well-behaved answer quotes the request's `Authorization` (the
 * many-guests target: each guest must get back its own secret's value, never another's).
 */
function normalText(label: string, request: HostileRequest): string {
  const echo = /[?&]echo=1/.test(request.target) ? `auth=${fieldOf(request.fields, "authorization") ?? ""}\n` : "";
  return normalBody(label, request.target) + echo;
}

export async function startHostile(options: HostileOptions): Promise<HostileUpstream> {
  const sockets = new Set<Socket>();
  const upstream: HostileUpstream = {
    label: options.label,
    port: 0,
    malformed: [],
    received: [],
    connections: 0,
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const run = async (socket: Socket, steps: readonly HostileStep[], stream: number, request?: HostileRequest): Promise<boolean> => {
    // Writes between pauses go out together: a response smuggled behind an answer comes with it,
    // as a client can tell (bytes with no request waiting for them). One that comes later, after
    // the client has sent its next request, no HTTP/1.1 client can tell from that request's answer.
    socket.cork();
    try {
      return await runCorked(socket, steps, stream, request);
    } finally {
      socket.uncork();
    }
  };
  const runCorked = async (socket: Socket, steps: readonly HostileStep[], stream: number, request?: HostileRequest): Promise<boolean> => {
    for (const step of steps) {
      if (socket.destroyed) return false;
      if (step === "end") {
        socket.end();
        return false;
      }
      if (step === "destroy") {
        socket.uncork();
        socket.destroy();
        return false;
      }
      if (step === "stall") return false;
      if ("pause" in step) {
        socket.uncork();
        await new Promise((resolve) => setTimeout(resolve, step.pause));
        socket.cork();
      }
      else if ("write" in step) socket.write(step.write);
      else if ("smuggle" in step) {
        // What the upstream received, behind the answer: a connection lent on would carry it to another request (another guest's).
        const text = `SMUGGLED ${step.smuggle} auth=${fieldOf(request?.fields ?? [], "authorization") ?? ""}\n`;
        socket.write(Buffer.from(`HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(text, "latin1")}\r\n\r\n${text}`, "latin1"));
      }
      else socket.write(step.frame(stream));
    }
    return true;
  };
  const serveH1 = (socket: Socket): void => {
    let recent = Buffer.alloc(0);
    let pending: Buffer = Buffer.alloc(0);
    // Requests are answered in order, each after the script before it has run.
    let queue: Promise<boolean> = Promise.resolve(true);
    socket.on("data", (chunk: Buffer) => {
      upstream.received.push(chunk);
      recent = Buffer.concat([recent, chunk]).subarray(-64 * 1024);
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
      for (;;) {
        const parsed = parseUpstreamRequest(pending);
        if (parsed.kind === "more") return;
        if (parsed.kind === "bad") {
          upstream.malformed.push({ reason: parsed.reason, bytes: recent });
          socket.destroy();
          return;
        }
        pending = pending.subarray(parsed.consumed);
        const request: UpstreamRequest = parsed.value;
        const steps = options.script(request);
        options.onRequest?.(request, steps !== undefined);
        const text = normalText(options.label, request);
        const answer: readonly HostileStep[] = steps ?? [
          { write: Buffer.from(`HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(text)}\r\n\r\n${request.method === "HEAD" ? "" : text}`) },
        ];
        queue = queue.then((open) => (open ? run(socket, answer, 0, request) : false));
      }
    });
  };
  const serveH2 = (socket: Socket): void => {
    socket.write(settingsFrame([]));
    if (process.env["FUZZ_DEBUG"] !== undefined) {
      process.stderr.write(`${options.label}: connection ${upstream.connections}\n`);
      socket.once("close", () => process.stderr.write(`${options.label}: connection closed\n`));
    }
    let buffered = Buffer.alloc(0);
    let prefaceSeen = false;
    // The shadow reads header blocks only: the preface and an empty SETTINGS, then each HEADERS
    // and CONTINUATION as they came.
    const shadowIn = new Duplex({
      read() {},
      write(_chunk, _encoding, callback) {
        callback();
      },
    });
    const shadow = createH2Server();
    const decoded = new Set<number>();
    const debug = process.env["FUZZ_DEBUG"] !== undefined;
    shadow.on("sessionError", (error) => debug && process.stderr.write(`shadow session error ${String(error)}\n`));
    shadow.on("session", (session) => {
      session.on("error", (error) => debug && process.stderr.write(`shadow error ${String(error)}\n`));
      session.on("frameError", (t, code, id) => debug && process.stderr.write(`shadow frameError ${t} ${code} ${id}\n`));
    });
    shadow.on("stream", (stream, headers: IncomingHttpHeaders) => {
      stream.on("error", () => undefined);
      const id = stream.id ?? 0;
      decoded.add(id);
      // Its request's DATA never comes (an upload's content-length would make an END_STREAM here a malformed request): closed at once.
      stream.close();
      const request: HostileRequest = {
        method: String(headers[":method"] ?? ""),
        target: String(headers[":path"] ?? ""),
        fields: Object.entries(headers)
          .filter(([name]) => !name.startsWith(":"))
          .map(([name, value]) => [name, Array.isArray(value) ? value.join(", ") : String(value ?? "")] as const),
      };
      const steps = options.script(request);
      options.onRequest?.(request, steps !== undefined);
      const text = normalText(options.label, request);
      const block = Buffer.concat([literal(":status", "200"), literal("content-type", "text/plain"), literal("content-length", String(Buffer.byteLength(text)))]);
      const answer: readonly HostileStep[] = steps ?? [{ write: frame(type.headers, 0x4, id, block) }, { write: frame(type.data, 0x1, id, Buffer.from(text)) }];
      void run(socket, answer, id);
    });
    shadow.emit("connection", shadowIn);
    shadowIn.push(Buffer.concat([preface, settingsFrame([])]));
    socket.once("close", () => shadowIn.destroy());
    socket.on("data", (chunk: Buffer) => {
      upstream.received.push(chunk);
      buffered = Buffer.concat([buffered, chunk]);
      if (!prefaceSeen) {
        if (buffered.length < preface.length) return;
        buffered = buffered.subarray(preface.length);
        prefaceSeen = true;
      }
      while (buffered.length >= 9 && !socket.destroyed) {
        const length = buffered.readUIntBE(0, 3);
        if (buffered.length < 9 + length) return;
        const frameType = buffered[3]!;
        const flags = buffered[4]!;
        const whole = buffered.subarray(0, 9 + length);
        const payload = buffered.subarray(9, 9 + length);
        buffered = buffered.subarray(9 + length);
        if (frameType === type.settings && (flags & 1) === 0) socket.write(frame(type.settings, 1, 0));
        if (frameType === type.ping && (flags & 1) === 0) socket.write(frame(type.ping, 1, 0, payload));
        // The proxy's GOAWAY with an error (after a frame its HTTP/2 client refused): closed, as
        // servers do. One without (a graceful close) leaves the streams under way to finish.
        if (frameType === type.goaway) {
          if (debug) process.stderr.write(`${options.label}: GOAWAY from the proxy ${payload.toString("hex")}\n`);
          const code = payload.length >= 8 ? payload.readUInt32BE(4) : 0;
          if (code !== 0) {
            options.onGoaway?.(code);
            socket.end();
          }
        }
        if (frameType === type.headers || frameType === type.continuation) shadowIn.push(whole);
        if (debug && frameType === type.headers) {
          const id = whole.readUInt32BE(5) & 0x7fffffff;
          setTimeout(() => decoded.has(id) || process.stderr.write(`${options.label}: HEADERS on stream ${id} not decoded: ${whole.subarray(0, 120).toString("hex")}\n`), 200);
        }
      }
    });
  };
  const serve = (socket: Socket): void => {
    upstream.connections += 1;
    socket.on("error", () => undefined);
    if (options.h2 === true) serveH2(socket);
    else serveH1(socket);
  };
  const { server, port } = await listenRaw(serve, options, options.h2 === true ? ["h2"] : ["http/1.1"], sockets);
  (upstream as { port: number }).port = port;
  return upstream;
}
