import type { Socket } from "node:net";
import { EgressError } from "../errors.js";
import type { Logger } from "../log.js";
import { writeRawError } from "./respond.js";
import type { ThrottledWarning } from "./throttled-log.js";

/**
 * Every guest connection is counted, overall and per source address, and one past either limit
 * is answered 503 at once: a guest holding hundreds of idle tunnels would otherwise run the
 * process out of descriptors, and every later guest would wait unanswered.
 */
export class ConnectionLimits {
  private readonly sockets = new Set<Socket>();
  private readonly perSource = new Map<string, number>();
  /** Connections answered 503 at accept: Node's parser is already on them, so nothing they send is served. */
  private readonly refusedSockets = new WeakSet<Socket>();
  /** Refused connections in their lingering close: descriptors held past the limit. */
  private refusedLingering = 0;

  constructor(
    private readonly limits: { readonly connections: number; readonly connectionsPerSource: number },
    private readonly log: Logger,
    private readonly warnings: ThrottledWarning,
  ) {}

  /** Counts a new connection, or answers it 503 and remembers it as refused. */
  track(socket: Socket): void {
    // One guest's reset must never become an uncaught exception.
    socket.on("error", (error) => this.log.debug("guest socket error", { error }));
    const source = socket.remoteAddress ?? "";
    const fromSource = this.perSource.get(source) ?? 0;
    const { connections, connectionsPerSource } = this.limits;
    const over =
      this.sockets.size >= connections
        ? `the proxy already has ${connections} guest connections open (limits.connections)`
        : fromSource >= connectionsPerSource
          ? `${source} already has ${connectionsPerSource} connections open (limits.connectionsPerSource)`
          : undefined;
    if (over !== undefined) {
      this.refusedSockets.add(socket);
      // A kind per reason too: the summary line says the reason of what it counts (ThrottledWarning).
      this.warnings.warn(`limit:${source}\u0000${over}`, "connection refused", { client: source, reason: over });
      // Its first request may be an upload, whose guest would lose the 503 to a reset: the
      // refusal lingers as other answers do, while few do. Each holds a descriptor the limit
      // does not count, so a flood's refusals past a sixteenth of it close once written.
      const linger = this.refusedLingering < Math.max(1, Math.floor(connections / 16));
      if (linger) {
        this.refusedLingering += 1;
        socket.once("close", () => (this.refusedLingering -= 1));
      }
      writeRawError(socket, new EgressError("EG_LIMIT", 503, `too many connections: ${over}`), { linger });
      return;
    }
    this.sockets.add(socket);
    this.perSource.set(source, fromSource + 1);
    socket.once("close", () => {
      this.sockets.delete(socket);
      const left = (this.perSource.get(source) ?? 1) - 1;
      if (left <= 0) this.perSource.delete(source);
      else this.perSource.set(source, left);
    });
  }

  refused(socket: Socket): boolean {
    return this.refusedSockets.has(socket);
  }

  destroyAll(): void {
    for (const socket of this.sockets) socket.destroy();
  }
}
