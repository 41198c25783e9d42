import { execFileSync } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { LineCounter, parseDocument, type YAMLMap } from "yaml";
import { loadConfigFile, reuseParses, withLines } from "../../src/config/file.js";
import { invalidConfigCode, makeIssue } from "../../src/config/option-error.js";
import { tempDir } from "../helpers/proxy.js";
import { fileErrorOf } from "../helpers/config-file.js";

/** Writes `text` as a config file in a fresh folder; returns its path. */
function configFile(text: string, name = "egressgate.yaml"): string {
  const file = join(tempDir("egressgate-config-"), name);
  writeFileSync(file, text);
  return file;
}


const twoGuests = `# two guests
listen: 0.0.0.0:3128
caDir: ca
guestEnvFile: guest.env
guests:
  ci:
    allowHosts: [api.github.com, "*.npmjs.org"]
    secrets:
      GH_TOKEN:
        hosts: [api.github.com]
        value: env:CI_GH_TOKEN
    hooksScript: policies/ci.ts
    hooksTimeoutMs: 250
  agent:
    allowHosts: [api.openai.com]
    resolve: { api.openai.com: [127.0.0.5] }
    sources: [10.88.0.2/32]
    secrets:
      OPENAI_KEY:
        hosts: [api.openai.com]
        value: file:secrets/openai
`;

describe("loadConfigFile: a valid file", () => {
  it("resolves two guests: env: and file: values read, relative paths from the file's folder", () => {
    const file = configFile(twoGuests);
    const dir = join(file, "..");
    mkdirSync(join(dir, "policies"));
    writeFileSync(join(dir, "policies", "ci.ts"), "export function isRequestAllowed() { return true; }\n");
    mkdirSync(join(dir, "secrets"));
    // One trailing newline, as editors and echo write it, is no part of the value.
    writeFileSync(join(dir, "secrets", "openai"), "sk-from-file\n");
    const config = loadConfigFile(file, { CI_GH_TOKEN: "ghp_from_env" });
    expect(config.single).toBe(false);
    expect(config.source).toBe(file);
    expect(config.proxy.listen).toEqual({ host: "0.0.0.0", port: 3128 });
    expect(config.proxy.caDir).toBe(join(dir, "ca"));
    expect(config.proxy.guestEnvFile).toBe(join(dir, "guest.env"));
    expect(config.workers).toBe(1);
    expect(Object.keys(config.guests)).toEqual(["ci", "agent"]);
    const ci = config.guests["ci"]!;
    expect(ci.allowHosts).toEqual(["api.github.com", "*.npmjs.org"]);
    expect(ci.secrets?.["GH_TOKEN"]).toEqual({ hosts: ["api.github.com"], value: "ghp_from_env", from: "env:CI_GH_TOKEN" });
    expect(ci.hooksScript).toEqual([join(dir, "policies", "ci.ts")]);
    expect(ci.hooksTimeoutMs).toBe(250);
    const agent = config.guests["agent"]!;
    expect(agent.secrets?.["OPENAI_KEY"]?.value).toBe("sk-from-file");
    expect(agent.secrets?.["OPENAI_KEY"]?.from).toBe(`file:${join(dir, "secrets", "openai")}`);
    expect(agent.resolve).toEqual({ "api.openai.com": ["127.0.0.5"] });
    expect(agent.sources).toEqual(["10.88.0.2/32"]);
  });

  it("top-level guest keys describe the one guest named default, and resolve stays proxy-wide", () => {
    const config = loadConfigFile(configFile("allowHosts: [api.test]\nauth: true\nresolve: { api.test: [127.0.0.1] }\n"), {});
    expect(config.single).toBe(true);
    expect(config.guests).toEqual({ default: { allowHosts: ["api.test"] } });
    expect(config.proxy.auth).toBe(true);
    expect(config.proxy.resolve).toEqual({ "api.test": ["127.0.0.1"] });
  });

  it("an empty file is the default configuration: one deny-all guest", () => {
    const config = loadConfigFile(configFile("# nothing yet\n"), {});
    expect(config.single).toBe(true);
    expect(config.guests).toEqual({ default: {} });
    expect(config.proxy).toEqual({});
  });

  // YAML hands `~/ca` over as it is: taken as relative, it made a folder named `~` next to the
  // file (black-box finding). A shell would have expanded it, so the file does.
  it("a path starting with ~/ is under $HOME, wherever it is a path", () => {
    const home = tempDir("egressgate-home-");
    mkdirSync(join(home, "policies"));
    writeFileSync(join(home, "policies", "p.mjs"), "export function onRequest() {}\n");
    writeFileSync(join(home, "token"), "tok-from-home\n");
    writeFileSync(join(home, "check.sh"), "#!/bin/sh\nexit 0\n", { mode: 0o755 });
    const file = configFile(
      [
        "caDir: ~/ca",
        "guestEnvFile: ~/guest.env",
        "auditLog: ~/audit.log",
        "allowHosts: [api.test]",
        "secrets: { T: { hosts: [api.test], value: 'file:~/token' } }",
        "hooks:",
        "  - script: ~/policies/p.mjs",
        "  - command: [~/check.sh]",
      ].join("\n"),
    );
    const config = loadConfigFile(file, { HOME: home });
    expect(config.proxy).toMatchObject({ caDir: join(home, "ca"), guestEnvFile: join(home, "guest.env"), auditLog: join(home, "audit.log") });
    const guest = config.guests["default"]!;
    expect(guest.secrets?.["T"]).toMatchObject({ value: "tok-from-home", from: `file:${join(home, "token")}` });
    expect(guest.hooks?.[0]).toEqual({ kind: "script", path: join(home, "policies", "p.mjs") });
    expect(guest.hooks?.[1]).toMatchObject({ decider: { argv: [join(home, "check.sh")], label: "command:~/check.sh" } });
    // A ~ anywhere else is a character of the name, as in a shell.
    const tilde = configFile("caDir: ca~/x");
    expect(loadConfigFile(tilde, { HOME: home }).proxy.caDir).toBe(join(tilde, "..", "ca~", "x"));
  });

  it("a path starting with ~user is refused with its path and line: whose home that is is the system's to say", () => {
    const file = configFile(["caDir: ~bob/ca", "allowHosts: [api.test]", "secrets: { T: { hosts: [api.test], value: 'file:~bob/token' } }", "hooksScript: ~root/p.mjs"].join("\n"));
    const error = fileErrorOf(file, { HOME: "/home/me" });
    expect(error.issues.map((issue) => [issue.path, issue.line, issue.reason])).toEqual([
      ["caDir", 1, 'starts with "~bob", which is not expanded: only ~ and ~/ are (the home folder, $HOME); write the folder out'],
      ["hooksScript", 4, 'starts with "~root", which is not expanded: only ~ and ~/ are (the home folder, $HOME); write the folder out'],
      ["secrets.T.value", 3, 'starts with "~bob", which is not expanded: only ~ and ~/ are (the home folder, $HOME); write the folder out'],
    ]);
  });

  it("JSON is accepted as it is", () => {
    const json = JSON.stringify({ listen: "127.0.0.1:0", guests: { ci: { allowHosts: ["api.test"], secrets: { T: { hosts: ["api.test"], value: "env:T" } } } } });
    const config = loadConfigFile(configFile(json, "egressgate.json"), { T: "tok" });
    expect(config.proxy.listen).toEqual({ host: "127.0.0.1", port: 0 });
    expect(config.guests["ci"]?.secrets?.["T"]?.value).toBe("tok");
  });
});

describe("reuseParses", () => {
  it("within one reload, the same file is parsed once; outside it, and for other text, anew", () => {
    const file = configFile("allowHosts: [a.test]\n");
    const env = {};
    const outside = loadConfigFile(file, env);
    expect(loadConfigFile(file, env)).not.toBe(outside);
    const stop = reuseParses();
    try {
      const first = loadConfigFile(file, env);
      expect(loadConfigFile(file, env)).toBe(first);
      // Another environment object (env: values may differ) or other text: parsed again.
      expect(loadConfigFile(file, {})).not.toBe(first);
      writeFileSync(file, "allowHosts: [b.test]\n");
      expect(loadConfigFile(file, env)).not.toBe(first);
    } finally {
      stop();
    }
    expect(loadConfigFile(file, env)).not.toBe(loadConfigFile(file, env));
  });
});

describe("loadConfigFile: errors name the path and the line", () => {
  it("an unknown key names its path, its line and the key it was likely meant to be", () => {
    const file = configFile("guests:\n  ci:\n    allowHosts: [a.test]\n    allowInternalHost: [db.test]\n");
    const error = fileErrorOf(file);
    expect(error.code).toBe(invalidConfigCode);
    expect(error.path).toBe("guests.ci.allowInternalHost");
    expect(error.line).toBe(4);
    expect(error.message).toBe(
      `${file}:4: unknown option "guests.ci.allowInternalHost"; did you mean "allowInternalHosts"? (known: ${[
        "allowHosts, allowInternalHosts, blockInternalRanges, secrets, replaceSecretsInQuery, secretRedirects, followRedirectsTo",
        "hooksScript, hooksTimeoutMs, hooks, resolve, sources",
      ].join(", ")})`,
    );
  });

  it("every problem in the file is reported at once, each on its own line", () => {
    const file = configFile(["workers: 0", "listen: nowhere", "guests:", "  ci:", "    allowHosts:", "      - ok.test", "      - https://bad.test"].join("\n"));
    const error = fileErrorOf(file);
    expect(error.issues.map((i) => [i.path, i.line])).toEqual([
      ["workers", 1],
      ["listen", 2],
      ["guests.ci.allowHosts[1]", 7],
    ]);
    expect(error.message).toMatch(/3 problems/);
    expect(error.message).toContain(`${file}:7: guests.ci.allowHosts[1] is not a host pattern`);
  });

  it("a missing required key points at the map it belongs in", () => {
    const error = fileErrorOf(configFile("secrets:\n  TOKEN:\n    value: env:TOKEN\n"), { TOKEN: "x" });
    expect([error.path, error.line]).toEqual(["secrets.TOKEN.hosts", 3]);
  });

  it("an inline secret value is refused, and neither the message nor the issues hold it", () => {
    const error = fileErrorOf(configFile("secrets:\n  GH_TOKEN:\n    hosts: [api.github.com]\n    value: ghp_inline_literal_0123456789\n"));
    expect([error.path, error.line]).toEqual(["secrets.GH_TOKEN.value", 4]);
    expect(error.message).toMatch(/never the value itself/);
    expect(JSON.stringify({ message: error.message, issues: error.issues })).not.toContain("ghp_inline_literal");
  });

  it("an env: source whose variable is not set, and a file: source that cannot be read, are named with their lines", () => {
    const text = "guests:\n  ci:\n    secrets:\n      A: { hosts: [a.test], value: env:NOT_SET_HERE }\n      B: { hosts: [b.test], value: file:missing.txt }\n";
    const error = fileErrorOf(configFile(text));
    expect(error.issues.map((i) => [i.path, i.line])).toEqual([
      ["guests.ci.secrets.A.value", 4],
      ["guests.ci.secrets.B.value", 5],
    ]);
    expect(error.issues[0]!.reason).toMatch(/names \$NOT_SET_HERE, which is not set/);
    expect(error.issues[1]!.reason).toMatch(/cannot read .*missing\.txt: ENOENT/);
  });

  it("a file: value with a line break inside, or empty, is refused without quoting it", () => {
    const file = configFile("secrets:\n  A: { hosts: [a.test], value: file:a }\n  B: { hosts: [b.test], value: file:b }\n");
    writeFileSync(join(file, "..", "a"), "first-part\nsecond-part\n");
    writeFileSync(join(file, "..", "b"), "\n");
    const error = fileErrorOf(file);
    expect(error.issues.map((i) => i.reason)).toEqual([expect.stringMatching(/line break or NUL/), expect.stringMatching(/is empty/)]);
    expect(error.message).not.toContain("first-part");
  });

  it("an env: or file: value with a control character other than tab (ESC, DEL) is refused naming the path, never quoted; a tab is taken", () => {
    const file = configFile("secrets:\n  A: { hosts: [a.test], value: env:ESC_VALUE }\n  B: { hosts: [b.test], value: file:b }\n  C: { hosts: [c.test], value: env:TAB_VALUE }\n");
    writeFileSync(join(file, "..", "b"), "before-del\x7fafter\n");
    const error = fileErrorOf(file, { ESC_VALUE: "before-esc\x1bafter", TAB_VALUE: "tab\tvalue" });
    expect(error.issues.map((i) => [i.path, i.line])).toEqual([
      ["secrets.A.value", 2],
      ["secrets.B.value", 3],
    ]);
    expect(error.issues.map((i) => i.reason)).toEqual([
      "holds a control character other than tab (ESC, DEL, U+0001 to U+001F) (from env:ESC_VALUE); a header field cannot carry one",
      expect.stringMatching(/^holds a control character other than tab .*\(from file:.*b\); a header field cannot carry one$/),
    ]);
    expect(error.message).not.toContain("before-");
  });

  it("a hooksScript or upstreamCa that does not exist is found before anything starts", () => {
    const error = fileErrorOf(configFile("upstreamCa: [missing-ca.pem]\nhooksScript: missing-policy.ts\n"));
    expect(error.issues.map((i) => [i.path, i.line])).toEqual([
      ["upstreamCa[0]", 1],
      ["hooksScript", 2],
    ]);
  });

  it("YAML 1.2: yes is a string, not a boolean", () => {
    const error = fileErrorOf(configFile("blockInternalRanges: yes\n"));
    expect(error.issues[0]?.reason).toBe('must be true or false (got "yes")');
  });

  // Read as YAML's core schema types them, these keys were renamed: the guest 0012 was served
  // as "12", and the credentials for 0012 got 407 (black-box finding).
  it.each([
    ["0012", "0012"],
    ["007", "007"],
    ["1.0", "1.0"],
    ["0o17", "0o17"],
    ["0x1f", "0x1f"],
    ["1e3", "1e3"],
    ["true", "true"],
    ["null", "null"],
    ['"0012"', "0012"],
    ["'007'", "007"],
    ["12", "12"],
  ])("a guest key written %s names the guest %s", (written, name) => {
    const config = loadConfigFile(configFile(`guests:\n  ${written}:\n    allowHosts: [a.test]\n`), {});
    expect(Object.keys(config.guests)).toEqual([name]);
  });

  it("resolve hosts and secret names keep their spelling too", () => {
    const config = loadConfigFile(configFile("resolve: { 1.10: [127.0.0.5], 0010: [127.0.0.6] }\nsecrets:\n  TRUE: { hosts: [a.test], value: env:T }\n"), { T: "value" });
    expect(Object.keys(config.proxy.resolve ?? {}).sort()).toEqual(["0010", "1.10"]);
    expect(Object.keys(config.guests["default"]!.secrets ?? {})).toEqual(["TRUE"]);
  });

  it("keys are compared as written: 12 and 012 are two guests, 12 and \"12\" one given twice", () => {
    expect(Object.keys(loadConfigFile(configFile("guests:\n  12: {}\n  012: {}\n"), {}).guests)).toEqual(["12", "012"]);
    const twice = fileErrorOf(configFile('guests:\n  12: {}\n  "12": {}\n'));
    expect(twice.line).toBe(3);
    expect(twice.message).toMatch(/:3: guests\.12 is given twice in one mapping \(first at line 2\)/);
  });

  // buildStaticHosts keys a name without its case and final dot: `A.test.` after `a.test` in one
  // map replaced its addresses without a word (the flags' `--resolve a.test=… --resolve A.test=…` too).
  it("two spellings of one host in one resolve map are refused; a guest's resolve still overrides the top level's", () => {
    const top = fileErrorOf(configFile("resolve:\n  a.test: [127.0.0.2]\n  A.test.: [127.0.0.3]\n"));
    expect(top.line).toBe(3);
    expect(top.message).toMatch(/:3: resolve\.A\.test\.: names the same hostname as "a\.test"; give it once, with all its values$/);
    const guest = fileErrorOf(configFile("guests:\n  g:\n    resolve: { API.test: [127.0.0.2], api.test: [127.0.0.3] }\n"));
    expect(guest.message).toMatch(/:3: guests\.g\.resolve\.api\.test: names the same hostname as "API\.test"/);
    const over = loadConfigFile(configFile("resolve: { a.test: [127.0.0.2] }\nguests:\n  g:\n    resolve: { A.test: [127.0.0.3] }\n"), {});
    expect(over.guests["g"]!.resolve).toEqual({ "A.test": ["127.0.0.3"] });
  });

  it("a syntax error and a duplicate key are reported with their lines", () => {
    expect(fileErrorOf(configFile("listen: 127.0.0.1:0\nguests: ci: {}\nworkers: 1\n")).message).toMatch(/:2: not valid YAML/);
    const duplicate = fileErrorOf(configFile("workers: 1\nworkers: 2\n"));
    expect(duplicate.line).toBe(2);
    expect(duplicate.message).toMatch(/:2: workers is given twice in one mapping \(first at line 1\): a key may appear once, as the second would replace the first without a word$/);
  });

  it("a key repeated in any mapping is found, whatever its quoting, in block and flow style alike", () => {
    const issues = fileErrorOf(configFile("a: 1\n'a': 2\n\"\\x61\": 3\nresolve: { h.test: [127.0.0.5], 'h.test': [127.0.0.6] }\nguests:\n  - x: 1\n    x: 2\n? b\n: 1\n&anchor b: 2\n")).issues;
    const twice = (where: string): string => `is given twice in one mapping (first at ${where}): a key may appear once, as the second would replace the first without a word`;
    expect(issues.map((issue) => [issue.line, issue.path, issue.reason])).toEqual([
      [2, "a", twice("line 1")],
      [3, "a", twice("line 1")],
      [4, "resolve.h.test", twice("line 4, column 12; this one at column 33")],
      [7, "guests[0].x", twice("line 6")],
      [10, "b", twice("line 8")],
    ]);
    // Keys that only read alike are not repeats: 1.0 and 1.00, 0x1f and 31.
    expect(Object.keys(loadConfigFile(configFile("guests: { 1.0: {}, 1.00: {}, 0x1f: {}, 31: {} }\n"), {}).guests).sort()).toEqual(["1.0", "1.00", "0x1f", "31"].sort());
  });

  // Duplicate keys were found by the YAML library comparing each key with every key before it:
  // 40,000 resolve entries (1 MB) took 11 s to parse, a request during SIGHUP waited 14 s, and a
  // 3.9 MB file did not finish check-config in a minute. No timing is asserted here; before the
  // fix these two parses ran past the test's timeout (figures in docs/reliability.md).
  it("a mapping of 40,000 keys parses, and a key repeated at its end is still found", () => {
    const entries = Array.from({ length: 40_000 }, (_, i) => `  h${i}.test: [127.0.0.5]\n`).join("");
    const config = loadConfigFile(configFile(`resolve:\n${entries}`), {});
    expect(Object.keys(config.proxy.resolve ?? {})).toHaveLength(40_000);
    const repeated = fileErrorOf(configFile(`resolve:\n${entries}  "h0.test": [127.0.0.6]\n`));
    expect(repeated.issues.map((issue) => [issue.line, issue.path, issue.reason])).toEqual([[40_002, "resolve.h0.test", expect.stringMatching(/^is given twice in one mapping \(first at line 2\)/)]]);
  });

  // JSON is read as YAML, which has no duplicate keys either; the refusal said only "not valid
  // YAML: Map keys must be unique" and a line, and a JSON file is often one line (carried from
  // an earlier session). It names the key by its path, and on one line the columns.
  it("a key given twice in a one-line JSON file is refused naming its path and both columns, with every other repeat", () => {
    const json = JSON.stringify({ guests: { ci: { allowHosts: ["a.test"] } }, listen: "127.0.0.1:0" }).replace('["a.test"]', '["a.test"],"allowHosts":["b.test"]').replace(/}$/, ',"listen":"127.0.0.1:1"}');
    const error = fileErrorOf(configFile(json, "egressgate.json"));
    expect(error.issues.map((issue) => [issue.line, issue.path])).toEqual([
      [1, "guests.ci.allowHosts"],
      [1, "listen"],
    ]);
    expect(error.message).toContain(`egressgate.json:1: guests.ci.allowHosts is given twice in one mapping (first at line 1, column ${json.indexOf("allowHosts")}; this one at column ${json.lastIndexOf("allowHosts")})`);
    expect(error.message).toContain(`egressgate.json:1: listen is given twice in one mapping (first at line 1, column ${json.indexOf('"listen"') + 1}; this one at column ${json.lastIndexOf('"listen"') + 1})`);
  });

  // Each problem's line was found by walking its mapping's keys, and each unknown key carried an
  // edit distance to every known key and the list of them: 64,000 unknown keys took 227 s, past
  // a reload's parse thread's deadline and then on the event loop, and 150,000 made a 68 MB
  // message (figures in docs/reliability.md).
  it("a file of 20,000 unknown keys lists 100 problems with their lines, and counts the rest", () => {
    const keys = Array.from({ length: 20_000 }, (_, i) => `zz${i}: 1\n`).join("");
    const error = fileErrorOf(configFile(`allowHosts: [a.test]\n${keys}`));
    expect(error.issues).toHaveLength(20_000);
    expect(error.issues.every((issue, i) => issue.line === i + 2 && issue.path === `zz${i}`)).toBe(true);
    const lines = error.message.split("\n");
    expect(lines).toHaveLength(102);
    expect(lines[0]).toMatch(/egressgate\.yaml: 20000 problems$/);
    expect(lines[1]).toMatch(/egressgate\.yaml:2: unknown option "zz0" \(known: listen, /);
    expect(lines[100]).toMatch(/egressgate\.yaml:101: unknown option "zz99" \(known: /);
    expect(lines[101]).toMatch(/egressgate\.yaml: 19900 more problems not listed$/);
    // Past the listed ones, no hint and no list of known keys: an unknown key costs its path only.
    expect(error.issues[100]!.reason).toBe("");
  });

  it("the lines of 2,000 issues in one mapping are found with one pass over its keys, not one per issue", () => {
    const keys = Array.from({ length: 2_000 }, (_, i) => `zz${i}: 1\n`).join("");
    const lines = new LineCounter();
    const doc = parseDocument(keys, { lineCounter: lines });
    const map = doc.contents as YAMLMap;
    let reads = 0;
    map.items = new Proxy(map.items, {
      get(target, key, receiver) {
        if (typeof key === "string" && /^\d+$/.test(key)) reads++;
        return Reflect.get(target, key, receiver) as unknown;
      },
    });
    const issues = Array.from({ length: 2_000 }, (_, i) => makeIssue([`zz${i}`], "", "unknown"));
    const located = withLines(issues, doc, lines);
    expect(located.map((issue) => issue.line)).toEqual(Array.from({ length: 2_000 }, (_, i) => i + 1));
    // One walk of the mapping is 2,000 reads; a walk per issue was about 2,000,000.
    expect(reads).toBeLessThan(10_000);
  });

  it("a file that is not a mapping, and a file that does not exist, are refused", () => {
    expect(fileErrorOf(configFile("- a\n- b\n")).message).toMatch(/yaml:1: must hold a mapping of options \(key: value\), not a list$/);
    expect(fileErrorOf(configFile("just words\n")).message).toMatch(/not a single value$/);
    const missing = fileErrorOf(join(tempDir(), "nope.yaml"));
    expect(missing.message).toMatch(/nope\.yaml: cannot read the config file: ENOENT/);
  });

  // A FIFO with no writer blocked the read (a start, or a reload holding every guest) until
  // something wrote to it; /dev/zero and /dev/urandom read until memory ran out.
  it("a FIFO or a device as the config file, a file: secret or an upstreamCa is refused at once, saying what it is", () => {
    const dir = tempDir();
    const fifo = join(dir, "fifo");
    execFileSync("mkfifo", [fifo]);
    expect(fileErrorOf(fifo).message).toMatch(/fifo: cannot read the config file: a FIFO, not a regular file$/);
    expect(fileErrorOf("/dev/zero").message).toMatch(/^\/dev\/zero: cannot read the config file: a character device, not a regular file$/);
    const text = `upstreamCa: [${fifo}]\nsecrets:\n  A: { hosts: [a.test], value: "file:${fifo}" }\n  B: { hosts: [b.test], value: "file:/dev/urandom" }\n`;
    const error = fileErrorOf(configFile(text));
    expect(error.issues.map((i) => [i.path, i.reason])).toEqual([
      ["upstreamCa[0]", `cannot read ${fifo}: a FIFO, not a regular file`],
      ["secrets.A.value", `cannot read ${fifo}: a FIFO, not a regular file`],
      ["secrets.B.value", "cannot read /dev/urandom: a character device, not a regular file"],
    ]);
  });

  // Read as UTF-8 with replacement, a byte that was not UTF-8 became U+FFFD and went out as
  // EF BF BD, and Notepad's byte order mark went out as three bytes before the value: a value that
  // was not the file's, and an upstream's 401 with nothing said of why.
  // A U+FFFD the file holds as UTF-8 (EF BF BD) is what an earlier decoding made of other bytes:
  // refused as createHttpHooks refuses one (fourteenth session).
  it("a file: secret that is not UTF-8, holds U+FFFD, or starts with a byte order mark, is refused; UTF-8 past ASCII is taken as it is", () => {
    const dir = tempDir();
    writeFileSync(join(dir, "latin1"), Buffer.from([0x70, 0xe4, 0x73, 0x73, 0x0a]));
    writeFileSync(join(dir, "bom"), Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from("token-0123456789\n")]));
    writeFileSync(join(dir, "replaced"), Buffer.from([0x70, 0xef, 0xbf, 0xbd, 0x73, 0x73, 0x0a]));
    writeFileSync(join(dir, "utf8"), "pässwörd-€-🔑\n");
    const secrets = (names: readonly string[]): string => `secrets:\n${names.map((name) => `  ${name.toUpperCase()}: { hosts: [a.test], value: "file:${join(dir, name)}" }\n`).join("")}`;
    const error = fileErrorOf(configFile(secrets(["latin1", "bom", "replaced", "utf8"])));
    expect(error.issues.map((issue) => [issue.path, issue.reason])).toEqual([
      ["secrets.LATIN1.value", `holds bytes that are not UTF-8 (from file:${join(dir, "latin1")}); a value is sent as its UTF-8 bytes, and these would be changed`],
      ["secrets.BOM.value", `starts with a byte order mark, U+FEFF (from file:${join(dir, "bom")}), which editors add and no credential holds; save the file without one`],
      ["secrets.REPLACED.value", `holds bytes that are not UTF-8, or U+FFFD, the character Node puts in their place (from file:${join(dir, "replaced")}); a value is sent as its UTF-8 bytes, and these would be changed`],
    ]);
    expect(loadConfigFile(configFile(secrets(["utf8"])), {}).guests["default"]?.secrets?.["UTF8"]?.value).toBe("pässwörd-€-🔑");
  });

  // Node decodes an environment variable's bytes as UTF-8, each byte that is not UTF-8 becoming
  // U+FFFD, and a value read with $(cat token.txt) keeps its byte order mark: env: values went
  // out as EF BF BD or with the mark in front, where a file: value is refused for either.
  it("an env: secret that is not UTF-8 (U+FFFD in Node's decoding), or that starts with a byte order mark, is refused naming the variable, never the value", () => {
    const names = ["LATIN1", "BOM", "UTF8", "LF", "LONG"];
    const file = configFile(`secrets:\n${names.map((name) => `  ${name}: { hosts: [a.test], value: env:${name}_TOKEN }\n`).join("")}`);
    const env = { LATIN1_TOKEN: "p\uFFFDss-latin1", BOM_TOKEN: "\uFEFFbom-token-0123456789", UTF8_TOKEN: "pässwörd-€-🔑", LF_TOKEN: "lf-token\n", LONG_TOKEN: "long-token".padEnd(16 * 1024 + 1, "x") };
    const error = fileErrorOf(file, env);
    expect(error.issues.map((issue) => [issue.path, issue.reason])).toEqual([
      ["secrets.LATIN1.value", "holds bytes that are not UTF-8, or U+FFFD, the character Node puts in their place (from env:LATIN1_TOKEN); a value is sent as its UTF-8 bytes, and these would be changed"],
      ["secrets.BOM.value", "starts with a byte order mark, U+FEFF (from env:BOM_TOKEN), which editors add and no credential holds; set it without one"],
      // As before: what a file: value is refused for besides.
      ["secrets.LF.value", "holds a line break or NUL (from env:LF_TOKEN); a value must fit in one header field"],
      ["secrets.LONG.value", "is longer than 16 KiB (16384 bytes), the most a secret's value may hold: it goes into one header field (from env:LONG_TOKEN)"],
    ]);
    expect(error.message).not.toMatch(/latin1|bom-token|lf-token|long-token/);
    expect(loadConfigFile(configFile("secrets:\n  UTF8: { hosts: [c.test], value: env:UTF8_TOKEN }\n"), env).guests["default"]?.secrets?.["UTF8"]?.value).toBe("pässwörd-€-🔑");
    // The bytes as a shell sets them, through the CLI: Node hands the proxy U+FFFD for \344.
    const run = (value: string): string => {
      try {
        execFileSync("/bin/sh", ["-c", `LATIN1_TOKEN="$(printf '${value}')" exec "$0" "$1" check-config "$2"`, process.execPath, join(import.meta.dirname, "..", "..", "dist", "cli", "bin.js"), configFile("secrets:\n  LATIN1: { hosts: [a.test], value: env:LATIN1_TOKEN }\n")], { stdio: "pipe", env: { PATH: process.env["PATH"] } });
        return "passed";
      } catch (failed) {
        return String((failed as { stderr: Buffer }).stderr);
      }
    };
    expect(run("p\\344ss-latin1")).toContain("secrets.LATIN1.value holds bytes that are not UTF-8, or U+FFFD, the character Node puts in their place (from env:LATIN1_TOKEN)");
    expect(run("p\\303\\244ss-utf8")).toBe("passed");
  });

  // 1 MB took 7 s to start, 133 MB aborted the process: no header field takes more than 16 KiB.
  // Keys were looked up without an own-property check, so `toString` passed as a known option;
  // and guests and secrets named __proto__ were assigned to plain objects, and vanished.
  it.each([
    ["toString: 1\n", "toString", 'unknown option "toString"'],
    ["timeouts:\n  constructor: 1\n", "timeouts.constructor", 'unknown option "timeouts.constructor"'],
    ["guests:\n  ci:\n    hasOwnProperty: 1\n", "guests.ci.hasOwnProperty", 'unknown option "guests.ci.hasOwnProperty"'],
    ["__proto__:\n  allowHosts: ['*']\n", "__proto__", 'unknown option "__proto__"'],
    ['{"__proto__": {"allowHosts": ["*"]}}', "__proto__", 'unknown option "__proto__"'],
    ["guests:\n  __proto__:\n    allowHosts: ['*']\n  ci: {}\n", "guests.__proto__", 'the name "__proto__" is reserved'],
    ["secrets:\n  __proto__: { hosts: ['*'], value: env:HOME }\n", "secrets.__proto__", 'the name "__proto__" is reserved'],
    ["resolve:\n  __proto__: [127.0.0.1]\n", "resolve.__proto__", 'the name "__proto__" is reserved'],
  ])("%j is refused, naming %s", (text, path, reason) => {
    const error = fileErrorOf(configFile(text), { HOME: "/home/x" });
    expect(error.path).toBe(path);
    expect(error.message).toContain(reason);
  });

  it("a guest and a secret named constructor are kept, and env:toString names no variable it has", () => {
    const config = loadConfigFile(configFile("guests:\n  constructor:\n    secrets:\n      constructor: { hosts: [a.test], value: env:TOKEN }\n"), { TOKEN: "v" });
    expect(Object.keys(config.guests)).toEqual(["constructor"]);
    expect(config.guests["constructor"]?.secrets?.["constructor"]).toMatchObject({ value: "v", from: "env:TOKEN" });
    const error = fileErrorOf(configFile("secrets:\n  A: { hosts: [a.test], value: env:toString }\n"), {});
    expect(error.issues[0]?.reason).toMatch(/^names an environment variable that is not set/);
  });

  // The name after "env:" was quoted back: a token pasted there in place of a name was printed.
  it("env: followed by a token, or by no variable name, is refused without quoting what follows", () => {
    const file = configFile('secrets:\n  A: { hosts: [a.test], value: "env:ghp_PASTEDtoken123" }\n  B: { hosts: [b.test], value: "env:$ghp_x9" }\n');
    const error = fileErrorOf(file, {});
    // The schema's issue comes first; the sources are read only once the document is valid.
    expect(error.issues.map((i) => i.path)).toEqual(["secrets.B.value"]);
    expect(error.message).not.toMatch(/PASTEDtoken|ghp_x9/);
    const unset = fileErrorOf(configFile('secrets:\n  A: { hosts: [a.test], value: "env:ghp_PASTEDtoken123" }\n'), {});
    expect(unset.issues[0]?.reason).toMatch(/^names an environment variable that is not set \(its name is not shown/);
    expect(unset.message).not.toContain("PASTEDtoken");
  });

  it("a secret value over 16 KiB, from a file or the environment, is refused without quoting it; 16 KiB and a newline load", () => {
    const file = configFile("secrets:\n  A: { hosts: [a.test], value: file:a }\n  B: { hosts: [b.test], value: file:b }\n  C: { hosts: [c.test], value: env:LONG }\n");
    writeFileSync(join(file, "..", "a"), `${"a".repeat(16 * 1024)}\n`);
    writeFileSync(join(file, "..", "b"), "b".repeat(10 * 1024 * 1024));
    const error = fileErrorOf(file, { LONG: "c".repeat(16 * 1024 + 1) });
    expect(error.issues.map((i) => [i.path, i.reason.replace(/\(from .*\)$/, "(from …)")])).toEqual([
      ["secrets.B.value", "is longer than 16 KiB (16384 bytes), the most a secret's value may hold: it goes into one header field (from …)"],
      ["secrets.C.value", "is longer than 16 KiB (16384 bytes), the most a secret's value may hold: it goes into one header field (from …)"],
    ]);
    expect(error.message).not.toMatch(/bbbb|cccc/);
  });

  it("a config file over 4 MiB is refused before it is parsed", () => {
    const file = configFile(`allowHosts: [a.test]\n${"#".repeat(4 * 1024 * 1024)}\n`);
    expect(fileErrorOf(file).message).toMatch(/cannot read the config file: larger than 4 MiB, the most it may hold$/);
  });

  // The YAML parser takes seconds over deep flow nesting (and a reload would hold every guest
  // meanwhile), then overflows its stack: such a file is refused before it is parsed.
  it.each([
    ["JSON", `{"allowHosts": ${"[".repeat(100_000)}${"]".repeat(100_000)}}`],
    ["YAML flow", `proxy:\n  logLevel: info\nallowHosts: ${"[".repeat(501)}${"]".repeat(501)}\n`],
    ["YAML maps", `allowHosts: ${"{a: ".repeat(501)}x${"}".repeat(501)}\n`],
    // A scan that skipped quoted text could be led past the rest of the file by one quote.
    ["behind an unclosed quote", `allowHosts: ['x.test]\n${"[".repeat(100_000)}\n`],
    // A compact sequence nests a level per "- ", with no bracket: a million levels held a reload 18 s.
    ["YAML compact sequences", `allowHosts:\n  ${"- ".repeat(1_000_000)}x\n`],
    // Past about 900 levels, the parser overflowed its stack.
    ["YAML compact sequences, short", `allowHosts:\n  ${"- ".repeat(920)}x\n`],
    ["YAML block maps", `allowHosts:\n${Array.from({ length: 880 }, (_, i) => `${" ".repeat(i + 1)}k${i}:`).join("\n")} x\n`],
    ["YAML blocks and flow together", `allowHosts:\n  ${"- ".repeat(300)}${"[".repeat(300)}\n`],
  ])("%s nested deeper than 500 levels is refused before parsing, with the line", (_kind, text) => {
    const error = fileErrorOf(configFile(text));
    expect(error.message).toMatch(/:\d+: nested deeper than 500 levels/);
  });

  // Keys nested in keys cost the YAML library time as a power of their depth: 300 levels, 22 s.
  it.each([
    ["nested explicit keys", `? ${"? ".repeat(300)}x\n`, 1],
    ["a list as a key", "allowHosts: [a.test]\n? - a\n: b\n", 2],
    ["a flow mapping as a key", "guests:\n  { {a: b}: c }\n", 2],
  ])("%s is refused before it is turned into data, with the line", (_kind, text, line) => {
    const started = performance.now();
    const error = fileErrorOf(configFile(text));
    expect([error.issues[0]?.reason, error.line]).toEqual(["has a list or mapping as a key; every key here is a name", line]);
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  it("block nesting short of the limit is parsed, and fast", () => {
    const started = performance.now();
    const error = fileErrorOf(configFile(`allowHosts:\n  ${"- ".repeat(495)}x.test\n`));
    expect(error.message).not.toMatch(/nested deeper/);
    expect(error.issues[0]?.path).toBe("allowHosts[0]");
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  it("brackets in strings and comments, short of the limit, load as they are", () => {
    const brackets = "[".repeat(100);
    const file = configFile(`# ${brackets}\nallowHosts: ["${brackets}x.test", '${brackets}y.test'] # ${brackets}\n`);
    expect(() => loadConfigFile(file, {})).not.toThrow(/nested deeper/);
  });

  it("an alias bomb is refused instead of expanded", () => {
    const bomb = ["a: &a [x, x, x, x, x, x, x, x, x, x]", ...Array.from({ length: 6 }, (_, i) => `${"bcdefg"[i]}: &${"bcdefg"[i]} [${Array(10).fill(`*${"abcdef"[i]}`).join(", ")}]`)].join("\n");
    expect(fileErrorOf(configFile(bomb)).message).toMatch(/cannot be read as data|Excessive alias count/);
  });
});
