import type { IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import { EgressError } from "../errors.js";
import type { Logger } from "../log.js";
import type { Pipeline } from "../pipeline/pipeline.js";
import { connectPinned, type PinnedSocketOptions } from "../upstream/pinned-socket.js";
import { toOutboundRequest } from "./guest-request.js";
import { writeRawError } from "./respond.js";
import { tunnelOf } from "./tunnel.js";

export interface UpgradeDeps {
  readonly pipeline: Pipeline;
  readonly log: Logger;
  readonly idleMs: number;
  readonly connect: Omit<PinnedSocketOptions, "url" | "address">;
}

/**
 * A WebSocket (or other) upgrade is checked like any request: head validation, secrets, and
 * every policy check. Then the proxy connects to the approved address itself, sends the request
 * head, and from there on relays bytes both ways: the 101 answer and everything after it pass
 * through as an opaque tunnel pinned to the checked IP. onRequest/onResponse do not run, since
 * there is no HTTP response to hand them.
 */
export async function serveUpgrade(req: IncomingMessage, socket: Socket, head: Buffer, deps: UpgradeDeps): Promise<void> {
  const target = `${req.method ?? ""} ${req.url ?? ""}`.split("?")[0]!;
  let upstream: Socket | undefined;
  try {
    const guestRequest = toOutboundRequest(req, tunnelOf(socket));
    const upgrade = req.headers.upgrade;
    if (upgrade === undefined || upgrade === "") throw new EgressError("EG_BAD_REQUEST", 400, "Upgrade header missing");
    const { request, addresses } = await deps.pipeline.authorizeUpgrade({ ...guestRequest, body: null });
    let lastError: unknown;
    for (const address of addresses) {
      try {
        upstream = await connectPinned({ ...deps.connect, url: request.url, address });
        break;
      } catch (error) {
        lastError = error;
        if (error instanceof EgressError) throw error;
      }
    }
    if (upstream === undefined) {
      const code = (lastError as NodeJS.ErrnoException | undefined)?.code ?? "connection failed";
      throw new EgressError("EG_UPSTREAM", 502, `upstream ${request.url.host} refused the upgrade connection: ${code}`);
    }
    const lines = [`${request.method} ${request.url.pathname}${request.url.search} HTTP/1.1`, `host: ${request.url.host}`];
    for (let i = 0; i < request.headers.length; i += 2) lines.push(`${request.headers[i]}: ${request.headers[i + 1]}`);
    lines.push("connection: Upgrade", `upgrade: ${upgrade}`);
    upstream.write(`${lines.join("\r\n")}\r\n\r\n`);
    if (head.length > 0) upstream.write(head);
  } catch (error) {
    const err =
      error instanceof EgressError
        ? error
        : new EgressError("EG_UPSTREAM", 502, `upgrade failed: ${(error as NodeJS.ErrnoException).code ?? "error"}`, { cause: error });
    deps.log.info("request", { method: req.method, target, status: err.status, reason: err.message, code: err.code, upgrade: true });
    writeRawError(socket, err);
    return;
  }
  deps.log.info("request", { method: req.method, target, status: 101, reason: "upgrade relayed", upgrade: true });
  const up = upstream;
  for (const s of [socket, up]) {
    s.setTimeout(deps.idleMs, () => {
      socket.destroy();
      up.destroy();
    });
    s.on("error", () => {
      socket.destroy();
      up.destroy();
    });
    s.on("close", () => {
      socket.destroy();
      up.destroy();
    });
  }
  socket.pipe(up);
  up.pipe(socket);
}
