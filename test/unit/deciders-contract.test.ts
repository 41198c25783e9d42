import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { MalformedAnswer, opaVerdict, parseAnswerText } from "../../src/deciders/answer.js";
import { DecisionCache, cacheKey } from "../../src/deciders/cache.js";
import { concealFor, documentBody, requestPart, revealNothing, type Conceal, type ConcealTally } from "../../src/deciders/document.js";
import { resolveDecider } from "../../src/deciders/options.js";
import { splitCommand } from "../../src/deciders/split-command.js";
import { createHttpHooks } from "../../src/index.js";
import { SecretStore } from "../../src/policy/secrets.js";
import { craftedText } from "../helpers/crafted-text.js";
import { tempDir } from "../helpers/proxy.js";

/** The problems resolveDecider reports for `entry`, as [path, reason]. */
function problems(entry: unknown, env: NodeJS.ProcessEnv = {}): [string, string][] {
  const found: [string, string][] = [];
  resolveDecider(entry, env, (reason, segments = []) => found.push([segments.join("."), reason]));
  return found;
}

describe("decider options", () => {
  it("resolves defaults: request phase only, 5 s, fail closed, no body, no cache, concurrency 4, queue 64", () => {
    const resolved = resolveDecider({ command: "./check.sh --strict 'two words'" }, { PATH: "/bin", HOME: "/root" }, () => undefined);
    expect(resolved).toMatchObject({
      kind: "command",
      label: "command:./check.sh",
      argv: ["./check.sh", "--strict", "two words"],
      env: { PATH: "/bin" },
      timeoutMs: 5000,
      failOpen: false,
      includeBody: false,
      maxBodyBytes: 65536,
      cacheMs: 0,
      concurrency: 4,
      queue: 64,
      shell: false,
    });
    expect([...resolved!.phases]).toEqual(["request"]);
  });

  it("reports each bad option at its path", () => {
    expect(problems({ command: [], timeoutMs: 0 })).toEqual([
      ["timeoutMs", "must be an integer from 1 to 600000 (got 0)"],
      ["command", 'must be a list of strings, program first (got [])'],
    ]);
    expect(problems({ webhook: "ftp://x" })).toEqual([["webhook", 'must be an http:// or https:// URL (got "ftp://x")']]);
    expect(problems({ webhook: "http://u:p@x/" })[0]![1]).toMatch(/must not carry credentials/);
    expect(problems({ opa: "http://x/", phases: ["request", "later"] })[0]).toEqual(["phases", 'must be a non-empty list of "request" and "response" (got ["request","later"])']);
    expect(problems({ webhook: "http://x/", includeBody: true, cacheMs: 10 })[0]![0]).toBe("cacheMs");
    expect(problems({ command: ["x"], webhook: "http://x/" })[0]![1]).toMatch(/one entry is one decider/);
    expect(problems({ command: ["x"], timeout: 5 })[0]).toEqual(["timeout", expect.stringContaining('did you mean "timeoutMs"?')]);
    expect(problems({ command: "x 'unterminated" })[0]![1]).toMatch(/unterminated single quote/);
  });

  it("webhook headers read only the environment variables allowEnv lists", () => {
    const env = { HOOK_TOKEN: "t0k", OTHER: "nope" };
    const ok = resolveDecider({ webhook: "http://x/", headers: { Authorization: "Bearer ${HOOK_TOKEN}" }, allowEnv: ["HOOK_TOKEN"] }, env, () => undefined);
    expect(ok).toMatchObject({ headers: { authorization: "Bearer t0k" } });
    expect(problems({ webhook: "http://x/", headers: { authorization: "Bearer ${OTHER}" }, allowEnv: ["HOOK_TOKEN"] }, env)).toEqual([
      ["headers.authorization", "references ${OTHER}, which allowEnv does not list; only variables listed there are read"],
    ]);
    expect(problems({ webhook: "http://x/", headers: { authorization: "${UNSET}" }, allowEnv: ["UNSET"] }, env)[0]![1]).toBe("references $UNSET, which is not set");
    expect(problems({ webhook: "http://x/", headers: { "content-length": "1" } })[0]![1]).toBe("is set by the proxy");
  });

  // Taken as text, `${NAME}` went out percent-encoded (`/$%7BHOOK_PATH%7D`) and every call failed.
  it("${NAME} in a webhook's or OPA's URL is filled in as in headers, for allowEnv names only, and never shown filled", () => {
    const env = { DECIDER_HOST: "127.0.0.9", DECIDER_TOKEN: "t0k-in-query", OTHER: "nope", BAD: "http://x/" };
    const webhook = resolveDecider(
      { webhook: "http://${DECIDER_HOST}:9000/decide?token=${DECIDER_TOKEN}", allowEnv: ["DECIDER_HOST", "DECIDER_TOKEN"] },
      env,
      () => undefined,
    );
    expect(webhook).toMatchObject({ kind: "webhook", written: "http://${DECIDER_HOST}:9000/decide?token=${DECIDER_TOKEN}" });
    expect(webhook?.kind === "webhook" && webhook.url.href).toBe("http://127.0.0.9:9000/decide?token=t0k-in-query");
    // The label is the URL as written, without its query: never what a variable put in it.
    expect(webhook?.label).toBe("webhook:http://${DECIDER_HOST}:9000/decide");
    const opa = resolveDecider({ opa: "http://${DECIDER_HOST}:8181/v1/data/egress", allowEnv: ["DECIDER_HOST"] }, env, () => undefined);
    expect(opa?.kind === "opa" && opa.url.href).toBe("http://127.0.0.9:8181/v1/data/egress");
    // Without references, as before: nothing kept as written.
    expect(resolveDecider({ webhook: "http://x/a?b=1" }, env, () => undefined)).not.toHaveProperty("written");
    expect(problems({ webhook: "http://${OTHER}/decide", allowEnv: ["DECIDER_HOST"] }, env)).toEqual([
      ["webhook", "references ${OTHER}, which allowEnv does not list; only variables listed there are read"],
    ]);
    expect(problems({ opa: "http://${UNSET}/", allowEnv: ["UNSET"] }, env)).toEqual([["opa", "references $UNSET, which is not set"]]);
    // A value that makes no URL, or one with credentials, is refused without being quoted.
    const notUrl = problems({ webhook: "${BAD}${DECIDER_TOKEN}", allowEnv: ["BAD", "DECIDER_TOKEN"] }, { ...env, BAD: "no url " });
    expect(notUrl).toEqual([["webhook", "must be an http:// or https:// URL once its references are filled in (not shown: a variable's value is in it)"]]);
    const credentials = problems({ webhook: "http://${DECIDER_TOKEN}@x/", allowEnv: ["DECIDER_TOKEN"] }, env);
    expect(credentials[0]![1]).toMatch(/must not carry credentials/);
    expect(JSON.stringify([notUrl, credentials])).not.toContain("t0k-in-query");
  });

  it("createHttpHooks refuses a bad decider entry with its path in the chain", () => {
    expect(() => createHttpHooks({ hooks: [{ onRequest: () => undefined }, { webhook: "nope" }] })).toThrow(
      expect.objectContaining({ code: "EG_INVALID_OPTION", path: "hooks[1].webhook" }),
    );
    expect(() => createHttpHooks({ hooks: [{ command: ["x"], concurrency: 0 }] })).toThrow(expect.objectContaining({ path: "hooks[0].concurrency" }));
  });

  // The CLI and the config file refuse a program that cannot be started when they load it;
  // createHttpHooks took it, and every request it was asked about got 502 "could not start:
  // ENOENT" (an embedding hunt).
  it("createHttpHooks refuses a command decider whose program cannot be started, naming the entry, as the config file does", () => {
    const dir = tempDir();
    const bin = join(dir, "bin");
    mkdirSync(bin);
    writeFileSync(join(bin, "decide"), "#!/bin/sh\nexit 0\n", { mode: 0o755 });
    writeFileSync(join(dir, "plain.sh"), "#!/bin/sh\nexit 0\n", { mode: 0o644 });
    vi.stubEnv("PATH", bin);
    vi.stubEnv("HOME", dir);
    onTestFinished(() => {
      vi.unstubAllEnvs();
    });
    const refused = (command: string | string[], index = 0) => {
      let thrown: unknown;
      try {
        createHttpHooks({ hooks: [...Array.from({ length: index }, () => ({ onRequest: () => undefined })), { command }] });
      } catch (error) {
        thrown = error;
      }
      expect(thrown, String(command)).toMatchObject({ name: "OptionError", code: "EG_INVALID_OPTION", path: `hooks[${index}].command` });
      return (thrown as Error).message;
    };
    expect(refused(["/nonexistent/decider", "--strict"])).toBe("createHttpHooks: hooks[0].command names /nonexistent/decider, which does not exist");
    expect(refused("~/missing.sh", 1)).toBe(`createHttpHooks: hooks[1].command names ${join(dir, "missing.sh")}, which does not exist`);
    expect(refused([join(dir, "plain.sh")])).toMatch(new RegExp(`^createHttpHooks: hooks\\[0\\]\\.command names ${join(dir, "plain.sh")}, which is not executable: make it so \\(chmod \\+x\\)`));
    expect(refused([bin])).toBe(`createHttpHooks: hooks[0].command names ${bin}, which is not a file`);
    expect(refused("no-such-decider-program --strict")).toBe(
      `createHttpHooks: hooks[0].command names the program "no-such-decider-program", which is not an executable file in any folder of PATH (PATH is ${JSON.stringify(bin)}): install it, or give its path`,
    );
    // What can be started is taken: a bare name in PATH, a path, ~/ under $HOME, and a shell script
    // (the shell's to run, not looked into).
    writeFileSync(join(dir, "home.sh"), "#!/bin/sh\nexit 0\n", { mode: 0o755 });
    for (const command of ["decide --strict", [join(bin, "decide")], "~/home.sh", "no-such-decider-program || true"]) {
      expect(() => createHttpHooks({ hooks: [{ command, ...(command === "no-such-decider-program || true" ? { shell: true } : {}) }] }), String(command)).not.toThrow();
    }
  });

  it("shell: true keeps the command as one script, quotes and all", () => {
    expect(resolveDecider({ command: "jq -e '.a | .b' >/dev/null", shell: true }, {}, () => undefined)).toMatchObject({ argv: ["jq -e '.a | .b' >/dev/null"] });
  });

  it("splitCommand splits words like a shell without expanding anything", () => {
    expect(splitCommand(`a "b c" 'd $e' f\\ g "h\\"i" $HOME`)).toEqual({ argv: ["a", "b c", "d $e", "f g", 'h"i', "$HOME"] });
    expect(splitCommand("  ")).toEqual({ argv: [] });
    expect(splitCommand('a "b')).toEqual({ error: "has an unterminated double quote" });
  });
});

describe("the answer contract", () => {
  it("nothing or an allow allows; a block has a status of 400-599 (default 403); a rewrite sets and removes headers", () => {
    expect(parseAnswerText("", "request")).toEqual({ decision: "allow" });
    expect(parseAnswerText(' {"decision":"allow"}\n', "request")).toEqual({ decision: "allow" });
    expect(parseAnswerText('{"decision":"block"}', "request")).toEqual({ decision: "block", status: 403, reason: "" });
    expect(parseAnswerText('{"decision":"block","reason":"no","status":451}', "response")).toEqual({ decision: "block", status: 451, reason: "no" });
    expect(parseAnswerText('{"decision":"allow","set_headers":{"X-A":"1"},"remove_headers":["X-B"]}', "request")).toEqual({
      decision: "rewrite",
      setHeaders: [["x-a", "1"]],
      removeHeaders: ["x-b"],
    });
  });

  it("anything else is malformed", () => {
    const bad = [
      "not json",
      "[]",
      '{"decision":"maybe"}',
      '{"decision":"block","status":200}',
      '{"decision":"block","status":"403"}',
      '{"decision":"allow","set_headers":{"x":1}}',
      '{"decision":"allow","set_headers":{"host":"evil.test"}}',
      '{"decision":"allow","set_headers":{"content-length":"0"}}',
      '{"decision":"allow","set_headers":{"x":"a\\r\\nb"}}',
      '{"decision":"allow","remove_headers":"x"}',
      '{"decision":"block","set_headers":{"x":"1"}}',
      '{"decision":"allow","extra":1}',
      // A decision that is there must be one of the two (null allowed, black-box finding), and a
      // reason or a status says the answer meant to refuse.
      '{"decision":null,"reason":"must not pass"}',
      '{"decision":null}',
      '{"decision":false}',
      '{"decision":"ALLOW"}',
      '{"reason":"must not pass"}',
      '{"decision":"allow","reason":"fine"}',
      '{"status":403}',
      '{"decision":"allow","status":null}',
    ];
    for (const text of bad) expect(() => parseAnswerText(text, "request"), text).toThrow(MalformedAnswer);
    // A rewrite is for requests only.
    expect(() => parseAnswerText('{"set_headers":{"x":"1"}}', "response")).toThrow(/request phase only/);
  });

  it("a reason is cut to its first KiB", () => {
    const verdict = parseAnswerText(JSON.stringify({ decision: "block", reason: "é".repeat(2000) }), "request");
    expect(verdict.decision === "block" && Buffer.byteLength(verdict.reason)).toBe(1024);
  });

  it("OPA: true and {allow: true} allow; false, an undefined result and {allow: false} deny", () => {
    expect(opaVerdict({ result: true }, "request")).toEqual({ decision: "allow" });
    expect(opaVerdict({ result: { allow: true, extra: 1 } }, "request")).toEqual({ decision: "allow" });
    expect(opaVerdict({ result: false }, "request")).toMatchObject({ decision: "block", status: 403 });
    expect(opaVerdict({}, "request")).toMatchObject({ decision: "block", status: 403, reason: expect.stringContaining("no result") });
    expect(opaVerdict({ result: { reason: "r" } }, "request")).toEqual({ decision: "block", status: 403, reason: "r" });
    expect(opaVerdict({ result: { allow: false, status: 429 } }, "request")).toMatchObject({ status: 429 });
    expect(opaVerdict({ result: { allow: true, set_headers: { a: "b" } } }, "request")).toMatchObject({ decision: "rewrite" });
    expect(() => opaVerdict({ result: "yes" }, "request")).toThrow(MalformedAnswer);
    expect(() => opaVerdict({ result: { allow: "yes" } }, "request")).toThrow(MalformedAnswer);
  });
});

describe("the input document", () => {
  it("parses the URL and joins repeated headers, lowercased", () => {
    const part = requestPart("POST", new URL("https://API.test:8443/a/b?x=1&y=2#frag"), ["X-A", "1", "x-a", "2", "Accept", "*/*"], revealNothing);
    expect(part).toEqual({
      method: "POST",
      url: "https://api.test:8443/a/b?x=1&y=2",
      url_parsed: { scheme: "https", host: "api.test", port: 8443, path: "/a/b", query: "x=1&y=2" },
      headers: { "x-a": "1, 2", accept: "*/*" },
    });
    expect(requestPart("GET", new URL("http://[::1]/"), [], revealNothing).url_parsed).toEqual({ scheme: "http", host: "::1", port: 80, path: "/", query: "" });
  });

  it("bodies are text when UTF-8 (a character cut by maxBodyBytes dropped), else base64, and marked when cut", () => {
    expect(documentBody(Buffer.from("héllo"), 100, revealNothing)).toEqual({ encoding: "utf8", data: "héllo", size: 6, truncated: false });
    expect(documentBody(Buffer.from("héllo"), 2, revealNothing)).toEqual({ encoding: "utf8", data: "h", size: 6, truncated: true });
    expect(documentBody(Buffer.from([0xff, 0, 1]), 100, revealNothing)).toEqual({ encoding: "base64", data: "/wAB", size: 3, truncated: false });
  });
});

describe("documentBody: a body cut at maxBodyBytes", () => {
  // The cut can fall inside a value (or an encoded copy): concealed only up to the cut, the part
  // before it was no longer recognised and went to the decider as it was.
  // Shares no four characters with a placeholder, which may itself be left cut at the end.
  const value = "Tok3n-VALUE-abcdef0123456789-xyz";
  const store = new SecretStore({ T: { hosts: ["api.test"], value } }, false, (hosts) => hosts as string[]);
  const conceal = concealFor(store);
  const percent = [...value].map((c) => `%${c.charCodeAt(0).toString(16).padStart(2, "0")}`).join("");
  const forms: Record<string, string> = {
    raw: value,
    base64: Buffer.from(value).toString("base64"),
    "percent-encoded": percent,
    // Decoders chain: JSON escapes of a percent-encoded copy, 18 characters per character.
    "JSON-escaped percent-encoded": [...percent].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`).join(""),
  };
  for (const [form, copy] of Object.entries(forms)) {
    // Every cut position for the short forms; every 7th for the long one.
    const step = copy.length > 200 ? 7 : 1;
    it.each([...Array(Math.ceil((copy.length - 1) / step)).keys()].map((i) => 1 + i * step))(`never leaves a ${form} copy cut after %i characters`, (kept) => {
      const prefix = "padding ".repeat(8);
      for (const binary of [false, true]) {
        const body = Buffer.concat([binary ? Buffer.from([0xff, 0xfe]) : Buffer.alloc(0), Buffer.from(`${prefix}${copy} and more text after it`)]);
        const cut = (binary ? 2 : 0) + prefix.length + kept;
        const doc = documentBody(body, cut, conceal);
        expect(doc.truncated).toBe(true);
        const data = doc.encoding === "base64" ? Buffer.from(doc.data, "base64").toString("latin1") : doc.data;
        expect(Buffer.byteLength(data, doc.encoding === "base64" ? "latin1" : "utf8")).toBeLessThanOrEqual(cut);
        // What is left of the copy must not be a recognisable start of it: at most 3 characters.
        for (let k = 4; k <= copy.length; k++) expect(data.endsWith(copy.slice(0, k)), `${k} characters of the ${form} copy`).toBe(false);
      }
    });
  }
});

describe("documentBody: many values before the cut", () => {
  // Each value mapped out shortens the text (a 1,000-byte value becomes a 66-byte placeholder),
  // pulling what lay past the window that was mapped before the cut: there, a copy the window's
  // end had split was never recognised.
  it("a copy split by the mapped window's end is never pulled before the cut", () => {
    const value = `Tok3n-${"0123456789abcdef".repeat(62)}-end`;
    const store = new SecretStore({ T: { hosts: ["api.test"], value } }, false, (hosts) => hosts as string[]);
    const conceal = concealFor(store);
    const body = Buffer.from(`${value}\n`.repeat(400));
    for (const cut of [5_000, 20_000, 60_000]) {
      const doc = documentBody(body, cut, conceal);
      expect(doc.encoding).toBe("utf8");
      expect(Buffer.byteLength(doc.data)).toBeLessThanOrEqual(cut);
      for (let k = 4; k <= value.length; k++) expect(doc.data.endsWith(value.slice(0, k)), `${k} characters at ${cut}`).toBe(false);
    }
  });
});

describe("documentBody: strings a body holds that only look like what conceal puts in", () => {
  // The window mapped past the cut grew by `reach` for every "EGRESSGATE_SECRET_" or
  // "[REDACTED" in the concealed text, the guest's own included, and was mapped again from
  // byte 0 each time it doubled: a 32 MiB body of "EGRESSGATE_SECRET_ " held the event loop
  // for 9 s. Only what the conceal itself took out of the text may grow the window.
  const value = "S3cr3tValueABCDEFGHIJ0123456789xyz";
  const store = new SecretStore({ T: { hosts: ["api.test"], value } }, false, (hosts) => hosts as string[]);
  const placeholder = store.env()["T"]!;
  /** The store's conceal, counting how often it ran and how many characters it was given. */
  const counting = (): { conceal: Conceal; passes: () => number; scanned: () => number } => {
    const inner = concealFor(store);
    let passes = 0;
    let scanned = 0;
    const conceal: Conceal = Object.assign(
      (text: string, header?: string, tally?: ConcealTally) => {
        passes++;
        scanned += text.length;
        return inner(text, header, tally);
      },
      { reach: () => store.reach() },
    );
    return { conceal, passes: () => passes, scanned: () => scanned };
  };
  const lookAlikes = ["EGRESSGATE_SECRET_ ", `${placeholder} `, "[REDACTED:T] ", "[REDACTED "];
  const named: [string, string][] = [
    ["the placeholders' prefix", lookAlikes[0]!],
    ["the guest's own placeholder", lookAlikes[1]!],
    ["a redaction marker", lookAlikes[2]!],
    ["a redaction marker's opening", lookAlikes[3]!],
  ];
  const percent = [...value].map((c) => `%${c.charCodeAt(0).toString(16).padStart(2, "0")}`).join("");
  const copies = [value, Buffer.from(value).toString("base64"), percent];

  it.each(named)("a 2 MiB body that repeats %s is concealed once, over the cut and reach only", (_, fill) => {
    const { conceal, passes, scanned } = counting();
    const cut = 64 * 1024;
    const body = Buffer.alloc(2 * 1024 * 1024, fill);
    const doc = documentBody(body, cut, conceal);
    expect(doc).toMatchObject({ encoding: "utf8", size: body.length, truncated: true });
    expect(doc.data).toBe(body.subarray(0, cut).toString("utf8"));
    expect(passes()).toBe(1);
    expect(scanned()).toBe(cut + store.reach());
  });

  it("values among many look-alikes are still concealed, a copy the cut splits too, and the look-alikes stay as written", () => {
    const { conceal } = counting();
    // Before the cut: look-alikes, each followed by a copy of the value in some encoding (and
    // some prose: packed tighter, the copies make a text too complex to scan, all redacted).
    const unit = (i: number): string => `${lookAlikes[i % lookAlikes.length]!}${copies[i % copies.length]!}\n${"and some prose. ".repeat(8)}`;
    let head = "";
    for (let i = 0; head.length < 24_000; i++) head += unit(i);
    for (const copy of copies) {
      for (const kept of [1, 4, Math.floor(copy.length / 2), copy.length - 1]) {
        const body = Buffer.from(`${head}${copy} ${lookAlikes.join("").repeat(100)}`);
        const doc = documentBody(body, head.length + kept, conceal);
        expect(doc.truncated).toBe(true);
        expect(doc.data).not.toContain(value);
        for (const c of copies) expect(doc.data).not.toContain(c);
        for (let k = 4; k <= copy.length; k++) expect(doc.data.endsWith(copy.slice(0, k)), `${k} characters of ${copy}`).toBe(false);
        expect(doc.data).toContain(`EGRESSGATE_SECRET_ ${placeholder}`);
        expect(doc.data).toContain(`${placeholder} [REDACTED:T]`);
        expect(doc.data).toContain("[REDACTED:T] [REDACTED:T]");
        expect(doc.data).toContain("[REDACTED [REDACTED:T]");
      }
    }
  });
});

describe("SecretStore.placeholdersFor", () => {
  const store = (): SecretStore => new SecretStore({ TOKEN: { hosts: ["api.test"], value: "s3cret-value-1" } }, false, (hosts) => hosts as string[]);

  it("maps a current value back to its placeholder, in Basic credentials too, and redacts a retired one", () => {
    const secrets = store();
    const placeholder = secrets.env()["TOKEN"]!;
    expect(secrets.placeholdersFor("Bearer s3cret-value-1")).toBe(`Bearer ${placeholder}`);
    const basic = `Basic ${Buffer.from("me:s3cret-value-1").toString("base64")}`;
    expect(secrets.placeholdersFor(basic, "Authorization")).toBe(`Basic ${Buffer.from(`me:${placeholder}`).toString("base64")}`);
    // Percent-encoded, it cannot be put back exactly: it is redacted.
    expect(secrets.placeholdersFor("x=s3cret%2Dvalue-1")).toBe("x=[REDACTED:TOKEN]");
    secrets.update("TOKEN", { value: "new-value-22" });
    expect(secrets.placeholdersFor("old s3cret-value-1, new new-value-22")).toBe(`old [REDACTED:TOKEN], new ${placeholder}`);
    expect(secrets.placeholdersFor("nothing here")).toBe("nothing here");
  });

  it("tallies what its replacements took out of the text, in UTF-8 bytes, and nothing for what the text held already", () => {
    const secrets = store();
    const placeholder = secrets.env()["TOKEN"]!;
    const tallied = (text: string): number => {
      const tally: ConcealTally = { shortened: 0 };
      secrets.placeholdersFor(text, undefined, tally);
      return tally.shortened;
    };
    // The value becomes a longer placeholder: nothing is taken out.
    expect(tallied("a s3cret-value-1 b")).toBe(0);
    const percent = encodeURIComponent("s3cret-value-1").replaceAll("-", "%2D");
    expect(tallied(`a ${percent} b ${percent}`)).toBe(2 * (percent.length - "[REDACTED:TOKEN]".length));
    expect(tallied(`${placeholder} [REDACTED:TOKEN] EGRESSGATE_SECRET_ [REDACTED `.repeat(100))).toBe(0);
    // Bytes, not characters: a retired value of 20 two-byte characters is redacted to 12.
    const wide = new SecretStore({ U: { hosts: ["api.test"], value: "ü".repeat(20) } }, false, (hosts) => hosts as string[]);
    wide.update("U", { value: "new-value-22" });
    const tally: ConcealTally = { shortened: 0 };
    expect(wide.placeholdersFor(`a ${"ü".repeat(20)} b`, undefined, tally)).toBe("a [REDACTED:U] b");
    expect(tally.shortened).toBe(40 - "[REDACTED:U]".length);
    // Nothing of a text too complex to scan is left to move: it is one marker.
    const crafted = `${percent} ${craftedText(20_000)}`;
    expect(secrets.placeholdersFor(crafted)).toBe("[REDACTED:UNSCANNED]");
    expect(tallied(crafted)).toBe(0);
  });
});

describe("the decision cache", () => {
  it("keeps allows and blocks until they expire, never rewrites, and drops the oldest past its size", () => {
    let now = 1000;
    const cache = new DecisionCache(50, 2, () => now);
    const key = (path: string): string => cacheKey({ phase: "request", guest: "g", method: "GET", scheme: "https", host: "a", port: 443, path });
    cache.set(key("/a"), { decision: "allow" });
    cache.set(key("/b"), { decision: "block", status: 403, reason: "" });
    cache.set(key("/r"), { decision: "rewrite", setHeaders: [], removeHeaders: [] });
    expect(cache.get(key("/a"))).toEqual({ decision: "allow" });
    expect(cache.get(key("/r"))).toBeUndefined();
    cache.set(key("/c"), { decision: "allow" });
    expect(cache.size).toBe(2);
    expect(cache.get(key("/a"))).toBeUndefined();
    now += 50;
    expect(cache.get(key("/c"))).toBeUndefined();
  });
});
