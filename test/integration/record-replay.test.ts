import { execFileSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { closeSync, constants, existsSync, lstatSync, mkdirSync, openSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { brotliCompressSync, brotliDecompressSync, gunzipSync, gzipSync } from "node:zlib";
import { ProxyAgent, request, request as undiciRequest } from "undici";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { connect as h2Connect } from "node:http2";
import { connect as tlsConnect } from "node:tls";
import { createHttpHooks, startProxy, type AuditRecord, type HttpHooks, type RunningProxy } from "../../src/index.js";
import type { ReplayOptions } from "../../src/record/network.js";
import type { RecordedHar } from "../../src/record/har.js";
import { checkHarFile, formatHarReport } from "../../src/record/har-check.js";
import { h2Request, h2Session } from "../helpers/h2-client.js";
import { startH2Upstream } from "../helpers/h2-upstream.js";
import { basic, credentialsOf, startGuestsProxy, type GuestSpec, type GuestsProxy } from "../helpers/guests.js";
import { openRaw, openTlsTunnel } from "../helpers/raw.js";
import { fetchVia, proxyAgent, startTestProxy, tempDir, type TestProxy } from "../helpers/proxy.js";
import { startUpstream, type Route } from "../helpers/upstream.js";
import { craftedText } from "../helpers/crafted-text.js";
import { testCa } from "../helpers/test-ca.js";

const VALUE = "ghp_realRecordedValue0123456789abcdef";

function readHar(path: string): RecordedHar {
  return JSON.parse(readFileSync(path, "utf8")) as RecordedHar;
}

/** Every byte of the HAR and its sidecar files, as one latin1 string, for grep-like checks. */
function everything(path: string): string {
  let out = readFileSync(path, "latin1");
  try {
    for (const file of readdirSync(`${path}.d`)) out += readFileSync(join(`${path}.d`, file), "latin1");
  } catch {
    // no sidecar folder
  }
  return out;
}

async function recordAndClose(proxy: TestProxy): Promise<void> {
  await proxy.close();
}

describe("recorded network", () => {
  it("records through a real upstream, then replays identical statuses, headers and bodies with zero upstream connections", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const upstream = await startUpstream({
      routes: {
        "/json": (_req, res) => {
          res.writeHead(201, { "content-type": "application/json", "x-custom": "yes" });
          res.end(JSON.stringify({ ok: true }));
        },
      },
    });
    const base = `https://api.test:${upstream.port}`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    const first = await fetchVia(recorder, `${base}/json?b=2&a=1`);
    const echoed = await fetchVia(recorder, `${base}/echo`, { method: "POST", body: "hello", headers: { "content-type": "text/plain" } });
    await recordAndClose(recorder);
    const hits = upstream.hits();
    expect(hits).toBe(2);
    const file = readHar(har);
    expect(file.log.version).toBe("1.2");
    expect(file.log.entries).toHaveLength(2);
    expect(file.log.entries[0]!._egressgate).toMatchObject({ seq: 1, hop: 0, guest: "default" });
    expect(file.log.entries[0]!.serverIPAddress).toBe("127.0.0.1");

    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
    const again = await fetchVia(replayer, `${base}/json?a=1&b=2`);
    expect(again.status).toBe(first.status);
    expect(again.text).toBe(first.text);
    expect(again.headers["x-custom"]).toBe("yes");
    expect(again.headers["content-type"]).toBe(first.headers["content-type"]);
    const echoAgain = await fetchVia(replayer, `${base}/echo`, { method: "POST", body: "hello", headers: { "content-type": "text/plain" } });
    expect(echoAgain.text).toBe(echoed.text);
    expect(upstream.hits()).toBe(hits);
  });

  // An entry said HTTP/1.1 whatever the upstream spoke; it is the upstream exchange that is recorded.
  it("an entry's httpVersion is the protocol the upstream spoke: HTTP/2 from an h2-only upstream, HTTP/1.1 from an HTTP/1.1 one; both replay", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const h1 = await startUpstream();
    const h2 = await startH2Upstream();
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    const viaH2 = await fetchVia(recorder, `https://api.test:${h2.port}/echo`);
    const viaH1 = await fetchVia(recorder, `https://api.test:${h1.port}/echo`);
    expect([viaH2.status, viaH1.status]).toEqual([200, 200]);
    await recordAndClose(recorder);
    const entries = readHar(har).log.entries;
    expect(entries.map((e) => [new URL(e.request.url).port, e.request.httpVersion, e.response.httpVersion])).toEqual([
      [String(h2.port), "HTTP/2", "HTTP/2"],
      [String(h1.port), "HTTP/1.1", "HTTP/1.1"],
    ]);
    expect(formatHarReport(await checkHarFile(har)).status).toBe(0);
    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
    expect((await fetchVia(replayer, `https://api.test:${h2.port}/echo`)).text).toBe(viaH2.text);
    expect((await fetchVia(replayer, `https://api.test:${h1.port}/echo`)).text).toBe(viaH1.text);
  });

  it("a miss gets 502 EG_REPLAY_MISS naming the nearest entry and the field, and opens no socket", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const upstream = await startUpstream();
    const base = `https://api.test:${upstream.port}`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    await fetchVia(recorder, `${base}/echo?token=RECORDED-QUERY-TOKEN`);
    await recorder.close();
    const records: AuditRecord[] = [];
    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } }, onDecision: (record) => void records.push(record) });
    const missed = await fetchVia(replayer, `${base}/echo?x=2`);
    expect(missed.status).toBe(502);
    expect(missed.text).toMatch(/no recorded response matches GET https:\/\/api\.test:\d+\/echo \(see the proxy log\)/);
    const line = replayer.logs.find((l) => l["code"] === "EG_REPLAY_MISS" && l["msg"] === "replay miss");
    expect(String(line?.["reason"])).toMatch(/nearest is entry 0 \(GET https:\/\/api\.test:\d+\/echo\?…\), which differs in query/);
    expect(line?.["recording"]).toBe(har);
    // A recorded query can carry credentials (another guest's, in a shared recording): never quoted.
    // Nor is the recording's path or its entries shown to the guest.
    expect(missed.text).not.toContain("RECORDED-QUERY-TOKEN");
    expect(missed.text).not.toContain(har);
    expect(missed.text).not.toContain("nearest");
    expect(JSON.stringify(replayer.logs)).not.toContain("RECORDED-QUERY-TOKEN");
    await vi.waitFor(() => expect(records).toHaveLength(1));
    expect(JSON.stringify(records)).not.toContain("RECORDED-QUERY-TOKEN");
    expect(records[0]!.detail).toMatch(/nearest is entry 0/);
    expect(upstream.hits()).toBe(1);
  });

  it("A, B, C recorded for one request replay as A, B, C, C (and 502 with --replay-exhausted error)", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    let n = 0;
    const upstream = await startUpstream({
      routes: {
        "/next": (_req, res) => {
          res.writeHead(200, { "content-type": "text/plain" });
          res.end("ABC"[n++]);
        },
      },
    });
    const base = `https://api.test:${upstream.port}`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    for (let i = 0; i < 3; i++) await fetchVia(recorder, `${base}/next`);
    await recorder.close();
    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
    const seen: string[] = [];
    for (let i = 0; i < 4; i++) seen.push((await fetchVia(replayer, `${base}/next`)).text);
    expect(seen).toEqual(["A", "B", "C", "C"]);
    const strict = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har, exhausted: "error" } } });
    for (let i = 0; i < 3; i++) await fetchVia(strict, `${base}/next`);
    const fourth = await fetchVia(strict, `${base}/next`);
    expect(fourth.status).toBe(502);
  });

  it("a recording with a real secret replays in a new run with new placeholders and a dummy value, and no real value is anywhere on disk", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const upstream = await startUpstream();
    const base = `https://api.test:${upstream.port}`;
    const secrets = (value: string) => ({ GH_TOKEN: { hosts: ["api.test"], value } });
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"], secrets: secrets(VALUE) }, { upstream: { record: { path: har } } });
    const placeholder = recorder.guestEnv()["GH_TOKEN"]!;
    const basic = `Basic ${Buffer.from(`user:${placeholder}`).toString("base64")}`;
    const recorded = await fetchVia(recorder, `${base}/echo`, { headers: { authorization: `Bearer ${placeholder}`, "x-basic": "1" } });
    // The echo carries the value back: it comes out redacted in the recording.
    expect(recorded.text).toContain(VALUE);
    await fetchVia(recorder, `${base}/echo?basic=1`, { headers: { authorization: basic } });
    await recorder.close();
    const disk = everything(har);
    expect(disk).not.toContain(VALUE);
    expect(disk).not.toContain(Buffer.from(VALUE).toString("base64").slice(0, 20));
    expect(disk).not.toContain(placeholder);
    expect(disk).toContain("EGRESSGATE_SECRET{GH_TOKEN}");
    expect(disk).toContain("[REDACTED:GH_TOKEN]");
    const file = readHar(har);
    expect(file.log.entries).toHaveLength(2);

    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"], secrets: secrets("dummy-value-xyz") }, { upstream: { replay: { path: har, matchHeaders: ["authorization"] } } });
    const newPlaceholder = replayer.guestEnv()["GH_TOKEN"]!;
    expect(newPlaceholder).not.toBe(placeholder);
    const replayed = await fetchVia(replayer, `${base}/echo`, { headers: { authorization: `Bearer ${newPlaceholder}` } });
    expect(replayed.status).toBe(200);
    expect(replayed.text).toContain("[REDACTED:GH_TOKEN]");
    const replayedBasic = await fetchVia(replayer, `${base}/echo?basic=1`, { headers: { authorization: `Basic ${Buffer.from(`user:${newPlaceholder}`).toString("base64")}` } });
    expect(replayedBasic.status).toBe(200);
    expect(upstream.hits()).toBe(2);
  });

  // A body goes out as it is, placeholders and all, and an upstream may send one back. The
  // response kept this run's placeholder raw, so `har check` flagged the proxy's own file and a
  // replaying run (with placeholders of its own) read back a stranger's.
  it("a placeholder an upstream echoes in a body and a header is recorded as its token, passes `har check`, and replays as the replaying run's placeholder", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const upstream = await startUpstream({
      routes: {
        "/reflect": (_req, res, body) => {
          res.writeHead(200, { "content-type": "text/plain", "x-reflect": body.toString("utf8") });
          res.end(`you sent: ${body.toString("utf8")}`);
        },
      },
    });
    const base = `https://api.test:${upstream.port}`;
    const secrets = (value: string) => ({ GH_TOKEN: { hosts: ["api.test"], value } });
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"], secrets: secrets(VALUE) }, { upstream: { record: { path: har } } });
    const placeholder = recorder.guestEnv()["GH_TOKEN"]!;
    const live = await fetchVia(recorder, `${base}/reflect`, { method: "POST", body: placeholder, headers: { "content-type": "text/plain" } });
    expect(live.text).toBe(`you sent: ${placeholder}`);
    expect(live.headers["x-reflect"]).toBe(placeholder);
    await recorder.close();
    const disk = everything(har);
    expect(disk).not.toContain(placeholder);
    const [entry] = readHar(har).log.entries;
    expect(entry!.response.content.text).toBe("you sent: EGRESSGATE_SECRET{GH_TOKEN}");
    expect(entry!.response.headers.find((h) => h.name === "x-reflect")?.value).toBe("EGRESSGATE_SECRET{GH_TOKEN}");
    expect(formatHarReport(await checkHarFile(har)).status).toBe(0);

    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"], secrets: secrets("dummy-value-xyz") }, { upstream: { replay: { path: har } } });
    const newPlaceholder = replayer.guestEnv()["GH_TOKEN"]!;
    expect(newPlaceholder).not.toBe(placeholder);
    const replayed = await fetchVia(replayer, `${base}/reflect`, { method: "POST", body: newPlaceholder, headers: { "content-type": "text/plain" } });
    expect(replayed.status).toBe(200);
    expect(replayed.text).toBe(`you sent: ${newPlaceholder}`);
    expect(replayed.headers["x-reflect"]).toBe(newPlaceholder);
    expect(upstream.hits()).toBe(1);
  });

  // Set-Cookie was masked, as a session cookie is a credential of its own, while the next
  // request's Cookie header carried the same session into the file in clear (black-box finding).
  it("Cookie values are masked as Set-Cookie values are (kept with cookies: true), and a replay matches them by name", async () => {
    const dir = tempDir();
    const upstream = await startUpstream({
      routes: {
        "/login": (_req, res) => {
          res.writeHead(200, [["set-cookie", "sid=SECRETSESSION123; Path=/; HttpOnly"], ["set-cookie", "theme=dark"], ["content-type", "text/plain"]].flat());
          res.end("in");
        },
        "/me": (_req, res) => {
          res.writeHead(200, { "content-type": "text/plain" });
          res.end("me");
        },
      },
    });
    const base = `https://api.test:${upstream.port}`;
    const session = { cookie: "sid=SECRETSESSION123; theme=dark" };
    const record = async (path: string, cookies: boolean): Promise<RecordedHar> => {
      const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path, cookies } } });
      expect((await fetchVia(recorder, `${base}/login`)).status).toBe(200);
      expect((await fetchVia(recorder, `${base}/me`, { headers: session })).status).toBe(200);
      await recorder.close();
      return readHar(path);
    };
    const cookiesOf = (file: RecordedHar): (string | undefined)[][] =>
      file.log.entries.map((e) => [e.request.headers.find((h) => h.name === "cookie")?.value, ...e.response.headers.filter((h) => h.name === "set-cookie").map((h) => h.value)]);
    const masked = join(dir, "masked.har");
    expect(cookiesOf(await record(masked, false))).toEqual([
      [undefined, "sid=[MASKED]; Path=/; HttpOnly", "theme=[MASKED]"],
      ["sid=[MASKED]; theme=[MASKED]"],
    ]);
    expect(everything(masked)).not.toContain("SECRETSESSION123");
    expect(cookiesOf(await record(join(dir, "kept.har"), true))).toEqual([
      [undefined, "sid=SECRETSESSION123; Path=/; HttpOnly", "theme=dark"],
      ["sid=SECRETSESSION123; theme=dark"],
    ]);
    // Headers are not part of the key by default; named, a Cookie header matches by its cookies' names.
    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: masked } } });
    expect((await fetchVia(replayer, `${base}/me`, { headers: { cookie: "sid=ANOTHERSESSION" } })).text).toBe("me");
    const byCookie = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: masked, matchHeaders: ["Cookie"] } } });
    expect((await fetchVia(byCookie, `${base}/me`, { headers: { cookie: "sid=ANOTHERSESSION; theme=light" } })).text).toBe("me");
    expect((await fetchVia(byCookie, `${base}/me`, { headers: { cookie: "other=1" } })).status).toBe(502);
  });

  it("a value a hook puts into a request body drops the entry with EG_RECORD_LEAK", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const upstream = await startUpstream();
    const base = `https://api.test:${upstream.port}`;
    const recorder = await startTestProxy(
      {
        allowedInternalHosts: ["api.test"],
        secrets: { GH_TOKEN: { hosts: ["api.test"], value: VALUE } },
        onRequest: (request) => (new URL(request.url).pathname === "/echo" ? new Request(request.url, { method: "POST", body: `token=${VALUE}`, headers: request.headers }) : undefined),
      },
      { upstream: { record: { path: har } } },
    );
    const res = await fetchVia(recorder, `${base}/echo`, { method: "POST", body: "x" });
    expect(res.status).toBe(200);
    await fetchVia(recorder, `${base}/bytes?n=10`);
    await recorder.close();
    expect(recorder.logs.some((l) => l["code"] === "EG_RECORD_LEAK" && l["secret"] === "GH_TOKEN")).toBe(true);
    const file = readHar(har);
    expect(file.log.entries.map((e) => new URL(e.request.url).pathname)).toEqual(["/bytes"]);
    expect(everything(har)).not.toContain(VALUE);
  });

  // A text body up to 64 KiB gets the full decoding scan. A body it could not finish within its
  // budget was recorded as "[REDACTED:UNSCANNED]" and replayed so, where a body over 64 KiB,
  // searched for the common spellings only, was recorded whole. With a short value, a JSON
  // document with a large base64 field was such a body (the scan now finishes it).
  it("a text body under 64 KiB that the full scan cannot finish is searched as a larger one and recorded whole; one that holds a value is not written as it came", async () => {
    const har = join(tempDir(), "run.har");
    const value = "p4ssw0rd-1234";
    let field = "";
    for (let i = 0; field.length < 58_000; i++) field += createHash("sha512").update(String(i)).digest("base64");
    const bodies: Record<string, string> = {
      "/blob": JSON.stringify({ data: field }),
      "/crafted": JSON.stringify({ data: craftedText(50_000) }),
      "/crafted-with-value": JSON.stringify({ data: `${craftedText(25_000)}${Buffer.from(value).toString("base64")}${craftedText(25_000)}` }),
    };
    const routes = Object.fromEntries(
      Object.entries(bodies).map(([path, text]): [string, Route] => [
        path,
        (_req, res) => {
          res.writeHead(200, { "content-type": "application/json" });
          res.end(text);
        },
      ]),
    );
    const upstream = await startUpstream({ routes });
    const base = `https://api.test:${upstream.port}`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"], secrets: { PW: { hosts: ["api.test"], value } } }, { upstream: { record: { path: har } } });
    for (const [path, text] of Object.entries(bodies)) {
      expect(text.length, path).toBeLessThan(64 * 1024);
      expect((await fetchVia(recorder, `${base}${path}`)).text, path).toBe(text);
    }
    await recorder.close();
    const recorded = new Map(readHar(har).log.entries.map((e) => [new URL(e.request.url).pathname, e.response.content.text]));
    expect(recorded.get("/blob")).toBe(bodies["/blob"]);
    expect(recorded.get("/crafted")).toBe(bodies["/crafted"]);
    // The copy of the value is found (base64 at its alignment), and that body is not written whole.
    expect(recorded.get("/crafted-with-value")).not.toBe(bodies["/crafted-with-value"]);
    expect(everything(har)).not.toContain(Buffer.from(value).toString("base64").slice(0, 16));
  });

  it("in replay, a redirect hop that leaves the allowlist gets 403 and a hook's deny holds", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const upstream = await startUpstream({ names: ["api.test", "other.test"] });
    const base = `https://api.test:${upstream.port}`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test", "other.test"] }, { upstream: { record: { path: har } } });
    const followed = await fetchVia(recorder, `${base}/redirect?to=${encodeURIComponent(`https://other.test:${upstream.port}/echo`)}`);
    expect(followed.status).toBe(200);
    await fetchVia(recorder, `${base}/echo?deny=1`);
    await recorder.close();
    expect(readHar(har).log.entries.map((e) => e._egressgate?.hop)).toEqual([0, 1, 0]);
    const replayer = await startTestProxy(
      { allowedInternalHosts: ["api.test"], isRequestAllowed: (request) => !new URL(request.url).search.includes("deny") },
      { upstream: { replay: { path: har } } },
    );
    const refused = await fetchVia(replayer, `${base}/redirect?to=${encodeURIComponent(`https://other.test:${upstream.port}/echo`)}`);
    expect(refused.status).toBe(403);
    expect((await fetchVia(replayer, `${base}/echo?deny=1`)).status).toBe(403);
    expect(upstream.hits()).toBe(3);
  });

  it("gzip is stored decoded, a PNG as base64, and a binary request body matches", async () => {
    const { gzipSync } = await import("node:zlib");
    const dir = tempDir();
    const har = join(dir, "run.har");
    const png = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), Buffer.from([0, 0, 0, 13, 0xff, 0xfe])]);
    const routes: Record<string, Route> = {
      "/gz": (_req, res) => {
        const body = gzipSync(JSON.stringify({ zipped: true }));
        res.writeHead(200, { "content-type": "application/json", "content-encoding": "gzip", "content-length": body.length });
        res.end(body);
      },
      "/png": (_req, res) => {
        res.writeHead(200, { "content-type": "image/png" });
        res.end(png);
      },
    };
    const upstream = await startUpstream({ routes });
    const base = `https://api.test:${upstream.port}`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    await fetchVia(recorder, `${base}/gz`);
    await fetchVia(recorder, `${base}/png`);
    const upload = Buffer.from([0, 1, 2, 255, 254, 0]);
    const echoed = await fetchVia(recorder, `${base}/echo`, { method: "PUT", body: upload, headers: { "content-type": "application/octet-stream" } });
    await recorder.close();
    const [gz, pngEntry, put] = readHar(har).log.entries;
    expect(gz!.response.content.text).toBe(JSON.stringify({ zipped: true }));
    expect(pngEntry!.response.content.encoding).toBe("base64");
    expect(Buffer.from(pngEntry!.response.content.text!, "base64").equals(png)).toBe(true);
    expect(put!.request.postData?._encoding).toBe("base64");
    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
    const gzAgain = await fetchVia(replayer, `${base}/gz`);
    expect(gzAgain.headers["content-encoding"]).toBe("gzip");
    const putAgain = await fetchVia(replayer, `${base}/echo`, { method: "PUT", body: upload, headers: { "content-type": "application/octet-stream" } });
    expect(putAgain.text).toBe(echoed.text);
    const other = await fetchVia(replayer, `${base}/echo`, { method: "PUT", body: Buffer.from([9, 9]), headers: { "content-type": "application/octet-stream" } });
    expect(other.status).toBe(502);
  });

  // The recorder tokenized a request body's placeholders only when it stored the body as text
  // (by its Content-Type), the replay in any valid UTF-8 body: an application/octet-stream body
  // carrying a placeholder was recorded raw and could never be replayed, even with the same
  // placeholders (black-box finding). One rule on both sides now, whatever the type or bytes.
  describe("a request body that carries a placeholder replays in a run with other placeholders, whatever its type", () => {
    const grpcFrame = (payload: string): Buffer => {
      const bytes = Buffer.from(payload, "latin1");
      const head = Buffer.alloc(5);
      head.writeUInt32BE(bytes.length, 1);
      return Buffer.concat([head, bytes]);
    };
    const cases: [string, string, (placeholder: string) => Buffer, boolean][] = [
      ["application/octet-stream", "application/octet-stream", (p) => Buffer.from(`upload=${p}`), true],
      ["application/x-protobuf, bytes that are not UTF-8", "application/x-protobuf", (p) => Buffer.concat([Buffer.from([0x0a, 0xff, 0xfe]), Buffer.from(p), Buffer.from([0x80, 0x00])]), true],
      ["application/protobuf", "application/protobuf", (p) => Buffer.from(`\x0a\x42${p}`), true],
      ["application/grpc", "application/grpc", (p) => grpcFrame(`\x0a\x42${p}`), true],
      ["application/json", "application/json", (p) => Buffer.from(JSON.stringify({ token: p, n: 1 })), false],
      ["text/plain", "text/plain", (p) => Buffer.from(`upload=${p}`), false],
    ];
    it.each(cases)("%s", async (_name, type, body, binary) => {
      const dir = tempDir();
      const har = join(dir, "run.har");
      const upstream = await startUpstream({
        routes: {
          "/upload": (req, res, bytes) => {
            res.writeHead(200, { "content-type": "text/plain" });
            res.end(`${String(req.headers["content-type"])}: ${bytes.length} bytes`);
          },
        },
      });
      const url = `https://api.test:${upstream.port}/upload`;
      const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"], secrets: { GH_TOKEN: { hosts: ["api.test"], value: VALUE } } }, { upstream: { record: { path: har } } });
      const sent = body(recorder.guestEnv()["GH_TOKEN"]!);
      const live = await fetchVia(recorder, url, { method: "POST", body: sent, headers: { "content-type": type } });
      expect(live.status).toBe(200);
      await recorder.close();
      const post = readHar(har).log.entries[0]!.request.postData!;
      expect(post._encoding === "base64").toBe(binary);
      const stored = Buffer.from(post.text!, binary ? "base64" : "utf8").toString("latin1");
      expect(stored).toContain("EGRESSGATE_SECRET{GH_TOKEN}");
      expect(stored).not.toContain(recorder.guestEnv()["GH_TOKEN"]!);
      const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"], secrets: { GH_TOKEN: { hosts: ["api.test"], value: "dummy-value-for-ci" } } }, { upstream: { replay: { path: har } } });
      const placeholder = replayer.guestEnv()["GH_TOKEN"]!;
      expect(placeholder).not.toBe(recorder.guestEnv()["GH_TOKEN"]);
      const again = await fetchVia(replayer, url, { method: "POST", body: body(placeholder), headers: { "content-type": type } });
      expect([again.status, again.text]).toEqual([200, live.text]);
    });
  });

  it("a body nonce misses unless its path is ignored", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const upstream = await startUpstream();
    const base = `https://api.test:${upstream.port}`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    const body = (nonce: string): string => JSON.stringify({ q: "x", nonce, ts: 1 });
    await fetchVia(recorder, `${base}/echo`, { method: "POST", body: body("n1"), headers: { "content-type": "application/json" } });
    await recorder.close();
    const strict = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
    expect((await fetchVia(strict, `${base}/echo`, { method: "POST", body: body("n2"), headers: { "content-type": "application/json" } })).status).toBe(502);
    const lenient = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har, ignoreBodyPaths: ["/nonce"] } } });
    // Key order does not matter either: the body is canonicalised.
    const reordered = JSON.stringify({ ts: 1, nonce: "n3", q: "x" });
    expect((await fetchVia(lenient, `${base}/echo`, { method: "POST", body: reordered, headers: { "content-type": "application/json" } })).status).toBe(200);
  });

  it("an 8 MiB download goes to a sidecar file and replays whole from it", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const upstream = await startUpstream();
    const base = `https://api.test:${upstream.port}`;
    const size = 8 * 1024 * 1024;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    const recorded = await fetchVia(recorder, `${base}/bytes?n=${size}`);
    await recorder.close();
    const entry = readHar(har).log.entries[0]!;
    expect(entry.response.content._file).toMatch(/^[0-9a-f]{64}$/);
    expect(readFileSync(har, "utf8").length).toBeLessThan(64 * 1024);
    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
    const replayed = await fetchVia(replayer, `${base}/bytes?n=${size}`);
    expect(replayed.text.length).toBe(recorded.text.length);
    expect(replayed.text === recorded.text).toBe(true);
    // The partial file is kept encrypted while it streams and decrypted once found clean.
    expect(createHash("sha256").update(readFileSync(join(`${har}.d`, entry.response.content._file!))).digest("hex")).toBe(entry.response.content._file);
    expect(readdirSync(`${har}.d`)).toEqual([entry.response.content._file]);
  });

  it("a sidecar body that holds a value, and a compressed one that cannot be searched, are dropped and never written to disk in clear", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const noise = gzipSync(randomBytes(2 * 1024 * 1024), { level: 0 });
    const upstream = await startUpstream({
      routes: {
        "/echo-big": (req, res) => {
          res.writeHead(200, { "content-type": "text/plain" });
          const line = `token seen: ${String(req.headers["authorization"])}\n`;
          res.end(line.repeat(Math.ceil((2 * 1024 * 1024) / line.length)));
        },
        "/gz-big": (_req, res) => {
          res.writeHead(200, { "content-type": "application/octet-stream", "content-encoding": "gzip", "content-length": noise.length });
          res.end(noise);
        },
      },
    });
    const recorder = await startTestProxy(
      { allowedInternalHosts: ["api.test"], secrets: { GH_TOKEN: { hosts: ["api.test"], value: VALUE } } },
      { upstream: { record: { path: har } } },
    );
    const placeholder = recorder.guestEnv()["GH_TOKEN"]!;
    expect((await fetchVia(recorder, `https://api.test:${upstream.port}/echo-big`, { headers: { authorization: `Bearer ${placeholder}` } })).status).toBe(200);
    expect((await fetchVia(recorder, `https://api.test:${upstream.port}/gz-big`)).status).toBe(200);
    await recorder.close();
    expect(readHar(har).log.entries).toEqual([]);
    expect(recorder.logs.filter((l) => l["code"] === "EG_RECORD_LEAK").map((l) => l["where"])).toEqual(["the response body", "the response body"]);
    expect(readdirSync(`${har}.d`)).toEqual([]);
    expect(everything(har)).not.toContain(VALUE);
  });

  // A withheld body is never written, but its sidecar name is its bytes' SHA-256: the same file an
  // earlier, clean entry wrote. Removing a leaked entry's files took that one too, and the earlier
  // entry pointed at nothing (har check failed, --replay refused the file).
  it("the same gzip file downloaded as is, then sent with Content-Encoding: gzip (not searchable, so not written), leaves the first entry's sidecar file in place", async () => {
    const har = join(tempDir(), "run.har");
    // Over 1 MiB whatever it compresses to (random bytes do not shrink): a sidecar file either way.
    const archive = gzipSync(randomBytes(2 * 1024 * 1024));
    const name = createHash("sha256").update(archive).digest("hex");
    // One precompressed file, served as a download and as an encoded response (nginx's gzip_static).
    const upstream = await startUpstream({
      routes: {
        "/data.json.gz": (_req, res) => {
          res.writeHead(200, { "content-type": "application/gzip", "content-length": archive.length });
          res.end(archive);
        },
        "/data.json": (_req, res) => {
          res.writeHead(200, { "content-type": "application/json", "content-encoding": "gzip", "content-length": archive.length });
          res.end(archive);
        },
      },
    });
    const base = `https://api.test:${upstream.port}`;
    const bytesVia = async (proxy: TestProxy, path: string): Promise<{ status: number; body: Buffer }> => {
      const res = await undiciRequest(`${base}${path}`, { dispatcher: proxyAgent(proxy), headers: { "accept-encoding": "gzip" } });
      return { status: res.statusCode, body: Buffer.from(await res.body.arrayBuffer()) };
    };
    const recorder = await startTestProxy(
      { allowedInternalHosts: ["api.test"], secrets: { GH_TOKEN: { hosts: ["api.test"], value: VALUE } } },
      { upstream: { record: { path: har } } },
    );
    const download = await bytesVia(recorder, "/data.json.gz");
    expect(download.status).toBe(200);
    expect(download.body.equals(archive)).toBe(true);
    // The guest gets it whole; the recording cannot search it while it is compressed, so it is not written.
    const encoded = await bytesVia(recorder, "/data.json");
    expect(encoded.status).toBe(200);
    expect(encoded.body.equals(archive)).toBe(true);
    await recorder.close();
    expect(recorder.logs.filter((l) => l["code"] === "EG_RECORD_LEAK").map((l) => l["where"])).toEqual(["the response body"]);
    const entries = readHar(har).log.entries;
    expect(entries.map((e) => [new URL(e.request.url).pathname, e.response.content._file])).toEqual([["/data.json.gz", name]]);
    // The leaked entry's removal is not awaited by close(): give it time to have happened.
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(readdirSync(`${har}.d`)).toEqual([name]);
    expect(readFileSync(join(`${har}.d`, name)).equals(archive)).toBe(true);
    expect(formatHarReport(await checkHarFile(har)).status).toBe(0);
    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
    const replayed = await bytesVia(replayer, "/data.json.gz");
    expect(replayed.status).toBe(200);
    expect(replayed.body.equals(archive)).toBe(true);
    expect(upstream.hits()).toBe(2);
  });

  it("concurrent requests record in the order they started, not the order they finished", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let arrived!: () => void;
    const slowArrived = new Promise<void>((resolve) => (arrived = resolve));
    const upstream = await startUpstream({
      routes: {
        "/slow": (_req, res) => {
          arrived();
          void held.then(() => res.end("slow"));
        },
        "/fast": (_req, res) => res.end("fast"),
      },
    });
    const base = `https://api.test:${upstream.port}`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    const slow = fetchVia(recorder, `${base}/slow`);
    await slowArrived;
    await fetchVia(recorder, `${base}/fast`);
    release();
    await slow;
    await recorder.close();
    expect(readHar(har).log.entries.map((e) => new URL(e.request.url).pathname)).toEqual(["/slow", "/fast"]);
  });

  it("--record-missing sends a miss to the network and adds it to the same file", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const upstream = await startUpstream();
    const base = `https://api.test:${upstream.port}`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    await fetchVia(recorder, `${base}/echo?a=1`);
    await recorder.close();
    const both = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har, recordMissing: true } } });
    await fetchVia(both, `${base}/echo?a=1`);
    await fetchVia(both, `${base}/echo?a=2`);
    await both.close();
    expect(upstream.hits()).toBe(2);
    expect(readHar(har).log.entries.map((e) => new URL(e.request.url).search)).toEqual(["?a=1", "?a=2"]);
  });

  // An entry that cannot be replayed as it stands (framing, a status or a header no response can
  // have) once went out broken: a 200 with no body that held the guest, a 101 to a plain GET.
  const request = (): Record<string, unknown> => ({ method: "GET", url: "https://api.test/x", httpVersion: "HTTP/1.1", cookies: [], headers: [], queryString: [], headersSize: -1, bodySize: 0 });
  const entry = (response: Record<string, unknown>, extra: Record<string, unknown> = {}): Record<string, unknown> => ({
    startedDateTime: "2026-12-01T00:00:00.000Z",
    time: 1,
    request: request(),
    response: { status: 200, statusText: "OK", httpVersion: "HTTP/1.1", cookies: [], headers: [], redirectURL: "", headersSize: -1, bodySize: 2, content: { size: 2, mimeType: "text/plain", text: "ok" }, ...response },
    cache: {},
    timings: { send: 0, wait: 1, receive: 0 },
    ...extra,
  });
  it.each([
    ["chunks that are not a list of [size, ms]", entry({}, { _egressgate: { chunks: "abc" } }), /_egressgate\.chunks: must be a list of \[bytes, ms\]/],
    ["a status no final response has", entry({ status: 1000 }), /response\.status: must be 0 \(no response\) or 100-599/],
    ["a status that is not a whole number", entry({ status: 200.5 }), /response\.status: must be 0 \(no response\) or 100-599/],
    ["a header value with a line break", entry({ headers: [{ name: "x-a", value: "1\r\nx-b: 2" }] }), /response\.headers\[0\]: .*control character/],
    ["a header value with another control character", entry({ headers: [{ name: "x-a", value: "1\u0001" }] }), /response\.headers\[0\]: .*control character/],
    ["a header value past Latin-1", entry({ headers: [{ name: "x-a", value: "1 €" }] }), /response\.headers\[0\]: .*cannot carry/],
    ["a header name that is not a token", entry({ headers: [{ name: "x a", value: "1" }] }), /response\.headers\[0\]: .*not a token/],
    ["a body text that is not a string", entry({ content: { size: 2, mimeType: "text/plain", text: 42 } }), /response\.content\.text: must be a string/],
    // Shapes that reached the replay as raw JavaScript errors, a 502 "internal error", or an
    // entry silently left out, while har check said otherwise (black-box finding).
    ["response headers that are an object", entry({ headers: { "content-type": "text/plain" } }), /log\.entries\[0\]\.response\.headers: must be an array/],
    ["a response header whose value is a number", entry({ headers: [{ name: "x-a", value: 1 }] }), /log\.entries\[0\]\.response\.headers\[0\]: must be \{ name, value \} with string values/],
    ["a response header that is a string", entry({ headers: ["x-a: 1"] }), /log\.entries\[0\]\.response\.headers\[0\]: must be \{ name, value \} with string values/],
    ["a serverIPAddress that is a number", entry({}, { serverIPAddress: 12345 }), /log\.entries\[0\]\.serverIPAddress: must be a string/],
    ["an entry that is null", null, /log\.entries\[0\]: must be an object/],
    ["an entry that is a string", "x", /log\.entries\[0\]: must be an object/],
    ["no request", entry({}, { request: undefined }), /log\.entries\[0\]\.request: missing/],
    ["a response that is a string", entry({}, { response: "200 OK" }), /log\.entries\[0\]\.response: must be an object/],
    ["a status that is a string", entry({ status: "200" }), /log\.entries\[0\]\.response\.status: must be a number/],
    ["no status", entry({ status: undefined }), /log\.entries\[0\]\.response\.status: missing/],
    ["a method that is a number", entry({}, { request: { ...request(), method: 7 } }), /log\.entries\[0\]\.request\.method: must be a string/],
    ["a method that is not a token", entry({}, { request: { ...request(), method: "GE T" } }), /log\.entries\[0\]\.request\.method: "GE T" is not a token/],
    ["a URL that is a number", entry({}, { request: { ...request(), url: 7 } }), /log\.entries\[0\]\.request\.url: must be a string/],
    ["a URL that is not absolute", entry({}, { request: { ...request(), url: "/x" } }), /log\.entries\[0\]\.request\.url: not an absolute URL/],
    ["request headers that are an object", entry({}, { request: { ...request(), headers: { accept: "*/*" } } }), /log\.entries\[0\]\.request\.headers: must be an array/],
    ["a request header whose name is missing", entry({}, { request: { ...request(), headers: [{ value: "1" }] } }), /log\.entries\[0\]\.request\.headers\[0\]: must be \{ name, value \} with string values/],
    ["a request body text that is a number", entry({}, { request: { ...request(), method: "POST", postData: { mimeType: "text/plain", text: 7 } } }), /log\.entries\[0\]\.request\.postData\.text: must be a string/],
    ["request body params that are not a list", entry({}, { request: { ...request(), method: "POST", postData: { mimeType: "x", params: { a: "1" } } } }), /log\.entries\[0\]\.request\.postData\.params: must be an array/],
    ["a request body param whose value is a number", entry({}, { request: { ...request(), method: "POST", postData: { mimeType: "x", params: [{ name: "a", value: 1 }] } } }), /log\.entries\[0\]\.request\.postData\.params\[0\]: must be \{ name, value \} with string values/],
    ["content that is a string", entry({ content: "ok" }), /log\.entries\[0\]\.response\.content: must be an object/],
    ["a content encoding that is a number", entry({ content: { size: 2, mimeType: "text/plain", text: "ok", encoding: 64 } }), /log\.entries\[0\]\.response\.content\.encoding: must be a string/],
    // Past 2^31 - 1 ms Node's setTimeout fires after 1 ms and warns (TimeoutOverflowWarning):
    // `--replay-latency recorded` answered at once what it was told to hold (black-box finding).
    ["a wait past 24 days", entry({}, { timings: { send: 0, wait: 3e9, receive: 0 } }), /log\.entries\[0\]\.timings\.wait: 3000000000 ms is more than 2147483647 ms \(24\.8 days\)/],
    ["a send time of 10^15 ms", entry({}, { timings: { send: 1e15, wait: 1, receive: 0 } }), /log\.entries\[0\]\.timings\.send: 1000000000000000 ms is more than 2147483647 ms/],
    ["a receive time past 24 days", entry({}, { timings: { send: 0, wait: 1, receive: 2147483648 } }), /log\.entries\[0\]\.timings\.receive: 2147483648 ms is more than 2147483647 ms/],
    ["a wait that is a string", entry({}, { timings: { send: 0, wait: "Infinity", receive: 0 } }), /log\.entries\[0\]\.timings\.wait: must be a number/],
    ["timings that are a list", entry({}, { timings: [0, 1, 0] }), /log\.entries\[0\]\.timings: must be an object/],
    ["a chunk time past 24 days", entry({}, { _egressgate: { chunks: [[1, 0], [1, 3e9]] } }), /log\.entries\[0\]\._egressgate\.chunks\[1\]: 3000000000 ms is more than 2147483647 ms/],
    ["a sidecar name that is not a SHA-256", entry({ content: { size: 2, mimeType: "text/plain", _file: "../../etc/passwd" } }), /log\.entries\[0\]\.response\.content\._file: must be the SHA-256 of the body \(64 hex digits\)/],
    // Node's decoder skips what is not base64 and stops at the first "=": such a body was
    // replayed as garbage bytes, and passed har check (black-box finding).
    ["a base64 body with a character outside the alphabet", entry({ content: { size: 3, mimeType: "image/png", text: "AAA*", encoding: "base64" } }), /log\.entries\[0\]\.response\.content\.text is not base64: "\*" at 3 is not in its alphabet/],
    ["a base64 body with \"=\" before its end", entry({ content: { size: 3, mimeType: "image/png", text: "AA==AAAA", encoding: "base64" } }), /response\.content\.text is not base64: "=" at 2 is not padding at its end/],
    ["a base64 body with three \"=\"", entry({ content: { size: 3, mimeType: "image/png", text: "A===", encoding: "base64" } }), /response\.content\.text is not base64: "=" at 1 is not padding/],
    ["a base64 body without its padding", entry({ content: { size: 3, mimeType: "image/png", text: "AAAAAA", encoding: "base64" } }), /response\.content\.text is not base64: its length, 6, is not a multiple of 4/],
    ["a base64 request body with a line break", entry({}, { request: { ...request(), method: "POST", postData: { mimeType: "application/octet-stream", text: "AAAA\nAAAA", _encoding: "base64" } } }), /log\.entries\[0\]\.request\.postData\.text is not base64: "\\n" at 4 is not in its alphabet/],
  ])("a file with %s fails the start, naming the entry, and har check says so (exit 2)", async (_name, bad, message) => {
    const dir = tempDir();
    const file = join(dir, "bad.har");
    writeFileSync(file, JSON.stringify({ log: { version: "1.2", creator: { name: "test", version: "1" }, pages: [], entries: [bad] } }));
    await expect(startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: file } } })).rejects.toThrow(message);
    const report = await checkHarFile(file);
    expect(report.problems.join("\n")).toMatch(message);
    expect(formatHarReport(report).status).toBe(2);
    // Said once, though both the HAR checks and the replay checks look at it.
    expect(new Set(report.problems).size).toBe(report.problems.length);
  });

  it("base64 bodies as RFC 4648 spells them pass har check and replay as their bytes", async () => {
    const file = join(tempDir(), "bytes.har");
    const e = entry({ content: { size: 5, mimeType: "application/octet-stream", text: Buffer.from([0, 1, 2, 255, 254]).toString("base64"), encoding: "base64" } });
    writeFileSync(file, JSON.stringify({ log: { version: "1.2", creator: { name: "test", version: "1" }, pages: [], entries: [e] } }));
    expect(formatHarReport(await checkHarFile(file)).status).toBe(0);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: file } } });
    const res = await undiciRequest("https://api.test/x", { dispatcher: proxyAgent(proxy) });
    expect([...Buffer.from(await res.body.arrayBuffer())]).toEqual([0, 1, 2, 255, 254]);
  });

  // JSON.parse takes any depth; har check's walk for secret-looking strings recursed, and said
  // only "egressgate: Maximum call stack size exceeded", exit 2, while --replay took the file
  // (and --record-missing failed every write of it, JSON.stringify recursing too) (black-box finding).
  it("an entry with an extra field nested 100,000 levels deep: har check reports in full, the depth a problem, and --replay refuses it", async () => {
    const file = join(tempDir(), "deep.har");
    const depth = 100_000;
    const deep = `${'{"a":'.repeat(depth)}"ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"${"}".repeat(depth)}`;
    const text = JSON.stringify({ log: { version: "1.2", creator: { name: "test", version: "1" }, pages: [], entries: [{ ...entry({}), _extra: "DEEP" }] } }).replace('"DEEP"', deep);
    writeFileSync(file, text);
    const report = await checkHarFile(file);
    expect(report.problems).toEqual(["log.entries[0]: nested more than 1000 levels deep"]);
    await expect(startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: file } } })).rejects.toThrow(/deep\.har cannot be replayed \(1 problem\): log\.entries\[0\]: nested more than 1000 levels deep/);
    expect(report.suspicious).toEqual([`log.entries[0]._extra${".a".repeat(depth)}: a GitHub token: ghp_012345… (42 characters)`]);
    expect(formatHarReport(report).status).toBe(2);
    // As deep as JSON.stringify writes back without trouble: taken.
    const within = `${'{"a":'.repeat(998)}1${"}".repeat(998)}`;
    writeFileSync(file, text.replace(deep, within));
    expect((await checkHarFile(file)).problems).toEqual([]);
  });

  it("with --replay-latency recorded, a send and a wait that add up past 2^31 - 1 ms are waited, not cut to 1 ms with a TimeoutOverflowWarning", async () => {
    const file = join(tempDir(), "slow.har");
    const slow = entry({}, { timings: { send: 2147483647, wait: 2147483647, receive: 0 } });
    const quick = { ...entry({}), request: { ...request(), url: "https://api.test/warm" } };
    writeFileSync(file, JSON.stringify({ log: { version: "1.2", creator: { name: "test", version: "1" }, pages: [], entries: [slow, quick] } }));
    expect(formatHarReport(await checkHarFile(file)).status).toBe(0);
    const warnings: string[] = [];
    const onWarning = (warning: Error): void => void warnings.push(warning.name);
    process.on("warning", onWarning);
    onTestFinished(() => void process.off("warning", onWarning));
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: file, latency: "recorded" } }, timeouts: { drainMs: 300 } });
    // The tunnel and its handshakes first, so that a wait cut to 1 ms would answer at once.
    expect((await fetchVia(proxy, "https://api.test/warm")).status).toBe(200);
    const answered = fetchVia(proxy, "https://api.test/x").then(() => "answered", () => "failed");
    const early = await Promise.race([answered, new Promise((resolve) => setTimeout(() => resolve("waiting"), 1_000))]);
    expect(early).toBe("waiting");
    expect(warnings).not.toContain("TimeoutOverflowWarning");
    // The close ends the wait (the guest is gone), so nothing is left running.
    await proxy.close();
    await answered;
  });

  it("--replay names every entry that cannot be replayed, not only the first", async () => {
    const file = join(tempDir(), "bad.har");
    const entries = [entry({ status: "200" }), entry({}), null, entry({ headers: { a: "1" } })];
    writeFileSync(file, JSON.stringify({ log: { version: "1.2", creator: { name: "test", version: "1" }, pages: [], entries } }));
    const start = startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: file } } });
    await expect(start).rejects.toThrow(/bad\.har cannot be replayed \(3 problems\): log\.entries\[0\]\.response\.status: must be a number; log\.entries\[2\]: must be an object; log\.entries\[3\]\.response\.headers: must be an array/);
  });

  it("entries with no response (status 0) or an informational one (a 101) are not replayed: their requests miss", async () => {
    const dir = tempDir();
    const file = join(dir, "skips.har");
    const at = (path: string, status: number): Record<string, unknown> => {
      const e = entry({ status });
      (e["request"] as Record<string, unknown>)["url"] = `https://api.test/${path}`;
      return e;
    };
    writeFileSync(file, JSON.stringify({ log: { version: "1.2", creator: { name: "test", version: "1" }, pages: [], entries: [at("aborted", 0), at("switch", 101), at("fine", 200)] } }));
    expect(formatHarReport(await checkHarFile(file)).status).toBe(0);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: file } } });
    expect((await fetchVia(proxy, "https://api.test/fine")).status).toBe(200);
    for (const path of ["aborted", "switch"]) {
      const res = await fetchVia(proxy, `https://api.test/${path}`);
      expect(res.status).toBe(502);
      expect(res.headers["x-egressgate-error"]).toBe("EG_REPLAY_MISS");
    }
  });

  // A HAR from before the proxy dropped a 204's Content-Length (or from elsewhere) may carry one:
  // an HTTP/2 guest's nghttp2 resets such a response as malformed (review).
  it("a recorded 204 with Content-Length is replayed without it, to an HTTP/2 guest too", async () => {
    const dir = tempDir();
    const file = join(dir, "nothing.har");
    const e = entry({ status: 204, statusText: "No Content", headers: [{ name: "content-length", value: "5" }, { name: "x-kept", value: "yes" }], content: { size: 0, mimeType: "", text: "" } });
    writeFileSync(file, JSON.stringify({ log: { version: "1.2", creator: { name: "test", version: "1" }, pages: [], entries: [e] } }));
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: file } } });
    const session = await h2Session(proxy.port, "api.test:443", proxy.caCertPem);
    const res = await h2Request(session, { ":path": "/x" });
    expect(res.status).toBe(204);
    expect(res.headers["content-length"]).toBeUndefined();
    expect(res.headers["x-kept"]).toBe("yes");
  });

  it("a recorded 205 with a body is replayed without it, with Content-Length: 0", async () => {
    const dir = tempDir();
    const file = join(dir, "reset.har");
    const e = entry({ status: 205, statusText: "Reset Content", headers: [{ name: "content-length", value: "5" }, { name: "x-kept", value: "yes" }], content: { size: 5, mimeType: "text/plain", text: "hello" } });
    writeFileSync(file, JSON.stringify({ log: { version: "1.2", creator: { name: "test", version: "1" }, pages: [], entries: [e] } }));
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: file } } });
    const session = await h2Session(proxy.port, "api.test:443", proxy.caCertPem);
    const viaH2 = await h2Request(session, { ":path": "/x" });
    expect(viaH2.status).toBe(205);
    expect(viaH2.body.length).toBe(0);
    expect(viaH2.headers["content-length"]).toBe("0");
    const tunnel = await openTlsTunnel(proxy.port, "api.test:443", { ca: proxy.caCertPem });
    tunnel.write("GET /x HTTP/1.1\r\nHost: api.test\r\n\r\n");
    const viaH1 = await tunnel.readResponse();
    expect(viaH1.status).toBe(205);
    expect(viaH1.body).toBe("");
    expect(viaH1.headers["content-length"]).toBe("0");
    expect(viaH1.headers["x-kept"]).toBe("yes");
  });

  it("a recording and a replay together are refused, and a replay file that is not HAR fails the start", async () => {
    const dir = tempDir();
    await expect(startTestProxy({}, { upstream: { record: { path: join(dir, "a.har") }, replay: { path: join(dir, "b.har") } } })).rejects.toThrow(/upstream\.record.*cannot be combined with replay/);
    await expect(startTestProxy({}, { upstream: { replay: { path: join(dir, "missing.har") } } })).rejects.toThrow(/upstream\.replay\.path.*cannot read/);
  });

  // A FIFO with no writer held the start until one came; /dev/zero never ends.
  it("a replay file, or a file to check, that is a FIFO or a device is refused at once, saying what it is", async () => {
    const fifo = join(tempDir(), "net.har");
    execFileSync("mkfifo", [fifo]);
    await expect(startTestProxy({}, { upstream: { replay: { path: fifo } } })).rejects.toThrow(/cannot read .*net\.har as a HAR file: a FIFO, not a regular file/);
    await expect(startTestProxy({}, { upstream: { replay: { path: "/dev/zero" } } })).rejects.toThrow(/cannot read \/dev\/zero as a HAR file: a character device, not a regular file/);
    expect((await checkHarFile(fifo)).problems).toEqual(["cannot read it as JSON: a FIFO, not a regular file"]);
  });
});

// Only the first Content-Encoding line was read: a body gzipped twice was stored decoded once, and
// one in a coding the proxy cannot undo was stored as it came, its copy of a secret searched for
// compressed and written to disk (review).
// A crash leaves FILE.har.journal, the only copy of what was recorded: the next --record on the
// same path opened it for writing and emptied it, without a word (black-box finding).
describe("a journal an earlier run left", () => {
  it("is kept beside under a name of its own, the log says where, and the new recording starts empty", async () => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const crashed = `${JSON.stringify({ request: { method: "GET", url: "https://api.test/left-by-a-crash" } })}\n`;
    writeFileSync(`${har}.journal`, crashed);
    const upstream = await startUpstream();
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    const kept = readdirSync(dir).filter((name) => name.startsWith("run.har.journal.") && name.endsWith(".crashed"));
    expect(kept).toHaveLength(1);
    expect(readFileSync(join(dir, kept[0]!), "utf8")).toBe(crashed);
    expect(recorder.logs.find((line) => line["code"] === "EG_RECORD_JOURNAL_KEPT")).toMatchObject({ level: "warn", journal: join(dir, kept[0]!) });
    await fetchVia(recorder, `https://api.test:${upstream.port}/echo`);
    await recordAndClose(recorder);
    expect(readHar(har).log.entries.map((entry) => new URL(entry.request.url).pathname)).toEqual(["/echo"]);
    // An empty journal (a clean run's, just opened) is no crash's: nothing is kept, nothing said.
    writeFileSync(`${har}.journal`, "");
    const again = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    expect(again.logs.filter((line) => line["code"] === "EG_RECORD_JOURNAL_KEPT")).toEqual([]);
    expect(readdirSync(dir).filter((name) => name.endsWith(".crashed"))).toHaveLength(1);
  });
});

// The HAR is written to FILE.PID.tmp, then renamed over FILE. Whatever stood at that name was
// opened as it was: a symbolic link was written through (a file elsewhere truncated and
// overwritten, and the link then renamed to FILE), and a FIFO held every flush in open().
describe("what stands at the recording's temporary name", () => {
  it.each([
    [
      "a symbolic link to another file",
      (tmp: string, dir: string): (() => void) => {
        const victim = join(dir, "victim.txt");
        writeFileSync(victim, "untouched");
        symlinkSync(victim, tmp);
        return () => expect(readFileSync(victim, "utf8")).toBe("untouched");
      },
    ],
    [
      "a FIFO",
      (tmp: string): (() => void) => {
        execFileSync("mkfifo", [tmp]);
        return () => undefined;
      },
    ],
  ])("%s is replaced, never written through, and the HAR is a regular file", async (_what, make) => {
    const dir = tempDir();
    const har = join(dir, "run.har");
    const upstream = await startUpstream();
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    const check = make(`${har}.${process.pid}.tmp`, dir);
    expect((await fetchVia(recorder, `https://api.test:${upstream.port}/echo`)).status).toBe(200);
    // Before, the FIFO held this flush in open() for good.
    await Promise.race([recorder.flushRecording(), new Promise((_resolve, reject) => setTimeout(() => reject(new Error("the flush took over 5 s")), 5_000).unref())]);
    check();
    expect(lstatSync(har).isFile()).toBe(true);
    expect(readHar(har).log.entries).toHaveLength(1);
    expect(existsSync(`${har}.${process.pid}.tmp`)).toBe(false);
    expect(recorder.logs.filter((line) => line["code"] === "EG_RECORD_FAILED")).toEqual([]);
  });
});

describe("recording a body under several content codings", () => {
  const cases: Record<string, { lines: string[]; encode: (text: string) => Buffer; recorded: boolean }> = {
    "gzip on two lines, applied twice": { lines: ["gzip", "gzip"], encode: (t) => gzipSync(gzipSync(t)), recorded: true },
    "gzip, br on one line": { lines: ["gzip, br"], encode: (t) => brotliCompressSync(gzipSync(t)), recorded: true },
    "gzip, zstd (one it cannot undo)": { lines: ["gzip, zstd"], encode: (t) => gzipSync(t), recorded: false },
  };
  for (const [name, { lines, encode, recorded }] of Object.entries(cases)) {
    it(`${name}: the value never reaches the disk${recorded ? ", and the body is stored decoded and redacted" : "; the exchange is not recorded"}`, async () => {
      const dir = tempDir();
      const har = join(dir, "run.har");
      const upstream = await startUpstream({
        routes: {
          "/coded": (req, res) => {
            res.writeHead(200, [["content-type", "text/plain"], ...lines.map((line) => ["content-encoding", line])].flat());
            // Echoes the secret's value, as a debugging endpoint would.
            res.end(encode(`token=${String(req.headers["authorization"]).slice("Bearer ".length)}`));
          },
        },
      });
      const recorder = await startTestProxy(
        { allowedInternalHosts: ["api.test"], secrets: { GH_TOKEN: { hosts: ["api.test"], value: VALUE } } },
        { upstream: { record: { path: har } } },
      );
      const placeholder = recorder.guestEnv()["GH_TOKEN"]!;
      expect((await fetchVia(recorder, `https://api.test:${upstream.port}/coded`, { headers: { authorization: `Bearer ${placeholder}` } })).status).toBe(200);
      await recorder.close();
      const entries = readHar(har).log.entries;
      if (recorded) {
        expect(entries).toHaveLength(1);
        expect(entries[0]!.response.content.text).toBe("token=[REDACTED:GH_TOKEN]");
      } else {
        expect(entries).toHaveLength(0);
      }
      expect(everything(har)).not.toContain(VALUE);
    });
  }
});

// The replay kept only the last Content-Encoding line and looked the whole value up as one
// coding: codings on two lines (gzip, then br) went out with both lines but a br-only body, which
// the guest could not decode, and one line naming several ("gzip, br") went out decoded, without
// the header (black-box finding).
describe("replaying a body under several content codings", () => {
  const text = `stacked ${"w".repeat(200)}`;
  const cases: Record<string, { lines: string[]; encode: (t: string) => Buffer }> = {
    "gzip, then br, on two lines": { lines: ["gzip", "br"], encode: (t) => brotliCompressSync(gzipSync(t)) },
    "gzip, br on one line": { lines: ["gzip, br"], encode: (t) => brotliCompressSync(gzipSync(t)) },
    "gzip, gzip on one line": { lines: ["gzip, gzip"], encode: (t) => gzipSync(gzipSync(t)) },
  };
  /** The body as a client undoes it: the codings in order of the header lines, the last applied undone first. */
  const decode = (header: string | string[] | undefined, body: Buffer): Buffer => {
    const codings = [header ?? []].flat().join(",").split(",").map((c) => c.trim()).filter((c) => c !== "");
    for (const coding of codings.reverse()) body = coding === "gzip" ? gunzipSync(body) : coding === "br" ? brotliDecompressSync(body) : body;
    return body;
  };
  for (const [name, { lines, encode }] of Object.entries(cases)) {
    it(`${name}: the replay sends the same Content-Encoding lines and a body that decodes to what the live run did`, async () => {
      const dir = tempDir();
      const har = join(dir, "run.har");
      const upstream = await startUpstream({
        routes: {
          "/coded": (_req, res) => {
            res.writeHead(200, [["content-type", "text/plain"], ...lines.map((line) => ["content-encoding", line])].flat());
            res.end(encode(text));
          },
        },
      });
      const url = `https://api.test:${upstream.port}/coded`;
      const get = async (proxy: TestProxy): Promise<{ encoding: string | string[] | undefined; decoded: string }> => {
        const res = await request(url, { dispatcher: proxyAgent(proxy) });
        expect(res.statusCode).toBe(200);
        const encoding = res.headers["content-encoding"];
        return { encoding, decoded: decode(encoding, Buffer.from(await res.body.arrayBuffer())).toString("utf8") };
      };
      const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
      const live = await get(recorder);
      await recorder.close();
      expect(live.decoded).toBe(text);
      expect(readHar(har).log.entries[0]!.response.content.text).toBe(text);
      const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
      const again = await get(replayer);
      expect(again.encoding).toEqual(live.encoding);
      expect(again.decoded).toBe(text);
      expect(upstream.hits()).toBe(1);
    });
  }
});


// A FIFO in FILE.har.d parked a libuv threadpool thread in open() for each replayed request that
// named it; after four, every fs call of the process waited (the audit log, the exit on SIGTERM),
// and `har check` passed the file (black-box finding).
describe("sidecar files that are not regular files", () => {
  const body = Buffer.from("sidecar body\n");
  const hash = createHash("sha256").update(body).digest("hex");
  const sidecarEntry = (path: string): Record<string, unknown> => ({
    startedDateTime: "2026-12-01T00:00:00.000Z",
    time: 1,
    request: { method: "GET", url: `https://api.test/${path}`, httpVersion: "HTTP/1.1", cookies: [], headers: [], queryString: [], headersSize: -1, bodySize: 0 },
    response: {
      status: 200,
      statusText: "OK",
      httpVersion: "HTTP/1.1",
      cookies: [],
      headers: [],
      redirectURL: "",
      headersSize: -1,
      bodySize: body.length,
      content: path === "inline" ? { size: 2, mimeType: "text/plain", text: "ok" } : { size: body.length, mimeType: "text/plain", _file: hash },
    },
    cache: {},
    timings: { send: 0, wait: 1, receive: 0 },
  });
  const writeRecording = (dir: string): string => {
    const file = join(dir, "side.har");
    writeFileSync(file, JSON.stringify({ log: { version: "1.2", creator: { name: "test", version: "1" }, pages: [], entries: [sidecarEntry("inline"), sidecarEntry("big")] } }));
    mkdirSync(`${file}.d`);
    return file;
  };
  /** Opens the FIFO for writing once, so any reader stuck in open() (the bug) is let go. */
  const releaseReaders = (fifo: string): void => {
    onTestFinished(() => {
      try {
        closeSync(openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK));
      } catch {
        // ENXIO: no reader waits, as it should be
      }
    });
  };

  it.each([
    ["a FIFO", "a FIFO", (target: string, _dir: string) => execFileSync("mkfifo", [target])],
    ["a directory", "a directory", (target: string, _dir: string) => mkdirSync(target)],
    [
      "a symbolic link to a FIFO",
      "a FIFO",
      (target: string, dir: string) => {
        execFileSync("mkfifo", [join(dir, "pipe")]);
        symlinkSync(join(dir, "pipe"), target);
      },
    ],
  ])("a sidecar file that is %s fails the start, naming the entry, and har check says so (exit 2)", async (_name, kind, make) => {
    const dir = tempDir();
    const file = writeRecording(dir);
    const target = join(`${file}.d`, hash);
    make(target, dir);
    releaseReaders(target);
    const message = new RegExp(`log\\.entries\\[1\\]\\.response\\.content\\._file: .*${hash} is ${kind}, not a regular file`);
    await expect(startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: file } } })).rejects.toThrow(message);
    const report = await checkHarFile(file);
    expect(report.problems.join("\n")).toMatch(message);
    expect(formatHarReport(report).status).toBe(2);
  });

  it("a sidecar file that becomes a FIFO after the start gets 502 at once, and the proxy's file system work goes on", async () => {
    const dir = tempDir();
    const file = writeRecording(dir);
    const target = join(`${file}.d`, hash);
    writeFileSync(target, body);
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: file } } });
    expect((await fetchVia(proxy, "https://api.test/big")).text).toBe(body.toString());
    rmSync(target);
    execFileSync("mkfifo", [target]);
    releaseReaders(target);
    const within = <T>(work: Promise<T>, what: string): Promise<T> =>
      Promise.race([work, new Promise<never>((_resolve, reject) => setTimeout(() => reject(new Error(`${what} took over 5 s`)), 5_000).unref())]);
    // More than the threadpool's four threads: each one used to stay in open() for good.
    const answers = await within(Promise.all(Array.from({ length: 6 }, () => fetchVia(proxy, "https://api.test/big"))), "six requests for the FIFO");
    for (const res of answers) {
      expect(res.status).toBe(502);
      expect(res.headers["x-egressgate-error"]).toBe("EG_REPLAY_MISS");
      expect(res.text).toMatch(new RegExp(`sidecar file that is a FIFO, not a regular file \\(${hash}\\)`));
    }
    expect((await within(fetchVia(proxy, "https://api.test/inline"), "an inline answer")).text).toBe("ok");
    expect((await within(readFile(file), "a file read")).length).toBeGreaterThan(0);
  });
});

// Guests a and b record into one file, and an upstream they share (a cache, an activity feed, a
// debug page) shows one guest's credential to the other: guest a's entry held guest b's real
// token in clear, in a response header and its body. Only a's own values were searched for.
describe("a recording several guests make", () => {
  const A_VALUE = "tokA_realvalue_aaaaaaaaaaaaaaaaaaaaaaaaa";
  const B_FIRST = "tokB_realvalue_bbbbbbbbbbbbbbbbbbbbbbbbb";
  const B_NEXT = "tokB_rotatedvalue_ccccccccccccccccccccccc";

  it("keeps every guest's current and retired values out of each guest's entries: redacted in responses, or the entry is not written", async () => {
    const dir = tempDir();
    const har = join(dir, "shared.har");
    let last = "";
    const upstream = await startUpstream({
      names: ["shared.test"],
      routes: {
        // What the previous caller sent, in a header and in the body.
        "/last-auth": (req, res) => {
          const seen = last;
          last = String(req.headers["authorization"] ?? last);
          res.writeHead(200, { "content-type": "text/plain", "x-last-auth": seen });
          res.end(`last caller's auth: ${seen}\n`);
        },
        // The same in a 2 MiB body: a sidecar file, searched as it streams.
        "/last-auth-big": (_req, res) => {
          res.writeHead(200, { "content-type": "text/plain" });
          const line = `last caller's auth: ${last}\n`;
          res.end(line.repeat(Math.ceil((2 * 1024 * 1024) / line.length)));
        },
      },
    });
    const guest = (name: string, value: string): ReturnType<typeof createHttpHooks> =>
      createHttpHooks({ allowedInternalHosts: ["shared.test"], secrets: { [`${name.toUpperCase()}_TOKEN`]: { hosts: ["shared.test"], value } } });
    const a = guest("a", A_VALUE);
    const b = guest("b", B_FIRST);
    const logs: Record<string, unknown>[] = [];
    const proxy = await startProxy({
      guests: { a: { httpHooks: a.httpHooks, env: a.env }, b: { httpHooks: b.httpHooks, env: b.env } },
      listen: { host: "127.0.0.1", port: 0 },
      caDir: join(dir, "ca"),
      upstreamCa: [(await testCa()).certPem],
      resolve: { "shared.test": ["127.0.0.1"] },
      logLevel: "debug",
      logSink: (line) => logs.push(JSON.parse(line) as Record<string, unknown>),
      upstream: { record: { path: har } },
    });
    onTestFinished(() => proxy.close());
    const as = async (name: "a" | "b", path: string): Promise<string> => {
      const env = proxy.guestEnv(name);
      const agent = new ProxyAgent({ uri: env["HTTPS_PROXY"]!, requestTls: { ca: proxy.caCertPem } });
      try {
        const res = await request(`https://shared.test:${upstream.port}${path}`, { dispatcher: agent, headers: { authorization: `Bearer ${env[`${name.toUpperCase()}_TOKEN`]!}` } });
        expect(res.statusCode).toBe(200);
        return await res.body.text();
      } finally {
        await agent.close();
      }
    };
    await as("b", "/last-auth");
    // b's first value is retired by the rotation, and still echoed to a.
    b.secretManager.updateSecret("B_TOKEN", { value: B_NEXT });
    expect(await as("a", "/last-auth")).toContain(B_FIRST);
    await as("b", "/last-auth");
    expect((await as("a", "/last-auth-big")).length).toBeGreaterThan(1024 * 1024);
    expect(await as("a", "/last-auth")).toContain(B_NEXT);
    await proxy.close();

    const entries = readHar(har).log.entries;
    const ofA = entries.filter((e) => e._egressgate?.guest === "a");
    expect(ofA.map((e) => [new URL(e.request.url).pathname, e.response.headers.find((h) => h.name === "x-last-auth")?.value, e.response.content.text])).toEqual([
      ["/last-auth", "Bearer [REDACTED:B_TOKEN]", "last caller's auth: Bearer [REDACTED:B_TOKEN]\n"],
      ["/last-auth", "Bearer [REDACTED:B_TOKEN]", "last caller's auth: Bearer [REDACTED:B_TOKEN]\n"],
    ]);
    // The large body cannot be redacted as it streams: it is not written, and neither is its file.
    expect(logs.filter((l) => l["code"] === "EG_RECORD_LEAK")).toEqual([expect.objectContaining({ guest: "a", secret: "B_TOKEN", where: "the response body" })]);
    expect(readdirSync(`${har}.d`)).toEqual([]);
    const disk = everything(har);
    for (const value of [A_VALUE, B_FIRST, B_NEXT]) expect(disk).not.toContain(value);
    expect(formatHarReport(await checkHarFile(har)).status).toBe(0);
  });
});

// Replay ignored `_egressgate.guest`: on a proxy serving guests a and b, b's request was answered
// with the entry a recorded, a's private data fetched with a's token (headers are not part of the
// key), whenever a's entry came first; so were a redirect's hops, one by one. An entry a named
// guest recorded now answers only that guest.
describe("replaying a recording several guests made", () => {
  const A_VALUE = "tokA_replayvalue_aaaaaaaaaaaaaaaaaaaaaaa";
  const B_VALUE = "tokB_replayvalue_bbbbbbbbbbbbbbbbbbbbbbb";
  const DEFAULT_VALUE = "tokD_replayvalue_ddddddddddddddddddddddd";
  const owners: Record<string, string> = { [A_VALUE]: "alice", [B_VALUE]: "bob", [DEFAULT_VALUE]: "dora" };

  /** Private data: whose it is follows from the token the request carried. */
  const privateData: Route = (req, res, _body, url) => {
    const who = owners[String(req.headers["authorization"]).replace(/^Bearer /, "")] ?? "nobody";
    res.writeHead(200, { "content-type": "text/plain" });
    res.end(`${who}'s ${url.pathname.slice(1)}${url.search}`);
  };
  const routes: Record<string, Route> = {
    "/me": privateData,
    "/landing": privateData,
    "/report": privateData,
    "/start": (_req, res) => {
      res.writeHead(302, { location: "/landing" });
      res.end();
    },
  };

  /** A guest with its own secret on both hosts (`value`: the real one to record, a dummy to replay). */
  const spec = (name: string, value: string): GuestSpec => ({
    allowedInternalHosts: ["shared.test", "a.test"],
    secrets: { [`${name.toUpperCase()}_TOKEN`]: { hosts: ["shared.test", "a.test"], value } },
  });

  /** GET as `guest` over HTTP/1.1 (undici through its proxy URL), with its placeholder as the bearer token. */
  async function getAs(proxy: RunningProxy, guest: string, url: string): Promise<{ status: number; text: string }> {
    const env = proxy.guestEnv(guest);
    const agent = new ProxyAgent({ uri: env["HTTPS_PROXY"]!, requestTls: { ca: proxy.caCertPem } });
    try {
      const res = await request(url, { dispatcher: agent, headers: { authorization: `Bearer ${env[`${guest.toUpperCase()}_TOKEN`]!}` } });
      return { status: res.statusCode, text: await res.body.text() };
    } finally {
      await agent.close();
    }
  }

  /** An HTTP/2 session as `guest`: CONNECT with its credentials, then TLS offering h2 alone. */
  async function h2As(proxy: RunningProxy, guest: string, authority: string): Promise<{ get(path: string): Promise<{ status: number; text: string }> }> {
    const { user, token } = credentialsOf(proxy, guest);
    const raw = await openRaw(proxy.port);
    raw.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\nProxy-Authorization: ${basic(user, token)}\r\n\r\n`);
    expect((await raw.readResponse({ forConnect: true })).status).toBe(200);
    const socket = tlsConnect({ socket: raw.detach(), servername: authority.slice(0, authority.lastIndexOf(":")), ca: proxy.caCertPem, ALPNProtocols: ["h2"] });
    await new Promise<void>((resolve, reject) => socket.once("secureConnect", resolve).once("error", reject));
    expect(socket.alpnProtocol).toBe("h2");
    const session = h2Connect(`https://${authority}`, { createConnection: () => socket });
    session.on("error", () => undefined);
    onTestFinished(() => void session.destroy());
    const placeholder = proxy.guestEnv(guest)[`${guest.toUpperCase()}_TOKEN`]!;
    return {
      async get(path) {
        const answer = await h2Request(session, { ":path": path, ":authority": authority, authorization: `Bearer ${placeholder}` });
        return { status: answer.status, text: answer.body.toString() };
      },
    };
  }

  /**
   * The proxy itself records guests a and b (a first each time) into one file: the same /me and
   * /start (a redirect to /landing), each answered with its own guest's data; a's report on
   * shared.test and its page on a.test, which b never asked for.
   */
  async function recordTwoGuests(): Promise<{ har: string; port: number; hits: () => number }> {
    const har = join(tempDir(), "shared.har");
    const upstream = await startUpstream({ names: ["shared.test", "a.test"], routes });
    const recorder = await startGuestsProxy({ a: spec("a", A_VALUE), b: spec("b", B_VALUE) }, { upstream: { record: { path: har } } });
    const shared = `https://shared.test:${upstream.port}`;
    expect(await getAs(recorder, "a", `${shared}/me`)).toEqual({ status: 200, text: "alice's me" });
    expect(await getAs(recorder, "b", `${shared}/me`)).toEqual({ status: 200, text: "bob's me" });
    expect(await getAs(recorder, "a", `${shared}/start`)).toEqual({ status: 200, text: "alice's landing" });
    expect(await getAs(recorder, "b", `${shared}/start`)).toEqual({ status: 200, text: "bob's landing" });
    expect(await getAs(recorder, "a", `${shared}/report?id=7`)).toEqual({ status: 200, text: "alice's report?id=7" });
    expect(await getAs(recorder, "a", `https://a.test:${upstream.port}/me`)).toEqual({ status: 200, text: "alice's me" });
    await recorder.close();
    const entries = readHar(har).log.entries;
    expect(entries.map((e) => [e._egressgate?.guest, new URL(e.request.url).pathname, e._egressgate?.named])).toEqual([
      ["a", "/me", undefined],
      ["b", "/me", undefined],
      ["a", "/start", undefined],
      ["a", "/landing", undefined],
      ["b", "/start", undefined],
      ["b", "/landing", undefined],
      ["a", "/report", undefined],
      ["a", "/me", undefined],
    ]);
    return { har, port: upstream.port, hits: upstream.hits };
  }

  /** Guests a and b, with dummy values, replaying `har`; no static names, so a host's addresses are the recorded ones. */
  function replayTwoGuests(har: string, replay: Partial<ReplayOptions> = {}, resolve: Readonly<Record<string, readonly string[]>> = {}): Promise<GuestsProxy> {
    return startGuestsProxy({ a: spec("a", "dummy-a"), b: spec("b", "dummy-b") }, { resolve, upstream: { replay: { path: har, ...replay } } });
  }

  it("an entry answers only the guest that recorded it, over HTTP/1.1 and HTTP/2, and a miss names none of another guest's entries", async () => {
    const { har, port, hits } = await recordTwoGuests();
    const recorded = hits();
    const replayer = await replayTwoGuests(har);
    const shared = `shared.test:${port}`;
    // b asks first: a's entry for the same request comes first in the file.
    const bH2 = await h2As(replayer, "b", shared);
    expect(await bH2.get("/me")).toEqual({ status: 200, text: "bob's me" });
    expect(await getAs(replayer, "b", `https://${shared}/me`)).toEqual({ status: 200, text: "bob's me" });
    expect(await getAs(replayer, "a", `https://${shared}/me`)).toEqual({ status: 200, text: "alice's me" });
    expect(await (await h2As(replayer, "a", shared)).get("/me")).toEqual({ status: 200, text: "alice's me" });

    // What only a recorded: a miss for b, on either protocol, its nearest entry one of b's own.
    expect(await bH2.get("/report?id=7")).toEqual({ status: 502, text: expect.stringMatching(/no recorded response matches GET https:\/\/shared\.test:\d+\/report \(see the proxy log\)/) as string });
    const missed = await getAs(replayer, "b", `https://${shared}/report?id=8`);
    expect(missed.status).toBe(502);
    const reasons = replayer.logs.filter((l) => l["code"] === "EG_REPLAY_MISS" && l["msg"] === "replay miss").map((l) => [l["guest"], String(l["reason"])]);
    expect(reasons).toEqual([
      ["b", expect.stringMatching(/^nearest is entry \d \(GET https:\/\/shared\.test:\d+\/(me|start|landing)\), which differs in path; entries another guest recorded are not used \(upstream\.replay\.anyGuest/)],
      ["b", expect.stringMatching(/^nearest is entry \d \(GET https:\/\/shared\.test:\d+\/(me|start|landing)\), which differs in path; /)],
    ]);
    const owned = readHar(har).log.entries.flatMap((e, i) => (e._egressgate?.guest === "b" ? [i] : []));
    for (const [, reason] of reasons) expect(owned).toContain(Number(/entry (\d)/.exec(reason as string)![1]));
    expect(replayer.rawLog.join("\n")).not.toContain("/report?");
    // A host only a's entries name has no recorded address for b: not a's, which the IP rules would judge.
    const elsewhere = await getAs(replayer, "b", `https://a.test:${port}/me`);
    expect(elsewhere.status).toBe(502);
    expect(elsewhere.text).toContain('the recording has no entry for host "a.test"');
    expect(await getAs(replayer, "a", `https://a.test:${port}/me`)).toEqual({ status: 200, text: "alice's me" });
    expect(hits()).toBe(recorded);
  });

  it("a redirect replays hop by hop from the guest's own entries, and each guest's repeats are its own with --replay-exhausted error", async () => {
    const { har, port } = await recordTwoGuests();
    const shared = `https://shared.test:${port}`;
    const replayer = await replayTwoGuests(har);
    // The proxy follows the 302: both hops are b's, though a's came first for each.
    expect(await getAs(replayer, "b", `${shared}/start`)).toEqual({ status: 200, text: "bob's landing" });
    expect(await (await h2As(replayer, "b", `shared.test:${port}`)).get("/start")).toEqual({ status: 200, text: "bob's landing" });
    expect(await getAs(replayer, "a", `${shared}/start`)).toEqual({ status: 200, text: "alice's landing" });

    // One answer each: a's second request is exhausted, and took none of b's.
    const strict = await replayTwoGuests(har, { exhausted: "error" });
    expect(await getAs(strict, "a", `${shared}/me`)).toEqual({ status: 200, text: "alice's me" });
    const again = await getAs(strict, "a", `${shared}/me`);
    expect(again.status).toBe(502);
    expect(again.text).toContain("no recorded response is left for GET");
    expect(await getAs(strict, "b", `${shared}/me`)).toEqual({ status: 200, text: "bob's me" });
  });

  it("with --record-missing, what only another guest recorded goes to the network for this guest, and is recorded as its own", async () => {
    const { har, port, hits } = await recordTwoGuests();
    const recorded = hits();
    const replayer = await startGuestsProxy({ a: spec("a", A_VALUE), b: spec("b", B_VALUE) }, { upstream: { replay: { path: har, recordMissing: true } } });
    expect(await getAs(replayer, "b", `https://shared.test:${port}/report?id=7`)).toEqual({ status: 200, text: "bob's report?id=7" });
    expect(await getAs(replayer, "a", `https://shared.test:${port}/report?id=7`)).toEqual({ status: 200, text: "alice's report?id=7" });
    expect(hits()).toBe(recorded + 1);
    await replayer.close();
    const reports = readHar(har).log.entries.filter((e) => new URL(e.request.url).pathname === "/report");
    expect(reports.map((e) => [e._egressgate?.guest, e.response.content.text])).toEqual([
      ["a", "alice's report?id=7"],
      ["b", "bob's report?id=7"],
    ]);
  });

  it("a guest a reload renames is not answered with the entries recorded under its old name", async () => {
    const { har, port } = await recordTwoGuests();
    const shared = `https://shared.test:${port}`;
    // shared.test named statically, so that a request of a guest with no entries there reaches the recording.
    const replayer = await replayTwoGuests(har, {}, { "shared.test": ["127.0.0.1"] });
    expect(await getAs(replayer, "a", `${shared}/me`)).toEqual({ status: 200, text: "alice's me" });
    const guest = (name: string): { httpHooks: HttpHooks; env: Readonly<Record<string, string>> } => {
      const { httpHooks, env } = createHttpHooks(spec(name, `dummy-${name}`));
      return { httpHooks, env };
    };
    await replayer.reload({ guests: { c: guest("c"), b: guest("b") }, resolve: { "shared.test": ["127.0.0.1"] } });
    expect(replayer.guestNames()).toEqual(["c", "b"]);
    const renamed = await getAs(replayer, "c", `${shared}/me`);
    expect(renamed.status).toBe(502);
    expect(renamed.text).not.toContain("alice");
    expect(await getAs(replayer, "b", `${shared}/me`)).toEqual({ status: 200, text: "bob's me" });
    const miss = replayer.logs.find((l) => l["msg"] === "replay miss" && l["guest"] === "c");
    expect(String(miss?.["reason"])).toMatch(/^the recording has no entries guest "c" may use; entries another guest recorded are not used/);
    // Named a again, it has its entries back.
    await replayer.reload({ guests: { a: guest("a"), b: guest("b") }, resolve: { "shared.test": ["127.0.0.1"] } });
    expect(await getAs(replayer, "a", `${shared}/me`)).toEqual({ status: 200, text: "alice's me" });
  });

  it("entries of a proxy without named guests, or of no guest, answer every guest; a guest named default beside others keeps its own; --replay-any-guest lends every entry", async () => {
    const upstream = await startUpstream({ names: ["shared.test", "a.test"], routes });
    const shared = `https://shared.test:${upstream.port}`;
    // The single-guest form records as `default`, unmarked.
    const single = join(tempDir(), "single.har");
    const lone = await startTestProxy(spec("default", DEFAULT_VALUE), { resolve: { "shared.test": ["127.0.0.1"] }, upstream: { record: { path: single } } });
    expect(await getAs(lone, "default", `${shared}/me`)).toEqual({ status: 200, text: "dora's me" });
    expect(await getAs(lone, "default", `${shared}/report?id=1`)).toEqual({ status: 200, text: "dora's report?id=1" });
    await lone.close();
    const file = readHar(single);
    expect(file.log.entries.map((e) => e._egressgate)).toEqual([expect.objectContaining({ guest: "default" }), expect.objectContaining({ guest: "default" })]);
    expect(file.log.entries.map((e) => e._egressgate?.named)).toEqual([undefined, undefined]);
    // And a HAR from another tool has no guest at all.
    delete file.log.entries[1]!._egressgate;
    writeFileSync(single, JSON.stringify(file));
    const many = await replayTwoGuests(single);
    expect(await getAs(many, "a", `${shared}/me`)).toEqual({ status: 200, text: "dora's me" });
    expect(await getAs(many, "b", `${shared}/me`)).toEqual({ status: 200, text: "dora's me" });
    expect(await (await h2As(many, "b", `shared.test:${upstream.port}`)).get("/report?id=1")).toEqual({ status: 200, text: "dora's report?id=1" });

    // Under `guests`, a guest named default is a named guest: its entries are marked, and answer only it.
    const named = join(tempDir(), "named.har");
    const recorder = await startGuestsProxy({ default: spec("default", DEFAULT_VALUE), b: spec("b", B_VALUE) }, { upstream: { record: { path: named } } });
    expect(await getAs(recorder, "default", `${shared}/me`)).toEqual({ status: 200, text: "dora's me" });
    await recorder.close();
    expect(readHar(named).log.entries.map((e) => e._egressgate)).toEqual([expect.objectContaining({ guest: "default", named: true })]);
    const beside = await startGuestsProxy({ default: spec("default", "dummy-d"), b: spec("b", "dummy-b") }, { resolve: {}, upstream: { replay: { path: named } } });
    expect((await getAs(beside, "b", `${shared}/me`)).status).toBe(502);
    expect(await getAs(beside, "default", `${shared}/me`)).toEqual({ status: 200, text: "dora's me" });
    // Entries go by the guest's name: the single guest of a replaying proxy is `default` too.
    const alone = await startTestProxy(spec("default", "dummy-d"), { upstream: { replay: { path: named } } });
    expect(await getAs(alone, "default", `${shared}/me`)).toEqual({ status: 200, text: "dora's me" });

    // Recorded as ci, replayed as ci2: a miss, whose log line says why, unless any guest may use any entry.
    const ci = join(tempDir(), "ci.har");
    const ciRecorder = await startGuestsProxy({ ci: spec("ci", A_VALUE) }, { upstream: { record: { path: ci } } });
    expect(await getAs(ciRecorder, "ci", `${shared}/me`)).toEqual({ status: 200, text: "alice's me" });
    await ciRecorder.close();
    const strict = await startGuestsProxy({ ci2: spec("ci2", "dummy") }, { upstream: { replay: { path: ci } } });
    expect((await getAs(strict, "ci2", `${shared}/me`)).status).toBe(502);
    expect(strict.logs.find((l) => l["msg"] === "replay miss")?.["reason"]).toBe(
      'the recording has no entries guest "ci2" may use; entries another guest recorded are not used (upstream.replay.anyGuest, --replay-any-guest, lets any guest use any entry)',
    );
    const lenient = await startGuestsProxy({ ci2: spec("ci2", "dummy") }, { resolve: {}, upstream: { replay: { path: ci, anyGuest: true } } });
    expect(await getAs(lenient, "ci2", `${shared}/me`)).toEqual({ status: 200, text: "alice's me" });
    expect(await (await h2As(lenient, "ci2", `shared.test:${upstream.port}`)).get("/me")).toEqual({ status: 200, text: "alice's me" });
  });

  it("an entry whose guest is not a string, or whose named is not a boolean, is refused by --replay and har check", async () => {
    const { har } = await recordTwoGuests();
    const file = readHar(har);
    (file.log.entries[0]!._egressgate as unknown as Record<string, unknown>)["guest"] = ["a"];
    (file.log.entries[1]!._egressgate as unknown as Record<string, unknown>)["named"] = "yes";
    writeFileSync(har, JSON.stringify(file));
    const report = await checkHarFile(har);
    expect(report.problems).toEqual(["log.entries[0]._egressgate.guest: must be a string", "log.entries[1]._egressgate.named: must be a boolean"]);
    await expect(replayTwoGuests(har)).rejects.toThrow(/log\.entries\[0\]\._egressgate\.guest: must be a string; log\.entries\[1\]\._egressgate\.named: must be a boolean/);
  });
});

// 16 KB of gzip decoding to 16 MiB was decoded whole on the event loop and stored inline: twenty
// such responses stalled every guest for seconds, and 34 made a 570 MB HAR that neither
// `har check` nor `--replay` could read (ERR_STRING_TOO_LONG) (black-box finding).
describe("a small compressed body that decodes to much more", () => {
  const decodedSize = 16 * 1024 * 1024 - 1024;
  const bomb = gzipSync(Buffer.alloc(decodedSize, "a"), { level: 9 });
  const gzipRoute =
    (body: Buffer): Route =>
    (_req, res) => {
      res.writeHead(200, { "content-type": "text/plain", "content-encoding": "gzip", "content-length": body.length });
      res.end(body);
    };
  const bytesVia = async (proxy: TestProxy, url: string): Promise<{ status: number; encoding: unknown; body: Buffer }> => {
    const res = await undiciRequest(url, { dispatcher: proxyAgent(proxy), headers: { "accept-encoding": "gzip" } });
    return { status: res.statusCode, encoding: res.headers["content-encoding"], body: Buffer.from(await res.body.arrayBuffer()) };
  };

  it("goes to a sidecar file, decoded, as any large body does; the HAR stays small and replays it gzipped again", async () => {
    const har = join(tempDir(), "run.har");
    const upstream = await startUpstream({ routes: { "/bomb": gzipRoute(bomb) } });
    const url = `https://api.test:${upstream.port}/bomb`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    const got = await Promise.all([1, 2, 3].map(() => bytesVia(recorder, url)));
    // The guest gets the bytes as they came.
    for (const g of got) expect(g.body.equals(bomb)).toBe(true);
    await recorder.close();
    expect(lstatSync(har).size).toBeLessThan(64 * 1024);
    const entries = readHar(har).log.entries;
    expect(entries).toHaveLength(3);
    const sha = createHash("sha256").update(Buffer.alloc(decodedSize, "a")).digest("hex");
    for (const e of entries) {
      expect(e.response.content).toEqual({ size: decodedSize, compression: decodedSize - bomb.length, mimeType: "text/plain", _file: sha });
    }
    // One file for the three (content-addressed), and nothing left half-written.
    expect(readdirSync(`${har}.d`)).toEqual([sha]);
    expect(lstatSync(join(`${har}.d`, sha)).size).toBe(decodedSize);
    expect(formatHarReport(await checkHarFile(har)).status).toBe(0);
    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
    const again = await bytesVia(replayer, url);
    expect(again.status).toBe(200);
    expect(again.encoding).toBe("gzip");
    expect(gunzipSync(again.body).equals(Buffer.alloc(decodedSize, "a"))).toBe(true);
  });

  it("one that decodes past 16 MiB is stored as it came and replayed byte for byte", async () => {
    const har = join(tempDir(), "run.har");
    const bigger = gzipSync(Buffer.alloc(16 * 1024 * 1024 + 1, "a"), { level: 9 });
    const upstream = await startUpstream({ routes: { "/bigger": gzipRoute(bigger) } });
    const url = `https://api.test:${upstream.port}/bigger`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    expect((await bytesVia(recorder, url)).status).toBe(200);
    await recorder.close();
    const [entry] = readHar(har).log.entries;
    expect(entry!.response.content).toEqual({ size: bigger.length, mimeType: "text/plain", text: bigger.toString("base64"), encoding: "base64", _encoded: "gzip" });
    expect(readdirSync(`${har}.d`)).toEqual([]);
    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
    const again = await bytesVia(replayer, url);
    expect(again.encoding).toBe("gzip");
    expect(again.body.equals(bigger)).toBe(true);
  });

  it("with secrets set, it is searched as it is decoded: a clean one is recorded to its sidecar, one holding a value is not recorded and leaves no file", async () => {
    const har = join(tempDir(), "run.har");
    const holding = gzipSync(Buffer.concat([Buffer.alloc(2 * 1024 * 1024, "a"), Buffer.from(` token=${VALUE} `)]));
    const upstream = await startUpstream({ routes: { "/bomb": gzipRoute(bomb), "/holding": gzipRoute(holding) } });
    const recorder = await startTestProxy(
      { allowedInternalHosts: ["api.test"], secrets: { GH_TOKEN: { hosts: ["api.test"], value: VALUE } } },
      { upstream: { record: { path: har } } },
    );
    expect((await bytesVia(recorder, `https://api.test:${upstream.port}/bomb`)).status).toBe(200);
    expect((await bytesVia(recorder, `https://api.test:${upstream.port}/holding`)).status).toBe(200);
    await recorder.close();
    const entries = readHar(har).log.entries;
    expect(entries.map((e) => new URL(e.request.url).pathname)).toEqual(["/bomb"]);
    expect(entries[0]!.response.content._file).toMatch(/^[0-9a-f]{64}$/);
    expect(recorder.logs.find((l) => l["code"] === "EG_RECORD_LEAK")).toMatchObject({ secret: "GH_TOKEN", where: "the response body" });
    expect(readdirSync(`${har}.d`)).toEqual([entries[0]!.response.content._file]);
    expect(everything(har)).not.toContain(VALUE);
  });
});

// HAR has no field for trailers: a recorded gRPC call replayed without its grpc-status, which a
// gRPC client takes for a failed call (black-box finding). They are kept in `_trailers`.
describe("response trailers", () => {
  it("an HTTP/2 upstream's trailers are recorded redacted, and replayed after the body to HTTP/2 and HTTP/1.1 guests", async () => {
    const har = join(tempDir(), "run.har");
    const upstream = await startH2Upstream({
      "/pkg.Svc/Call": (stream, headers) => {
        stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
        stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "7", "grpc-message": "denied by upstream", "x-echo": `token=${String(headers["authorization"]).slice("Bearer ".length)}` }));
        stream.end(Buffer.from([0, 0, 0, 0, 2, 8, 1]));
      },
    });
    const authority = `api.test:${upstream.port}`;
    const recorder = await startTestProxy(
      { allowedInternalHosts: ["api.test"], secrets: { GH_TOKEN: { hosts: ["api.test"], value: VALUE } } },
      { upstream: { record: { path: har } } },
    );
    const placeholder = recorder.guestEnv()["GH_TOKEN"]!;
    const call = { ":method": "POST", ":path": "/pkg.Svc/Call", "content-type": "application/grpc", te: "trailers", authorization: `Bearer ${placeholder}` };
    const live = await h2Request(await h2Session(recorder.port, authority, recorder.caCertPem), call, Buffer.from([0, 0, 0, 0, 0]));
    expect(live.trailers?.["grpc-status"]).toBe("7");
    await recorder.close();
    const [entry] = readHar(har).log.entries;
    expect(entry!.response._trailers).toEqual([
      { name: "grpc-status", value: "7" },
      { name: "grpc-message", value: "denied by upstream" },
      { name: "x-echo", value: "token=[REDACTED:GH_TOKEN]" },
    ]);
    expect(everything(har)).not.toContain(VALUE);
    expect(formatHarReport(await checkHarFile(har)).status).toBe(0);

    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"], secrets: { GH_TOKEN: { hosts: ["api.test"], value: "dummy" } } }, { upstream: { replay: { path: har } } });
    const again = { ...call, authorization: `Bearer ${replayer.guestEnv()["GH_TOKEN"]!}` };
    const viaH2 = await h2Request(await h2Session(replayer.port, authority, replayer.caCertPem), again, Buffer.from([0, 0, 0, 0, 0]));
    expect(viaH2.status).toBe(200);
    expect(viaH2.body.toString("hex")).toBe("00000000020801");
    expect(viaH2.trailers).toMatchObject({ "grpc-status": "7", "grpc-message": "denied by upstream", "x-echo": "token=[REDACTED:GH_TOKEN]" });
    const tunnel = await openTlsTunnel(replayer.port, authority, { ca: replayer.caCertPem });
    tunnel.write(`POST /pkg.Svc/Call HTTP/1.1\r\nHost: ${authority}\r\nContent-Type: application/grpc\r\nTE: trailers\r\nAuthorization: ${again.authorization}\r\nContent-Length: 5\r\nConnection: close\r\n\r\n`);
    tunnel.write(Buffer.from([0, 0, 0, 0, 0]));
    await tunnel.closed;
    const raw = tunnel.pending();
    expect(raw).toMatch(/^HTTP\/1\.1 200 /);
    expect(raw).toMatch(/transfer-encoding: chunked/i);
    expect(raw).toMatch(/\r\n0\r\ngrpc-status: 7\r\ngrpc-message: denied by upstream\r\nx-echo: token=\[REDACTED:GH_TOKEN\]\r\n\r\n$/i);
  });

  // Black-box finding (eighteenth session): a replayed Trailers-Only answer went out as a head and
  // then an empty DATA frame ending the stream, and grpc-js failed the call INTERNAL "Call ended
  // without gRPC status" instead of the recorded NOT_FOUND.
  it("a gRPC Trailers-Only answer (grpc-status in a head that ends the stream) is replayed as one, as it passed live", async () => {
    const har = join(tempDir(), "run.har");
    const upstream = await startH2Upstream({
      "/pkg.Svc/Missing": (stream) => {
        stream.respond({ ":status": 200, "content-type": "application/grpc", "grpc-status": "5", "grpc-message": "no such thing" }, { endStream: true });
      },
    });
    const authority = `api.test:${upstream.port}`;
    const call = { ":method": "POST", ":path": "/pkg.Svc/Missing", "content-type": "application/grpc", te: "trailers" };
    /** The answer's head, and whether the HEADERS frame carrying it ended the stream. */
    const headOf = async (proxy: TestProxy): Promise<{ head: Record<string, unknown>; endsStream: boolean; body: number }> => {
      const session = await h2Session(proxy.port, authority, proxy.caCertPem);
      return await new Promise((resolve, reject) => {
        const stream = session.request(call);
        let answer: { head: Record<string, unknown>; endsStream: boolean } | undefined;
        let body = 0;
        stream.on("response", (head, flags) => (answer = { head: { ...head }, endsStream: (flags & 0x1) !== 0 }));
        stream.on("data", (chunk: Buffer) => (body += chunk.length));
        stream.on("error", reject);
        stream.on("close", () => (answer === undefined ? reject(new Error(`no answer (code ${stream.rstCode})`)) : resolve({ ...answer, body })));
        stream.end(Buffer.from([0, 0, 0, 0, 0]));
      });
    };
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    const live = await headOf(recorder);
    expect(live).toMatchObject({ endsStream: true, body: 0, head: { ":status": 200, "grpc-status": "5", "grpc-message": "no such thing" } });
    await recorder.close();

    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
    const again = await headOf(replayer);
    expect(again).toMatchObject({ endsStream: true, body: 0, head: { ":status": 200, "grpc-status": "5", "grpc-message": "no such thing" } });
    // An HTTP/1.1 guest gets the same head and no body, as it does live.
    const viaH1 = await fetchVia(replayer, `https://${authority}/pkg.Svc/Missing`, { method: "POST", headers: { "content-type": "application/grpc" }, body: Buffer.from([0, 0, 0, 0, 0]) });
    expect(viaH1).toMatchObject({ status: 200, text: "", headers: { "grpc-status": "5" } });
    // The proxy serves on: a normal stream after it still gets its recorded answer.
    expect((await headOf(replayer)).head["grpc-status"]).toBe("5");
  });

  it("an HTTP/1.1 chunked upstream's trailer section is recorded and replayed; a file whose trailer cannot be sent is refused", async () => {
    const har = join(tempDir(), "run.har");
    const upstream = await startUpstream({
      routes: {
        "/sum": (_req, res) => {
          res.writeHead(200, { "content-type": "text/plain", trailer: "x-checksum" });
          res.write("chunked body");
          res.addTrailers({ "x-checksum": "h1-sum" });
          res.end();
        },
      },
    });
    const url = `https://api.test:${upstream.port}/sum`;
    const recorder = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { record: { path: har } } });
    expect((await fetchVia(recorder, url)).text).toBe("chunked body");
    await recorder.close();
    const recorded = readHar(har);
    expect(recorded.log.entries[0]!.response._trailers).toEqual([{ name: "x-checksum", value: "h1-sum" }]);
    const replayer = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } });
    const res = await h2Request(await h2Session(replayer.port, `api.test:${upstream.port}`, replayer.caCertPem), { ":path": "/sum" });
    expect(res.body.toString()).toBe("chunked body");
    expect(res.trailers?.["x-checksum"]).toBe("h1-sum");
    recorded.log.entries[0]!.response._trailers = [{ name: "x-checksum", value: "a\r\nb" }];
    writeFileSync(har, JSON.stringify(recorded));
    await expect(startTestProxy({ allowedInternalHosts: ["api.test"] }, { upstream: { replay: { path: har } } })).rejects.toThrow(/log\.entries\[0\]\.response\._trailers\[0\]: the value of "x-checksum" has a control character/);
  });
});
