/**
 * A TCP relay that adds a fixed delay to each direction, so a loopback upstream is `2 × delayMs`
 * of round trip away, as one across a network is: a flow-control window then caps a stream at
 * window ÷ RTT, as it would there. It looks at no byte (TLS passes through).
 *
 * Forked by bench/h2-windows.ts with an IPC channel: `setup` names the upstream ports (dialled on
 * 127.0.0.1 only) and the delay; it reports `{ kind: "ready", ports }`, one listening port per
 * upstream port in the same order, and exits when the parent disconnects. Each direction holds
 * at most `maxInFlight` bytes on their way (the source is paused beyond), about what Linux's
 * autotuned TCP buffers let one connection have in flight (tcp_rmem's and tcp_wmem's 4–6 MiB).
 */
import { connect, createServer, type Socket } from "node:net";

export interface DelayRelaySetup {
  readonly kind: "setup";
  readonly ports: readonly number[];
  readonly delayMs: number;
  readonly maxInFlight: number;
}

export interface DelayRelayReady {
  readonly kind: "ready";
  readonly ports: readonly number[];
}

function delayed(from: Socket, to: Socket, delayMs: number, maxInFlight: number): void {
  let inFlight = 0;
  let ended = false;
  from.on("data", (chunk: Buffer) => {
    inFlight += chunk.length;
    if (inFlight > maxInFlight) from.pause();
    setTimeout(() => {
      inFlight -= chunk.length;
      if (!to.destroyed) to.write(chunk);
      if (inFlight <= maxInFlight && from.isPaused()) from.resume();
      if (ended && inFlight === 0) to.end();
    }, delayMs);
  });
  from.on("end", () => {
    ended = true;
    if (inFlight === 0) setTimeout(() => to.end(), delayMs);
  });
}

function start(setup: DelayRelaySetup): void {
  const listening = setup.ports.map(
    (port) =>
      new Promise<number>((resolve) => {
        const server = createServer({ allowHalfOpen: true }, (inbound) => {
          const outbound = connect({ host: "127.0.0.1", port, allowHalfOpen: true });
          inbound.setNoDelay(true);
          outbound.setNoDelay(true);
          const close = (): void => {
            inbound.destroy();
            outbound.destroy();
          };
          inbound.on("error", close);
          outbound.on("error", close);
          inbound.on("close", () => setTimeout(close, setup.delayMs + 10));
          outbound.on("close", () => setTimeout(close, setup.delayMs + 10));
          delayed(inbound, outbound, setup.delayMs, setup.maxInFlight);
          delayed(outbound, inbound, setup.delayMs, setup.maxInFlight);
        });
        server.listen(0, "127.0.0.1", () => resolve((server.address() as { port: number }).port));
      }),
  );
  void Promise.all(listening).then((ports) => process.send!({ kind: "ready", ports } satisfies DelayRelayReady));
}

if (process.send === undefined) {
  process.stderr.write("bench/delay-relay.ts is started by bench/h2-windows.ts (it needs an IPC channel)\n");
  process.exit(2);
}
process.on("disconnect", () => process.exit(0));
process.once("message", (message: DelayRelaySetup) => start(message));
