import { channel } from "node:diagnostics_channel";
import { Socket } from "node:net";
import { describe, expect, it } from "vitest";
import { isStaleConnection } from "../../src/upstream/stale-connection.js";

// The module listens on undici's diagnostics channels, which every undici in the process
// publishes to (Node's own fetch among them) and anyone may publish to. A listener that throws
// is reported as an uncaught exception, which ends a proxy serving every guest.
describe("the stale-connection listeners on undici's channels", () => {
  const shapes: [string, unknown][] = [
    ["undefined", undefined],
    ["null", null],
    ["an empty object", {}],
    ["a request without a socket", { request: {} }],
    ["a socket without a request", { socket: new Socket() }],
    ["a socket that is not one", { request: {}, socket: 42 }],
    ["a socket without bytesRead", { request: {}, socket: {} }],
    ["a primitive request", { request: "r", socket: new Socket(), error: new Error("x") }],
  ];

  it.each(shapes)("a message of another shape (%s) is passed over, in silence", async (_name, message) => {
    const uncaught: unknown[] = [];
    const onUncaught = (error: unknown): void => void uncaught.push(error);
    process.prependListener("uncaughtException", onUncaught);
    try {
      channel("undici:client:sendHeaders").publish(message);
      channel("undici:request:error").publish(message);
      // Node reports a listener's throw on the next tick.
      await new Promise((resolve) => setImmediate(resolve));
    } finally {
      process.removeListener("uncaughtException", onUncaught);
    }
    expect(uncaught).toEqual([]);
  });

  /** An error as undici reports it: `SocketError` ("other side closed") has the code UND_ERR_SOCKET. */
  const undiciError = (message: string, code: string): Error => Object.assign(new Error(message), { code });

  it("a failure on a reused connection with no byte read after the head is stale; on a new one it is not", () => {
    const socket = new Socket();
    const first = {};
    const second = {};
    const firstError = undiciError("other side closed", "UND_ERR_SOCKET");
    const secondError = undiciError("other side closed", "UND_ERR_SOCKET");
    channel("undici:client:sendHeaders").publish({ request: first, socket });
    channel("undici:request:error").publish({ request: first, error: firstError });
    channel("undici:client:sendHeaders").publish({ request: second, socket });
    channel("undici:request:error").publish({ request: second, error: secondError });
    expect(isStaleConnection(firstError)).toBe(false);
    expect(isStaleConnection(secondError)).toBe(true);
    socket.destroy();
  });

  // undici's headers timeout fails a request the upstream took and is still working on: resent,
  // a DELETE reached the upstream twice (upstream-resend.test.ts has it on the wire).
  it.each([
    ["the peer's close", "UND_ERR_SOCKET", true],
    ["a reset", "ECONNRESET", true],
    ["a broken pipe", "EPIPE", true],
    ["undici's headers timeout", "UND_ERR_HEADERS_TIMEOUT", false],
    ["the pool destroyed under it", "UND_ERR_DESTROYED", false],
    ["an abort", "UND_ERR_ABORTED", false],
    ["an error without a code", undefined, false],
  ] as const)("on a reused connection that read nothing, %s (%s) counts as a crossed close: %s", (_name, code, stale) => {
    const socket = new Socket();
    const first = {};
    const second = {};
    channel("undici:client:sendHeaders").publish({ request: first, socket });
    channel("undici:client:sendHeaders").publish({ request: second, socket });
    const error = code === undefined ? new Error("failed") : undiciError("failed", code);
    channel("undici:request:error").publish({ request: second, error });
    expect(isStaleConnection(error)).toBe(stale);
    socket.destroy();
  });
});
