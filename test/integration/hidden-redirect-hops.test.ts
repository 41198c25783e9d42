import { readdirSync, readFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { createServer } from "node:https";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { djsHooksOptionsFromFile } from "../../src/index.js";
import type { RecordedHar } from "../../src/record/har.js";
import { checkHarFile, formatHarReport } from "../../src/record/har-check.js";
import { json, startDecisionServer } from "../helpers/deciders.js";
import { loadPolicy } from "../helpers/djs.js";
import { fetchVia, startTestProxy, tempDir } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";
import { listenForTest } from "../helpers/upstream.js";

/**
 * An upstream inside a secret's hosts writes the value into a redirect's Location in a form the
 * WHATWG URL parser rewrites: a JSON-escaped `\/` becomes `//`, each `\u0041` becomes `/u0041`,
 * a `?` in the value splits it over the path and the query, a base64 copy written as a scheme or
 * a host is lowercased. Redaction searched the hop's URL as the parser wrote it and no longer
 * recognised the value: it reached the 508 or 502 body, the log, the audit record, an external
 * decider's document and the HAR recording (black-box finding). Each row drives a real upstream
 * through the real proxy with every one of those outputs on, and looks for the value, and for
 * the copy the parser made of it, in all of them.
 */

const jsonEscaped = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
const withQuery = "p@ss word+/=?&|x~VAL2";
const plain = "Sup3rS3cretValue-hidden-7f3a9c1d2e";

interface Row {
  readonly name: string;
  readonly value: string;
  /** The Location the upstream answers `/start` with; `to` is `/loop/` or `/echo/`. */
  readonly location: (to: string) => string;
  /** Rows whose Location is refused (502) rather than followed. */
  readonly refused?: RegExp;
  /** What the parser makes of the value (lowercased, rewritten): looked for too. */
  readonly copy: (location: string) => string;
  /** The hop's host when the Location names another origin (in the secret's hosts too). */
  readonly to?: string;
  /** Pieces of the value that an output quoting only part of the URL held: looked for too. */
  readonly pieces?: readonly string[];
}

const base64 = (text: string): string => Buffer.from(text).toString("base64").replace(/=+$/, "");
const parsedPath = (location: string): string => {
  const url = new URL(location, "https://api.test/");
  return `${url.pathname}${url.search}`.replace(/^\/(loop|echo)\//, "");
};

/** The running upstream's port, for the rows whose Location is absolute. */
let upstreamPort = 0;

const rows: Row[] = [
  { name: "JSON-escaped slashes (\\/)", value: jsonEscaped, location: (to) => `${to}${jsonEscaped.replaceAll("/", "\\/")}`, copy: parsedPath },
  {
    name: "every character as \\uXXXX",
    value: jsonEscaped,
    location: (to) => `${to}${[...jsonEscaped].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`).join("")}`,
    copy: parsedPath,
  },
  {
    name: "JSON-escaped slashes, on another host of the secret",
    value: jsonEscaped,
    location: (to) => `https://OTHER.test:${upstreamPort}${to}${jsonEscaped.replaceAll("/", "\\/")}`,
    copy: parsedPath,
    to: "other.test",
  },
  // The path alone held the part before `?`, the query the rest: neither was recognised.
  { name: "a value holding ?", value: withQuery, location: (to) => `${to}${withQuery}`, copy: parsedPath, pieces: withQuery.split("?") },
  { name: "base64 as the scheme", value: plain, location: () => `${base64(plain)}:x`, refused: /502 Bad Gateway: redirect to an unsupported scheme \(not http: or https:\)/, copy: () => base64(plain).toLowerCase() },
  {
    name: "base64 as the host",
    value: plain,
    location: () => `https://${Buffer.from(plain).toString("base64url")}../x`,
    refused: /redirect from https:\/\/api\.test:\d+ to an invalid host\n$/,
    copy: () => Buffer.from(plain).toString("base64url").toLowerCase(),
  },
];

/** The api.test upstream: `/start/N?to=…` answers row N's Location, `/loop/…` redirects to itself, `/echo/…` answers its own request target. */
async function startUpstream(): Promise<{ port: number; targets: string[] }> {
  const ca = await testCa();
  const contexts = await ca.serverContexts(["api.test", "other.test"]);
  const targets: string[] = [];
  const server = createServer({ SNICallback: (name, cb) => cb(null, contexts.get(name) ?? contexts.get("api.test")!) }, (req: IncomingMessage, res: ServerResponse) => {
    const target = req.url ?? "/";
    targets.push(target);
    req.resume();
    const start = /^\/start\/(\d+)\?to=(loop|echo)$/.exec(target);
    if (start !== null) {
      res.writeHead(302, { location: rows[Number(start[1])]!.location(`/${start[2]}/`) });
      res.end();
    } else if (target.startsWith("/loop/")) {
      res.writeHead(302, { location: target });
      res.end();
    } else {
      res.writeHead(200, { "content-type": "application/json", "content-location": target });
      res.end(JSON.stringify({ url: target }));
    }
  });
  upstreamPort = await listenForTest(server);
  return { port: upstreamPort, targets };
}

/** Lenient percent-decoding, as a reader would: bad escapes stay as they are. */
function percentDecode(text: string): string {
  return text.replace(/(?:%[0-9A-Fa-f]{2})+/g, (run) => Buffer.from(run.replaceAll("%", ""), "hex").toString("latin1"));
}

/** The text as it is, percent-decoded once and twice, with `+` as space, and JSON-unescaped. */
function readings(text: string): string[] {
  const out = new Set<string>();
  for (const base of [text, text.replaceAll("\\/", "/").replaceAll('\\"', '"')]) {
    for (const t of [base, base.replaceAll("+", " ")]) {
      out.add(t);
      out.add(percentDecode(t));
      out.add(percentDecode(percentDecode(t)));
    }
  }
  return [...out].map((t) => t.toLowerCase());
}

function expectNowhere(needles: readonly string[], texts: readonly string[], where: string): void {
  for (const needle of needles) {
    for (const text of texts) {
      for (const reading of readings(text)) {
        if (reading.includes(needle.toLowerCase())) expect.fail(`${where}: ${JSON.stringify(needle)} found in ${JSON.stringify(text.slice(0, 2000))}`);
      }
    }
  }
}

function readAll(dir: string, file: string): string {
  let out = readFileSync(join(dir, file), "latin1");
  try {
    for (const side of readdirSync(join(dir, `${file}.d`))) out += readFileSync(join(dir, `${file}.d`, side), "latin1");
  } catch {
    // no sidecar folder
  }
  return out;
}

describe("a redirect whose Location holds a secret's value in a form the URL parser rewrites", () => {
  it.each(rows.flatMap((row, i) => (row.refused === undefined ? (["loop", "echo"] as const) : (["loop"] as const)).map((to) => [row.name, to, i] as const)))(
    "%s (to /%s/): no output of the proxy holds the value or the parser's copy of it, and the hop goes as the upstream asked",
    async (_name, to, i) => {
      const row = rows[i]!;
      const upstream = await startUpstream();
      const webhook = await startDecisionServer((_doc, _req, res) => json(res, 200, { decision: "allow" }));
      const dir = tempDir();
      const proxy = await startTestProxy(
        {
          allowedInternalHosts: ["api.test", "other.test"],
          secrets: { TOK: { hosts: ["api.test", "other.test"], value: row.value } },
          hooks: [{ webhook: webhook.url, phases: ["request", "response"], includeBody: true }],
        },
        { auditLog: join(dir, "audit.jsonl"), upstream: { record: { path: join(dir, "run.har") } } },
      );
      const origin = `https://api.test:${upstream.port}`;
      const res = await fetchVia(proxy, `${origin}/start/${i}?to=${to}`, { headers: { "x-token": proxy.guestEnv()["TOK"]! } });
      const location = row.location(`/${to}/`);
      const copy = row.copy(location);
      // Where the hop went, and how the 508 names where the last hop came from.
      const hopOrigin = row.to === undefined ? origin : `https://${row.to}:${upstream.port}`;
      const named = row.to === undefined ? origin : "a host it was redirected to at ";
      if (row.refused !== undefined) {
        expect(res.status).toBe(502);
        expect(upstream.targets).toHaveLength(1);
      } else {
        // Sent as the upstream asked, rewritten copy and all.
        const sent = new URL(location, origin);
        expect(upstream.targets[1]).toBe(`${sent.pathname}${sent.search}`);
        if (to === "loop") {
          expect(res.status).toBe(508);
          expect(upstream.targets).toHaveLength(11);
        } else {
          // The guest gets the response as it came (responses are never scrubbed).
          expect(res.status).toBe(200);
          expect(JSON.parse(res.text)).toEqual({ url: upstream.targets[1] });
        }
      }
      await proxy.close();

      const logs = proxy.logs.map((line) => JSON.stringify(line));
      const audit = readFileSync(join(dir, "audit.jsonl"), "utf8");
      const documents = webhook.raw;
      const har = readAll(dir, "run.har");
      const report = formatHarReport(await checkHarFile(join(dir, "run.har")));
      expect(report.text).toContain("secret-looking strings: none");
      expect(report.status, report.text).toBe(0);
      const outputs: [string, string[]][] = [
        ["the guest's answer", row.refused === undefined && to === "echo" ? [] : [res.text]],
        ["the log", logs],
        ["the audit record", [audit]],
        ["a decider's document", documents],
        ["the recording", [har]],
      ];
      for (const [where, texts] of outputs) expectNowhere([row.value, copy, ...(row.pieces ?? [])], texts, `${row.name}, /${to}/: ${where}`);

      // Each output names the hop, redacted, so the checks above look where the copy was.
      if (row.refused !== undefined) expect(res.text).toMatch(row.refused);
      else if (to === "loop") expect(res.text).toBe(`508 Loop Detected: more than 10 redirects, the last from ${named}/[REDACTED:TOK]\n`);
      if (row.refused === undefined) {
        const hops = webhook.received.map((doc) => (doc as { request: { url: string; url_parsed: { path: string; query: string } } }).request).slice(1);
        expect(hops.length).toBeGreaterThan(0);
        for (const hop of hops) {
          expect(hop.url).toBe(`${hopOrigin}/[REDACTED:TOK]`);
          expect(hop.url_parsed).toMatchObject({ path: "/[REDACTED:TOK]", query: "" });
        }
        const entries = (JSON.parse(readFileSync(join(dir, "run.har"), "utf8")) as RecordedHar).log.entries;
        expect(entries.slice(1).map((entry) => entry.request.url)).toEqual(entries.slice(1).map(() => `${hopOrigin}/EGRESSGATE_SECRET{TOK}`));
        expect(entries[0]!.response.redirectURL).toBe(row.to === undefined ? "/EGRESSGATE_SECRET{TOK}" : `https://OTHER.test:${upstream.port}/EGRESSGATE_SECRET{TOK}`);
        if (to === "loop") expect(audit).toContain(`the last from ${named}/[REDACTED:TOK]`);
        else expect(entries[1]!.response.content.text).toBe('{"url":"[REDACTED:TOK]"}');
      } else {
        expect(audit).toMatch(/"reason":"redirect/);
      }
    },
  );

  it("a recording of such a hop replays: the Location and the hop's entry agree on the hop's token", async () => {
    const upstream = await startUpstream();
    const dir = tempDir();
    const har = join(dir, "run.har");
    const hooks = { allowedInternalHosts: ["api.test"], secrets: { TOK: { hosts: ["api.test"], value: jsonEscaped } } };
    const recorder = await startTestProxy(hooks, { upstream: { record: { path: har } } });
    const target = `https://api.test:${upstream.port}/start/0?to=echo`;
    expect((await fetchVia(recorder, target)).status).toBe(200);
    await recorder.close();
    const hits = upstream.targets.length;
    const replayer = await startTestProxy(hooks, { upstream: { replay: { path: har } } });
    const again = await fetchVia(replayer, target);
    expect(again.status, again.text).toBe(200);
    expect(again.text).toBe('{"url":"[REDACTED:TOK]"}');
    expect(upstream.targets).toHaveLength(hits);
  });

  it("the shipped audit-log.mjs policy logs a hidden hop's path as the redaction", async () => {
    const upstream = await startUpstream();
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      secrets: { TOK: { hosts: ["api.test"], value: jsonEscaped } },
      djsHooks: loadPolicy(djsHooksOptionsFromFile(fileURLToPath(new URL("../../policies/audit-log.mjs", import.meta.url)))),
    });
    expect((await fetchVia(proxy, `https://api.test:${upstream.port}/start/0?to=echo`)).status).toBe(200);
    const lines = proxy.logs.filter((line) => line["msg"] === "policy console").map((line) => line["text"]);
    expect(lines).toEqual([`audit GET api.test:${upstream.port}[REDACTED:TOK] -> 200`]);
    expectNowhere([jsonEscaped, parsedPath(rows[0]!.location("/echo/"))], proxy.logs.map((line) => JSON.stringify(line)), "the log");
  });

  it("a guest's own URL holding a value with ? reaches a decider redacted whole, not split into two unrecognised halves", async () => {
    const upstream = await startUpstream();
    const webhook = await startDecisionServer((_doc, _req, res) => json(res, 200, { decision: "allow" }));
    const proxy = await startTestProxy({
      allowedInternalHosts: ["api.test"],
      secrets: { TOK: { hosts: ["api.test"], value: withQuery } },
      hooks: [{ webhook: webhook.url }],
    });
    const res = await fetchVia(proxy, `https://api.test:${upstream.port}/echo/${withQuery.replace(" ", "%20")}`);
    expect(res.status).toBe(200);
    const hop = (webhook.received[0] as { request: { url: string; url_parsed: { path: string; query: string } } }).request;
    expect(hop.url_parsed).toMatchObject({ path: "/echo/[REDACTED:TOK]", query: "" });
    expect(hop.url).toBe(`https://api.test:${upstream.port}/echo/[REDACTED:TOK]`);
    expectNowhere([withQuery, "p@ss%20word+/=", "&|x~VAL2"], webhook.raw, "decider document");
  });
});
