import { createHmac } from "node:crypto";
import { chmodSync, chownSync, closeSync, openSync, readFileSync, readSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { request, ProxyAgent } from "undici";
import { createHttpHooks, HttpRequestBlockedError, OptionError, ProxyClosedError, startProxy, type AuditRecord, type GuestOptions } from "../../src/index.js";
import type { Socket } from "node:net";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { testCa } from "../helpers/test-ca.js";
import { curlVia } from "../helpers/curl.js";
import { loadPolicy } from "../helpers/djs.js";
import { basic, credentialsOf, startGuestsProxy, type GuestsProxy } from "../helpers/guests.js";
import { fetchVia, startTestProxy, tempDir } from "../helpers/proxy.js";
import { openRaw, type RawResponse } from "../helpers/raw.js";
import { startUpstream, type Upstream } from "../helpers/upstream.js";
import { startH2Upstream } from "../helpers/h2-upstream.js";
import { eventually, FifoReader, makeFifo } from "../helpers/fifo.js";

const A_VALUE = "a-secret-value-0123456789";
const B_VALUE = "b-secret-value-9876543210";

/** Two guests: `a` may reach a.test with secret A_TOKEN, `b` may reach b.test with B_TOKEN. */
async function twoGuests(): Promise<{ proxy: GuestsProxy; upstream: Upstream; a: string; b: string }> {
  const upstream = await startUpstream({ names: ["a.test", "b.test"] });
  const proxy = await startGuestsProxy({
    a: { allowedInternalHosts: ["a.test"], secrets: { A_TOKEN: { hosts: ["a.test"], value: A_VALUE } } },
    b: { allowedInternalHosts: ["b.test"], secrets: { B_TOKEN: { hosts: ["b.test"], value: B_VALUE } } },
  });
  return { proxy, upstream, a: `https://a.test:${upstream.port}`, b: `https://b.test:${upstream.port}` };
}

/** undici through the proxy with a guest's credentials in the proxy URL. */
async function getAs(proxyUrl: string, caPem: string, url: string, headers: Record<string, string> = {}): Promise<{ status: number; text: string; headers: Record<string, unknown> }> {
  const agent = new ProxyAgent({ uri: proxyUrl, requestTls: { ca: caPem } });
  try {
    const res = await request(url, { dispatcher: agent, headers });
    return { status: res.statusCode, text: await res.body.text(), headers: res.headers };
  } catch (error) {
    // undici reports a refused CONNECT as an error that names the proxy's status.
    const refused = /Proxy response \((\d{3})\)/.exec((error as Error).message);
    if (refused === null) throw error;
    return { status: Number(refused[1]), text: "", headers: {} };
  } finally {
    await agent.close();
  }
}

/** Every way credentials can be wrong, as the Proxy-Authorization a guest sends (undefined: none). */
function badCredentials(proxy: GuestsProxy): Record<string, string | undefined> {
  const a = credentialsOf(proxy, "a");
  const b = credentialsOf(proxy, "b");
  return {
    missing: undefined,
    "not Basic": `Bearer ${a.token}`,
    "not base64": "Basic !!!not-base64!!!",
    "no colon": `Basic ${Buffer.from(a.token).toString("base64")}`,
    "empty token": basic("a", ""),
    "empty user": basic("", a.token),
    "unknown guest": basic("nobody", a.token),
    "wrong token": basic("a", "0".repeat(64)),
    "another guest's token": basic("a", b.token),
    "a token as the user name": basic(a.token, "x"),
  };
}

describe("guests: credentials", () => {
  it("guestEnv(name) gives the credentialed proxy URL, git's auth method and only that guest's placeholders", async () => {
    const { proxy } = await twoGuests();
    const env = proxy.guestEnv("a");
    const { user, token } = credentialsOf(proxy, "a");
    expect(user).toBe("a");
    expect(token).toMatch(/^[0-9a-f]{64}$/);
    expect(env["HTTPS_PROXY"]).toBe(`http://a:${token}@127.0.0.1:${proxy.port}`);
    expect(env["http_proxy"]).toBe(env["HTTPS_PROXY"]);
    expect(env["GIT_HTTP_PROXY_AUTHMETHOD"]).toBe("basic");
    expect(env["A_TOKEN"]).toMatch(/^EGRESSGATE_SECRET_[0-9a-f]{48}$/);
    expect(env["B_TOKEN"]).toBeUndefined();
    expect(credentialsOf(proxy, "b").token).not.toBe(token);
    expect(() => proxy.guestEnv()).toThrow(/name a guest \(served: a, b\)/);
    expect(() => proxy.guestEnv("c")).toThrow(/no guest named "c"/);
  });

  it("tokens are HMAC-SHA256(deploymentKey, name): two proxies with one key accept the same credentials", async () => {
    const key = "k".repeat(40);
    const first = await startGuestsProxy({ ci: { allowedHosts: ["a.test"] } }, { deploymentKey: key });
    const second = await startGuestsProxy({ ci: { allowedHosts: ["a.test"] } }, { deploymentKey: key });
    const expected = createHmac("sha256", key).update("ci").digest("hex");
    expect(credentialsOf(first, "ci").token).toBe(expected);
    expect(credentialsOf(second, "ci").token).toBe(expected);
    const third = await startGuestsProxy({ ci: { allowedHosts: ["a.test"] } });
    expect(credentialsOf(third, "ci").token).not.toBe(expected);
  });

  for (const form of ["CONNECT", "absolute-form"] as const) {
    it(`${form}: missing, malformed, unknown and wrong credentials all get the same 407 with Proxy-Authenticate, and the connection closes`, async () => {
      const { proxy, upstream } = await twoGuests();
      const answers = new Set<string>();
      for (const [label, header] of Object.entries(badCredentials(proxy))) {
        const raw = await openRaw(proxy.port);
        const auth = header === undefined ? "" : `Proxy-Authorization: ${header}\r\n`;
        raw.write(
          form === "CONNECT"
            ? `CONNECT a.test:${upstream.port} HTTP/1.1\r\nHost: a.test:${upstream.port}\r\n${auth}\r\n`
            : `GET http://a.test:${upstream.port}/echo HTTP/1.1\r\nHost: a.test:${upstream.port}\r\n${auth}\r\n`,
        );
        const res = await raw.readResponse({ forConnect: form === "CONNECT" });
        expect(res.status, label).toBe(407);
        expect(res.headers["proxy-authenticate"], label).toBe('Basic realm="egressgate", charset="UTF-8"');
        expect(res.headers["connection"], label).toBe("close");
        expect(res.body, label).toContain("egressgate env --guest NAME");
        answers.add(`${res.status} ${res.statusText} ${res.body}`);
        await raw.closed;
      }
      expect(answers.size).toBe(1);
      expect(upstream.hits()).toBe(0);
      // Still serving the guest with the right credentials.
      expect((await getAs(credentialsOf(proxy, "a").proxyUrl, proxy.caCertPem, `https://a.test:${upstream.port}/echo`)).status).toBe(200);
    });
  }

  // Node keeps the first of several Proxy-Authorization headers and drops the rest: a's and then
  // b's passed as a's, and nothing said so (black-box finding).
  for (const form of ["CONNECT", "absolute-form", "upgrade"] as const) {
    it(`${form}: two Proxy-Authorization headers, whichever guests they name, get 400 saying so, in the body and the log`, async () => {
      const { proxy, upstream } = await twoGuests();
      const a = basic("a", credentialsOf(proxy, "a").token);
      const b = basic("b", credentialsOf(proxy, "b").token);
      for (const [first, second] of [[a, b], [b, a], [a, a]] as const) {
        const raw = await openRaw(proxy.port);
        // The second in lower case: field names are case-insensitive.
        const auth = `Proxy-Authorization: ${first}\r\nproxy-authorization: ${second}\r\n`;
        const upgrade = form === "upgrade" ? "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" : "";
        raw.write(
          form === "CONNECT"
            ? `CONNECT a.test:${upstream.port} HTTP/1.1\r\nHost: a.test:${upstream.port}\r\n${auth}\r\n`
            : `GET https://a.test:${upstream.port}/echo HTTP/1.1\r\nHost: a.test:${upstream.port}\r\n${upgrade}${auth}\r\n`,
        );
        const res = await raw.readResponse({ forConnect: form === "CONNECT" });
        expect(res.status).toBe(400);
        expect(res.body).toContain("2 Proxy-Authorization headers");
        raw.socket.destroy();
      }
      expect(upstream.hits()).toBe(0);
      const lines = proxy.logs.filter((l) => l["msg"] === "request");
      expect(lines).toHaveLength(3);
      for (const line of lines) {
        expect(line).toMatchObject({ status: 400, code: "EG_BAD_REQUEST", method: form === "CONNECT" ? "CONNECT" : "GET" });
        expect(line["guest"]).toBeUndefined();
        expect(line["reason"]).toMatch(/2 Proxy-Authorization headers/);
      }
      // One header still passes.
      expect((await getAs(credentialsOf(proxy, "a").proxyUrl, proxy.caCertPem, `https://a.test:${upstream.port}/echo`)).status).toBe(200);
    });
  }

  it("curl with no credentials, or another guest's name with its own token, exits 56 after the 407", async () => {
    const { proxy, a } = await twoGuests();
    const url = new URL(proxy.url);
    const noCredentials = await curlVia(proxy.url, proxy.caFile, `${a}/echo`);
    expect(noCredentials.exitCode).toBe(56);
    expect(noCredentials.stderr).toMatch(/407/);
    const mixed = await curlVia(`http://b:${credentialsOf(proxy, "a").token}@${url.host}`, proxy.caFile, `${a}/echo`);
    expect(mixed.exitCode).toBe(56);
    const right = await curlVia(credentialsOf(proxy, "a").proxyUrl, proxy.caFile, `${a}/echo`);
    expect(right.exitCode).toBe(0);
    expect(right.status).toBe(200);
  });

  it("past a burst of 20 failures a source gets 429 with Retry-After, the log holds one line for them, and valid credentials still pass", async () => {
    const { proxy, upstream, a } = await twoGuests();
    const statuses: number[] = [];
    let retryAfter: string | undefined;
    for (let i = 0; i < 25; i++) {
      const raw = await openRaw(proxy.port);
      raw.write(`CONNECT a.test:${upstream.port} HTTP/1.1\r\nProxy-Authorization: ${basic("a", "f".repeat(64))}\r\n\r\n`);
      const res = await raw.readResponse({ forConnect: true });
      statuses.push(res.status);
      retryAfter ??= res.headers["retry-after"];
      await raw.closed;
    }
    // The bucket refills at one a second, so a slow machine may see one more 407 in the run.
    expect(statuses.slice(0, 20)).toEqual(Array(20).fill(407));
    expect(statuses.slice(-3)).toEqual([429, 429, 429]);
    expect(Number(retryAfter)).toBeGreaterThanOrEqual(1);
    // One line for all 25, not a decision line each: a flood of bad attempts must not fill the log.
    expect(proxy.logs.filter((l) => l["msg"] === "proxy authentication failed")).toHaveLength(1);
    expect(proxy.logs.filter((l) => l["status"] === 407 || l["status"] === 429)).toEqual([]);
    expect((await getAs(credentialsOf(proxy, "a").proxyUrl, proxy.caCertPem, `${a}/echo`)).status).toBe(200);
  });

  it("requests without credentials never count as failures: a client that waits for the 407 before sending them is never locked out", async () => {
    const { proxy, upstream } = await twoGuests();
    const { token } = credentialsOf(proxy, "a");
    // git, Java and curl --proxy-anyauth: one bare CONNECT, the 407, then the credentials, on each of 30 connections.
    for (let i = 0; i < 30; i++) {
      const bare = await openRaw(proxy.port);
      bare.write(`CONNECT a.test:${upstream.port} HTTP/1.1\r\n\r\n`);
      expect((await bare.readResponse({ forConnect: true })).status).toBe(407);
      await bare.closed;
      const tunnel = await openTunnelAs(proxy.port, `a.test:${upstream.port}`, basic("a", token));
      tunnel.socket.destroy();
    }
    expect(proxy.logs.filter((l) => l["msg"] === "proxy authentication failed")).toHaveLength(1);
  });
});

// The summary of a source's failed authentications gave the last failure's reason with the count
// of every kind: 9 wrong tokens then 1 missing read `"reason":"missing","repeated":9` (black-box finding).
describe("guests: the log of failed authentications", () => {
  it("says each reason once, then summarises each reason's repeats apart, per source", async () => {
    const { proxy, upstream } = await twoGuests();
    const { token } = credentialsOf(proxy, "a");
    const sent = {
      "wrong token": `Proxy-Authorization: ${basic("a", "f".repeat(64))}\r\n`,
      missing: "",
      malformed: "Proxy-Authorization: Bearer x\r\n",
      "unknown guest": `Proxy-Authorization: ${basic("nobody", token)}\r\n`,
    } as const;
    type Reason = keyof typeof sent;
    // A row per source address: what it sends, in order, and the summaries (repeats per reason) it must get.
    const rows: { source: string; sends: [Reason, number][]; repeated: Partial<Record<Reason, number>> }[] = [
      { source: "127.0.0.2", sends: [["wrong token", 9], ["missing", 1]], repeated: { "wrong token": 8 } },
      { source: "127.0.0.3", sends: [["missing", 1], ["wrong token", 4], ["malformed", 3], ["unknown guest", 2], ["wrong token", 1]], repeated: { "wrong token": 4, malformed: 2, "unknown guest": 1 } },
      { source: "127.0.0.4", sends: [["missing", 5]], repeated: { missing: 4 } },
    ];
    for (const { source, sends } of rows) {
      for (const [reason, times] of sends) {
        for (let i = 0; i < times; i++) {
          const raw = await openRaw(proxy.port, { localAddress: source });
          raw.write(`GET http://a.test:${upstream.port}/echo HTTP/1.1\r\nHost: a.test:${upstream.port}\r\n${sent[reason]}Connection: close\r\n\r\n`);
          expect((await raw.readResponse()).status).toBe(407);
          await raw.closed;
        }
      }
    }
    const lines = (source: string, summary: boolean): Record<string, unknown>[] =>
      proxy.logs.filter((l) => l["msg"] === `proxy authentication failed${summary ? " (repeated)" : ""}` && l["client"] === source);
    // At once: one line per reason a source gave, in the order first given.
    for (const { source, sends } of rows) expect(lines(source, false).map((l) => l["reason"])).toEqual([...new Set(sends.map(([reason]) => reason))]);
    // The summaries come 10 s after each reason's first line (polled: a bound for a loaded machine).
    const expected = rows.reduce((sum, row) => sum + Object.keys(row.repeated).length, 0);
    for (let waited = 0; proxy.logs.filter((l) => l["msg"] === "proxy authentication failed (repeated)").length < expected && waited < 20_000; waited += 100) {
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    for (const { source, repeated } of rows) {
      const summaries = Object.fromEntries(lines(source, true).map((l) => [l["reason"], l["repeated"]]));
      expect(summaries, source).toEqual(repeated);
    }
  }, 40_000);
});

describe("guests: isolation", () => {
  it("a guest cannot reach a host that only another guest allows", async () => {
    const { proxy, upstream, b } = await twoGuests();
    const res = await getAs(credentialsOf(proxy, "a").proxyUrl, proxy.caCertPem, `${b}/echo`);
    expect(res.status).toBe(403);
    expect(upstream.hits()).toBe(0);
    const own = await getAs(credentialsOf(proxy, "b").proxyUrl, proxy.caCertPem, `${b}/echo`);
    expect(own.status).toBe(200);
  });

  it("another guest's placeholder gets 403 naming the secret but not its guest, and nothing leaves", async () => {
    const { proxy, upstream, a, b } = await twoGuests();
    const bPlaceholder = proxy.guestEnv("b")["B_TOKEN"]!;
    // A header name too, in any letter case: it is never substituted (sixth session's black-box run).
    for (const headers of [{ authorization: `Bearer ${bPlaceholder}` }, { authorization: basic("x", bPlaceholder) }, { [bPlaceholder]: "x" }, { [`x-${bPlaceholder.toUpperCase()}`]: "x" }]) {
      const res = await getAs(credentialsOf(proxy, "a").proxyUrl, proxy.caCertPem, `${a}/echo`, headers);
      expect(res.status).toBe(403);
      expect(res.text).toContain('secret "B_TOKEN"');
      expect(res.text).not.toMatch(/\bb\b/);
      expect(res.text).not.toContain(B_VALUE);
    }
    const inPath = await getAs(credentialsOf(proxy, "a").proxyUrl, proxy.caCertPem, `${a}/echo/${bPlaceholder}`);
    expect(inPath.status).toBe(403);
    expect(upstream.hits()).toBe(0);
    // The owner's own placeholder still becomes its value.
    const own = await getAs(credentialsOf(proxy, "b").proxyUrl, proxy.caCertPem, `${b}/echo`, { authorization: `Bearer ${bPlaceholder}` });
    expect(own.status).toBe(200);
    expect((JSON.parse(own.text) as { headers: Record<string, string> }).headers["authorization"]).toBe(`Bearer ${B_VALUE}`);
  });

  it("a tunnel opened as one guest stays that guest when a request inside carries another's credentials, which never reach the upstream", async () => {
    const upstream = await startUpstream({ tls: false, names: ["a.test", "b.test"] });
    const proxy = await startGuestsProxy({ a: { allowedInternalHosts: ["a.test"] }, b: { allowedInternalHosts: ["b.test", "a.test"] } });
    const bAuth = basic("b", credentialsOf(proxy, "b").token);
    // apt sends Proxy-Authorization inside the tunnel: curl -p tunnels plain http, -H puts it on the inner request.
    const res = await curlVia(credentialsOf(proxy, "a").proxyUrl, proxy.caFile, `http://a.test:${upstream.port}/echo`, ["-p", "-H", `Proxy-Authorization: ${bAuth}`]);
    expect(res.status).toBe(200);
    const seen = JSON.parse(res.body) as { headers: Record<string, string> };
    expect(seen.headers["proxy-authorization"]).toBeUndefined();
    // Inside a's tunnel to b.test, b's credentials change nothing: a may not reach b.test.
    const raw = await openRaw(proxy.port);
    raw.write(`CONNECT b.test:${upstream.port} HTTP/1.1\r\nProxy-Authorization: ${basic("a", credentialsOf(proxy, "a").token)}\r\n\r\n`);
    const connect = await raw.readResponse({ forConnect: true });
    expect(connect.status).toBe(403);
    const tunnel = await openTunnelAs(proxy.port, `a.test:${upstream.port}`, basic("a", credentialsOf(proxy, "a").token));
    tunnel.write(`GET http://b.test:${upstream.port}/echo HTTP/1.1\r\nHost: b.test:${upstream.port}\r\nProxy-Authorization: ${bAuth}\r\n\r\n`);
    expect((await tunnel.readResponse()).status).toBe(421);
    tunnel.write(`GET /echo HTTP/1.1\r\nHost: a.test:${upstream.port}\r\nProxy-Authorization: ${bAuth}\r\n\r\n`);
    const inner = await tunnel.readResponse();
    expect(inner.status).toBe(200);
    expect(proxy.logs.filter((l) => l["msg"] === "request" && l["status"] === 200).every((l) => l["guest"] === "a")).toBe(true);
  });

  it("every decision line names its guest, and no token or its Basic form appears in any log line or error body", async () => {
    const { proxy, a, b } = await twoGuests();
    const aCreds = credentialsOf(proxy, "a");
    const bCreds = credentialsOf(proxy, "b");
    const bodies: string[] = [];
    bodies.push((await getAs(aCreds.proxyUrl, proxy.caCertPem, `${a}/echo/${bCreds.token}`)).text);
    bodies.push((await getAs(aCreds.proxyUrl, proxy.caCertPem, `${b}/echo/${bCreds.token}`)).text);
    const url = new URL(proxy.url);
    bodies.push((await curlVia(`http://a:${bCreds.token}@${url.host}`, proxy.caFile, `${a}/echo`, ["-i"])).body);
    const forbidden = [aCreds.token, bCreds.token, Buffer.from(`a:${aCreds.token}`).toString("base64"), Buffer.from(`b:${bCreds.token}`).toString("base64")];
    for (const text of [...proxy.rawLog, ...bodies]) for (const needle of forbidden) expect(text).not.toContain(needle);
    const decisions = proxy.logs.filter((l) => l["msg"] === "request" && l["status"] !== 407);
    expect(decisions.length).toBeGreaterThanOrEqual(2);
    for (const line of decisions) expect(line["guest"]).toBe("a");
  });
});

/** CONNECT with credentials; the returned client is inside the tunnel. */
async function openTunnelAs(port: number, target: string, authorization: string): Promise<Awaited<ReturnType<typeof openRaw>>> {
  const raw = await openRaw(port);
  raw.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: ${authorization}\r\n\r\n`);
  const res = await raw.readResponse({ forConnect: true });
  if (res.status !== 200) throw new Error(`CONNECT ${target} answered ${res.status}: ${res.body}`);
  return raw;
}

describe("guests: source binding", () => {
  it("a guest bound to a source range is known by its address alone; other addresses still need credentials", async () => {
    const upstream = await startUpstream({ tls: false, names: ["a.test"] });
    const proxy = await startGuestsProxy({ vm: { allowedInternalHosts: ["a.test"], sources: ["127.0.0.2/32"] }, other: { allowedHosts: [] } });
    const bound = await curlVia(proxy.url, proxy.caFile, `http://a.test:${upstream.port}/echo`, ["--interface", "127.0.0.2"]);
    expect(bound.status).toBe(200);
    const unbound = await curlVia(proxy.url, proxy.caFile, `http://a.test:${upstream.port}/echo`, ["--interface", "127.0.0.3"]);
    expect(unbound.status).toBe(407);
    // Credentials, when sent, decide: wrong ones are not rescued by the address.
    const wrong = await curlVia(`http://vm:${"0".repeat(64)}@${new URL(proxy.url).host}`, proxy.caFile, `http://a.test:${upstream.port}/echo`, ["--interface", "127.0.0.2"]);
    expect(wrong.status).toBe(407);
    expect(proxy.logs.find((l) => l["msg"] === "request" && l["status"] === 200)?.["guest"]).toBe("vm");
  });

  it("overlapping source ranges of two guests are refused at start", async () => {
    await expect(startGuestsProxy({ x: { sources: ["10.88.0.0/24"] }, y: { sources: ["10.88.0.7/32"] } })).rejects.toThrow(/guests\.y\.sources.*overlaps guests\.x\.sources/);
  });

  // The connection's address is IPv4 (plainAddress turns ::ffff:a.b.c.d into a.b.c.d), and an
  // IPv4-mapped range was kept as IPv6: it passed every check and never matched (black-box run).
  it.each(["::ffff:127.0.0.6/128", "::ffff:127.0.0.0/104"])("a guest bound to the IPv4-mapped range %s is known by a connection from 127.0.0.6", async (range) => {
    const upstream = await startUpstream({ tls: false, names: ["a.test"] });
    const proxy = await startGuestsProxy({ vm: { allowedInternalHosts: ["a.test"], sources: [range] }, other: { allowedHosts: [] } });
    const statusFrom = async (localAddress: string): Promise<number> => {
      const raw = await openRaw(proxy.port, { localAddress });
      raw.write(`GET http://a.test:${upstream.port}/echo HTTP/1.1\r\nHost: a.test:${upstream.port}\r\nConnection: close\r\n\r\n`);
      return (await raw.readResponse()).status;
    };
    expect(await statusFrom("127.0.0.6")).toBe(200);
    expect(proxy.logs.find((l) => l["msg"] === "request" && l["status"] === 200)?.["guest"]).toBe("vm");
    if (range.endsWith("/128")) expect(await statusFrom("127.0.0.7")).toBe(407);
  });

  it("a mapped range in one guest and the IPv4 range it maps in another are refused as overlapping", async () => {
    await expect(startGuestsProxy({ x: { sources: ["::ffff:127.0.0.6/128"] }, y: { sources: ["127.0.0.6/32"] } })).rejects.toThrow(/guests\.y\.sources.*overlaps guests\.x\.sources/);
    await expect(startGuestsProxy({ x: { sources: ["127.0.0.0/29"] }, y: { sources: ["::ffff:127.0.0.0/104"] } })).rejects.toThrow(/guests\.y\.sources.*overlaps guests\.x\.sources/);
  });

  it("a mapped range with a prefix under 96 is refused at start, saying why", async () => {
    await expect(startGuestsProxy({ x: { sources: ["::ffff:127.0.0.0/64"] } })).rejects.toThrow(/guests\.x\.sources\[0\].*IPv4-mapped.*prefix under 96/);
  });
});

// A policy's console line was redacted with its own guest's values before the log cut it; another
// guest's value the cut went through was left to the log's own pass, which came after the cut and
// no longer recognised what was left of it (review finding).
describe("guests: a policy's console line and another guest's value", () => {
  it.each([8, 20])("a line cut %i characters into guest b's value, logged by guest a's policy, shows none of it", async (inside) => {
    const upstream = await startUpstream({ names: ["a.test", "b.test"] });
    const proxy = await startGuestsProxy({
      a: {
        djsHooks: loadPolicy(`export function onRequest(r) { console.log(r.headers.get("x-long"), r.headers.get("x-other")); }`),
        allowedInternalHosts: ["a.test"],
        secrets: { A_TOKEN: { hosts: ["a.test"], value: A_VALUE } },
      },
      b: { allowedInternalHosts: ["b.test"], secrets: { B_TOKEN: { hosts: ["b.test"], value: B_VALUE } } },
    });
    // "x…x" and a space: b's value starts at 8192 - inside.
    const long = "x".repeat(8192 - inside - 1);
    const res = await getAs(credentialsOf(proxy, "a").proxyUrl, proxy.caCertPem, `https://a.test:${upstream.port}/echo`, { "x-long": long, "x-other": B_VALUE });
    expect(res.status).toBe(200);
    const line = proxy.rawLog.find((l) => l.includes('"policy console"'));
    expect(line).toBeDefined();
    expect(line).toContain(`${long} [REDACTED:B_TOKEN]`);
    expect(line).not.toContain(B_VALUE.slice(0, inside));
  });
});

describe("guests: added and removed while running", () => {
  it("an added guest is served at once; a removed guest's open tunnel is closed and its credentials get 407", async () => {
    const { proxy, upstream } = await twoGuests();
    const { httpHooks, env } = createHttpHooks({ allowedInternalHosts: ["a.test"] });
    proxy.addGuest("late", { httpHooks, env });
    expect(proxy.guestNames()).toEqual(["a", "b", "late"]);
    const late = credentialsOf(proxy, "late");
    expect((await getAs(late.proxyUrl, proxy.caCertPem, `https://a.test:${upstream.port}/echo`)).status).toBe(200);
    expect(() => proxy.addGuest("late", { httpHooks })).toThrow(/already served/);
    expect(() => proxy.addGuest("Bad Name", { httpHooks })).toThrow(/addGuest: guests\["Bad Name"\]: a guest name must be/);

    const tunnel = await openTunnelAs(proxy.port, `a.test:${upstream.port}`, basic("late", late.token));
    await proxy.removeGuest("late");
    await tunnel.closed;
    expect(proxy.guestNames()).toEqual(["a", "b"]);
    const after = await openRaw(proxy.port);
    after.write(`CONNECT a.test:${upstream.port} HTTP/1.1\r\nProxy-Authorization: ${basic("late", late.token)}\r\n\r\n`);
    expect((await after.readResponse({ forConnect: true })).status).toBe(407);
    await expect(proxy.removeGuest("late")).rejects.toThrow(/no guest named "late"/);
    // The others are untouched.
    expect((await getAs(credentialsOf(proxy, "a").proxyUrl, proxy.caCertPem, `https://a.test:${upstream.port}/echo`)).status).toBe(200);
  });
});

// The README said a removed guest's "credentials get 407 from now on"; but a token is
// HMAC(deployment key, name), so a guest given the name again accepted the old credentials, and
// a keyed placeholder came back with them (black-box finding): documented, and pinned here.
describe("guests: a name is a lasting credential", () => {
  const key = "lasting-credential-deployment-key-0123456789";
  it.each([
    { served: "the same name", name: "box1", deploymentKey: key, status: 200 },
    { served: "another name", name: "box1-2", deploymentKey: key, status: 407 },
    { served: "the same name under a rotated deployment key", name: "box1", deploymentKey: `${key}-rotated`, status: 407 },
  ])("after removeGuest, $served: the removed guest's credentials get $status", async ({ name, deploymentKey, status }) => {
    const upstream = await startUpstream({ names: ["a.test"] });
    const url = `https://a.test:${upstream.port}/echo`;
    // Placeholders keyed per guest by the deployment key and the name, as the config file derives them.
    const hooksFor = (value: string, withKey: string, guest: string): ReturnType<typeof createHttpHooks> =>
      createHttpHooks({ allowedInternalHosts: ["a.test"], secrets: { API_KEY: { hosts: ["a.test"], value } }, secretPlaceholderKey: createHmac("sha256", withKey).update(guest).digest("hex") });
    const first = await startGuestsProxy({ keeper: {} }, { deploymentKey: key, logLevel: "warn" });
    const old = hooksFor("old-tenant-value-0123456789", key, "box1");
    first.addGuest("box1", { httpHooks: old.httpHooks, env: old.env });
    const kept = credentialsOf(first, "box1").proxyUrl;
    const placeholder = first.guestEnv("box1")["API_KEY"]!;
    expect((await getAs(kept, first.caCertPem, url, { authorization: `Bearer ${placeholder}` })).status).toBe(200);
    await first.removeGuest("box1");
    expect((await getAs(kept, first.caCertPem, url)).status).toBe(407);
    // A new tenant given a name: in the same process, or in one restarted with a new key.
    const proxy = deploymentKey === key ? first : await startGuestsProxy({ keeper: {} }, { deploymentKey, logLevel: "warn" });
    const next = hooksFor("new-tenant-value-0123456789", deploymentKey, name);
    proxy.addGuest(name, { httpHooks: next.httpHooks, env: next.env });
    const oldUrl = new URL(kept);
    oldUrl.port = String(proxy.port);
    const answer = await getAs(oldUrl.href, proxy.caCertPem, url, { authorization: `Bearer ${placeholder}` });
    expect(answer.status).toBe(status);
    // Served again under the same name, the old tenant's URL and placeholder reach the new tenant's value.
    if (status === 200) expect(JSON.parse(answer.text).headers.authorization).toBe("Bearer new-tenant-value-0123456789");
  });
});

// addGuest(5) failed with Node's ERR_INVALID_ARG_TYPE from inside the token derivation, a name
// already served or not served threw a TypeError without a code, and a proxy whose close() had
// begun took a new guest, or removed one, without a word (an embedding hunt).
describe("guests: calls that name a guest, and calls on a closing proxy", () => {
  const { httpHooks, env } = createHttpHooks({ allowedInternalHosts: ["a.test"] });
  const named: Array<[string, (proxy: GuestsProxy) => unknown, RegExp]> = [
    ["addGuest(5)", (proxy) => proxy.addGuest(5 as unknown as string, { httpHooks, env }), /^addGuest: guests: a guest name must be a string \(got number\)$/],
    ["addGuest(null)", (proxy) => proxy.addGuest(null as unknown as string, { httpHooks, env }), /^addGuest: guests: a guest name must be a string \(got null\)$/],
    ['addGuest("a"), already served', (proxy) => proxy.addGuest("a", { httpHooks, env }), /^addGuest: guests\.a: a guest named "a" is already served$/],
    ['removeGuest("zz")', (proxy) => proxy.removeGuest("zz"), /^removeGuest: guests\.zz: no guest named "zz" \(served: a, b\)$/],
    ["removeGuest(5)", (proxy) => proxy.removeGuest(5 as unknown as string), /^removeGuest: guests: a guest name must be a string \(got number\)$/],
    ['guestEnv("zz")', (proxy) => proxy.guestEnv("zz"), /^guestEnv: guests\.zz: no guest named "zz" \(served: a, b\)$/],
    ["guestEnv(5)", (proxy) => proxy.guestEnv(5 as unknown as string), /^guestEnv: guests: a guest name must be a string \(got number\)$/],
    ["guestEnv() of two", (proxy) => proxy.guestEnv(), /^guestEnv: guests: name a guest \(served: a, b\)$/],
  ];

  it.each(named)("%s: EG_INVALID_OPTION at the guest's path; the guests are unchanged", async (_label, call, message) => {
    const { proxy, upstream } = await twoGuests();
    let thrown: unknown;
    try {
      await call(proxy);
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(OptionError);
    expect((thrown as OptionError).code).toBe("EG_INVALID_OPTION");
    expect((thrown as Error).message).toMatch(message);
    expect(proxy.guestNames()).toEqual(["a", "b"]);
    expect((await getAs(credentialsOf(proxy, "a").proxyUrl, proxy.caCertPem, `https://a.test:${upstream.port}/echo`)).status).toBe(200);
  });

  const changes: Array<[string, (proxy: GuestsProxy) => unknown]> = [
    ["addGuest", (proxy) => proxy.addGuest("late", { httpHooks, env })],
    ["removeGuest", (proxy) => proxy.removeGuest("b")],
    ["reload", (proxy) => proxy.reload({ guests: { a: { httpHooks, env } } })],
  ];

  it.each(changes)("%s once close() has begun, and after it ended: EG_CLOSED, and the guests are unchanged", async (method, call) => {
    const { proxy } = await twoGuests();
    const closed = proxy.close();
    for (const when of ["closing", "closed"]) {
      if (when === "closed") await closed;
      let thrown: unknown;
      try {
        await call(proxy);
      } catch (error) {
        thrown = error;
      }
      expect(thrown, when).toBeInstanceOf(ProxyClosedError);
      expect((thrown as ProxyClosedError).code).toBe("EG_CLOSED");
      expect((thrown as Error).message).toBe(`${method}: the proxy is closing`);
      expect(proxy.guestNames(), when).toEqual(["a", "b"]);
    }
  });
});

// These threw plain TypeErrors, without the code and path every other option error has, and
// addGuest's said "startProxy:" (a black-box hunt of the embedding API): a reserved variable in
// env, addGuest without options, overlapping sources at addGuest, addGuest/removeGuest on the open
// single-guest proxy, and a reload that changes whether credentials are asked.
describe("guests: every option error of startProxy, addGuest, removeGuest and reload has its code, path and caller", () => {
  const { httpHooks, env } = createHttpHooks({ allowedInternalHosts: ["a.test"] });
  const base = (): { listen: { host: string; port: number }; caDir: string } => ({ listen: { host: "127.0.0.1", port: 0 }, caDir: tempDir() });
  type Case = [label: string, proxyKind: "none" | "guests" | "open", call: (proxy: RunningProxyLike) => unknown, path: string, message: RegExp];
  type RunningProxyLike = Pick<GuestsProxy, "addGuest" | "removeGuest" | "reload" | "guestNames">;
  const cases: Case[] = [
    ["startProxy: a reserved variable in env", "none", () => startProxy({ ...base(), env: { HTTPS_PROXY: "http://elsewhere.test:1" } }), "env.HTTPS_PROXY", /^startProxy: env\.HTTPS_PROXY: HTTPS_PROXY is a variable the proxy sets/],
    ["startProxy: a reserved variable in a guest's env", "none", () => startProxy({ ...base(), guests: { a: { env: { NODE_EXTRA_CA_CERTS: "/x" } } } }), "guests.a.env.NODE_EXTRA_CA_CERTS", /^startProxy: guests\.a\.env\.NODE_EXTRA_CA_CERTS: /],
    ['addGuest("e") without options', "guests", (proxy) => proxy.addGuest("e", undefined as unknown as GuestOptions), "guests.e", /^addGuest: guests\.e must be an object \(got undefined\)$/],
    ["addGuest: a reserved variable in env", "guests", (proxy) => proxy.addGuest("e", { httpHooks, env: { ...env, HTTP_PROXY: "http://elsewhere.test:1" } }), "guests.e.env.HTTP_PROXY", /^addGuest: guests\.e\.env\.HTTP_PROXY: /],
    ["addGuest: sources overlapping another guest's", "guests", (proxy) => proxy.addGuest("e", { httpHooks, env, sources: ["10.88.0.0/24"] }), "guests.e.sources", /^addGuest: guests\.e\.sources overlaps guests\.b\.sources/],
    ["addGuest on the open single-guest proxy", "open", (proxy) => proxy.addGuest("e", { httpHooks, env }), "guests.e", /^addGuest: this proxy serves one guest without credentials/],
    ["removeGuest on the open single-guest proxy", "open", (proxy) => proxy.removeGuest("default"), "guests.default", /^removeGuest: this proxy serves one guest without credentials/],
    ["reload from the open single-guest form to guests", "open", (proxy) => proxy.reload({ ...base(), guests: { a: { httpHooks, env } } }), "guests", /^reload: a proxy that serves one guest without credentials stays that way/],
    ["reload from guests to the open single-guest form", "guests", (proxy) => proxy.reload({ ...base(), httpHooks, env }), "auth", /^reload: a proxy that serves one guest without credentials stays that way/],
    ["reload: a reserved variable in a guest's env", "guests", (proxy) => proxy.reload({ ...base(), guests: { a: { httpHooks, env: { SSL_CERT_FILE: "/x" } } } }), "guests.a.env.SSL_CERT_FILE", /^reload: guests\.a\.env\.SSL_CERT_FILE: /],
    ["reload: overlapping sources", "guests", (proxy) => proxy.reload({ ...base(), guests: { a: { sources: ["10.9.0.0/16"] }, b: { sources: ["10.9.1.0/24"] } } }), "guests.b.sources", /^reload: guests\.b\.sources overlaps guests\.a\.sources/],
    ["reload: a value the schema refuses", "guests", (proxy) => proxy.reload({ ...base(), guests: { a: {} }, maxRedirects: "3" as unknown as number }), "maxRedirects", /^reload: maxRedirects /],
  ];

  it.each(cases)("%s", async (_label, proxyKind, call, path, message) => {
    const proxy: RunningProxyLike | undefined =
      proxyKind === "guests"
        ? await startGuestsProxy({ a: { allowedInternalHosts: ["a.test"] }, b: { allowedInternalHosts: ["b.test"], sources: ["10.88.0.7/32"] } })
        : proxyKind === "open"
          ? await startTestProxy({ allowedInternalHosts: ["api.test"] })
          : undefined;
    const namesBefore = proxy?.guestNames();
    let thrown: unknown;
    try {
      await call(proxy as RunningProxyLike);
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(TypeError);
    expect(thrown).toBeInstanceOf(OptionError);
    expect(thrown).toMatchObject({ code: "EG_INVALID_OPTION", path });
    expect((thrown as Error).message).toMatch(message);
    // Refused whole: the guests served are the ones before the call.
    if (proxy !== undefined) expect(proxy.guestNames()).toEqual(namesBefore);
  });
});

// A guest removed (removeGuest, or a reload without it) while a request of its own was under way
// on a connection not bound to it (an absolute-form request on the listener): the log, the audit
// record and the error body lost its values' redaction, and the request still went out, with its
// secret, on a pool made anew after removeGuest had resolved (black-box findings).
describe("guests: removed while their requests are under way", () => {
  /** Guest `a`, whose requests wait in isRequestAllowed until released; `/quote` is then refused quoting its Authorization. */
  async function heldGuest(): Promise<{ proxy: GuestsProxy; upstream: Upstream; records: AuditRecord[]; arrived: Promise<void>; release: () => void; send: (path: string) => Promise<RawResponse> }> {
    const upstream = await startUpstream({ names: ["a.test", "b.test"] });
    let arrive!: () => void;
    const arrived = new Promise<void>((resolve) => (arrive = resolve));
    let release!: () => void;
    const released = new Promise<void>((resolve) => (release = resolve));
    const records: AuditRecord[] = [];
    const proxy = await startGuestsProxy(
      {
        a: {
          allowedInternalHosts: ["a.test"],
          secrets: { A_TOKEN: { hosts: ["a.test"], value: A_VALUE } },
          isRequestAllowed: async (request) => {
            arrive();
            await released;
            if (new URL(request.url).pathname === "/quote") throw new HttpRequestBlockedError(`refused: ${request.headers.get("authorization") ?? ""}`);
            return true;
          },
        },
        b: { allowedInternalHosts: ["b.test"] },
      },
      { onDecision: (record) => void records.push(record) },
    );
    const placeholder = proxy.guestEnv("a")["A_TOKEN"]!;
    const send = async (path: string): Promise<RawResponse> => {
      // Absolute-form on the listener: the connection is not bound to the guest, so removing it does not close it.
      const raw = await openRaw(proxy.port);
      const target = `a.test:${upstream.port}`;
      raw.write(`GET https://${target}${path} HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: ${basic("a", credentialsOf(proxy, "a").token)}\r\nAuthorization: Bearer ${placeholder}\r\n\r\n`);
      return raw.readResponse();
    };
    return { proxy, upstream, records, arrived, release, send };
  }

  it("a refusal that quotes the secret after its guest was removed is still redacted, in the body, the log and the audit record", async () => {
    const { proxy, records, arrived, release, send } = await heldGuest();
    const answer = send("/quote");
    await arrived;
    await proxy.removeGuest("a");
    release();
    const res = await answer;
    expect(res.status).toBe(403);
    expect(res.body).toContain("[REDACTED:A_TOKEN]");
    expect(res.body).not.toContain(A_VALUE);
    await vi.waitFor(() => expect(records).toHaveLength(1));
    expect(JSON.stringify(records)).not.toContain(A_VALUE);
    expect(JSON.stringify(records)).toContain("[REDACTED:A_TOKEN]");
    expect(proxy.rawLog.join("")).not.toContain(A_VALUE);
    expect(proxy.logs.find((line) => line["msg"] === "request")?.["reason"]).toContain("[REDACTED:A_TOKEN]");
  });

  it("a request whose guest was removed before it went out never reaches the upstream: 403 naming the removal", async () => {
    const { proxy, upstream, arrived, release, send } = await heldGuest();
    const answer = send("/echo");
    await arrived;
    await proxy.removeGuest("a");
    release();
    const res = await answer;
    expect(res.status).toBe(403);
    expect(res.body).toMatch(/guest "a" was removed/);
    expect(upstream.hits()).toBe(0);
    expect(proxy.logs.find((line) => line["msg"] === "request")).toMatchObject({ guest: "a", status: 403, code: "EG_DENIED" });
    // The other guest is served.
    expect((await getAs(credentialsOf(proxy, "b").proxyUrl, proxy.caCertPem, `https://b.test:${upstream.port}/echo`)).status).toBe(200);
  });

  // The removal destroyed the guest's upstream pools under it: 502 "upstream request failed for
  // a.test:PORT: UND_ERR_DESTROYED: The client is destroyed", logged EG_UPSTREAM (black-box finding).
  it.each(["HTTP/1.1", "HTTP/2"] as const)("a request already at its %s upstream when its guest is removed gets the upstream's answer in full", async (protocol) => {
    let answer: (() => void) | undefined;
    let arrive!: () => void;
    const arrived = new Promise<void>((resolve) => (arrive = resolve));
    const port =
      protocol === "HTTP/1.1"
        ? (await startUpstream({ names: ["a.test"], routes: { "/held": (_req, res) => ((answer = () => res.end("late answer")), arrive()) } })).port
        : (
            await startH2Upstream(
              {
                "/held": (stream) => {
                  answer = () => {
                    stream.respond({ ":status": 200 });
                    stream.end("late answer");
                  };
                  arrive();
                },
              },
              ["a.test"],
            )
          ).port;
    const proxy = await startGuestsProxy({ a: { allowedInternalHosts: ["a.test"] }, b: { allowedInternalHosts: ["b.test"] } });
    // Absolute-form on the listener: the connection is not bound to the guest, so removing it does not close it.
    const raw = await openRaw(proxy.port);
    const target = `a.test:${port}`;
    raw.write(`GET https://${target}/held HTTP/1.1\r\nHost: ${target}\r\nProxy-Authorization: ${basic("a", credentialsOf(proxy, "a").token)}\r\n\r\n`);
    await arrived;
    await proxy.removeGuest("a");
    answer!();
    const res = await raw.readResponse();
    expect(res).toMatchObject({ status: 200, body: "late answer" });
    await vi.waitFor(() => expect(proxy.logs.find((line) => line["msg"] === "request")).toMatchObject({ guest: "a", status: 200 }));
    expect(proxy.logs.find((line) => line["msg"] === "request")).not.toHaveProperty("error");
  });

  it("a request cut in a removed guest's tunnel is logged as the proxy's cut, not as the upstream's failure or the guest's", async () => {
    const { proxy, upstream, arrived, release } = await heldGuest();
    const tunnel = await openTunnelAs(proxy.port, `a.test:${upstream.port}`, basic("a", credentialsOf(proxy, "a").token));
    const tls = await tlsInside(tunnel, "a.test");
    tls.write(`GET /echo HTTP/1.1\r\nHost: a.test:${upstream.port}\r\n\r\n`);
    await arrived;
    await proxy.removeGuest("a");
    release();
    await vi.waitFor(() => expect(proxy.logs.filter((line) => line["msg"] === "request" && line["method"] === "GET")).toHaveLength(1));
    const line = proxy.logs.find((l) => l["msg"] === "request" && l["method"] === "GET")!;
    expect(line).toMatchObject({ guest: "a", status: 499 });
    expect(line["reason"]).toMatch(/the proxy closed the connection: the guest "a" was removed/);
    expect(upstream.hits()).toBe(0);
  });
});

describe("guests: reloaded with a tunnel open", () => {
  it("each reload leaves one close listener on the tunnel, not one more per reload (the replaced guests were kept alive by them)", async () => {
    const upstream = await startUpstream();
    const options = { allowedInternalHosts: ["api.test"] };
    const proxy = await startGuestsProxy({ a: options });
    const tunnel = await openTunnelAs(proxy.port, `api.test:${upstream.port}`, basic("a", credentialsOf(proxy, "a").token));
    const warnings: string[] = [];
    const onWarning = (warning: Error): void => void warnings.push(warning.name);
    process.on("warning", onWarning);
    try {
      const ca = await testCa();
      for (let i = 0; i < 15; i++) {
        const { httpHooks, env } = createHttpHooks(options);
        await proxy.reload({ guests: { a: { httpHooks, env } }, listen: { host: "127.0.0.1", port: 0 }, upstreamCa: [ca.certPem], resolve: { "api.test": ["127.0.0.1"] } });
      }
      // Node warns at the eleventh listener of one event; warnings are emitted on the next tick.
      await new Promise((resolve) => setImmediate(resolve));
    } finally {
      process.off("warning", onWarning);
    }
    expect(warnings).not.toContain("MaxListenersExceededWarning");
    // The tunnel still serves, as the reloaded guest's.
    const tls = await tlsInside(tunnel, "api.test");
    tls.write(`GET /echo HTTP/1.1\r\nHost: api.test:${upstream.port}\r\nConnection: close\r\n\r\n`);
    const text = await new Promise<string>((resolve) => {
      let got = "";
      tls.on("data", (c: Buffer) => (got += c.toString()));
      tls.on("close", () => resolve(got));
    });
    expect(text).toMatch(/^HTTP\/1\.1 200 /);
  });
});

describe("guests: the guest environment files", () => {
  // writeFile's mode applies only to a file it creates: one that was there already (a `touch`,
  // systemd-tmpfiles under umask 022) kept 0644, and every guest's token went into it readable
  // by every local user (black-box finding).
  it("an existing file the proxy's user owns loses what other users may do with it before the credentials go in, and the log says so; its group keeps its access", async () => {
    const dir = tempDir();
    const file = join(dir, "guest.env");
    for (const [name, mode] of [["ci", 0o644], ["agent", 0o640], ["build", 0o666]] as const) {
      writeFileSync(`${file}.${name}`, "OLD=1\n");
      chmodSync(`${file}.${name}`, mode);
    }
    // Someone who opened it while everyone could keeps that handle: what goes in must not reach it.
    const early = openSync(`${file}.ci`, "r");
    onTestFinished(() => closeSync(early));
    const proxy = await startGuestsProxy({ ci: { allowedHosts: ["a.test"] }, agent: { allowedHosts: ["b.test"] }, build: { allowedHosts: ["c.test"] } }, { guestEnvFile: file });
    const seen = Buffer.alloc(4096);
    expect(seen.toString("utf8", 0, readSync(early, seen, 0, seen.length, 0))).toBe("OLD=1\n");
    for (const [name, mode] of [["ci", "640"], ["agent", "640"], ["build", "660"]]) {
      expect((statSync(`${file}.${name}`).mode & 0o777).toString(8), name).toBe(mode);
      const text = readFileSync(`${file}.${name}`, "utf8");
      expect(text).toContain(`HTTPS_PROXY=${credentialsOf(proxy, name!).proxyUrl}`);
      expect(text).not.toContain("OLD=1");
    }
    const warned = proxy.logs.filter((line) => line["msg"] === "the guest environment file could be read by other users; the proxy took that away before writing the credentials");
    expect(warned.map((line) => [line["file"], line["mode"], line["now"]]).sort()).toEqual([
      [`${file}.build`, "0666", "0660"],
      [`${file}.ci`, "0644", "0640"],
    ]);
    for (const line of proxy.rawLog) expect(line).not.toContain(credentialsOf(proxy, "ci").token);
  });

  it("a file the proxy makes, or one already 0600, is written 0600 with no warning", async () => {
    const dir = tempDir();
    const file = join(dir, "guest.env");
    writeFileSync(`${file}.agent`, "OLD=1\n", { mode: 0o600 });
    const proxy = await startGuestsProxy({ ci: { allowedHosts: ["a.test"] }, agent: { allowedHosts: ["b.test"] } }, { guestEnvFile: file });
    for (const name of ["ci", "agent"]) {
      expect((statSync(`${file}.${name}`).mode & 0o777).toString(8)).toBe("600");
      expect(readFileSync(`${file}.${name}`, "utf8")).toBe(Object.entries(proxy.guestEnv(name)).map(([k, v]) => `${k}=${v}\n`).join(""));
    }
    expect(proxy.logs.some((line) => String(line["msg"]).startsWith("the guest environment file could be read"))).toBe(false);
  });

  // Only root can give a file to another user; elsewhere the unit test of envFilePermissionProblem covers the rule.
  it.runIf(process.getuid?.() === 0)("a file another user owns that everyone can read is refused before anything goes into it; one only its group can read is written as it is", async () => {
    const dir = tempDir();
    const file = join(dir, "guest.env");
    writeFileSync(file, "OLD=1\n");
    chownSync(file, 65534, 65534);
    chmodSync(file, 0o666);
    const refused = startTestProxy({ allowedHosts: [] }, { auth: true, guestEnvFile: file });
    await expect(refused).rejects.toMatchObject({ code: "EG_INVALID_OPTION", path: "guestEnvFile" });
    await expect(refused).rejects.toThrow(/guestEnvFile cannot write .*guest\.env \(.*guest\.env can be read or written by users other than its owner and group \(mode 0666\).*chmod o-rwx/);
    expect(readFileSync(file, "utf8")).toBe("OLD=1\n");
    chmodSync(file, 0o660);
    const proxy = await startTestProxy({ allowedHosts: [] }, { auth: true, guestEnvFile: file });
    expect(readFileSync(file, "utf8")).toContain(`HTTPS_PROXY=${proxy.guestEnv()["HTTPS_PROXY"]}`);
    expect(statSync(file).mode & 0o777).toBe(0o660);
  });
  // A FIFO (a launcher handing the credentials on without a file on disk) with no reader yet
  // held the start in open() for good, on a threadpool thread: no listening line, no metrics
  // listener, no word of why (black-box finding). It is waited for now, as the audit log's FIFO
  // is, with one warning; a file larger than the pipe holds is written as the reader drains it.
  it.each([
    ["a few lines", 0],
    ["more than a pipe holds (64 KiB)", 1_200],
  ])("a FIFO with no reader yet: the start waits for one, saying so once, and the reader gets the whole file (%s)", async (_what, secrets) => {
    const fifo = makeFifo("guest.env");
    const logs: Record<string, unknown>[] = [];
    const hooks = {
      allowedHosts: [],
      secrets: Object.fromEntries(Array.from({ length: secrets }, (_, i) => [`SECRET_${i}`, { hosts: ["api.test"], value: `value-${i}` }])),
    };
    let proxy: Awaited<ReturnType<typeof startTestProxy>> | undefined;
    const started = startTestProxy(hooks, { guestEnvFile: fifo, logSink: (line) => logs.push(JSON.parse(line) as Record<string, unknown>) }).then((p) => (proxy = p));
    // Without a reader the start never ends: the FIFO's removal at the test's end fails it then.
    started.catch(() => undefined);
    const waiting = "the guest environment file is a FIFO with no reader; the start waits for one to open it";
    await eventually(() => logs.some((line) => line["msg"] === waiting), "the warning that the start waits for a reader");
    expect(proxy).toBeUndefined();
    const reader = new FifoReader(fifo);
    // Read as it comes: a file larger than the pipe is written in parts.
    await eventually(() => (reader.read(), proxy !== undefined), "the start, once the reader has the file");
    await started;
    await eventually(() => reader.read().endsWith("\n") && reader.read().split("\n").length - 1 === Object.keys(proxy!.guestEnv()).length, "every line at the reader");
    expect(reader.read()).toBe(Object.entries(proxy!.guestEnv()).map(([k, v]) => `${k}=${v}\n`).join(""));
    expect(Buffer.byteLength(reader.read())).toBeGreaterThan(secrets > 0 ? 64 * 1024 : 0);
    expect(logs.filter((line) => line["msg"] === waiting)).toHaveLength(1);
    expect(logs.some((line) => line["msg"] === "listening")).toBe(true);
  });
});

describe("guests: no accidental open proxy", () => {
  it("listening beyond loopback without guests is refused unless auth is said either way", async () => {
    const caDir = tempDir();
    await expect(startProxy({ listen: { host: "0.0.0.0", port: 0 }, caDir })).rejects.toThrow(/auth: true.*auth: false/);
    const open = await startProxy({ listen: { host: "0.0.0.0", port: 0 }, caDir, auth: false, logLevel: "silent" });
    expect(open.guestEnv()["HTTPS_PROXY"]).not.toContain("@");
    await open.close();
  });

  it("auth: true makes the single guest `default` send credentials, derived from the deployment key", async () => {
    const upstream = await startUpstream({ tls: false, names: ["api.test"] });
    const key = "d".repeat(32);
    const { httpHooks, env } = createHttpHooks({ allowedInternalHosts: ["api.test"] });
    const proxy = await startProxy({ httpHooks, env, auth: true, deploymentKey: key, listen: { host: "127.0.0.1", port: 0 }, caDir: tempDir(), resolve: { "api.test": ["127.0.0.1"] }, logLevel: "silent" });
    try {
      const proxyUrl = proxy.guestEnv()["HTTPS_PROXY"]!;
      expect(new URL(proxyUrl).username).toBe("default");
      expect(new URL(proxyUrl).password).toBe(createHmac("sha256", key).update("default").digest("hex"));
      const none = await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`);
      expect(none.status).toBe(407);
      const ok = await curlVia(proxyUrl, "/dev/null", `http://api.test:${upstream.port}/echo`);
      expect(ok.status).toBe(200);
    } finally {
      await proxy.close();
    }
  });

  it("removeGuest is refused on the single-guest form without credentials, as addGuest is, and it goes on serving", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] });
    await expect(proxy.removeGuest("default")).rejects.toThrow(/removeGuest: this proxy serves one guest without credentials/);
    expect(proxy.guestNames()).toEqual(["default"]);
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
  });

  it("the single-guest form on loopback asks for nothing, as before", async () => {
    const upstream = await startUpstream({ tls: false, names: ["api.test"] });
    const { httpHooks } = createHttpHooks({ allowedInternalHosts: ["api.test"] });
    const proxy = await startProxy({ httpHooks, listen: { host: "127.0.0.1", port: 0 }, caDir: tempDir(), resolve: { "api.test": ["127.0.0.1"] }, logLevel: "silent" });
    try {
      expect(proxy.guestEnv()["GIT_HTTP_PROXY_AUTHMETHOD"]).toBeUndefined();
      expect((await curlVia(proxy.url, "/dev/null", `http://api.test:${upstream.port}/echo`)).status).toBe(200);
      expect(() => proxy.addGuest("x", { httpHooks })).toThrow(/auth: true/);
    } finally {
      await proxy.close();
    }
  });
});

/** TLS inside a CONNECT tunnel, trusting the proxy's CA (read from its leaf chain). */
async function tlsInside(tunnel: Awaited<ReturnType<typeof openRaw>>, servername: string): Promise<TLSSocket> {
  const socket = tlsConnect({ socket: tunnel.detach() as Socket, servername, rejectUnauthorized: false });
  socket.on("error", () => undefined);
  onTestFinished(() => void socket.destroy());
  await new Promise<void>((resolve) => socket.once("secureConnect", () => resolve()));
  return socket;
}
