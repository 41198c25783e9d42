import { describe, expect, it } from "vitest";
import { isOptionError } from "../../src/config/option-error.js";
import { createHttpHooks } from "../../src/hooks/http-hooks.js";
import { checkGuestOptions, resolveProxyOptions, type ProxyOptions, type ResolvedProxyOptions } from "../../src/proxy/options.js";
import { startProxy } from "../../src/proxy/start-proxy.js";
import { tempDir } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";

// upstreamCa certificates are parsed: the getter's first value must be a real one.
const { certPem } = await testCa();

// startProxy's schema walked own enumerable keys while the resolver and the guest read options
// by name, prototype included, and read getters again: values the check never saw were used,
// and every hooked request failed instead of the start (black-box finding). The options are now
// read once, own data only; that copy is what is checked and what is used.

const untyped = (options: unknown): ProxyOptions => options as ProxyOptions;

/** An enumerable getter that counts its reads and answers `values` in turn. */
function getter<T, O extends object = Record<string, T>>(key: string, values: readonly T[], target: object = {}): { object: O; reads: () => number } {
  let reads = 0;
  const object = Object.defineProperty(target, key, { enumerable: true, get: () => values[Math.min(reads++, values.length - 1)] }) as O;
  return { object, reads: () => reads };
}

const throwing = (key: string): Record<string, unknown> =>
  Object.defineProperty({}, key, {
    enumerable: true,
    get: () => {
      throw new Error("boom");
    },
  }) as Record<string, unknown>;

describe("startProxy's options are read once, own data only: what is checked is what is used", () => {
  const hookMs = getter("hookMs", [100, Number.NaN]);
  const ca = getter<string, string[]>("0", [certPem, "not a certificate"], []);
  it.each<[string, () => unknown, (resolved: ResolvedProxyOptions) => unknown, unknown]>([
    ["a getter is read once: its first value is checked and used", () => ({ timeouts: hookMs.object }), (r) => [r.timeouts.hookMs, hookMs.reads()], [100, 1]],
    ["a getter in a list is read once", () => ({ upstreamCa: ca.object }), (r) => [r.upstreamCaPems.length, ca.reads()], [1, 1]],
    [
      "createHttpHooks' hooks keep their allowlist, which travels under symbols",
      () => ({ httpHooks: createHttpHooks({ allowedHosts: ["api.test"] }).httpHooks }),
      (r) => r.guests[0]!.declarative.allowedHosts,
      ["api.test"],
    ],
  ])("%s", (_name, options, read, expected) => {
    expect(read(resolveProxyOptions(untyped(options())))).toEqual(expected);
  });

  it.each<[string, () => unknown, string, RegExp]>([
    ["a getter that throws", () => ({ timeouts: throwing("hookMs") }), "timeouts.hookMs", /^startProxy: timeouts\.hookMs could not be read: boom$/],
    ["a getter that throws at the top level", () => throwing("caDir"), "caDir", /^startProxy: caDir could not be read: boom$/],
    ["a getter that throws in a list", () => ({ upstreamCa: Object.defineProperty([], "0", { enumerable: true, get: () => { throw new Error("boom"); } }) }), "upstreamCa[0]", /upstreamCa\[0\] could not be read: boom/],
    ["a hook getter that throws", () => ({ httpHooks: throwing("onRequest") }), "httpHooks.onRequest", /httpHooks\.onRequest could not be read: boom/],
    ["a Proxy whose ownKeys trap throws", () => ({ limits: new Proxy({}, { ownKeys: () => { throw new Error("trap"); } }) }), "limits", /limits could not be read: trap/],
    ["a getter whose value is wrong, though read once", () => ({ timeouts: getter("hookMs", ["abc"]).object }), "timeouts.hookMs", /timeouts\.hookMs must be an integer \(got "abc"\)/],
    // Inherited, an option was never checked but used; left out, a class's hook was silently dropped.
    ["an inherited timeouts", () => Object.create({ timeouts: { hookMs: "abc" } }), "timeouts", /^startProxy: timeouts is inherited from a prototype/],
    ["an inherited hookMs inside timeouts", () => ({ timeouts: Object.create({ hookMs: "abc" }) }), "timeouts.hookMs", /timeouts\.hookMs is inherited from a prototype/],
    ["an inherited limits", () => Object.create({ limits: { connections: 0 } }), "limits", /limits is inherited from a prototype/],
    ["an inherited listen.host", () => ({ listen: Object.create({ host: "0.0.0.0" }) }), "listen.host", /listen\.host is inherited from a prototype/],
    ["a hook on httpHooks' prototype (a class's method)", () => ({ httpHooks: new (class { onRequest(): undefined { return undefined; } })() }), "httpHooks.onRequest", /httpHooks\.onRequest is inherited from a prototype/],
    ["an inherited guest", () => ({ guests: Object.assign(Object.create({ evil: {} }), { ci: {} }) }), "guests.evil", /guests\.evil is inherited from a prototype/],
  ])("%s is an option error naming its path, not the caller's raw error", (_name, options, path, message) => {
    let error: unknown;
    try {
      resolveProxyOptions(untyped(options()));
    } catch (e) {
      error = e;
    }
    expect(isOptionError(error)).toBe(true);
    expect(error).toMatchObject({ code: "EG_INVALID_OPTION", path });
    expect((error as Error).message).toMatch(message);
  });

  it("addGuest's options are read once too: an inherited source is refused, a throwing getter names guests.NAME", () => {
    expect(() => checkGuestOptions("ci", Object.create({ sources: ["10.0.0.0/8"] }))).toThrow(/guests\.ci\.sources is inherited from a prototype/);
    const env = getter("A", ["1", "2"]);
    expect({ ...checkGuestOptions("ci", { env: env.object }).env }).toEqual({ A: "1" });
    expect(env.reads()).toBe(1);
    expect(() => checkGuestOptions("ci", { env: throwing("A") })).toThrow(/^addGuest: guests\.ci\.env\.A could not be read: boom$/);
  });

  it("a proxy started with options from a prototype is refused at the start, naming the option (a hooked request was answered 504 \"within abc ms\")", async () => {
    const { httpHooks, env } = createHttpHooks({ allowedHosts: ["api.test"] });
    const options = Object.assign(Object.create({ timeouts: { hookMs: "abc" }, limits: { connections: 0 } }), {
      httpHooks,
      env,
      caDir: tempDir(),
      listen: { host: "127.0.0.1", port: 0 },
      logLevel: "silent",
    }) as ProxyOptions;
    await expect(startProxy(options)).rejects.toMatchObject({ code: "EG_INVALID_OPTION", path: "timeouts" });
  });
});
