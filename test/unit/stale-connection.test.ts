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

  it("a failure on a reused connection with no byte read after the head is stale; on a new one it is not", () => {
    const socket = new Socket();
    const first = {};
    const second = {};
    const firstError = new Error("other side closed");
    const secondError = new Error("other side closed");
    channel("undici:client:sendHeaders").publish({ request: first, socket });
    channel("undici:request:error").publish({ request: first, error: firstError });
    channel("undici:client:sendHeaders").publish({ request: second, socket });
    channel("undici:request:error").publish({ request: second, error: secondError });
    expect(isStaleConnection(firstError)).toBe(false);
    expect(isStaleConnection(secondError)).toBe(true);
    socket.destroy();
  });
});
