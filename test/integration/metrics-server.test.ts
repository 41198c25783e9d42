import { connect } from "node:net";
import { request } from "node:http";
import { once } from "node:events";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { metricsHeadersMs, startMetricsServer } from "../../src/metrics/metrics-server.js";
import { createLogger } from "../../src/log.js";
import { plainGet as get } from "../helpers/upstream.js";
import { latch } from "../helpers/latch.js";

/** A metrics listener whose scrape counts its renders and answers `render N`, padded to `size` bytes; `hold` keeps the first render waiting. */
async function countingServer(options: { size?: number; hold?: Promise<void> } = {}) {
  let renders = 0;
  const server = await startMetricsServer({
    host: "127.0.0.1",
    port: 0,
    scrape: async () => {
      const n = ++renders;
      if (n === 1 && options.hold !== undefined) await options.hold;
      return { text: `render ${n}\n`.padEnd(options.size ?? 0, "#"), contentType: "text/plain" };
    },
    ready: () => true,
    log: createLogger("error", () => undefined),
  });
  onTestFinished(() => server.close());
  return { server, renders: () => renders };
}

describe("the metrics listener's thread", () => {
  it("a scrape whose head Node refuses ends that connection only; a scrape that throws answers 500; the thread keeps serving", async () => {
    const lines: string[] = [];
    let mode: "bad-type" | "throws" | "fine" = "bad-type";
    const server = await startMetricsServer({
      host: "127.0.0.1",
      port: 0,
      scrape: () => {
        if (mode === "throws") throw new Error("registry broke");
        return Promise.resolve({ text: "x 1\n", contentType: mode === "bad-type" ? "text/plain\r\nx-injected: 1" : "text/plain" });
      },
      ready: () => true,
      log: createLogger("warn", (line) => lines.push(line)),
    });
    onTestFinished(() => server.close());
    await expect(get(`${server.url}/metrics`)).rejects.toThrow();
    mode = "throws";
    expect(await get(`${server.url}/metrics`)).toEqual({ status: 500, text: "metrics scrape failed\n" });
    expect(lines.some((line) => line.includes("metrics scrape failed"))).toBe(true);
    mode = "fine";
    expect(await get(`${server.url}/metrics`)).toEqual({ status: 200, text: "x 1\n" });
    expect(await get(`${server.url}/healthz`)).toEqual({ status: 200, text: "ok\n" });
    // The thread never died: nothing was logged about restarting it.
    expect(lines.some((line) => line.includes("starting it again"))).toBe(false);
  });

  it("refuses an address it cannot listen on with the listen error's code, and close() twice ends the thread once", async () => {
    const first = await startMetricsServer({ host: "127.0.0.1", port: 0, scrape: () => Promise.resolve({ text: "", contentType: "text/plain" }), ready: () => true, log: createLogger("error", () => undefined) });
    await expect(
      startMetricsServer({ host: "127.0.0.1", port: first.port, scrape: () => Promise.resolve({ text: "", contentType: "text/plain" }), ready: () => true, log: createLogger("error", () => undefined) }),
    ).rejects.toMatchObject({ code: "EADDRINUSE" });
    await Promise.all([first.close(), first.close()]);
    await expect(get(`${first.url}/healthz`)).rejects.toThrow();
  });

  it("scrapes that come while a render is under way share the next one: 40 scrapes cost the proxy's thread one render, and each scrape sees a render begun after it came", async () => {
    const [hold, release] = latch();
    const { server, renders } = await countingServer({ hold });
    const first = get(`${server.url}/metrics`);
    // The first render has begun and is held: every scrape below comes after it began.
    await expect.poll(renders).toBe(1);
    const written: Promise<unknown>[] = [];
    const rest = Array.from({ length: 40 }, () => {
      const [sent, wrote] = latch();
      written.push(sent);
      return new Promise<{ status: number; text: string }>((resolve, reject) => {
        request(`${server.url}/metrics`, { agent: false }, (res) => {
          let text = "";
          res.setEncoding("utf8");
          res.on("data", (chunk: string) => (text += chunk));
          res.on("end", () => resolve({ status: res.statusCode ?? 0, text }));
        })
          .on("error", reject)
          .on("socket", (socket) => socket.once("connect", () => wrote()))
          .end();
      });
    });
    await Promise.all(written);
    // The listener takes connections in the order they were made: once a probe made after every
    // scrape's connection is answered, the listener has the scrapes, and none had a render of its own.
    expect((await get(`${server.url}/healthz`)).status).toBe(200);
    expect(renders()).toBe(1);
    release();
    expect(await first).toEqual({ status: 200, text: "render 1\n" });
    for (const answer of await Promise.all(rest)) expect(answer).toEqual({ status: 200, text: "render 2\n" });
    expect(renders()).toBe(2);
    // One after another, each scrape gets a render of its own (nothing is served from a cache).
    const before = renders();
    expect((await get(`${server.url}/metrics`)).text).toBe(`render ${before + 1}\n`);
    expect((await get(`${server.url}/metrics`)).text).toBe(`render ${before + 2}\n`);
  });

  it("a scraper that pipelines requests and never reads its answers loses its connection; the proxy's thread renders a few times, and other scrapes are served", async () => {
    const { server, renders } = await countingServer({ size: 256 * 1024 });
    const socket = connect(server.port, "127.0.0.1");
    socket.on("error", () => undefined);
    await once(socket, "connect");
    socket.pause();
    socket.write("GET /metrics HTTP/1.1\r\nhost: m\r\n\r\n".repeat(500));
    await once(socket, "close");
    expect(renders()).toBeLessThan(20);
    expect((await get(`${server.url}/metrics`)).status).toBe(200);
  });

  it("takes at most 64 connections at once; past that a connection is closed, and a scrape is served once others have gone", async () => {
    const { server } = await countingServer();
    const sockets = await Promise.all(
      Array.from({ length: 70 }, async () => {
        const socket = connect(server.port, "127.0.0.1");
        socket.on("error", () => undefined);
        await once(socket, "connect");
        return socket;
      }),
    );
    const closed = sockets.map((socket) => new Promise<boolean>((resolve) => socket.once("close", () => resolve(true))));
    // The listener closes the connections past its limit as it takes them.
    const refused = await Promise.all(closed.slice(64).map((c) => c));
    expect(refused.every(Boolean)).toBe(true);
    for (const socket of sockets) socket.destroy();
    await Promise.all(closed);
    // The listener counts a connection gone at its own close, a moment after ours: a few tries.
    await expect.poll(() => get(`${server.url}/healthz`).then((r) => r.status, () => 0), { timeout: 10_000 }).toBe(200);
  });

  // With Node's defaults (a head within 60 s, checked every 30 s), 64 connections that sent
  // nothing held every place for 90 s, and /healthz failed all that time (black-box finding).
  it("closes a connection that sends no head, or one a byte at a time, within seconds, and /healthz is served again", async () => {
    const { server } = await countingServer();
    const sockets = await Promise.all(
      Array.from({ length: 64 }, async () => {
        const socket = connect(server.port, "127.0.0.1");
        socket.on("error", () => undefined);
        await once(socket, "connect");
        return socket;
      }),
    );
    // One of them sends its head a byte at a time, never finishing it.
    const trickle = setInterval(() => sockets[0]!.write("G"), 200);
    onTestFinished(() => {
      clearInterval(trickle);
      for (const socket of sockets) socket.destroy();
    });
    let closed = 0;
    for (const socket of sockets) socket.once("close", () => (closed += 1));
    // Closed by the listener after metricsHeadersMs (5 s), checked every second; before, 60 to 90 s.
    await vi.waitFor(() => expect(closed).toBe(64), { timeout: metricsHeadersMs * 4, interval: 100 });
    clearInterval(trickle);
    await expect.poll(() => get(`${server.url}/healthz`).then((r) => r.status, () => 0), { timeout: 10_000 }).toBe(200);
  }, 30_000);

  // Its head came at once, so the head deadline never applied: the unread body kept the
  // connection until requestTimeout, three times as long (black-box finding).
  it.each([
    ["a Content-Length body", "Content-Length: 1000000\r\n"],
    ["a chunked body", "Transfer-Encoding: chunked\r\n"],
  ])("answers a request that sends %s (no path takes one) and closes the connection, however slowly the body comes", async (_what, field) => {
    const { server } = await countingServer();
    const socket = connect(server.port, "127.0.0.1");
    socket.on("error", () => undefined);
    onTestFinished(() => void socket.destroy());
    await once(socket, "connect");
    let received = "";
    socket.on("data", (chunk: Buffer) => (received += chunk.toString("latin1")));
    const closed = once(socket, "close");
    socket.write(`GET /healthz HTTP/1.1\r\nHost: x\r\n${field}\r\n`);
    // A body that keeps coming: the close must not wait for its end.
    const trickle = setInterval(() => socket.writable && socket.write("a"), 100);
    onTestFinished(() => clearInterval(trickle));
    await closed;
    expect(received).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    expect(received.toLowerCase()).toContain("connection: close");
    expect(received.endsWith("ok\n")).toBe(true);
  }, 30_000);

  // Node's server takes a client's FIN as its leaving and drops the requests it has not answered:
  // a scraper that sends its request and then half-closes (`nc -N`, shutdown(SHUT_WR)) got no
  // answer at all (carried from an earlier session). RFC 9112 §9.6: the answer still goes.
  it("answers a scraper that half-closes its connection after its requests, in order, then closes it", async () => {
    const { server } = await countingServer();
    const socket = connect(server.port, "127.0.0.1");
    socket.on("error", () => undefined);
    onTestFinished(() => void socket.destroy());
    await once(socket, "connect");
    let received = "";
    socket.on("data", (chunk: Buffer) => (received += chunk.toString("latin1")));
    socket.end("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    await once(socket, "close");
    expect(received).toMatch(/^HTTP\/1\.1 200 OK\r\n[\s\S]*\r\n\r\nrender 1\nHTTP\/1\.1 200 OK\r\n[\s\S]*\r\n\r\nok\n$/);
  });

  it("keeps a connection whose requests have no body (or Content-Length: 0) open for the next", async () => {
    const { server } = await countingServer();
    const socket = connect(server.port, "127.0.0.1");
    socket.on("error", () => undefined);
    onTestFinished(() => void socket.destroy());
    await once(socket, "connect");
    let received = "";
    socket.on("data", (chunk: Buffer) => (received += chunk.toString("latin1")));
    socket.write("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    await vi.waitFor(() => expect(received.match(/HTTP\/1\.1 200 OK/g)?.length).toBe(2), { timeout: 10_000 });
    expect(received.toLowerCase()).not.toContain("connection: close");
    expect(socket.destroyed).toBe(false);
  });
});
