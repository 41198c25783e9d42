import * as grpc from "@grpc/grpc-js";
import { createHash } from "node:crypto";
import { fileURLToPath } from "node:url";
import { describe, expect, it, vi } from "vitest";
import { cleanEnv, runClient } from "../helpers/clients.js";
import { bytesService, grpcGuestClient, startBytesServer, unaryCall, useGrpcProxy, type GrpcUpstream } from "../helpers/grpc-upstream.js";
import { guestConnections, startTestProxy, type TestProxy } from "../helpers/proxy.js";
import type { ProxyOptions } from "../../src/index.js";

// grpc-js as its users configure it, through the proxy's HTTP/2 hardening: none of its limits
// (the reset rate, the running-work cap, the PING count, the idle and PING timers) may end a
// connection whose client only makes, cancels and keeps alive its calls.

const keepaliveClient = fileURLToPath(new URL("../fixtures/grpc/keepalive-client.mjs", import.meta.url));

async function setup(options: Omit<ProxyOptions, "httpHooks"> = {}): Promise<{ proxy: TestProxy; upstream: GrpcUpstream }> {
  const upstream = await startBytesServer();
  const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstreamCa: [upstream.caPem], ...options });
  useGrpcProxy(proxy);
  return { proxy, upstream };
}

/** Another guest, on a connection of its own (a channel with its own subchannel pool), still gets its answers. */
async function othersServed(proxy: TestProxy, upstream: GrpcUpstream): Promise<void> {
  const other = grpcGuestClient(proxy, upstream, { "grpc.use_local_subchannel_pool": 1 });
  const answers = await Promise.all([1, 2, 3].map((i) => unaryCall(other, bytesService.echo, Buffer.from(`other ${i}`))));
  expect(answers.map((a) => a.value.toString())).toEqual(["other 1", "other 2", "other 3"]);
}

const sha256 = (bytes: Buffer): string => createHash("sha256").update(bytes).digest("hex");

/** `count` calls to `hang` whose deadlines all pass together: each ends DEADLINE_EXCEEDED, and grpc-js resets its stream. */
async function missedDeadlines(client: grpc.Client, count: number, deadlineMs: number): Promise<number[]> {
  const deadline = Date.now() + deadlineMs;
  return Promise.all(Array.from({ length: count }, () => unaryCall(client, bytesService.hang, Buffer.from("x"), { deadline }).then(() => grpc.status.OK, (error: grpc.ServiceError) => error.code)));
}

/**
 * A deadline past h2Limits.prematureResetMs (1 s) with room to spare: the calls are on the wire
 * within milliseconds, and their resets come when the deadline passes.
 */
const deadlineMs = 2_000;

describe("grpc-js through the proxy: every call kind, and legitimate cancellations and keepalive never end the connection", () => {
  it("unary with 4 MiB messages and ascii and -bin metadata both ways, server-streaming 5,000 messages, client-streaming and bidi 1,000 each, on one connection", async () => {
    const { proxy, upstream } = await setup();
    const client = grpcGuestClient(proxy, upstream);
    // grpc-js's default limit for a received message: 4 MiB, each way.
    const big = Buffer.alloc(4 * 1024 * 1024, 0x5a);
    big.write("start", 0);
    const metadata = new grpc.Metadata();
    metadata.set("x-ascii", "plain text, with spaces");
    const binary = Buffer.from([0x00, 0xff, 0x80, 0x0a, 0x0d, 0x3a, 0x7f, 0x01]);
    metadata.set("x-blob-bin", binary);
    const unary = await unaryCall(client, bytesService.echo, big, { metadata });
    expect(unary.value.length).toBe(big.length);
    expect(sha256(unary.value)).toBe(sha256(big));
    for (const received of [unary.metadata, unary.trailers]) {
      expect(received.get("x-ascii")).toEqual(["plain text, with spaces"]);
      expect(received.get("x-blob-bin")).toEqual([binary]);
    }

    const streamed: string[] = [];
    const status = await new Promise<grpc.StatusObject>((resolve, reject) => {
      const call = client.makeServerStreamRequest(bytesService.count.path, bytesService.count.requestSerialize, bytesService.count.responseDeserialize, Buffer.from("5000"));
      call.on("data", (message: Buffer) => streamed.push(message.toString()));
      call.on("status", resolve);
      call.on("error", (error: grpc.ServiceError) => (error.code === grpc.status.OK ? undefined : reject(error)));
    });
    expect(status.code).toBe(grpc.status.OK);
    expect(streamed.length).toBe(5000);
    expect(streamed.every((message, i) => message === `m${i}`)).toBe(true);

    const summed = await new Promise<string>((resolve, reject) => {
      const call = client.makeClientStreamRequest(bytesService.sum.path, bytesService.sum.requestSerialize, bytesService.sum.responseDeserialize, (error, value) => (error ? reject(error) : resolve(value!.toString())));
      for (let i = 0; i < 1000; i++) call.write(Buffer.alloc(1024, i & 0xff));
      call.end();
    });
    expect(summed).toBe(`1000/${1000 * 1024}`);

    const echoed: string[] = [];
    await new Promise<void>((resolve, reject) => {
      const call = client.makeBidiStreamRequest(bytesService.bidi.path, bytesService.bidi.requestSerialize, bytesService.bidi.responseDeserialize);
      call.on("data", (message: Buffer) => echoed.push(message.toString()));
      call.on("status", (s: grpc.StatusObject) => (s.code === grpc.status.OK ? resolve() : reject(new Error(s.details))));
      call.on("error", (error: grpc.ServiceError) => (error.code === grpc.status.OK ? undefined : reject(error)));
      for (let i = 0; i < 1000; i++) call.write(Buffer.from(`b${i}`));
      call.end();
    });
    expect(echoed).toEqual(Array.from({ length: 1000 }, (_, i) => `b${i}`));
    expect(guestConnections(proxy)).toEqual({ tunnels: 1, closed: [] });
    await othersServed(proxy, upstream);
  });

  it("a call whose deadline passes on a server that never answers fails DEADLINE_EXCEEDED, and its cancel reaches the server", async () => {
    const { proxy, upstream } = await setup();
    const client = grpcGuestClient(proxy, upstream);
    expect(await missedDeadlines(client, 1, 300)).toEqual([grpc.status.DEADLINE_EXCEEDED]);
    await vi.waitFor(() => expect(upstream.hangCancelled()).toBe(1), { timeout: 10_000, interval: 20 });
    expect((await unaryCall(client, bytesService.echo, Buffer.from("after"))).value.toString()).toBe("after");
    expect(guestConnections(proxy)).toEqual({ tunnels: 1, closed: [] });
  });

  // 300 calls at once are 100 on the wire (the stream limit) and 200 queued in grpc-js, which
  // drops the queued ones unsent when their deadline passes: each round is 100 resets at once.
  // Three rounds in 10 s were past limits.h2ResetsPer10s (200), and the GOAWAY(ENHANCE_YOUR_CALM)
  // failed the bidi call in flight and the next call with RESOURCE_EXHAUSTED.
  it("300 calls whose deadlines pass together, three times over, leave the connection and a bidi call in flight on it alone", async () => {
    const { proxy, upstream } = await setup();
    const client = grpcGuestClient(proxy, upstream);
    expect((await unaryCall(client, bytesService.echo, Buffer.from("first"))).value.toString()).toBe("first");
    const bidi = client.makeBidiStreamRequest(bytesService.bidi.path, bytesService.bidi.requestSerialize, bytesService.bidi.responseDeserialize);
    const echoed: string[] = [];
    let bidiError: grpc.ServiceError | undefined;
    bidi.on("data", (message: Buffer) => echoed.push(message.toString()));
    bidi.on("error", (error: grpc.ServiceError) => (bidiError = error));
    for (let round = 0; round < 3; round++) {
      const codes = await missedDeadlines(client, 300, deadlineMs);
      expect(new Set(codes)).toEqual(new Set([grpc.status.DEADLINE_EXCEEDED]));
      bidi.write(Buffer.from(`round ${round}`));
      await vi.waitFor(() => expect(bidiError ?? echoed.length).toBe(round + 1), { timeout: 10_000, interval: 20 });
      expect((await unaryCall(client, bytesService.echo, Buffer.from(`after ${round}`))).value.toString()).toBe(`after ${round}`);
    }
    expect(echoed).toEqual(["round 0", "round 1", "round 2"]);
    // Each round put 99 calls on the wire beside the bidi call (a few more should a slot free
    // before a queued call's own deadline fires), and each was cancelled upstream too.
    expect(upstream.hung()).toBeGreaterThanOrEqual(3 * 99);
    await vi.waitFor(() => expect(upstream.hangCancelled()).toBe(upstream.hung()), { timeout: 10_000, interval: 20 });
    bidi.end();
    expect(guestConnections(proxy)).toEqual({ tunnels: 1, closed: [] });
    await othersServed(proxy, upstream);
  }, 60_000);

  // grpc-js sends the calls it queued at the stream limit as the calls ahead of them miss their
  // deadline, often read by the proxy before the work of the reset calls has ended. They were
  // refused (REFUSED_STREAM, which grpc-js retries once), and past 100 refusals on the connection
  // it was closed: the queued calls failed RESOURCE_EXHAUSTED.
  it("calls queued behind 100 calls that miss their deadline all succeed, round after round, on one connection", async () => {
    const { proxy, upstream } = await setup();
    const client = grpcGuestClient(proxy, upstream);
    expect((await unaryCall(client, bytesService.echo, Buffer.from("first"))).value.toString()).toBe("first");
    for (let round = 0; round < 3; round++) {
      const missed = missedDeadlines(client, 100, deadlineMs);
      const queued = Array.from({ length: 100 }, (_, i) =>
        unaryCall(client, bytesService.echo, Buffer.from(`q${round}-${i}`), { deadline: Date.now() + 20_000 }).then(
          (answer) => answer.value.toString(),
          (error: grpc.ServiceError) => `${error.code} ${error.details}`,
        ),
      );
      expect(new Set(await missed)).toEqual(new Set([grpc.status.DEADLINE_EXCEEDED]));
      expect(await Promise.all(queued)).toEqual(Array.from({ length: 100 }, (_, i) => `q${round}-${i}`));
    }
    expect(guestConnections(proxy)).toEqual({ tunnels: 1, closed: [] });
    await othersServed(proxy, upstream);
  }, 60_000);

  it("a keepalive client (a PING every 500 ms, with no call and no cap on PINGs without data) keeps its connection idle through 8 acknowledged PINGs, then calls on it", async () => {
    const { proxy, upstream } = await setup();
    // A process of its own: grpc-js reads GRPC_TRACE when it loads, and the trace is how it tells of each PING's acknowledgement.
    const run = await runClient(process.execPath, [keepaliveClient, `api.test:${upstream.port}`, "500", "8"], cleanEnv({ ...proxy.guestEnv(), GRPC_TRACE: "keepalive,transport", GRPC_VERBOSITY: "DEBUG" }));
    expect(run.exitCode, run.stderr).toBe(0);
    const result = JSON.parse(run.stdout.trim()) as { answers: unknown[]; pings: number; goaways: number };
    expect(result.answers).toEqual([{ value: "before" }, { value: "after" }]);
    expect(result.pings).toBeGreaterThanOrEqual(8);
    expect(result.goaways).toBe(0);
    expect(guestConnections(proxy)).toEqual({ tunnels: 1, closed: [] });
    await othersServed(proxy, upstream);
  });

  it("a keepalive channel the proxy closes at idleMs (its PINGs hold no idle connection open) reconnects for its next call, which succeeds", async () => {
    const { proxy, upstream } = await setup({ timeouts: { idleMs: 1_500 } });
    const client = grpcGuestClient(proxy, upstream, { "grpc.keepalive_time_ms": 200, "grpc.keepalive_permit_without_calls": 1, "grpc.http2.max_pings_without_data": 0 });
    expect((await unaryCall(client, bytesService.echo, Buffer.from("before"))).value.toString()).toBe("before");
    const channel = client.getChannel();
    expect(channel.getConnectivityState(false)).toBe(grpc.connectivityState.READY);
    // The proxy's close of the idle connection is what moves the channel out of READY.
    await new Promise<void>((resolve, reject) => channel.watchConnectivityState(grpc.connectivityState.READY, Date.now() + 20_000, (error) => (error ? reject(error) : resolve())));
    expect((await unaryCall(client, bytesService.echo, Buffer.from("after"))).value.toString()).toBe("after");
    expect(guestConnections(proxy)).toEqual({ tunnels: 2, closed: [] });
  });
});
