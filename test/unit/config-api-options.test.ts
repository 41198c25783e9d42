import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { defaults as tableDefaults } from "../../src/config/defaults.js";
import { isOptionError, type OptionError, type OptionRangeError } from "../../src/config/option-error.js";
import { PolicyLoadError } from "../../src/djs/create-djs-hooks.js";
import { HttpRequestBlockedError } from "../../src/hooks/blocked-error.js";
import { createHttpHooks, type HttpHooksOptions } from "../../src/hooks/http-hooks.js";
import { checkGuestOptions, defaults, resolveProxyOptions, type ProxyOptions } from "../../src/proxy/options.js";
import { tempDir } from "../helpers/proxy.js";

/** Options the type system would refuse, as a JavaScript caller could still pass them. */
const untyped = (options: Record<string, unknown>): ProxyOptions => options as ProxyOptions;

function errorOf(options: Record<string, unknown>): OptionError | OptionRangeError {
  try {
    resolveProxyOptions(untyped(options));
  } catch (error) {
    expect(isOptionError(error)).toBe(true);
    return error as OptionError;
  }
  throw new Error(`${JSON.stringify(options)} was accepted`);
}

describe("startProxy's options go through the one schema", () => {
  it.each([
    { options: { timeouts: { dnsMs: 0 } }, path: "timeouts.dnsMs", range: true },
    { options: { limits: { pipelinedRequests: "4" } }, path: "limits.pipelinedRequests", range: false },
    { options: { guests: { ci: { sources: ["10.0.0.0/33"] } } }, path: "guests.ci.sources[0]", range: false },
    { options: { guests: { ci: { resolve: { "a.test": ["nope"] } } } }, path: "guests.ci.resolve.a.test[0]", range: false },
    { options: { guests: { "Bad Name": {} } }, path: 'guests["Bad Name"]', range: false },
    { options: { guests: {} }, path: "guests", range: false },
    { options: { deploymentKey: "short" }, path: "deploymentKey", range: false },
    { options: { guests: { ci: {} }, httpHooks: {} }, path: "httpHooks", range: false },
  ])("$path: code EG_INVALID_OPTION and the path, as a RangeError only for a number out of range", ({ options, path, range }) => {
    const error = errorOf(options);
    expect(error.code).toBe("EG_INVALID_OPTION");
    expect(error.path).toBe(path);
    expect(error).toBeInstanceOf(range ? RangeError : TypeError);
    expect(error.message).toMatch(new RegExp(`^startProxy: ${path.replace(/[[\].]/g, "\\$&")}:? `));
  });

  // Looked up without an own-property check, `toString` and `constructor` passed as known keys.
  it("a key named after Object.prototype's members is unknown, and a guest named __proto__ is refused by name", () => {
    expect(errorOf({ toString: 1 }).message).toMatch(/^startProxy: unknown option "toString"/);
    expect(errorOf({ timeouts: { constructor: 1 } }).message).toMatch(/unknown option "timeouts\.constructor"/);
    expect(errorOf({ guests: { ci: { hasOwnProperty: 1 } } }).path).toBe("guests.ci.hasOwnProperty");
    // As JSON.parse gives it: an own key, which an object literal's __proto__ is not.
    expect(errorOf(JSON.parse('{"guests": {"__proto__": {}}}') as Record<string, unknown>).message).toMatch(/guests\.__proto__: the name "__proto__" is reserved/);
  });

  it("limits.sourceBufferBytes under one HTTP/2 upload's charge is refused, as it would refuse every upload", () => {
    // h2StreamCharge at the defaults: the response's window 1,048,575 and the guest's 131,071.
    expect(() => resolveProxyOptions({ limits: { sourceBufferBytes: 1_179_645 } })).toThrow(expect.objectContaining({ code: "EG_INVALID_OPTION", path: "limits.sourceBufferBytes" }) as Error);
    expect(() => resolveProxyOptions({ limits: { sourceBufferBytes: 1_179_646 } })).not.toThrow();
    expect(() => resolveProxyOptions({ limits: { sourceBufferBytes: 131_070, h2StreamWindowBytes: 65_535 } })).not.toThrow();
  });

  it("a short deployment key is never quoted", () => {
    expect(errorOf({ deploymentKey: "not-long-enough-secret" }).message).not.toContain("not-long-enough-secret");
  });

  it("an unknown guest key gets a did-you-mean", () => {
    const error = errorOf({ guests: { ci: { source: ["10.0.0.1/32"] } } });
    expect(error.path).toBe("guests.ci.source");
    expect(error.message).toMatch(/unknown option "guests\.ci\.source"; did you mean "sources"\?/);
  });

  it("checks that need several options or a file carry a code and a path too", () => {
    expect(errorOf({ listen: { host: "0.0.0.0", port: 0 } }).path).toBe("auth");
    expect(errorOf({ guests: { a: { sources: ["10.0.0.0/24"] }, b: { sources: ["10.0.0.7/32"] } } }).path).toBe("guests.b.sources");
    const missing = join(tempDir(), "missing.pem");
    const unreadable = errorOf({ upstreamCa: [missing] });
    expect([unreadable.path, unreadable.message]).toEqual(["upstreamCa[0]", expect.stringContaining(missing)]);
  });

  it("defaults come from the one table, which options.ts re-exports", () => {
    expect(defaults).toBe(tableDefaults);
    const resolved = resolveProxyOptions(untyped({ httpHooks: createHttpHooks({}).httpHooks, timeouts: { idleMs: undefined } }));
    expect(resolved.timeouts.idleMs).toBe(tableDefaults.timeouts.idleMs);
    expect(resolved.limits.connectionsPerSource).toBe(tableDefaults.limits.connectionsPerSource);
  });

  // Any name but "" was taken: `A#` went into guestEnv() and the env file, `egressgate env` printed
  // `export A#='…'` (a shell error), and a name with a space failed only when the env file was
  // written, blamed on guestEnvFile.
  it.each([
    [{ env: { "A#": "1" } }, 'env["A#"]'],
    [{ env: { "1A": "1" } }, "env.1A"],
    [{ env: { "A B": "1" } }, 'env["A B"]'],
    [{ env: { "a.b": "1" } }, "env.a.b"],
    [{ guests: { ci: { env: { "A-B": "1" } } } }, "guests.ci.env.A-B"],
  ])("an env entry whose name is no environment variable name is refused with its path: %j", (options, path) => {
    const error = errorOf(options);
    expect([error.code, error.path]).toEqual(["EG_INVALID_OPTION", path]);
    expect(error.message).toMatch(/is not an environment variable name \(\[A-Za-z_\]\[A-Za-z0-9_\]\*\)/);
    expect(() => checkGuestOptions("ci", { env: { "A#": "1" } })).toThrow(expect.objectContaining({ code: "EG_INVALID_OPTION", path: 'guests.ci.env["A#"]' }) as Error);
    expect(() => resolveProxyOptions({ env: { _A1: "1", a_b: "" } })).not.toThrow();
  });

  // Not a token: a name no request can carry, so the match never took it into account.
  it.each(["bad header", "x:y", "é"])("upstream.replay.matchHeaders refuses %j, which is no header name", (name) => {
    const error = errorOf({ upstream: { replay: { path: "/x.har", matchHeaders: ["x-ok", name] } } });
    expect([error.code, error.path]).toEqual(["EG_INVALID_OPTION", "upstream.replay.matchHeaders[1]"]);
    expect(error.message).toContain(`must be a header name: letters, digits and !#$%&'*+-.^_\`|~ only (got ${JSON.stringify(name)})`);
  });
});

describe("createHttpHooks' options carry a code and a path too", () => {
  function hooksErrorOf(options: Record<string, unknown>): OptionError {
    try {
      createHttpHooks(options as HttpHooksOptions);
    } catch (error) {
      expect(isOptionError(error)).toBe(true);
      return error as OptionError;
    }
    throw new Error(`${JSON.stringify(options)} was accepted`);
  }

  it.each([
    { options: { allowedHosts: ["ok.test", "https://x.test"] }, path: "allowedHosts[1]" },
    { options: { allowedHost: ["x.test"] }, path: "allowedHost" },
    { options: { secrets: { T: { hosts: [], value: "v" } } }, path: "secrets.T.hosts" },
    { options: { secrets: { T: { hosts: ["a.test"], value: "a\nb" } } }, path: "secrets.T.value" },
    { options: { secrets: { "a-b": { hosts: ["a.test"], value: "v" } } }, path: "secrets.a-b" },
    // A secret of that name replaced the guest's own HTTPS_PROXY (or its CA variable).
    { options: { secrets: { HTTPS_PROXY: { hosts: ["a.test"], value: "v" } } }, path: "secrets.HTTPS_PROXY" },
    { options: { secrets: { NODE_EXTRA_CA_CERTS: { hosts: ["a.test"], value: "v" } } }, path: "secrets.NODE_EXTRA_CA_CERTS" },
    { options: { secrets: { T: { hosts: ["a.test"], value: "v", followRedirectsTo: ["b.test"] } } }, path: "secrets.T.followRedirectsTo" },
    { options: { secretRedirects: "sometimes" }, path: "secretRedirects" },
  ])("$path", ({ options, path }) => {
    const error = hooksErrorOf(options);
    expect([error.code, error.path]).toEqual(["EG_INVALID_OPTION", path]);
    expect(error.message.startsWith(`createHttpHooks: `)).toBe(true);
  });

  it("an env entry named like a variable the proxy sets is refused by startProxy, for one guest and for each of several", () => {
    expect(() => resolveProxyOptions({ env: { https_proxy: "http://elsewhere:1" } })).toThrow(/env\.https_proxy: https_proxy is a variable the proxy sets/);
    expect(() => resolveProxyOptions({ guests: { ci: { env: { SSL_CERT_FILE: "/x" } } } })).toThrow(/guests\.ci\.env\.SSL_CERT_FILE: SSL_CERT_FILE is a variable the proxy sets/);
    expect(() => resolveProxyOptions({ env: { GH_TOKEN: "EGRESSGATE_SECRET_x" } })).not.toThrow();
  });

  it("an unknown option gets a did-you-mean; a secret's value and the placeholder key are never quoted", () => {
    expect(hooksErrorOf({ allowedHost: ["x.test"] }).message).toMatch(/did you mean "allowedHosts"\?/);
    expect(hooksErrorOf({ secrets: { T: { hosts: ["a.test"], value: "line-one\nline-two" } } }).message).not.toContain("line-one");
    expect(hooksErrorOf({ secretPlaceholderKey: "short-key-value" }).message).not.toContain("short-key-value");
  });
});

describe("the other errors a caller meets carry a stable code", () => {
  it("HttpRequestBlockedError is EG_HOOK_BLOCKED, PolicyLoadError EG_POLICY_LOAD", () => {
    expect(new HttpRequestBlockedError("no", 451).code).toBe("EG_HOOK_BLOCKED");
    expect(new PolicyLoadError("policy.ts:1: boom").code).toBe("EG_POLICY_LOAD");
  });
});

describe("checkGuestOptions (for addGuest)", () => {
  it("checks one guest as startProxy would, naming guests.NAME and the caller", () => {
    expect(() => checkGuestOptions("ci", { httpHooks: createHttpHooks({}).httpHooks, sources: ["10.0.0.1/32"] })).not.toThrow();
    let error: unknown;
    try {
      checkGuestOptions("ci", { sourcs: [] });
    } catch (e) {
      error = e;
    }
    expect(error).toMatchObject({ code: "EG_INVALID_OPTION", path: "guests.ci.sourcs" });
    expect((error as Error).message).toMatch(/^addGuest: unknown option "guests\.ci\.sourcs"; did you mean "sources"\?/);
    expect(() => checkGuestOptions("Not Valid", {})).toThrow(/a guest name must be/);
  });
});
