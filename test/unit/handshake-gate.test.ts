import { describe, expect, it } from "vitest";
import { HandshakeGate } from "../../src/proxy/handshake-gate.js";
import { latch } from "../helpers/latch.js";

const never = new Promise<void>(() => undefined);
const nextRound = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

describe("HandshakeGate", () => {
  it("a waiter whose guest leaves as the turn reaches it passes the turn on: the address is not locked out", async () => {
    const gate = new HandshakeGate(1);
    const [goneB, leaveB] = latch();
    const a = await gate.enter("10.0.0.1", never);
    const b = gate.enter("10.0.0.1", goneB);
    // A's turn ends and B's guest leaves in the same turn of the event loop.
    a!();
    leaveB();
    expect(await b).toBeUndefined();
    await nextRound();
    await nextRound();
    // The turn came back: a newcomer gets it at once. Before, B took it and never gave it back.
    const c = await Promise.race([gate.enter("10.0.0.1", never), nextRound().then(() => "waiting")]);
    expect(typeof c).toBe("function");
  });

  it("an ended turn goes to the first waiter, not to someone arriving meanwhile, and never past the limit", async () => {
    const gate = new HandshakeGate(1);
    const order: string[] = [];
    const a = await gate.enter("10.0.0.1", never);
    const b = gate.enter("10.0.0.1", never).then((turn) => (order.push("B"), turn));
    a!();
    // In the same turn of the event loop, before B has started.
    const c = gate.enter("10.0.0.1", never).then((turn) => (order.push("C"), turn));
    const endB = await b;
    await nextRound();
    expect(order).toEqual(["B"]);
    endB!();
    await c;
    expect(order).toEqual(["B", "C"]);
  });

  it("another address is not held by one whose turns are all taken", async () => {
    const gate = new HandshakeGate(2);
    await gate.enter("10.0.0.1", never);
    await gate.enter("10.0.0.1", never);
    const waiting = gate.enter("10.0.0.1", never);
    const other = await Promise.race([gate.enter("10.0.0.2", never), nextRound().then(() => "waiting")]);
    expect(typeof other).toBe("function");
    expect(await Promise.race([waiting, nextRound().then(() => "waiting")])).toBe("waiting");
  });
});
