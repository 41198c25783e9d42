import { createServer } from "node:http";
import { describe, expect, it } from "vitest";
import { openRaw, openTlsTunnel, type RawClient } from "../helpers/raw.js";
import { startTestProxy } from "../helpers/proxy.js";
import { listenForTest, startUpstream } from "../helpers/upstream.js";

// A SIGHUP with a large config file (40,000 keys) holds the event loop for seconds while it
// parses (README, "Live reload"). Timers run before the poll that reads the sockets, so a
// connection whose deadline passed meanwhile was judged silent and destroyed with what its guest
// had sent in time still unread in the kernel: an undici guest's keep-alive request, sent 3 s
// into the 5 s the proxy advertises, got ECONNRESET. Here the test holds the loop itself (proxy
// and clients share it), after writing each request, for longer than Node's keep-alive timer
// (5 s and the 1 s Node adds) and idleMs.

/** Holds the event loop, as a long parse does: nothing is read or fired until it returns. */
function holdEventLoop(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    // Busy: the proxy and the clients share this thread.
  }
}

describe("a held event loop", () => {
  it("requests a guest sent while the loop was held past their connection's deadline are answered after it, not reset", async () => {
    const plainUpstream = await startUpstream({ tls: false });
    const tlsUpstream = await startUpstream({ names: ["api.test"] });
    // An upstream that says when an upload's head is in: the proxy has read its first half then.
    let headIn!: () => void;
    const uploadStarted = new Promise<void>((resolve) => (headIn = resolve));
    const uploadPort = await listenForTest(
      createServer((req, res) => {
        headIn();
        let bytes = 0;
        req.on("data", (chunk: Buffer) => (bytes += chunk.length));
        req.on("end", () => res.end(`got ${bytes}`));
      }),
    );
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { logLevel: "warn", timeouts: { idleMs: 3_000 } });
    const plainGet = `GET http://api.test:${plainUpstream.port}/echo HTTP/1.1\r\nHost: api.test:${plainUpstream.port}\r\n\r\n`;
    const tunnelGet = `GET /echo HTTP/1.1\r\nHost: api.test:${tlsUpstream.port}\r\n\r\n`;

    // Two keep-alive connections, each idle after an answer (Node's keep-alive timer runs), one
    // in the clear and one in a TLS tunnel, and an upload half sent (idleMs runs).
    const plain = await openRaw(proxy.port);
    const tunnel = await openTlsTunnel(proxy.port, `api.test:${tlsUpstream.port}`, { ca: proxy.caCertPem });
    const ask = async (client: RawClient, request: string): Promise<number> => {
      client.write(request);
      return (await client.readResponse()).status;
    };
    expect(await ask(plain, plainGet)).toBe(200);
    expect(await ask(tunnel, tunnelGet)).toBe(200);
    const upload = await openRaw(proxy.port);
    upload.write(`POST http://api.test:${uploadPort}/up HTTP/1.1\r\nHost: api.test:${uploadPort}\r\nContent-Length: 10\r\n\r\n12345`);
    await uploadStarted;

    plain.write(plainGet);
    tunnel.write(tunnelGet);
    upload.write("67890");
    holdEventLoop(6_200);

    // Each as an answer or how its connection ended: a reset was ECONNRESET.
    const outcome = (client: RawClient): Promise<string> =>
      client.readResponse().then(
        (answer) => (answer.body.startsWith("got") ? `${answer.status} ${answer.body}` : String(answer.status)),
        () => `closed (${(client.error as NodeJS.ErrnoException | undefined)?.code ?? "no error"})`,
      );
    expect(await Promise.all([outcome(plain), outcome(tunnel), outcome(upload)])).toEqual(["200", "200", "200 got 10"]);
    // The connections serve on.
    expect(await ask(plain, plainGet)).toBe(200);
    expect(await ask(tunnel, tunnelGet)).toBe(200);
    expect(proxy.logs.filter((line) => String(line["msg"]).includes("internal error"))).toEqual([]);
  });
});
