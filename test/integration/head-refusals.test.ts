import { describe, expect, it, vi } from "vitest";
import type { AuditRecord } from "../../src/index.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { startGuestsProxy } from "../helpers/guests.js";
import { startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { openRaw, openTlsTunnel, type RawClient } from "../helpers/raw.js";
import { startUpstream } from "../helpers/upstream.js";

// A HEAD's answer has no content (RFC 9110 §9.3.2; RFC 9112 §6.3), though its Content-Length may
// state what a GET would get. The proxy's refusals of a HEAD (carried note, fourteenth session):
// a HEAD with Upgrade refused had its error text written after the head; an HTTP/2 guest's HEAD
// had the text written into the stream Node had ended at the head, which destroyed the stream
// with ERR_STREAM_WRITE_AFTER_END; and both guests' records counted the text in bytesDown.

/** Paths the proxy refuses, with the status each gets. */
const refusals = [
  ["/deny", 403],
  ["/throw", 502],
  ["/loop", 508],
] as const;

async function setup(): Promise<{ proxy: TestProxy; authority: string; records: AuditRecord[] }> {
  const upstream = await startUpstream({
    routes: {
      "/loop": (_req, res) => {
        res.writeHead(302, { location: "/loop" });
        res.end();
      },
    },
  });
  const records: AuditRecord[] = [];
  const proxy = await startTestProxy(
    {
      allowedInternalHosts: ["api.test"],
      isRequestAllowed: (request) => new URL(request.url).pathname !== "/deny",
      onRequest: (request) => {
        if (new URL(request.url).pathname === "/throw") throw new Error("boom");
      },
    },
    { onDecision: (record) => records.push(record) },
  );
  return { proxy, authority: `api.test:${upstream.port}`, records };
}

/** What the records say of each request: method, path, status and body bytes sent. */
function sent(records: readonly AuditRecord[]): [string, string, number, number | undefined][] {
  return records.map((r) => [r.method, new URL(r.url).pathname, r.status, r.bytesDown]);
}

describe("a refused HEAD is answered with a head alone", () => {
  it.each(refusals)("HTTP/1.1 in a TLS tunnel, %s: the %s head carries the Content-Length a GET gets, no body, and the GET after it on the connection is read whole", async (path, status) => {
    const s = await setup();
    const client = await openTlsTunnel(s.proxy.port, s.authority, { ca: s.proxy.caCertPem });
    client.write(`HEAD ${path} HTTP/1.1\r\nHost: ${s.authority}\r\n\r\n`);
    const head = await client.readResponse({ forHead: true });
    client.write(`GET ${path} HTTP/1.1\r\nHost: ${s.authority}\r\n\r\n`);
    // Read as a response to a GET: any byte of a body after the HEAD's head would come first.
    const get = await client.readResponse();
    expect([head.status, get.status]).toEqual([status, status]);
    expect(get.body).toMatch(new RegExp(`^${status} `));
    expect(head.headers["content-length"]).toBe(String(Buffer.byteLength(get.body)));
    await vi.waitFor(() => expect(s.records).toHaveLength(2));
    expect(sent(s.records)).toEqual([
      ["HEAD", path, status, 0],
      ["GET", path, status, Buffer.byteLength(get.body)],
    ]);
  });

  it.each(refusals)("HTTP/2, %s: the %s head carries the Content-Length a GET gets and ends the stream, which is not destroyed, and the record counts no body", async (path, status) => {
    const s = await setup();
    const session = await h2Session(s.proxy.port, s.authority, s.proxy.caCertPem);
    const head = await h2Request(session, { ":method": "HEAD", ":path": path });
    const get = await h2Request(session, { ":path": path });
    expect([head.status, get.status]).toEqual([status, status]);
    expect(head.body.length).toBe(0);
    expect(head.headers["content-length"]).toBe(String(get.body.length));
    await vi.waitFor(() => expect(s.records).toHaveLength(2));
    expect(s.proxy.logs.filter((line) => line["msg"] === "guest h2 stream error")).toEqual([]);
    expect(sent(s.records)).toEqual([
      ["HEAD", path, status, 0],
      ["GET", path, status, get.body.length],
    ]);
  });

  const upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\n";

  /** Reads the answer to a HEAD, then everything until the proxy closes the connection. */
  async function headThenClose(client: RawClient): Promise<{ status: number; length: string | undefined; after: string }> {
    const res = await client.readResponse({ forHead: true });
    expect(res.headers["connection"]).toBe("close");
    expect(await client.closesWithin(10_000)).toBe(true);
    return { status: res.status, length: res.headers["content-length"], after: client.pending() };
  }

  it("HTTP/1.1 with Upgrade, absolute-form to a host not allowed and in a TLS tunnel to a refused path: 403 with its Content-Length and nothing after the head", async () => {
    const s = await setup();
    const plain = await openRaw(s.proxy.port);
    plain.write(`HEAD http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n${upgrade}\r\n`);
    const denied = await headThenClose(plain);
    expect(denied).toMatchObject({ status: 403, after: "" });
    expect(Number(denied.length)).toBeGreaterThan(0);
    const tunnel = await openTlsTunnel(s.proxy.port, s.authority, { ca: s.proxy.caCertPem });
    tunnel.write(`HEAD /deny HTTP/1.1\r\nHost: ${s.authority}\r\n${upgrade}\r\n`);
    const refused = await headThenClose(tunnel);
    expect(refused).toMatchObject({ status: 403, after: "" });
    expect(Number(refused.length)).toBeGreaterThan(0);
    await vi.waitFor(() => expect(s.records).toHaveLength(2));
    expect(s.records.map((r) => [r.method, r.status, r.bytesDown])).toEqual([
      ["HEAD", 403, 0],
      ["HEAD", 403, 0],
    ]);
  });

  it("HTTP/1.1 with Upgrade, without a guest's credentials: 407 with its Content-Length and nothing after the head", async () => {
    const proxy = await startGuestsProxy({ a: { allowedInternalHosts: ["api.test"] }, b: { allowedInternalHosts: ["api.test"] } });
    const client = await openRaw(proxy.port);
    client.write(`HEAD http://api.test/ HTTP/1.1\r\nHost: api.test\r\n${upgrade}\r\n`);
    const answer = await headThenClose(client);
    expect(answer).toMatchObject({ status: 407, after: "" });
    expect(Number(answer.length)).toBeGreaterThan(0);
  });
});
