import { describe, expect, it } from "vitest";
import { parseCli, parseHostSecret, UsageError } from "../../src/cli/args.js";
import { createHttpHooks, declarativeConfigOf } from "../../src/hooks/http-hooks.js";
import { SecretStore } from "../../src/policy/secrets.js";

describe("--host-secret NAME@HOST[,HOST...][=VALUE]", () => {
  it.each([
    ["GH@api.github.com=tok", { name: "GH", hosts: ["api.github.com"], value: "tok" }],
    ["GH@a.test,b.test=v", { name: "GH", hosts: ["a.test", "b.test"], value: "v" }],
    ["GH@a.test=x=y@z", { name: "GH", hosts: ["a.test"], value: "x=y@z" }],
    ["GH@a.test==lead", { name: "GH", hosts: ["a.test"], value: "=lead" }],
    ["GH@*.test=@at", { name: "GH", hosts: ["*.test"], value: "@at" }],
  ])("%j splits at the first @ and then the first =", (spec, expected) => {
    expect(parseHostSecret(spec, {})).toEqual(expected);
  });

  it("takes the value from the environment variable NAME when =VALUE is absent", () => {
    expect(parseHostSecret("GH_TOKEN@api.test", { GH_TOKEN: "from-env=@" })).toEqual({
      name: "GH_TOKEN",
      hosts: ["api.test"],
      value: "from-env=@",
    });
  });

  it("exits with a message naming the variable when it is unset", () => {
    expect(() => parseHostSecret("GH_TOKEN@api.test", {})).toThrow(/environment variable GH_TOKEN is not set/);
  });

  it.each([
    ["GH_TOKEN@=v", /no hosts given/],
    ["GH_TOKEN@", /no hosts given/],
    ["@a.test=v", /expected NAME@HOST/],
    ["noat=secret-value", /expected NAME@HOST/],
    ["GH@a.test=", /value is empty/],
    // An empty entry was dropped without a word: the secret went to fewer hosts than listed.
    ["GH@a.test,=v", /^--host-secret GH: host 2 of 2 is empty \(got "a\.test,"\)/],
    ["GH@a.test,", /^--host-secret GH: host 2 of 2 is empty \(got "a\.test,"\)/],
    ["GH@,a.test=v", /^--host-secret GH: host 1 of 2 is empty/],
    ["GH@a.test,,b.test=v", /^--host-secret GH: host 2 of 3 is empty/],
    ["GH@a.test, =v", /^--host-secret GH: host 2 of 2 is empty/],
  ])("%j is refused with a UsageError", (spec, message) => {
    expect(() => parseHostSecret(spec, {})).toThrow(UsageError);
    expect(() => parseHostSecret(spec, {})).toThrow(message);
  });

  it("a malformed spec never echoes its value", () => {
    let message = "";
    try {
      parseHostSecret("noat=s3cr3t", {});
    } catch (error) {
      message = (error as Error).message;
    }
    expect(message).toMatch(/expected NAME@HOST/);
    expect(message).not.toContain("s3cr3t");
  });

  it("the serve command builds secrets and placeholders from repeated flags", () => {
    const command = parseCli(["--host-secret", "A@a.test=1", "--host-secret", "B@b.test", "--replace-secrets-in-query"], { B: "2" });
    if (command.kind !== "serve") throw new Error("expected serve");
    const env = command.options.env ?? {};
    expect(Object.keys(env)).toEqual(["A", "B"]);
    expect(env["A"]).toMatch(/^EGRESSGATE_SECRET_[0-9a-f]{48}$/);
    const secrets = declarativeConfigOf(command.options.httpHooks!)?.secrets;
    expect(secrets?.replaceInQuery).toBe(true);
    expect(secrets?.list().map((s) => s.name)).toEqual(["A", "B"]);
  });

  it.each([
    [["--host-secret", "A@a.test=1", "--host-secret", "A@b.test=2"], /given twice/],
    [["--host-secret", "a-b@a.test=1"], /--host-secret a-b: a secret name must be an environment variable name/],
    [["--host-secret", "HTTPS_PROXY@a.test=1"], /--host-secret HTTPS_PROXY: HTTPS_PROXY is a variable the proxy sets/],
    [["--host-secret", "A@https://a.test=1"], /--host-secret A.*not a host pattern/],
  ])("%j is refused naming --host-secret", (argv, message) => {
    expect(() => parseCli(argv, {})).toThrow(message);
  });
});

describe("--host-secret and --resolve names from Object.prototype", () => {
  it("a secret named constructor is no secret given twice, and takes no value from the prototype", () => {
    const command = parseCli(["--host-secret", "constructor@a.test=v1", "--host-secret", "toString@a.test"], { toString: "v2" });
    if (command.kind !== "serve") throw new Error("expected serve");
    expect(Object.keys(command.config.guests["default"]?.secrets ?? {})).toEqual(["constructor", "toString"]);
    expect(() => parseCli(["--host-secret", "valueOf@a.test"], {})).toThrow(/environment variable valueOf is not set/);
  });

  it("a secret or a host named __proto__ is refused by name, not dropped", () => {
    expect(() => parseCli(["--host-secret", "__proto__@a.test=v"], {})).toThrow(/--host-secret __proto__: the name "__proto__" is reserved/);
    expect(() => parseCli(["--resolve", "__proto__=127.0.0.1"], {})).toThrow(/the name "__proto__" is reserved/);
  });
});

describe("flags given no value, an empty one, one that is no number, or twice", () => {
  it.each([
    [["--max-redirects", ""], "--max-redirects: must be a number (got an empty value)"],
    [["--max-body-bytes="], "--max-body-bytes: must be a number (got an empty value)"],
    [["--max-redirects", "abc"], '--max-redirects: must be a number (got "abc")'],
    [["--workers=2x"], '--workers: must be a number (got "2x")'],
    [["--allow-host"], "--allow-host: needs a value"],
    [["--resolve", "--allow-host", "a.test"], "--resolve: needs a value"],
    [["--host-secret"], "--host-secret: needs a value"],
    [["--config"], "--config: needs a value"],
    [["--config", ""], "--config: needs a value (got an empty one)"],
    [["--listen", "127.0.0.1:0", "--listen", "127.0.0.1:1"], "--listen: given twice; it takes one value"],
    [["--workers=1", "--workers", "2"], "--workers: given twice; it takes one value"],
  ])("%j is refused", (argv, message) => {
    expect(() => parseCli(argv, {})).toThrow(UsageError);
    expect(() => parseCli(argv, {})).toThrow(message);
  });

  // yargs reads any value of a boolean flag but "true" as false: --block-internal-ranges=yes
  // turned the block off and started with no word (black-box finding).
  it.each(["block-internal-ranges", "auth", "watch", "refuse-in-tunnel", "replace-secrets-in-query", "record-cookies", "record-missing"])("--%s=VALUE (or its camelCase spelling) takes true or false only, and --no-%s no value", (name) => {
    const camel = name.replace(/-([a-z])/g, (_m, c: string) => c.toUpperCase());
    for (const value of ["yes", "1", "on", "TRUE", "no", ""]) {
      expect(() => parseCli([`--${name}=${value}`], {}), value).toThrow(new UsageError(`--${name}: takes no value, or true or false (got ${JSON.stringify(value)})`));
      // The camelCase spelling yargs also takes is the same flag (review finding).
      expect(() => parseCli([`--${camel}=${value}`], {}), value).toThrow(new UsageError(`--${name}: takes no value, or true or false (got ${JSON.stringify(value)})`));
    }
    for (const value of ["true", "false", "yes"]) expect(() => parseCli([`--no-${name}=${value}`], {}), value).toThrow(new UsageError(`--no-${name}: takes no value (got ${JSON.stringify(value)})`));
  });

  it("--block-internal-ranges with no value, =true or =false is read as said", () => {
    const blocks = (argv: string[]): boolean | undefined => {
      const command = parseCli([...argv, "--allow-host", "a.test"], {});
      return command.kind === "serve" ? command.config.guests["default"]?.blockInternalRanges : undefined;
    };
    expect(blocks(["--block-internal-ranges"])).toBe(true);
    expect(blocks(["--block-internal-ranges=true"])).toBe(true);
    expect(blocks(["--block-internal-ranges=false"])).toBe(false);
    expect(blocks(["--no-block-internal-ranges"])).toBe(false);
  });

  it("check's --json and --dns take true or false only too", () => {
    expect(() => parseCli(["check", "GET", "https://a.test/", "--json=yes"], {})).toThrow(/--json: takes no value, or true or false \(got "yes"\)/);
    expect(() => parseCli(["check", "GET", "https://a.test/", "--no-dns=1"], {})).toThrow(/--no-dns: takes no value/);
  });

  it("a value flag's camelCase spelling is held to the same checks", () => {
    expect(() => parseCli(["--maxRedirects", ""], {})).toThrow(new UsageError("--max-redirects: must be a number (got an empty value)"));
  });

  it("a repeatable flag given twice passes", () => {
    expect(() => parseCli(["--allow-host", "a.test", "--allow-host", "b.test"], {})).not.toThrow();
  });
});

describe("--host-secret's value from $NAME", () => {
  it("is named as coming from env:NAME, not inline", () => {
    expect(() => parseCli(["--host-secret", "TOK@a.test"], { TOK: "a\tb\nc" })).toThrow(/--host-secret TOK: holds a line break or NUL \(from env:TOK\)/);
    expect(() => parseCli(["--host-secret", "TOK@a.test=a\nb"], {})).toThrow(/\(from inline\)/);
  });

  // Node decodes a variable's (and an argument's) bytes as UTF-8, a byte that is not UTF-8 becoming U+FFFD.
  it("one that is not UTF-8 or starts with a byte order mark is refused naming env:NAME, never the value", () => {
    expect(() => parseCli(["--host-secret", "TOK@a.test"], { TOK: "p\uFFFDss-value" })).toThrow(/^--host-secret TOK: holds bytes that are not UTF-8, or U\+FFFD, the character Node puts in their place \(from env:TOK\)/);
    expect(() => parseCli(["--host-secret", "TOK@a.test"], { TOK: "\uFEFFtoken-value" })).toThrow(/^--host-secret TOK: starts with a byte order mark, U\+FEFF \(from env:TOK\)/);
    expect(() => parseCli(["--host-secret", "TOK@a.test=p\uFFFDss-value"], {})).toThrow(/not UTF-8.*\(from inline\)/);
    expect(() => parseCli(["--host-secret", "TOK@a.test"], { TOK: "\uFEFFtoken-value" })).not.toThrow(/token-value/);
  });
});

describe("--host-secret's value length", () => {
  it("a value over 16 KiB is refused naming the flag and the secret, never quoting it", () => {
    expect(() => parseCli(["--host-secret", `A@a.test=${"x".repeat(16 * 1024 + 1)}`], {})).toThrow(/^--host-secret A: is longer than 16 KiB \(16384 bytes\)[^x]*$/);
  });
});

describe("secretPlaceholderKey", () => {
  const secrets = { GH: { hosts: ["api.test"], value: "v1" }, NPM: { hosts: ["npm.test"], value: "v2" } };
  const key = "a".repeat(32);

  it("derives the same placeholders from the same key, different ones per name and per key", () => {
    const first = createHttpHooks({ secrets, secretPlaceholderKey: key }).env;
    const again = createHttpHooks({ secrets: { GH: { hosts: ["other.test"], value: "changed" } }, secretPlaceholderKey: key }).env;
    const otherKey = createHttpHooks({ secrets, secretPlaceholderKey: "b".repeat(32) }).env;
    expect(first["GH"]).toMatch(/^EGRESSGATE_SECRET_[0-9a-f]{48}$/);
    // Only the key and the name count: not the hosts, not the value (a placeholder reveals nothing of it).
    expect(again["GH"]).toBe(first["GH"]);
    expect(first["NPM"]).not.toBe(first["GH"]);
    expect(otherKey["GH"]).not.toBe(first["GH"]);
  });

  it("without a key every call makes new placeholders", () => {
    expect(createHttpHooks({ secrets }).env["GH"]).not.toBe(createHttpHooks({ secrets }).env["GH"]);
  });

  it.each([["short"], [42], [""]])("refuses the key %j", (bad) => {
    expect(() => createHttpHooks({ secrets, secretPlaceholderKey: bad as string })).toThrow(/secretPlaceholderKey must be a string of at least 32 characters/);
  });
});

describe("secret store checks", () => {
  const store = (value: string) =>
    new SecretStore({ T: { hosts: ["api.test"], value } }, false, (hosts) => hosts as string[]);
  const request = (url: string, headers: string[]) => ({ url: new URL(url), headers });

  it("a retired value that merely contains the new one is still refused", () => {
    const s = store("tok_ABCDEF_v1");
    s.update("T", { value: "tok_ABCDEF" });
    expect(() => s.apply(request("https://api.test/", ["authorization", "Bearer tok_ABCDEF_v1"]), "api.test")).toThrow(/retired value/);
  });

  it("a retired value inside the current one passes only there", () => {
    const s = store("abc123");
    s.update("T", { value: "xxabc123yy" });
    expect(s.apply(request("https://api.test/", ["x", "xxabc123yy"]), "api.test")).toBeUndefined();
    expect(() => s.apply(request("https://api.test/", ["x", "xxabc123yy abc123"]), "api.test")).toThrow(/retired value/);
  });

  it("a real value bound for plain http:// is refused, even to the secret's own host", () => {
    const s = store("real-value-1");
    expect(() => s.apply(request("http://api.test/", ["x-key", "real-value-1"]), "api.test")).toThrow(/over plain http/);
  });

  it.each([
    ["in the path", "https://other.test/c/Tok_Real-9"],
    ["split across path and query", "https://other.test/c/Tok_Real?-9"],
    ["percent-encoded, after a byte that is not UTF-8", "https://other.test/c/%ff%54%6F%6B%5F%52%65%61%6C%2D%39"],
    ["in the hostname, which the URL parser lowercases", "https://Tok_Real-9.other.test/"],
    ["in the userinfo", "https://u:Tok_Real-9@other.test/"],
  ])("a real value %s of a URL bound for another host is refused", (_where, url) => {
    const s = store(url.includes("?") ? "Tok_Real?-9" : "Tok_Real-9");
    const hostname = new URL(url).hostname;
    expect(() => s.apply(request(url, []), hostname)).toThrow(/the URL carries the value of secret T to host/);
  });

  it("a real value in a URL to the secret's own host over https passes, and a retired one does not", () => {
    const s = store("Tok_Real-9");
    expect(s.apply(request("https://api.test/c/Tok_Real-9", []), "api.test")).toBeUndefined();
    expect(() => s.apply(request("http://api.test/c/Tok_Real-9", []), "api.test")).toThrow(/over plain http/);
    s.update("T", { value: "Tok_Next-10" });
    expect(() => s.apply(request("https://api.test/c/Tok_Real-9", []), "api.test")).toThrow(/retired value/);
  });

  it("a URL that merely contains a value in another letter case, outside the hostname, passes", () => {
    const s = store("Tok_Real-9");
    expect(s.apply(request("https://other.test/docs/tok_real-9.html", []), "other.test")).toBeUndefined();
    expect(s.apply(request("https://other.test/?q=TOK_REAL-9", []), "other.test")).toBeUndefined();
  });

  it("redaction catches the value inside Basic credentials at any alignment", () => {
    const s = store("hunter2pass");
    for (const user of ["bob", "bo", "b"]) {
      const basic = Buffer.from(`${user}:hunter2pass`).toString("base64");
      expect(s.redact(`Authorization: Basic ${basic}`)).toContain("[REDACTED:T]");
    }
  });
});
