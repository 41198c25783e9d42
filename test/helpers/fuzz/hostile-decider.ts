import { createServer, type AddressInfo, type Socket } from "node:net";
import type { HostileStep } from "./hostile-upstream.js";
import { parseUpstreamRequest } from "./wire.js";

/**
 * A webhook and OPA endpoint that misbehaves on cue (decider-inputs.ts writes the cues): each
 * POST is read with the fuzzer's strict parser, its JSON document says which request and phase
 * it asks about, and a call whose request names a case (`c=TAG`) is answered with that case's
 * script, bytes written as they are, with pauses, a half-close, a cut or silence. Every other
 * call is allowed at once (`204` to a webhook, `{"result":true}` to OPA), so the other targets
 * run through the deciders unharmed.
 */
export interface DeciderCall {
  readonly path: string;
  readonly phase: string;
  readonly url: string;
}

export interface HostileDecider {
  readonly port: number;
  /** Calls read, in order (the last 200). */
  readonly calls: DeciderCall[];
  /** POSTs the strict parser could not read: the proxy's decider client wrote a bad request. */
  readonly malformed: { reason: string; bytes: Buffer }[];
  close(): Promise<void>;
}

export interface HostileDeciderOptions {
  /** The script for a call, or undefined for an allow. */
  readonly script: (call: DeciderCall) => readonly HostileStep[] | undefined;
}

/** The path each kind is configured with (fuzz-proxy-child.ts). */
export const deciderPaths = { webhook: "/decide", opa: "/v1/data/egress" } as const;

function documentOf(path: string, body: Buffer): { phase: string; url: string } {
  try {
    const parsed = JSON.parse(body.toString("utf8")) as { input?: unknown; phase?: unknown; request?: { url?: unknown } };
    const doc = (path === deciderPaths.opa ? parsed.input : parsed) as { phase?: unknown; request?: { url?: unknown } } | undefined;
    return { phase: String(doc?.phase ?? ""), url: String(doc?.request?.url ?? "") };
  } catch {
    return { phase: "", url: "" };
  }
}

export async function startHostileDecider(options: HostileDeciderOptions): Promise<HostileDecider> {
  const sockets = new Set<Socket>();
  const decider: HostileDecider = {
    port: 0,
    calls: [],
    malformed: [],
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const run = async (socket: Socket, steps: readonly HostileStep[]): Promise<boolean> => {
    for (const step of steps) {
      if (socket.destroyed) return false;
      if (step === "end") {
        socket.end();
        return false;
      }
      if (step === "destroy") {
        socket.destroy();
        return false;
      }
      if (step === "stall") return false;
      if ("pause" in step) await new Promise((resolve) => setTimeout(resolve, step.pause));
      else if ("write" in step) socket.write(step.write);
    }
    return true;
  };
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    socket.on("error", () => undefined);
    let pending = Buffer.alloc(0);
    let queue: Promise<boolean> = Promise.resolve(true);
    socket.on("data", (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      for (;;) {
        const parsed = parseUpstreamRequest(pending);
        if (parsed.kind === "more") return;
        if (parsed.kind === "bad") {
          decider.malformed.push({ reason: parsed.reason, bytes: pending.subarray(0, 2000) });
          socket.destroy();
          return;
        }
        pending = pending.subarray(parsed.consumed);
        const path = parsed.value.target;
        const call: DeciderCall = { path, ...documentOf(path, parsed.value.body) };
        decider.calls.push(call);
        if (decider.calls.length > 200) decider.calls.shift();
        const allow = path === deciderPaths.opa ? 'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n{"result":true}' : "HTTP/1.1 204 No Content\r\n\r\n";
        const steps = options.script(call) ?? [{ write: Buffer.from(allow, "latin1") }];
        queue = queue.then((open) => (open ? run(socket, steps) : false));
      }
    });
  });
  server.on("error", () => undefined);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve());
  });
  (decider as { port: number }).port = (server.address() as AddressInfo).port;
  return decider;
}
