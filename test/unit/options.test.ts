import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { createHttpHooks, declarativeConfigOf, type HttpHooks, type HttpHooksOptions, type IpInfo } from "../../src/hooks/http-hooks.js";
import { HttpRequestBlockedError } from "../../src/hooks/blocked-error.js";
import { createDjsHooks, type DjsHooksOptions } from "../../src/djs/create-djs-hooks.js";
import { defaults, resolveProxyOptions, type ProxyOptions } from "../../src/proxy/options.js";
import { tempDir } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";

/** Options the type system would refuse, as a JavaScript caller could still pass them. */
function untyped(options: Record<string, unknown>): ProxyOptions {
  return options as ProxyOptions;
}

function errorOf(fn: () => unknown): Error {
  try {
    fn();
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected a throw");
}

const ipInfo = (hostname: string, ip: string): IpInfo => ({ hostname, ip, family: 4, port: 443, protocol: "https" });

describe("resolveProxyOptions: defaults", () => {
  it("no options give the documented defaults and deny-all", () => {
    vi.stubEnv("XDG_CONFIG_HOME", "/tmp/eg-xdg");
    onTestFinished(() => {
      vi.unstubAllEnvs();
    });
    const resolved = resolveProxyOptions();
    expect(resolved.listen).toEqual({ host: "127.0.0.1", port: 8080 });
    expect(resolved.caDir).toBe(join("/tmp/eg-xdg", "egressgate"));
    expect(resolved.leafKeyType).toBe("ecdsa");
    expect(resolved.leafCacheSize).toBe(1000);
    expect(resolved.maxRedirects).toBe(10);
    expect(resolved.logLevel).toBe("info");
    expect(resolved.logSink).toBeUndefined();
    expect(resolved.guestEnvFile).toBeUndefined();
    expect(resolved.guests[0]!.env).toEqual({});
    expect(resolved.upstreamCaPems).toEqual([]);
    expect(resolved.guests[0]!.staticHosts.size).toBe(0);
    expect(resolved.timeouts).toEqual({
      handshakeMs: 10_000,
      headersMs: 30_000,
      idleMs: 120_000,
      h2PingMs: 10_000,
      dnsMs: 5_000,
      hookMs: 30_000,
      requestMs: 300_000,
      upstreamConnectMs: 10_000,
      upstreamHeadersMs: 60_000,
      upstreamBodyMs: 120_000,
      drainMs: 10_000,
    });
    expect(resolved.guests[0]!.declarative).toEqual({ allowedHosts: [], allowedInternalHosts: [], blockInternalRanges: true });
    expect(resolved.guests[0]!.checkHooks).toEqual({});
  });

  it("the caDir default falls back to ~/.config/egressgate without XDG_CONFIG_HOME", () => {
    vi.stubEnv("XDG_CONFIG_HOME", "");
    vi.stubEnv("HOME", "/tmp/eg-home");
    onTestFinished(() => {
      vi.unstubAllEnvs();
    });
    expect(resolveProxyOptions().caDir).toBe(join("/tmp/eg-home", ".config", "egressgate"));
  });

  // No shell stands between a program and startProxy: `caDir: "~/ca"` made a folder named `~` in
  // the working directory, where the config file and the flags have long expanded it.
  it("a path option starting with ~/ is under $HOME, as in the config file; ~user is refused naming the option", async () => {
    const home = tempDir("egressgate-home-");
    vi.stubEnv("HOME", home);
    onTestFinished(() => {
      vi.unstubAllEnvs();
    });
    const { certPem } = await testCa();
    writeFileSync(join(home, "ca.pem"), certPem);
    const resolved = resolveProxyOptions({
      caDir: "~/ca",
      guestEnvFile: "~/guest.env",
      auditLog: "~/audit.log",
      upstreamCa: ["~/ca.pem"],
      upstream: { record: { path: "~/run.har" } },
    });
    expect(resolved).toMatchObject({ caDir: join(home, "ca"), guestEnvFile: join(home, "guest.env"), auditLog: join(home, "audit.log"), upstreamCaPems: [certPem] });
    expect(resolved.upstream?.record?.path).toBe(join(home, "run.har"));
    expect(resolveProxyOptions({ caDir: "~" }).caDir).toBe(home);
    expect(resolveProxyOptions({ upstream: { replay: { path: "~/run.har" } } }).upstream?.replay?.path).toBe(join(home, "run.har"));
    // A ~ anywhere else is a character of the name, as in a shell.
    expect(resolveProxyOptions({ caDir: "ca~/x" }).caDir).toBe("ca~/x");
    for (const [options, path] of [
      [{ caDir: "~bob/ca" }, "caDir"],
      [{ guestEnvFile: "~bob/guest.env" }, "guestEnvFile"],
      [{ auditLog: "~bob/audit.log" }, "auditLog"],
      [{ upstreamCa: [certPem, "~bob/ca.pem"] }, "upstreamCa[1]"],
      [{ upstream: { record: { path: "~bob/run.har" } } }, "upstream.record.path"],
    ] as const) {
      const error = errorOf(() => resolveProxyOptions(options as ProxyOptions));
      expect(error).toMatchObject({ code: "EG_INVALID_OPTION", path });
      expect(error.message).toBe(`startProxy: ${path} starts with "~bob", which is not expanded: only ~ and ~/ are (the home folder, $HOME); write the folder out`);
    }
  });

  it("the defaults live in one frozen object that resolving never changes", () => {
    expect(Object.isFrozen(defaults)).toBe(true);
    expect(Object.isFrozen(defaults.listen)).toBe(true);
    expect(Object.isFrozen(defaults.timeouts)).toBe(true);
    const resolved = resolveProxyOptions({ timeouts: { idleMs: 5 } });
    expect(resolved.timeouts.idleMs).toBe(5);
    expect(defaults.timeouts.idleMs).toBe(120_000);
  });

  it("given values are kept", () => {
    const logSink = (): void => undefined;
    const resolved = resolveProxyOptions({
      env: { A: "1" },
      listen: { host: "::1", port: 0 },
      caDir: "/tmp/eg-ca",
      resolve: { "API.Test.": ["127.0.0.1", "[::1]"] },
      leafKeyType: "rsa",
      leafCacheSize: 5,
      maxRedirects: 0,
      timeouts: { drainMs: 1 },
      logLevel: "silent",
      logSink,
      guestEnvFile: "/tmp/eg-guest.env",
    });
    expect(resolved.guests[0]!.env).toEqual({ A: "1" });
    expect(resolved.listen).toEqual({ host: "::1", port: 0 });
    expect(resolved.caDir).toBe("/tmp/eg-ca");
    expect(resolved.guests[0]!.staticHosts.get("api.test")).toEqual([
      { ip: "127.0.0.1", family: 4 },
      { ip: "::1", family: 6 },
    ]);
    expect(resolved.leafKeyType).toBe("rsa");
    expect(resolved.leafCacheSize).toBe(5);
    expect(resolved.maxRedirects).toBe(0);
    expect(resolved.timeouts.drainMs).toBe(1);
    expect(resolved.timeouts.idleMs).toBe(120_000);
    expect(resolved.logLevel).toBe("silent");
    expect(resolved.logSink).toBe(logSink);
    expect(resolved.guestEnvFile).toBe("/tmp/eg-guest.env");
  });
});

describe("resolveProxyOptions: unknown keys are refused with a hint", () => {
  it("an unknown top-level option names the key and lists the known ones", () => {
    const error = errorOf(() => resolveProxyOptions(untyped({ allowHosts: ["x"] })));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toMatch(/unknown option "allowHosts"/);
    expect(error.message).toMatch(/known: .*httpHooks/);
  });

  it("an unknown timeout names timeouts.<key> and lists the known timeouts", () => {
    const error = errorOf(() => resolveProxyOptions(untyped({ timeouts: { bogus: 1 } })));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toMatch(/"timeouts\.bogus"/);
    expect(error.message).toMatch(/known: .*idleMs/);
  });

  it("an unknown listen key names listen.<key>, so a typo cannot silently listen on the default port", () => {
    const error = errorOf(() => resolveProxyOptions(untyped({ listen: { prot: 0 } })));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toMatch(/listen\.prot/);
  });
});

describe("resolveProxyOptions: each bad value names its option path", () => {
  it("listen.port out of range is a RangeError naming listen.port and the value", () => {
    const error = errorOf(() => resolveProxyOptions({ listen: { port: 70000 } }));
    expect(error).toBeInstanceOf(RangeError);
    expect(error.message).toMatch(/listen\.port/);
    expect(error.message).toMatch(/70000/);
    expect(() => resolveProxyOptions({ listen: { port: -1 } })).toThrow(RangeError);
    expect(() => resolveProxyOptions({ listen: { port: 1.5 } })).toThrow(/listen\.port/);
  });

  it.each([
    { name: "listen.port as a string", options: { listen: { port: "80" } }, path: /listen\.port/, type: TypeError },
    { name: "listen.host with a space", options: { listen: { host: "a b" } }, path: /listen\.host/, type: TypeError },
    { name: "listen as a string", options: { listen: "127.0.0.1:0" }, path: /listen/, type: TypeError },
    { name: "resolve with a non-IP", options: { resolve: { "api.test": ["not-an-ip"] } }, path: /resolve\.api\.test.*not-an-ip/, type: TypeError },
    { name: "resolve with no addresses", options: { resolve: { "api.test": [] } }, path: /resolve\.api\.test/, type: TypeError },
    { name: "resolve with a bad hostname", options: { resolve: { "a b": ["127.0.0.1"] } }, path: /resolve.*"a b"/, type: TypeError },
    { name: "upstreamCa as a string", options: { upstreamCa: "/x.pem" }, path: /upstreamCa/, type: TypeError },
    { name: "upstreamCa with an empty entry", options: { upstreamCa: [""] }, path: /upstreamCa\[0\]/, type: TypeError },
    { name: "timeouts.idleMs of 0", options: { timeouts: { idleMs: 0 } }, path: /timeouts\.idleMs/, type: RangeError },
    { name: "timeouts.idleMs as a string", options: { timeouts: { idleMs: "5" } }, path: /timeouts\.idleMs/, type: TypeError },
    { name: "logLevel", options: { logLevel: "loud" }, path: /logLevel.*loud/, type: TypeError },
    { name: "leafKeyType", options: { leafKeyType: "dsa" }, path: /leafKeyType.*dsa/, type: TypeError },
    { name: "leafCacheSize of 0", options: { leafCacheSize: 0 }, path: /leafCacheSize/, type: RangeError },
    { name: "maxRedirects of -1", options: { maxRedirects: -1 }, path: /maxRedirects/, type: RangeError },
    { name: "caDir empty", options: { caDir: "" }, path: /caDir/, type: TypeError },
    { name: "guestEnvFile empty", options: { guestEnvFile: "" }, path: /guestEnvFile/, type: TypeError },
    { name: "logSink not a function", options: { logSink: "stderr" }, path: /logSink/, type: TypeError },
    { name: "env with a non-string value", options: { env: { A: 1 } }, path: /env\.A/, type: TypeError },
    { name: "httpHooks not an object", options: { httpHooks: "deny" }, path: /httpHooks/, type: TypeError },
    { name: "httpHooks.isIpAllowed not a function", options: { httpHooks: { isIpAllowed: true } }, path: /httpHooks\.isIpAllowed/, type: TypeError },
  ])("$name", ({ options, path, type }) => {
    const error = errorOf(() => resolveProxyOptions(untyped(options)));
    expect(error).toBeInstanceOf(type);
    expect(error.message).toMatch(path);
  });

  it("options that are not an object are refused", () => {
    expect(() => resolveProxyOptions(null as unknown as ProxyOptions)).toThrow(/options must be an object/);
  });

  it("an upstreamCa path that does not exist names upstreamCa[i] and the path", () => {
    const missing = join(tempDir(), "missing-ca.pem");
    const error = errorOf(() => resolveProxyOptions({ upstreamCa: [missing] }));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toMatch(/upstreamCa\[0\]/);
    expect(error.message).toContain(missing);
  });

  it("an upstreamCa file that holds no certificate names upstreamCa[i] and the path", () => {
    const file = join(tempDir(), "not-a-ca.pem");
    writeFileSync(file, "hello\n");
    const error = errorOf(() => resolveProxyOptions({ upstreamCa: [file] }));
    expect(error.message).toMatch(/upstreamCa\[0\]/);
    expect(error.message).toContain(file);
  });

  // Only the BEGIN marker was checked, and TLS skips a block it cannot read: a damaged CA was
  // taken in silence and every upstream then failed with 502 DEPTH_ZERO_SELF_SIGNED_CERT.
  it("an upstreamCa certificate that cannot be parsed is refused with its code, path and entry", async () => {
    const { certPem } = await testCa();
    const garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    const file = join(tempDir(), "damaged-ca.pem");
    writeFileSync(file, `${certPem}${garbage}`);
    for (const [entries, at, named] of [
      [[garbage], 0, /upstreamCa\[0\] holds a PEM certificate that cannot be read \(certificate 1: /],
      [[certPem, `${certPem}${garbage}`], 1, /upstreamCa\[1\] holds a PEM certificate that cannot be read \(certificate 2: /],
      [["hello -----BEGIN CERTIFICATE----- world"], 0, /certificate 1: no -----END CERTIFICATE-----/],
      [[file], 0, new RegExp(`upstreamCa\\[0\\] names ${file}, which holds a PEM certificate that cannot be read \\(certificate 2: `)],
    ] as const) {
      const error = errorOf(() => resolveProxyOptions({ upstreamCa: [...entries] }));
      expect(error).toMatchObject({ code: "EG_INVALID_OPTION", path: `upstreamCa[${at}]` });
      expect(error.message).toMatch(named);
    }
  });

  it("upstreamCa takes PEM text as is and reads file paths", async () => {
    const { certPem } = await testCa();
    const file = join(tempDir(), "ca.pem");
    writeFileSync(file, certPem);
    expect(resolveProxyOptions({ upstreamCa: [certPem, file] }).upstreamCaPems).toEqual([certPem, certPem]);
  });
});

describe("resolveProxyOptions: httpHooks", () => {
  it("a key other than the four hooks is refused: a policy spread into httpHooks would otherwise never run", () => {
    const { httpHooks } = createHttpHooks({ allowedHosts: ["api.test"] });
    const error = errorOf(() => resolveProxyOptions(untyped({ httpHooks: { ...httpHooks, djsHooks: {} } })));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toMatch(/unknown option "httpHooks\.djsHooks"/);
    expect(error.message).toMatch(/createHttpHooks\(\{ \.\.\.createDjsHooks\(policy\) \}\)/);
    expect(() => resolveProxyOptions(untyped({ httpHooks: { ...httpHooks, onRequest: () => undefined } }))).not.toThrow();
  });
});

describe("createHttpHooks: option validation", () => {
  it("an unknown option is refused, naming it and the known options", () => {
    const error = errorOf(() => createHttpHooks({ allowedHost: ["x.test"] } as unknown as Parameters<typeof createHttpHooks>[0]));
    expect(error).toBeInstanceOf(TypeError);
    expect(error.message).toMatch(/unknown option "allowedHost"/);
    expect(error.message).toMatch(/allowedHosts/);
  });

  it("a bad pattern names allowedHosts[i] or allowedInternalHosts[i]", () => {
    expect(() => createHttpHooks({ allowedHosts: ["ok.test", "https://x.test"] })).toThrow(/allowedHosts\[1\].*https:\/\/x\.test/);
    expect(() => createHttpHooks({ allowedHosts: ["x.test:443"] })).toThrow(/allowedHosts\[0\]/);
    expect(() => createHttpHooks({ allowedHosts: ["x.test/path"] })).toThrow(/allowedHosts\[0\]/);
    expect(() => createHttpHooks({ allowedInternalHosts: ["ok.test", ""] })).toThrow(/allowedInternalHosts\[1\]/);
    expect(() => createHttpHooks({ allowedHosts: "x.test" } as unknown as Parameters<typeof createHttpHooks>[0])).toThrow(/allowedHosts/);
  });

  it("blockInternalRanges must be a boolean", () => {
    expect(() => createHttpHooks({ blockInternalRanges: "no" } as unknown as Parameters<typeof createHttpHooks>[0])).toThrow(
      /blockInternalRanges/,
    );
  });

  it("patterns are normalised to lowercase without a trailing dot", () => {
    const created = createHttpHooks({ allowedHosts: ["API.Test."] });
    expect(created.allowedHosts).toEqual(["api.test"]);
    expect(declarativeConfigOf(created.httpHooks)?.allowedHosts).toEqual(["api.test"]);
  });
});

describe("a value JSON cannot show is named in the option error, at every entry point", () => {
  // The messages quote the bad value with JSON.stringify, which throws on these: the embedder got
  // "Do not know how to serialize a BigInt" or "Converting circular structure to JSON", naming no
  // option, in place of the EG_INVALID_OPTION that names it (black-box finding).
  const cycle: Record<string, unknown> = {};
  cycle["self"] = cycle;
  const values: Record<string, () => unknown> = {
    "a BigInt": () => 5n,
    "a list holding a BigInt": () => [5n],
    "a cycle": () => cycle,
    "an object whose getter throws": () => ({
      get a(): never {
        throw new Error("the getter's own error");
      },
    }),
  };
  const sites: Record<string, { path: string; call: (value: unknown) => unknown }> = {
    "startProxy maxRedirects": { path: "maxRedirects", call: (value) => resolveProxyOptions(untyped({ maxRedirects: value })) },
    "startProxy listen.port": { path: "listen.port", call: (value) => resolveProxyOptions(untyped({ listen: { port: value } })) },
    "startProxy env.A": { path: "env.A", call: (value) => resolveProxyOptions(untyped({ env: { A: value } })) },
    "startProxy resolve.x.test": { path: "resolve.x.test", call: (value) => resolveProxyOptions(untyped({ resolve: { "x.test": value } })) },
    "startProxy upstreamCa": { path: "upstreamCa", call: (value) => resolveProxyOptions(untyped({ upstreamCa: value })) },
    "startProxy auth": { path: "auth", call: (value) => resolveProxyOptions(untyped({ auth: value })) },
    "startProxy httpHooks.onRequest": { path: "httpHooks.onRequest", call: (value) => resolveProxyOptions(untyped({ httpHooks: { onRequest: value } })) },
    "createHttpHooks allowedHosts": { path: "allowedHosts", call: (value) => createHttpHooks({ allowedHosts: value } as HttpHooksOptions) },
    "createHttpHooks allowedHosts[0]": { path: "allowedHosts[0]", call: (value) => createHttpHooks({ allowedHosts: [value] } as HttpHooksOptions) },
    "createHttpHooks blockInternalRanges": { path: "blockInternalRanges", call: (value) => createHttpHooks({ blockInternalRanges: value } as HttpHooksOptions) },
    "createHttpHooks secretRedirects": { path: "secretRedirects", call: (value) => createHttpHooks({ secretRedirects: value } as HttpHooksOptions) },
    "createHttpHooks secrets.A.hosts": { path: "secrets.A.hosts", call: (value) => createHttpHooks({ secrets: { A: { hosts: value, value: "v" } } } as HttpHooksOptions) },
    "createHttpHooks hooks[0].command": { path: "hooks[0].command", call: (value) => createHttpHooks({ hooks: [{ command: value }] } as HttpHooksOptions) },
    "createDjsHooks kind": { path: "kind", call: (value) => createDjsHooks({ source: "export function onRequest() {}", kind: value } as DjsHooksOptions) },
    "createDjsHooks workers": { path: "workers", call: (value) => createDjsHooks({ source: "export function onRequest() {}", workers: value } as DjsHooksOptions) },
    "createDjsHooks limits.timeoutMs": { path: "limits.timeoutMs", call: (value) => createDjsHooks({ source: "export function onRequest() {}", limits: { timeoutMs: value } } as DjsHooksOptions) },
  };
  const rows = Object.keys(sites).flatMap((site) => Object.keys(values).map((value) => ({ site, value })));

  it.each(rows)("$site: $value", ({ site, value }) => {
    const { path, call } = sites[site]!;
    const error = errorOf(() => call(values[value]!()));
    expect(error.message).toContain(path);
    // A list's element is named by its own place (`upstreamCa[0]`).
    expect(error).toMatchObject({ code: "EG_INVALID_OPTION", path: expect.stringMatching(new RegExp(`^${path.replace(/[.[\]]/g, "\\$&")}(\\[0\\])?$`)) });
    // A BigInt is shown as one: "(got 5)" read as a value in range.
    if (value === "a BigInt") expect(error.message).toContain("5n");
  });
});

describe("createHttpHooks without the proxy: the returned functions are complete on their own", () => {
  const { httpHooks, allowedHosts } = createHttpHooks({ allowedHosts: ["public.test", "db.test"], allowedInternalHosts: ["db.test", "cache.test"] });
  const info = (hostname: string, ip: string, protocol: "http" | "https" = "https"): IpInfo => ({ hostname, ip, family: 4, port: 443, protocol });

  it("isIpAllowed gives the whole verdict: a host off the allowlist is refused whatever its address", async () => {
    expect(await httpHooks.isIpAllowed!(info("public.test", "93.184.216.34"))).toBe(true);
    expect(await httpHooks.isIpAllowed!(info("elsewhere.test", "93.184.216.34"))).toBe(false);
    expect(await httpHooks.isIpAllowed!(info("public.test", "10.0.0.5"))).toBe(false);
    expect(await httpHooks.isIpAllowed!(info("db.test", "10.0.0.5", "http"))).toBe(true);
    expect(await httpHooks.isIpAllowed!(info("db.test", "169.254.169.254"))).toBe(false);
  });

  it("isRequestAllowed applies the allowlist", async () => {
    expect(await httpHooks.isRequestAllowed!(new Request("https://cache.test/x"))).toBe(true);
    expect(await httpHooks.isRequestAllowed!(new Request("https://elsewhere.test/x"))).toBe(false);
  });

  it("allowedHosts is the effective list: the allowed and the internal hosts, each once", () => {
    expect(allowedHosts).toEqual(["public.test", "db.test", "cache.test"]);
  });

  const withSecrets = (extra: Partial<HttpHooksOptions> = {}): ReturnType<typeof createHttpHooks> =>
    createHttpHooks({ allowedHosts: ["api.test", "other.test"], secrets: { TOKEN: { hosts: ["api.test"], value: "s3cret-value" } }, ...extra });

  it("onRequest is there whenever secrets are, and substitutes them for the secret's hosts", async () => {
    const { httpHooks, env } = withSecrets();
    expect(httpHooks.onRequest).toBeTypeOf("function");
    const out = (await httpHooks.onRequest!(new Request("https://api.test/x", { headers: { authorization: `Bearer ${env["TOKEN"]}`, "x-other": "kept" } }))) as Request;
    expect(out.headers.get("authorization")).toBe("Bearer s3cret-value");
    expect(out.headers.get("x-other")).toBe("kept");
    expect(createHttpHooks({ allowedHosts: ["api.test"] }).httpHooks.onRequest).toBeUndefined();
  });

  it("onRequest refuses a placeholder bound for a host outside its secret's scope", async () => {
    const { httpHooks, env } = withSecrets();
    const refused = httpHooks.onRequest!(new Request("https://other.test/x", { headers: { authorization: `Bearer ${env["TOKEN"]}` } }));
    await expect(refused).rejects.toBeInstanceOf(HttpRequestBlockedError);
    await expect(refused).rejects.toMatchObject({ status: 403, message: expect.stringContaining("TOKEN") });
  });

  it("onRequest substitutes inside Basic credentials: decoded, replaced and encoded again", async () => {
    const { httpHooks, env } = withSecrets();
    const basic = Buffer.from(`user:${env["TOKEN"]}`).toString("base64");
    const out = (await httpHooks.onRequest!(new Request("https://api.test/x", { headers: { authorization: `Basic ${basic}` } }))) as Request;
    expect(Buffer.from(out.headers.get("authorization")!.slice("Basic ".length), "base64").toString()).toBe("user:s3cret-value");
  });

  it("onRequest follows a rotation: the new value goes out, and the old one is refused", async () => {
    const { httpHooks, env, secretManager } = withSecrets();
    secretManager.updateSecret("TOKEN", { value: "rotated-value" });
    const out = (await httpHooks.onRequest!(new Request("https://api.test/x", { headers: { authorization: `Bearer ${env["TOKEN"]}` } }))) as Request;
    expect(out.headers.get("authorization")).toBe("Bearer rotated-value");
    await expect(httpHooks.onRequest!(new Request("https://api.test/x", { headers: { authorization: "Bearer s3cret-value" } }))).rejects.toMatchObject({ status: 403 });
  });

  // A bad pattern was named as `["updateSecret: hosts"][1]` under createHttpHooks, and an empty list
  // was taken, where createHttpHooks refuses one (black-box finding).
  it("updateSecret's hosts are checked as createHttpHooks checks them, named by their place, and the secret is left as it was", async () => {
    const { httpHooks, env, secretManager } = withSecrets();
    expect(() => secretManager.updateSecret("TOKEN", { hosts: ["api.test", "a b"] })).toThrow(/^updateSecret: secrets\.TOKEN\.hosts\[1\]: /);
    expect(() => secretManager.updateSecret("TOKEN", { hosts: [] })).toThrow(new TypeError("updateSecret: secrets.TOKEN.hosts: a secret needs at least one host"));
    const out = (await httpHooks.onRequest!(new Request("https://api.test/x", { headers: { authorization: `Bearer ${env["TOKEN"]}` } }))) as Request;
    expect(out.headers.get("authorization")).toBe("Bearer s3cret-value");
  });

  it("onRequest runs the user's hooks first, on placeholders, then substitutes what they produced", async () => {
    const seen: string[] = [];
    const { httpHooks, env } = withSecrets({
      onRequest: (request: Request) => {
        seen.push(request.headers.get("authorization") ?? "");
        return new Request(request.url, { headers: { authorization: `${request.headers.get("authorization")}`, "x-added": "added" } });
      },
    });
    const out = (await httpHooks.onRequest!(new Request("https://api.test/x", { headers: { authorization: `Bearer ${env["TOKEN"]}` } }))) as Request;
    expect(seen).toEqual([`Bearer ${env["TOKEN"]}`]);
    expect(out.headers.get("authorization")).toBe("Bearer s3cret-value");
    expect(out.headers.get("x-added")).toBe("added");
  });

  it("a chain's callbacks run in order on their own too, and a Response from one ends the phase", async () => {
    const trail: string[] = [];
    const { httpHooks } = createHttpHooks({
      allowedHosts: ["api.test"],
      hooks: [
        { onRequest: () => void trail.push("a"), isRequestAllowed: (r: Request) => !r.url.includes("/denied") },
        { onRequest: () => new Response("answered", { status: 203 }) },
        { onRequest: () => void trail.push("c") },
      ],
    });
    const out = (await httpHooks.onRequest!(new Request("https://api.test/x"))) as Response;
    expect(out.status).toBe(203);
    expect(trail).toEqual(["a"]);
    expect(await httpHooks.isRequestAllowed!(new Request("https://api.test/ok"))).toBe(true);
    expect(await httpHooks.isRequestAllowed!(new Request("https://api.test/denied"))).toBe(false);
  });

  it("startProxy ignores the generated onRequest: it substitutes natively, and calls only the user's hook", () => {
    const onRequest = (): undefined => undefined;
    expect(resolveProxyOptions({ httpHooks: withSecrets().httpHooks }).guests[0]!.checkHooks.onRequest).toBeUndefined();
    expect(resolveProxyOptions({ httpHooks: withSecrets({ onRequest }).httpHooks }).guests[0]!.checkHooks.onRequest).toBe(onRequest);
    expect(resolveProxyOptions({ httpHooks: { ...withSecrets({ onRequest }).httpHooks } }).guests[0]!.checkHooks.onRequest).toBe(onRequest);
  });
});

describe("resolveProxyOptions: how the declarative tier is enforced", () => {
  const options = { allowedHosts: ["public.test"], allowedInternalHosts: ["db.test"], blockInternalRanges: true };
  const config = { allowedHosts: ["public.test"], allowedInternalHosts: ["db.test"], blockInternalRanges: true };

  it("hooks straight from createHttpHooks run natively: no hook is called in the checks", () => {
    const { httpHooks } = createHttpHooks(options);
    const resolved = resolveProxyOptions({ httpHooks });
    expect(resolved.guests[0]!.declarative).toEqual(config);
    expect(resolved.guests[0]!.checkHooks).toEqual({});
  });

  it("a spread copy lost the configuration, so the native tier allows all and both generated hooks decide", () => {
    const { httpHooks } = createHttpHooks(options);
    const copy: HttpHooks = { ...httpHooks };
    expect(declarativeConfigOf(copy)).toBeUndefined();
    const resolved = resolveProxyOptions({ httpHooks: copy });
    expect(resolved.guests[0]!.declarative.allowedHosts).toEqual(["*"]);
    expect(resolved.guests[0]!.checkHooks.isRequestAllowed).toBe(httpHooks.isRequestAllowed);
    expect(resolved.guests[0]!.checkHooks.isIpAllowed).toBe(httpHooks.isIpAllowed);
  });

  it("the generated hooks a spread copy delegates to give the declarative answers", async () => {
    const { httpHooks } = createHttpHooks(options);
    const { checkHooks } = resolveProxyOptions({ httpHooks: { ...httpHooks } }).guests[0]!;
    expect(await checkHooks.isRequestAllowed?.(new Request("https://public.test/x"))).toBe(true);
    expect(await checkHooks.isRequestAllowed?.(new Request("https://DB.test./x"))).toBe(true);
    expect(await checkHooks.isRequestAllowed?.(new Request("https://other.test/x"))).toBe(false);
    expect(await checkHooks.isIpAllowed?.(ipInfo("public.test", "93.184.215.14"))).toBe(true);
    expect(await checkHooks.isIpAllowed?.(ipInfo("public.test", "127.0.0.1"))).toBe(false);
    expect(await checkHooks.isIpAllowed?.(ipInfo("db.test", "10.0.0.5"))).toBe(true);
    expect(await checkHooks.isIpAllowed?.(ipInfo("db.test", "169.254.169.254"))).toBe(false);
  });

  it("a spread copy with isIpAllowed replaced keeps the recovered configuration native and calls only the replacement", () => {
    const { httpHooks } = createHttpHooks(options);
    const isIpAllowed = (): boolean => true;
    const resolved = resolveProxyOptions({ httpHooks: { ...httpHooks, isIpAllowed } });
    expect(resolved.guests[0]!.declarative).toEqual(config);
    expect(resolved.guests[0]!.checkHooks.isIpAllowed).toBe(isIpAllowed);
    expect(resolved.guests[0]!.checkHooks.isRequestAllowed).toBeUndefined();
  });

  it("a spread copy with isRequestAllowed replaced keeps the recovered configuration native and calls only the replacement", () => {
    const { httpHooks } = createHttpHooks(options);
    const isRequestAllowed = (): boolean => true;
    const resolved = resolveProxyOptions({ httpHooks: { ...httpHooks, isRequestAllowed } });
    expect(resolved.guests[0]!.declarative).toEqual(config);
    expect(resolved.guests[0]!.checkHooks.isRequestAllowed).toBe(isRequestAllowed);
    expect(resolved.guests[0]!.checkHooks.isIpAllowed).toBeUndefined();
  });

  it("hooks with no configuration at all are deny-all", () => {
    const deny = { allowedHosts: [], allowedInternalHosts: [], blockInternalRanges: true };
    expect(resolveProxyOptions({ httpHooks: {} }).guests[0]!.declarative).toEqual(deny);
    expect(resolveProxyOptions({ httpHooks: {} }).guests[0]!.checkHooks).toEqual({});
    const isIpAllowed = (): boolean => true;
    const own = resolveProxyOptions({ httpHooks: { isIpAllowed } });
    expect(own.guests[0]!.declarative).toEqual(deny);
    expect(own.guests[0]!.checkHooks.isIpAllowed).toBe(isIpAllowed);
  });
});
