import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it, onTestFinished } from "vitest";
import { parse } from "yaml";
import { buildProxyOptions, guestPlaceholderKey } from "../../src/config/build.js";
import { describeConfig } from "../../src/config/describe.js";
import { loadConfigFile } from "../../src/config/file.js";
import { OptionError } from "../../src/config/option-error.js";
import { PolicyLoadError } from "../../src/djs/create-djs-hooks.js";
import { createHttpHooks, declarativeConfigOf, djsHooksOf } from "../../src/hooks/http-hooks.js";
import { tempDir } from "../helpers/proxy.js";

const key = "k".repeat(16) + "0123456789abcdef0123";

function configFile(text: string): string {
  const file = join(tempDir("egressgate-config-"), "egressgate.yaml");
  writeFileSync(file, text);
  return file;
}

const sameSecretTwice = `guests:
  ci:
    allowHosts: [api.test]
    secrets: { TOKEN: { hosts: [api.test], value: env:CI_TOKEN } }
  agent:
    allowHosts: [other.test]
    resolve: { other.test: [127.0.0.2] }
    sources: [10.88.0.2/32]
    secrets: { TOKEN: { hosts: [other.test], value: file:agent-token } }
`;

function loadTwoGuests(): ReturnType<typeof loadConfigFile> {
  const file = configFile(sameSecretTwice);
  writeFileSync(join(file, "..", "agent-token"), "agent-secret-value-from-file\n");
  return loadConfigFile(file, { CI_TOKEN: "ci-secret-value-from-env" });
}

describe("check-config's description", () => {
  it("names every guest's hosts and secret sources, and holds no secret value", () => {
    const text = describeConfig(loadTwoGuests());
    expect(text).not.toContain("ci-secret-value-from-env");
    expect(text).not.toContain("agent-secret-value");
    const described = parse(text) as { guests: Record<string, Record<string, unknown>> };
    expect(Object.keys(described.guests)).toEqual(["ci", "agent"]);
    expect(described.guests["ci"]).toMatchObject({
      credentials: "required",
      allowHosts: ["api.test"],
      blockInternalRanges: true,
      secrets: { TOKEN: { hosts: ["api.test"], value: "(redacted; from env:CI_TOKEN)" } },
    });
    expect(described.guests["agent"]).toMatchObject({
      credentials: "required, or a connection from 10.88.0.2/32",
      sources: ["10.88.0.2/32"],
      resolve: { "other.test": ["127.0.0.2"] },
      secrets: { TOKEN: { value: expect.stringMatching(/^\(redacted; from file:\/.*agent-token\)$/) } },
    });
  });

  it("the one guest of a file without guests is default, with the proxy-wide options filled from the defaults", () => {
    const described = parse(describeConfig(loadConfigFile(configFile("allowHosts: [a.test]\n"), {}))) as Record<string, unknown>;
    expect(described).toMatchObject({ listen: "127.0.0.1:8080", workers: 1, logLevel: "info" });
    expect(described["guests"]).toEqual({
      default: { credentials: expect.stringMatching(/^none/), allowHosts: ["a.test"], blockInternalRanges: true, secrets: {} },
    });
  });
});

describe("buildProxyOptions", () => {
  it("listed guests become startProxy's guests, each with its own hooks, env, resolve and sources", () => {
    const built = buildProxyOptions(loadTwoGuests(), { deploymentKey: key });
    const guests = built.options.guests!;
    expect(Object.keys(guests)).toEqual(["ci", "agent"]);
    expect(built.options.httpHooks).toBeUndefined();
    expect(built.options.deploymentKey).toBe(key);
    expect(declarativeConfigOf(guests["ci"]!.httpHooks)?.allowedHosts).toEqual(["api.test"]);
    expect(declarativeConfigOf(guests["agent"]!.httpHooks)?.allowedHosts).toEqual(["other.test"]);
    expect(guests["agent"]!.resolve).toEqual({ "other.test": ["127.0.0.2"] });
    expect(guests["agent"]!.sources).toEqual(["10.88.0.2/32"]);
    expect("sources" in guests["ci"]!).toBe(false);
    expect(built.redact("x ci-secret-value-from-env y agent-secret-value-from-file")).not.toMatch(/secret-value/);
  });

  it("two guests' same-named secrets get different placeholders, the same on every build with the same key", () => {
    const first = buildProxyOptions(loadTwoGuests(), { deploymentKey: key }).options.guests!;
    const again = buildProxyOptions(loadTwoGuests(), { deploymentKey: key }).options.guests!;
    const ci = first["ci"]!.env["TOKEN"];
    const agent = first["agent"]!.env["TOKEN"];
    expect(ci).toMatch(/^EGRESSGATE_SECRET_[0-9a-f]{48}$/);
    expect(agent).toMatch(/^EGRESSGATE_SECRET_[0-9a-f]{48}$/);
    expect(ci).not.toBe(agent);
    expect(again["ci"]!.env["TOKEN"]).toBe(ci);
    expect(again["agent"]!.env["TOKEN"]).toBe(agent);
    // Derived per guest: what createHttpHooks gives for the guest's own key.
    const direct = createHttpHooks({ secrets: { TOKEN: { hosts: ["api.test"], value: "v" } }, secretPlaceholderKey: guestPlaceholderKey(key, "ci") });
    expect(direct.env["TOKEN"]).toBe(ci);
  });

  it("the single guest keeps the deployment key itself, so its placeholders are those of before guests", () => {
    const config = loadConfigFile(configFile("secrets: { TOKEN: { hosts: [api.test], value: env:T } }\nauth: true\n"), { T: "value" });
    const built = buildProxyOptions(config, { deploymentKey: key });
    expect(built.options.guests).toBeUndefined();
    expect(built.options.auth).toBe(true);
    const direct = createHttpHooks({ secrets: { TOKEN: { hosts: ["api.test"], value: "v" } }, secretPlaceholderKey: key });
    expect(built.options.env?.["TOKEN"]).toBe(direct.env["TOKEN"]);
  });

  it("a deployment key shorter than 32 characters is refused by path, without quoting it", () => {
    const short = "tooshort-key-1234";
    let error: unknown;
    try {
      buildProxyOptions(loadTwoGuests(), { deploymentKey: short });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(OptionError);
    expect((error as OptionError).path).toBe("deploymentKey");
    expect((error as OptionError).message).not.toContain(short);
  });

  it("a guest's tier-2 policy is loaded with its time limit; one that does not compile names the guest's hooksScript", async () => {
    const file = configFile("guests:\n  ci: { hooksScript: good.js, hooksTimeoutMs: 70 }\n  bad: { hooksScript: bad.js }\n");
    writeFileSync(join(file, "..", "good.js"), "function isRequestAllowed() { return true; }\n");
    writeFileSync(join(file, "..", "bad.js"), "function isRequestAllowed( {\n");
    const config = loadConfigFile(file, {});
    let error: unknown;
    try {
      buildProxyOptions(config);
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(OptionError);
    expect((error as OptionError).path).toBe("guests.bad.hooksScript");
    expect((error as OptionError).cause).toBeInstanceOf(PolicyLoadError);
    expect((error as OptionError).message).toMatch(/^guests\.bad\.hooksScript: \/.*bad\.js:\d+:\d+: SyntaxError/);

    const good = buildProxyOptions({ ...config, guests: { ci: config.guests["ci"]! } });
    onTestFinished(() => good.close());
    expect(good.policies).toHaveLength(1);
    const djs = djsHooksOf(good.options.guests!["ci"]!.httpHooks);
    expect(djs?.phases).toEqual(["isRequestAllowed"]);
    expect(djs?.engine.limits.timeoutMs).toBe(70);
  });
});
