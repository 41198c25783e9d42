import type { Socket } from "node:net";
import { listenRaw } from "./recorder.js";
import type { HostileStep } from "./hostile-upstream.js";
import { parseUpstreamRequest, type UpstreamRequest } from "./wire.js";

/**
 * A WebSocket upstream that misbehaves on cue (websocket-inputs.ts writes the cues): it reads an
 * upgrade request's head with the fuzzer's strict parser, then runs the script its case names
 * (`c=TAG`): bytes as they are (a 101, a wrong one, garbage, a frame cut short), pauses, a
 * close, a cut, silence, or `echo`, which sends back every byte that came after the head, as
 * they come, and half-closes once the proxy has. What came after the head is kept per case:
 * an upgrade the proxy refused must have let none of it through.
 */
export type WsStep = HostileStep | "echo";

export interface WsConnection {
  readonly request: UpstreamRequest;
  /** Every byte after the request's head, in order. */
  after: Buffer;
}

export interface HostileWebSocket {
  readonly label: string;
  readonly port: number;
  /** The connections of each case, by its `c=` value (the last 200 cases). */
  readonly byTag: Map<string, WsConnection[]>;
  /** Strict-parse failures of a head: the reason and the bytes. */
  readonly malformed: { reason: string; bytes: Buffer }[];
  /** Bytes received since the harness last took them (for the secret scan). */
  readonly received: Buffer[];
  close(): Promise<void>;
}

export interface HostileWebSocketOptions {
  readonly label: string;
  readonly host: string;
  readonly tls?: { readonly key: string; readonly cert: string };
  readonly script: (request: UpstreamRequest) => readonly WsStep[];
}

export async function startHostileWebSocket(options: HostileWebSocketOptions): Promise<HostileWebSocket> {
  const sockets = new Set<Socket>();
  const upstream: HostileWebSocket = {
    label: options.label,
    port: 0,
    byTag: new Map(),
    malformed: [],
    received: [],
    close: async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
  const serve = (socket: Socket): void => {
    socket.on("error", () => undefined);
    let pending = Buffer.alloc(0);
    let connection: WsConnection | undefined;
    let echoing = false;
    let ended = false;
    socket.on("end", () => {
      ended = true;
      if (echoing) socket.end();
    });
    const run = async (steps: readonly WsStep[]): Promise<void> => {
      for (const step of steps) {
        if (socket.destroyed) return;
        if (step === "end") return void socket.end();
        if (step === "destroy") return void socket.destroy();
        if (step === "stall") return;
        if (step === "echo") {
          echoing = true;
          if (connection!.after.length > 0) socket.write(connection!.after);
          if (ended) socket.end();
          return;
        }
        if ("pause" in step) await new Promise((resolve) => setTimeout(resolve, step.pause));
        else if ("write" in step) socket.write(step.write);
      }
    };
    socket.on("data", (chunk: Buffer) => {
      upstream.received.push(chunk);
      if (connection !== undefined) {
        connection.after = Buffer.concat([connection.after, chunk]);
        if (echoing) socket.write(chunk);
        return;
      }
      pending = Buffer.concat([pending, chunk]);
      const head = pending.indexOf("\r\n\r\n");
      if (head < 0) {
        if (pending.length > 128 * 1024) socket.destroy();
        return;
      }
      // The head alone: what follows is the upgraded protocol's, not a body.
      const parsed = parseUpstreamRequest(pending.subarray(0, head + 4));
      if (parsed.kind !== "done") {
        upstream.malformed.push({ reason: parsed.kind === "bad" ? parsed.reason : "an incomplete head", bytes: pending.subarray(0, 2000) });
        socket.destroy();
        return;
      }
      connection = { request: parsed.value, after: pending.subarray(head + 4) };
      const tag = /[?&]c=([^&]+)/.exec(parsed.value.target)?.[1] ?? "";
      const list = upstream.byTag.get(tag) ?? [];
      list.push(connection);
      upstream.byTag.set(tag, list);
      if (upstream.byTag.size > 200) upstream.byTag.delete(upstream.byTag.keys().next().value!);
      void run(options.script(parsed.value));
    });
  };
  const { server, port } = await listenRaw(serve, options, ["http/1.1"], sockets);
  (upstream as { port: number }).port = port;
  return upstream;
}
