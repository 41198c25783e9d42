import type { ServerResponse } from "node:http";
import { ProxyAgent, request } from "undici";
import { describe, expect, it, onTestFinished } from "vitest";
import { startTestProxy } from "../helpers/proxy.js";
import { startUpstream } from "../helpers/upstream.js";
import { h2Session } from "../helpers/h2-client.js";

// An upstream that sends its head and holds its body (server-sent events, a long poll) until the
// guest has that head. Node sends an HTTP/1.1 response's head with its first body bytes, so an
// HTTP/1.1 guest had no head at all until the first event, where an HTTP/2 guest had its HEADERS
// at once (README, "Framing": an upstream's head goes as soon as it came). Each row waits for the
// head before the upstream sends a byte of body: without the head, it never would.

/** Rejects after `ms` with `what`: a deadline against a hang, so the row fails instead. */
function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`no ${what} within ${ms} ms`)), ms)));
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

describe("a response head whose body comes later", () => {
  const rows = [
    { guest: "HTTP/1.1 in a TLS tunnel", scheme: "https", framing: "chunked" },
    { guest: "HTTP/1.1 in a TLS tunnel", scheme: "https", framing: "content-length" },
    { guest: "HTTP/1.1 in the clear", scheme: "http", framing: "chunked" },
    { guest: "HTTP/2 in a TLS tunnel", scheme: "https", framing: "chunked" },
  ] as const;
  it.each(rows)("reaches the guest before its body: $guest, $framing", async ({ guest, scheme, framing }) => {
    const held: ServerResponse[] = [];
    let heldOne!: () => void;
    const holding = new Promise<void>((resolve) => (heldOne = resolve));
    const event = "data: first\n\n";
    const upstream = await startUpstream({
      ...(scheme === "https" ? { names: ["api.test"] } : { tls: false }),
      routes: {
        "/events": (_req, res) => {
          res.writeHead(200, { "content-type": "text/event-stream", ...(framing === "content-length" ? { "content-length": String(event.length) } : {}) });
          res.flushHeaders();
          held.push(res);
          heldOne();
        },
      },
    });
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { logLevel: "warn" });
    const url = `${scheme}://api.test:${upstream.port}/events`;
    const release = async (): Promise<void> => {
      await holding;
      held[0]!.end(event);
    };
    if (guest.startsWith("HTTP/2")) {
      const session = await h2Session(proxy.port, `api.test:${upstream.port}`, proxy.caCertPem);
      onTestFinished(() => void session.close());
      const stream = session.request({ ":method": "GET", ":path": "/events", ":authority": `api.test:${upstream.port}`, ":scheme": "https" });
      const head = await within(new Promise<Record<string, unknown>>((resolve) => stream.once("response", resolve)), 15_000, "response head");
      expect(head[":status"]).toBe(200);
      await release();
      let text = "";
      stream.setEncoding("utf8").on("data", (chunk: string) => (text += chunk));
      await new Promise((resolve) => stream.once("end", resolve));
      expect(text).toBe(event);
      return;
    }
    const agent = new ProxyAgent({ uri: proxy.url, requestTls: { ca: proxy.caCertPem } });
    onTestFinished(() => agent.close());
    const response = await within(request(url, { dispatcher: agent }), 15_000, "response head");
    expect(response.statusCode).toBe(200);
    expect(response.headers["content-type"]).toBe("text/event-stream");
    await release();
    expect(await response.body.text()).toBe(event);
    // The proxy serves on, and said nothing was wrong.
    const again = await request(url.replace("/events", "/echo"), { dispatcher: agent });
    expect(again.statusCode).toBe(200);
    await again.body.text();
    expect(proxy.logs.filter((line) => line["level"] === "error" || String(line["msg"]).includes("internal error"))).toEqual([]);
  });
});
