import { createServer } from "node:https";
import type { SecureContext } from "node:tls";
import { describe, expect, it, vi } from "vitest";
import type { AuditRecord, HttpHooksOptions } from "../../src/index.js";
import { json, startDecisionServer } from "../helpers/deciders.js";
import { loadPolicy } from "../helpers/djs.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { fetchVia, startTestProxy, type TestProxy } from "../helpers/proxy.js";
import { openTlsTunnel } from "../helpers/raw.js";
import { testCa } from "../helpers/test-ca.js";
import { listenForTest, startUpstream } from "../helpers/upstream.js";

/**
 * Heads a source builds are held to the proxy's bounds (src/pipeline/head-bounds.ts). A Response
 * whose fields were 70 KB, or 20,000 fields, was logged and audited 200 "answered by the policy"
 * while HTTP/1.1 guests failed with "Header overflow" and HTTP/2 guests had the stream reset; a
 * request rewritten with a header of megabytes went upstream, where the 128 KiB bound on a head
 * held only while secrets were substituted. Both are the maker's failure now: 502
 * `EG_HOOK_FAILED` naming the size, logged and audited so, with nothing sent, in every tier and
 * on both guest protocols, and the proxy goes on serving.
 */

type Source = NonNullable<HttpHooksOptions["hooks"]>[number];
type Protocol = "HTTP/1.1" | "HTTP/2";

/** An upstream that takes heads of any size, so that a head the proxy let through is seen arriving, not refused by the upstream's parser. */
async function roomyUpstream(): Promise<{ port: number; arrived: string[] }> {
  const context = (await (await testCa()).serverContexts(["api.test"])).get("api.test")!;
  const arrived: string[] = [];
  const tls = { SNICallback: (_name: string, done: (error: Error | null, context: SecureContext) => void) => done(null, context) };
  const server = createServer({ ...tls, maxHeaderSize: 16 * 1024 * 1024 }, (req, res) => {
    arrived.push(req.url ?? "");
    req.resume();
    res.end("from upstream");
  });
  server.on("clientError", (_error, socket) => {
    arrived.push("(a head the upstream refused)");
    socket.destroy();
  });
  return { port: await listenForTest(server), arrived };
}

/** One GET to `path` on api.test as a guest speaking `protocol` would send it, through `proxy`. */
type Guest = (path: string) => Promise<{ status: number; text: string; headers: Record<string, unknown> }>;

/**
 * With `roomy`, a guest that takes the largest head the proxy sends: raw bytes over HTTP/1.1
 * (undici takes 16 KiB), and over HTTP/2 a header list of 64 KiB as RFC 9113 §6.5.2 counts it
 * (Node's client takes 65,535 bytes and 128 fields by default).
 */
async function guestFor(protocol: Protocol, proxy: TestProxy, port: number, roomy = false): Promise<Guest> {
  if (protocol === "HTTP/1.1" && roomy) {
    const tunnel = await openTlsTunnel(proxy.port, `api.test:${port}`, { ca: proxy.caCertPem });
    return async (path) => {
      tunnel.write(`GET ${path} HTTP/1.1\r\nHost: api.test:${port}\r\n\r\n`);
      const answer = await tunnel.readResponse();
      return { status: answer.status, text: answer.body, headers: answer.headers };
    };
  }
  if (protocol === "HTTP/1.1") return (path) => fetchVia(proxy, `https://api.test:${port}${path}`);
  const session = roomy
    ? await h2Session(proxy.port, `api.test:${port}`, proxy.caCertPem, { maxHeaderListSize: 64 * 1024 }, { maxHeaderListPairs: 2000 })
    : await h2Session(proxy.port, `api.test:${port}`, proxy.caCertPem);
  return async (path) => {
    const answer = await h2Request(session, { ":path": path });
    return { status: answer.status, text: answer.body.toString(), headers: answer.headers };
  };
}

function decisionFor(proxy: TestProxy, path: string): Record<string, unknown> | undefined {
  return proxy.logs.find((line) => line["msg"] === "request" && String(line["target"]).endsWith(path));
}

// -- Response heads a source made --------------------------------------------------------------

/**
 * Builds `h`, a Headers of the row's kind; the same text runs in the sandbox (tier 2) and here
 * (tier 3). "At the bound" is 65,536 bytes as an HTTP/2 guest is sent the head (each field's name
 * and value, and 32, RFC 9113 §6.5.2): its own Content-Type (54), the :status (42) and the date
 * (65) the proxy adds, and the rest, 65,375, in one field or in 999 (1,000 with Content-Type).
 */
const responseHeadersCode = `
  const h = new Headers();
  if (kind === "one 70 KB field") h.set("x-big", "v".repeat(70 * 1024));
  else if (kind === "20,000 fields") for (let i = 0; i < 20000; i++) h.append("x-f" + i, "v");
  else if (kind === "1,100 small fields") for (let i = 0; i < 1100; i++) h.append("f" + i, "v");
  else if (kind === "990 fields of 61 characters") for (let i = 0; i < 990; i++) h.append("x-field-" + String(i).padStart(3, "0"), "v".repeat(50));
  else if (kind === "one field at the bound" || kind === "one field a byte over the bound") {
    h.set("content-type", "text/plain");
    h.set("x-big", "v".repeat(65375 - 5 - 32 + (kind === "one field at the bound" ? 0 : 1)));
  } else if (kind === "999 fields at the bound") {
    h.set("content-type", "text/plain");
    for (let i = 0; i < 999; i++) h.append("f" + String(i).padStart(3, "0"), "v".repeat(i < 440 ? 30 : 29));
  } else h.set("x-fine", "v".repeat(12 * 1024));
  return h;`;
const responseHeaders = new Function("kind", responseHeadersCode) as (kind: string) => Headers;

type ResponsePhase = "onRequest" | "onResponse" | "handle";

/** A source whose `phase` answers /made with a Response whose head is of `kind`, and lets anything else through. */
function responseMaker(tier: "tier2" | "tier3", phase: ResponsePhase, kind: string): { source: Source; label: string } {
  if (tier === "tier2") {
    const made = `new Response("made", { headers: heads(${JSON.stringify(kind)}) })`;
    const body = {
      onRequest: `export function onRequest(r) { if (new URL(r.url).pathname === "/made") return ${made}; }`,
      onResponse: `export function onResponse(res, r) { if (new URL(r.url).pathname === "/made") return ${made}; }`,
      handle: `export function handle(r, next) { return new URL(r.url).pathname === "/made" ? ${made} : next(r); }`,
    }[phase];
    const policy = loadPolicy({ source: `function heads(kind) {${responseHeadersCode}}\n${body}`, filename: "makes-heads.mjs", workers: 1 });
    return { source: policy, label: policy.engine.filename };
  }
  const made = (): Response => new Response("made", { headers: responseHeaders(kind) });
  const isMade = (r: Request): boolean => new URL(r.url).pathname === "/made";
  const source = {
    onRequest: { onRequest: (r: Request) => (isMade(r) ? made() : undefined) },
    onResponse: { onResponse: (_res: Response, r: Request) => (isMade(r) ? made() : undefined) },
    handle: { handle: (r: Request, next: (r: Request) => Promise<Response>) => (isMade(r) ? made() : next(r)) },
  }[phase];
  return { source, label: "hooks[0]" };
}

const overBounds = [
  { kind: "one 70 KB field", reason: /header fields are 7\d{4} bytes, over the 65536/ },
  { kind: "20,000 fields", reason: /a response of 2000[01] header fields, over the 1000 / },
  // Over what a Node guest keeps (1,023 fields: the rest, Content-Length among them, go unseen).
  { kind: "1,100 small fields", reason: /a response of 110[01] header fields, over the 1000 / },
  // 64,350 bytes as HTTP/1.1 writes them, which passed; nghttp2 counts more a field, and an HTTP/2
  // guest's stream was reset (FRAME_SIZE_ERROR) while the answer was logged 200.
  { kind: "990 fields of 61 characters", reason: /header fields are 92\d{3} bytes, over the 65536 the proxy sends a guest \(counted as HTTP\/2 counts them/ },
  { kind: "one field a byte over the bound", reason: /header fields are 65537 bytes, over the 65536/ },
];

const responseRows = (["tier2", "tier3"] as const).flatMap((tier) =>
  (["onRequest", "onResponse", "handle"] as const).flatMap((phase) =>
    (["HTTP/1.1", "HTTP/2"] as const).flatMap((protocol) => overBounds.map((over) => ({ tier, phase, protocol, ...over }))),
  ),
);

describe("a response head a source made past the proxy's bounds", () => {
  it.each(responseRows)("$tier $phase, $kind, to an $protocol guest: 502 EG_HOOK_FAILED naming the size, logged and audited so", async ({ tier, phase, protocol, kind, reason }) => {
    const upstream = await roomyUpstream();
    const { source, label } = responseMaker(tier, phase, kind);
    const records: AuditRecord[] = [];
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [source] }, { onDecision: (record) => records.push(record) });
    const guest = await guestFor(protocol, proxy, upstream.port);

    const made = await guest("/made");
    expect(made.status).toBe(502);
    expect(made.text).toMatch(reason);
    await vi.waitFor(() => expect(decisionFor(proxy, "/made")).toMatchObject({ status: 502, code: "EG_HOOK_FAILED", source: label }));
    expect(String(decisionFor(proxy, "/made")!["reason"])).toMatch(reason);
    await vi.waitFor(() => expect(records).toHaveLength(1));
    expect(records[0]).toMatchObject({ status: 502, code: "EG_HOOK_FAILED", source: label });
    expect(records[0]!.sources).toContainEqual(expect.objectContaining({ source: label, phase, decision: "error", failure: "invalid" }));

    // The same guest connection goes on being served.
    const next = await guest("/next");
    expect(next).toMatchObject({ status: 200, text: "from upstream" });
  });

  it.each(
    (["tier2", "tier3"] as const).flatMap((tier) => (["onRequest", "onResponse", "handle"] as const).flatMap((phase) => (["HTTP/1.1", "HTTP/2"] as const).map((protocol) => ({ tier, phase, protocol })))),
  )("$tier $phase, one 12 KB field, to an $protocol guest: within the bounds, delivered", async ({ tier, phase, protocol }) => {
    const upstream = await roomyUpstream();
    const { source } = responseMaker(tier, phase, "one 12 KB field");
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [source] });
    const guest = await guestFor(protocol, proxy, upstream.port);
    const made = await guest("/made");
    expect(made).toMatchObject({ status: 200, text: "made" });
    expect(made.headers["x-fine"]).toBe("v".repeat(12 * 1024));
  });

  it.each(
    (["tier2", "tier3"] as const).flatMap((tier) =>
      (["onRequest", "onResponse", "handle"] as const).flatMap((phase) =>
        (["HTTP/1.1", "HTTP/2"] as const).flatMap((protocol) => (["one field at the bound", "999 fields at the bound"] as const).map((kind) => ({ tier, phase, protocol, kind }))),
      ),
    ),
  )("$tier $phase, $kind, to an $protocol guest that takes it: delivered whole, and logged 200", async ({ tier, phase, protocol, kind }) => {
    const upstream = await roomyUpstream();
    const { source } = responseMaker(tier, phase, kind);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [source] });
    const guest = await guestFor(protocol, proxy, upstream.port, true);
    const made = await guest("/made");
    expect(made).toMatchObject({ status: 200, text: "made" });
    if (kind === "one field at the bound") expect(made.headers["x-big"]).toBe("v".repeat(65338));
    else expect(Object.keys(made.headers).filter((name) => /^f\d{3}$/.test(name))).toHaveLength(999);
    await vi.waitFor(() => expect(decisionFor(proxy, "/made")).toMatchObject({ status: 200 }));
    const next = await guest("/next");
    expect(next).toMatchObject({ status: 200, text: "from upstream" });
  });
});

// -- Request heads a source handed on ----------------------------------------------------------

/** Sets the row's fields on `h`, a Headers; the same text runs in the sandbox and here. */
const requestFieldsCode = `
  if (kind === "one 200 KB field") h.set("x-big", "v".repeat(200 * 1024));
  else for (let i = 0; i < 20000; i++) h.append("x-f" + i, "v");
  return h;`;
const requestFields = new Function("h", "kind", requestFieldsCode) as (h: Headers, kind: string) => Headers;

type RequestWay = "tier2 onRequest's new Request" | "tier2 onRequest, in place" | "tier2 handle's next()" | "tier3 onRequest's new Request" | "tier3 onRequest, in place" | "tier3 handle's next()" | "a decider's set_headers";

/** A source that hands on the request to /grown with fields of `kind` added, the way `way` says, and any other as it came. */
async function requestGrower(way: RequestWay, kind: string): Promise<{ source: Source; label: string }> {
  const grown = (r: Request): boolean => new URL(r.url).pathname === "/grown";
  if (way.startsWith("tier2")) {
    const body = {
      "tier2 onRequest's new Request": `export function onRequest(r) { if (new URL(r.url).pathname === "/grown") return new Request(r.url, { headers: fields(new Headers(), K) }); }`,
      "tier2 onRequest, in place": `export function onRequest(r) { if (new URL(r.url).pathname === "/grown") fields(r.headers, K); }`,
      "tier2 handle's next()": `export function handle(r, next) { return next(new URL(r.url).pathname === "/grown" ? new Request(r.url, { headers: fields(new Headers(), K) }) : r); }`,
    }[way as "tier2 onRequest, in place"];
    const policy = loadPolicy({ source: `const K = ${JSON.stringify(kind)};\nfunction fields(h, kind) {${requestFieldsCode}}\n${body}`, filename: "grows-heads.mjs", workers: 1 });
    return { source: policy, label: policy.engine.filename };
  }
  if (way === "a decider's set_headers") {
    const set: Record<string, string> = {};
    if (kind === "one 200 KB field") set["x-big"] = "v".repeat(200 * 1024);
    else for (let i = 0; i < 20000; i++) set[`x-f${i}`] = "v";
    const server = await startDecisionServer((body, _req, res) => {
      const url = String((body["request"] as Record<string, unknown>)["url"]);
      json(res, 200, url.endsWith("/grown") ? { decision: "allow", set_headers: set } : { decision: "allow" });
    });
    const url = `${server.url}/decide`;
    return { source: { webhook: url }, label: `webhook:${url}` };
  }
  const source = {
    "tier3 onRequest's new Request": { onRequest: (r: Request) => (grown(r) ? new Request(r.url, { headers: requestFields(new Headers(), kind) }) : undefined) },
    "tier3 onRequest, in place": { onRequest: (r: Request) => void (grown(r) ? requestFields(r.headers, kind) : undefined) },
    "tier3 handle's next()": { handle: (r: Request, next: (r: Request) => Promise<Response>) => next(grown(r) ? new Request(r.url, { headers: requestFields(new Headers(), kind) }) : r) },
  }[way as "tier3 onRequest, in place"];
  return { source, label: "hooks[0]" };
}

const ways: RequestWay[] = [
  "tier2 onRequest's new Request",
  "tier2 onRequest, in place",
  "tier2 handle's next()",
  "tier3 onRequest's new Request",
  "tier3 onRequest, in place",
  "tier3 handle's next()",
  "a decider's set_headers",
];

const requestRows = ways.flatMap((way) =>
  (["HTTP/1.1", "HTTP/2"] as const).flatMap((protocol) =>
    [
      { kind: "one 200 KB field", reason: /head \(URL and header fields\) is 20\d{4} bytes, over the 131072/ },
      { kind: "20,000 fields", reason: /head \(URL and header fields\) is \d{6} bytes, over the 131072/ },
    ].map((over) => ({ way, protocol, ...over })),
  ),
);

describe("a request head a source handed on past 128 KiB", () => {
  it.each(requestRows)("$way, $kind, from an $protocol guest: 502 EG_HOOK_FAILED naming the size, and nothing goes upstream", async ({ way, protocol, kind, reason }) => {
    const upstream = await roomyUpstream();
    const { source, label } = await requestGrower(way, kind);
    const records: AuditRecord[] = [];
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [source] }, { onDecision: (record) => records.push(record) });
    const guest = await guestFor(protocol, proxy, upstream.port);

    const grown = await guest("/grown");
    expect(grown.status).toBe(502);
    expect(upstream.arrived).toEqual([]);
    await vi.waitFor(() => expect(decisionFor(proxy, "/grown")).toMatchObject({ status: 502, code: "EG_HOOK_FAILED", source: label }));
    expect(String(decisionFor(proxy, "/grown")!["reason"])).toMatch(reason);
    await vi.waitFor(() => expect(records).toHaveLength(1));
    expect(records[0]).toMatchObject({ status: 502, code: "EG_HOOK_FAILED", source: label });
    expect(records[0]!.sources).toContainEqual(expect.objectContaining({ source: label, decision: "error", failure: "invalid" }));

    const next = await guest("/next");
    expect(next).toMatchObject({ status: 200, text: "from upstream" });
    expect(upstream.arrived).toEqual(["/next"]);
  });
});

// -- A request handed on to port 0 -------------------------------------------------------------

type PortZeroWay = "tier2 onRequest" | "tier2 handle's next()" | "tier3 onRequest" | "tier3 handle's next()";

/** A source that hands on the request to /zero with its URL's port set to 0, and any other as it came. */
function portZeroer(way: PortZeroWay): { source: Source; label: string } {
  if (way.startsWith("tier2")) {
    const rewrite = `function zeroed(r) { const u = new URL(r.url); u.port = "0"; return new Request(u.href, r); }`;
    const body =
      way === "tier2 onRequest"
        ? `export function onRequest(r) { if (new URL(r.url).pathname === "/zero") return zeroed(r); }`
        : `export function handle(r, next) { return next(new URL(r.url).pathname === "/zero" ? zeroed(r) : r); }`;
    const policy = loadPolicy({ source: `${rewrite}\n${body}`, filename: "port-zero.mjs", workers: 1 });
    return { source: policy, label: policy.engine.filename };
  }
  const zeroed = (r: Request): Request => {
    const url = new URL(r.url);
    url.port = "0";
    return new Request(url, r);
  };
  const isZero = (r: Request): boolean => new URL(r.url).pathname === "/zero";
  const source =
    way === "tier3 onRequest"
      ? { onRequest: (r: Request) => (isZero(r) ? zeroed(r) : undefined) }
      : { handle: (r: Request, next: (r: Request) => Promise<Response>) => next(isZero(r) ? zeroed(r) : r) };
  return { source, label: "hooks[0]" };
}

// A guest's own request to port 0 gets 400 and a redirect to it 502, but a hook's rewrite to it
// was dialled: ECONNREFUSED, a 502 EG_UPSTREAM blamed on the upstream (review finding).
describe("a request a source handed on to port 0", () => {
  it.each((["tier2 onRequest", "tier2 handle's next()", "tier3 onRequest", "tier3 handle's next()"] as const).flatMap((way) => (["HTTP/1.1", "HTTP/2"] as const).map((protocol) => ({ way, protocol }))))(
    "$way, from an $protocol guest: 502 EG_HOOK_FAILED naming port 0, as any invalid rewrite, and the next request is served",
    async ({ way, protocol }) => {
      const upstream = await roomyUpstream();
      const { source, label } = portZeroer(way);
      const records: AuditRecord[] = [];
      const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"], hooks: [source] }, { onDecision: (record) => records.push(record) });
      const guest = await guestFor(protocol, proxy, upstream.port);

      const zero = await guest("/zero");
      expect(zero.status).toBe(502);
      expect(zero.text).toMatch(/a request to port 0 \(https:\/\/api\.test:0\), where no request may go/);
      await vi.waitFor(() => expect(decisionFor(proxy, "/zero")).toMatchObject({ status: 502, code: "EG_HOOK_FAILED", source: label }));
      await vi.waitFor(() => expect(records).toHaveLength(1));
      expect(records[0]!.sources).toContainEqual(expect.objectContaining({ source: label, decision: "error", failure: "invalid" }));

      const next = await guest("/next");
      expect(next).toMatchObject({ status: 200, text: "from upstream" });
      expect(upstream.arrived).toEqual(["/next"]);
    },
  );
});

// -- A request handed on to a host spelled otherwise ---------------------------------------------

/**
 * Hosts a rewrite may spell, in the order the guest asks for them (`/to/<index>`), and what each
 * must become: the spelling a guest's own target gets (src/hostname.ts), or a 502. The URL parser
 * lowercases, decodes and maps the first three by itself; it kept the trailing dot and let the
 * invalid ones through.
 */
const handedHosts: readonly { readonly host: string; readonly becomes: "api.test" | "refused" }[] = [
  { host: "API.TEST.", becomes: "api.test" },
  { host: "%61pi.test", becomes: "api.test" },
  { host: "\uff21\uff30\uff29.test", becomes: "api.test" },
  { host: "api.test.", becomes: "api.test" },
  { host: "api..test", becomes: "refused" },
  { host: "a$b.test", becomes: "refused" },
  { host: `${"a".repeat(64)}.test`, becomes: "refused" },
];

type HostWay = "tier2 onRequest" | "tier2 handle's next()" | "tier3 onRequest" | "tier3 handle's next()";

/** A source that hands on `/to/<index>` as a request to {@link handedHosts}[index] on the same port, path `/echo`, headers kept. */
function hostRewriter(way: HostWay): { source: Source; label: string } {
  const rewrite = `const hosts = ${JSON.stringify(handedHosts.map((row) => row.host))};
    function moved(r) {
      const u = new URL(r.url);
      const m = /^\\/to\\/(\\d+)$/.exec(u.pathname);
      return m === null ? r : new Request("https://" + hosts[Number(m[1])] + ":" + u.port + "/echo", r);
    }`;
  if (way.startsWith("tier2")) {
    const body = way === "tier2 onRequest" ? `export function onRequest(r) { const m = moved(r); if (m !== r) return m; }` : `export function handle(r, next) { return next(moved(r)); }`;
    const policy = loadPolicy({ source: `${rewrite}\n${body}`, filename: "host-rewrite.mjs", workers: 1 });
    return { source: policy, label: policy.engine.filename };
  }
  const moved = new Function(`${rewrite}\nreturn moved;`)() as (r: Request) => Request;
  const source =
    way === "tier3 onRequest"
      ? { onRequest: (r: Request) => (moved(r) === r ? undefined : moved(r)) }
      : { handle: (r: Request, next: (r: Request) => Promise<Response>) => next(moved(r)) };
  return { source, label: "hooks[0]" };
}

// A guest's own target and a redirect's Location have their host spelled by normalizeHost, but a
// rewrite's was taken as the URL parser left it: `https://api.test./` was matched by the allowlist
// and the secret's hosts (which ignore one trailing dot) while isRequestAllowed, isIpAllowed and
// the upstream's Host got `api.test.`; `api..test`, `a$b.test` and a 64-character label, which a
// guest gets 400 for, went on to the checks (and to the resolver, where one was allowed). Helper
// finding, eleventh session.
describe("a request a source handed on to a host spelled otherwise", () => {
  it.each(["tier2 onRequest", "tier2 handle's next()", "tier3 onRequest", "tier3 handle's next()"] as const)(
    "%s: the host is spelled as a guest's own (allowlist, secret, isRequestAllowed, isIpAllowed, Host), or the rewrite is a 502",
    async (way) => {
      const upstream = await startUpstream({ names: ["api.test"] });
      const { source, label } = hostRewriter(way);
      const checked: string[] = [];
      const watcher = {
        isRequestAllowed: (r: Request) => checked.push(`request ${new URL(r.url).host}`) > 0,
        isIpAllowed: (info: { hostname: string }) => checked.push(`ip ${info.hostname}`) > 0,
      };
      const proxy = await startTestProxy({
        allowedInternalHosts: ["api.test"],
        secrets: { API_KEY: { hosts: ["api.test"], value: "the-api-key-value" } },
        hooks: [source, watcher],
      });
      const placeholder = proxy.guestEnv()["API_KEY"]!;
      for (const [index, { host, becomes }] of handedHosts.entries()) {
        checked.length = 0;
        const hits = upstream.hits();
        const res = await fetchVia(proxy, `https://api.test:${upstream.port}/to/${index}`, { headers: { authorization: `Bearer ${placeholder}` } });
        const line = decisionFor(proxy, `/to/${index}`);
        if (becomes === "refused") {
          expect([host, res.status], res.text).toEqual([host, 502]);
          expect(res.text).toMatch(/(handed on|passed next\(\)) a request to an invalid host/);
          expect(line, host).toMatchObject({ status: 502, code: "EG_HOOK_FAILED", source: label });
          expect(checked, host).toEqual([]);
          expect(upstream.hits(), host).toBe(hits);
          continue;
        }
        expect([host, res.status], res.text).toEqual([host, 200]);
        const echo = JSON.parse(res.text) as { path: string; headers: Record<string, string> };
        expect([host, echo.path, echo.headers["host"], echo.headers["authorization"]]).toEqual([host, "/echo", `api.test:${upstream.port}`, "Bearer the-api-key-value"]);
        expect([host, ...checked]).toEqual([host, `request api.test:${upstream.port}`, "ip api.test"]);
        expect([host, line?.["reason"]]).toEqual([host, 'host "api.test" matches "api.test"']);
      }
    },
  );
});
