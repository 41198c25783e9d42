import { describe, expect, it } from "vitest";
import { defaultDjsLimits } from "../../src/djs/create-djs-hooks.js";
import { createHttpHooks, declarativeConfigOf } from "../../src/hooks/http-hooks.js";
import { defaults } from "../../src/config/defaults.js";
import { configOverrides, flagFor, flagText, optionFlags } from "../../src/config/flags.js";
import { formatPath, invalidOptionCode, issueText, optionError, OptionError, OptionRangeError, type OptionIssue } from "../../src/config/option-error.js";
import { apiOptionsSchema, configFileSchema, schemaPaths } from "../../src/config/schema.js";
import { InlineSecret } from "../../src/config/secret-source.js";
import { closest, editDistance, validate, type ObjectNode } from "../../src/config/validate.js";

function issuesOf(schema: ObjectNode, value: unknown, inlineSecrets = false): OptionIssue[] {
  const issues: OptionIssue[] = [];
  validate(schema, value, [], issues, { inlineSecrets });
  return issues;
}

const fileIssues = (value: unknown): OptionIssue[] => issuesOf(configFileSchema, value);

function onlyIssue(issues: OptionIssue[]): OptionIssue {
  expect(issues).toHaveLength(1);
  return issues[0]!;
}

describe("the option schema: every error has a code and a path", () => {
  it.each([
    { name: "a port out of range", value: { listen: { port: 70000 } }, path: "listen.port", kind: "range" },
    { name: "a timeout given as text", value: { timeouts: { dnsMs: "5s" } }, path: "timeouts.dnsMs", kind: "invalid" },
    { name: "an unknown limit", value: { limits: { conections: 5 } }, path: "limits.conections", kind: "unknown" },
    { name: "a guest's bad source range", value: { guests: { ci: { sources: ["10.0.0.1/40"] } } }, path: "guests.ci.sources[0]", kind: "invalid" },
    { name: "a bad guest name", value: { guests: { CI: {} } }, path: "guests.CI", kind: "clause" },
    { name: "a resolve entry with no addresses", value: { resolve: { "api.test": [] } }, path: "resolve.api.test", kind: "invalid" },
    { name: "a hook that is not a function", value: { httpHooks: { onRequest: 1 } }, path: "httpHooks.onRequest", kind: "invalid" },
  ])("startProxy options: $name", ({ value, path, kind }) => {
    const issue = onlyIssue(issuesOf(apiOptionsSchema, value));
    expect(issue.path).toBe(path);
    expect(issue.kind).toBe(kind);
    const error = optionError(issue, { prefix: "startProxy: " });
    expect(error.code).toBe(invalidOptionCode);
    expect(error.path).toBe(path);
    expect(error).toBeInstanceOf(kind === "range" ? RangeError : TypeError);
    expect(error.message.startsWith(`startProxy: `)).toBe(true);
    expect(error.message).toContain(path);
  });

  it("a number out of range is an OptionRangeError (a RangeError), anything else an OptionError (a TypeError)", () => {
    const range = optionError(onlyIssue(fileIssues({ workers: 65 })));
    expect(range).toBeInstanceOf(OptionRangeError);
    expect(range.message).toBe("workers must be an integer from 1 to 64 (got 65)");
    const type = optionError(onlyIssue(fileIssues({ workers: "2" })));
    expect(type).toBeInstanceOf(OptionError);
    expect(type).not.toBeInstanceOf(RangeError);
    expect(type.message).toBe('workers must be an integer (got "2")');
  });

  it("paths index lists and quote keys that are not plain", () => {
    expect(formatPath(["guests", "ci", "allowHosts", 2])).toBe("guests.ci.allowHosts[2]");
    expect(formatPath(["resolve", "a b"])).toBe('resolve["a b"]');
    expect(formatPath([])).toBe("options");
  });

  it("collects every issue of a document, not only the first", () => {
    const issues = fileIssues({ workers: 0, logLevel: "loud", guests: { ci: { allowHosts: ["https://x.test"], hooksTimeoutMs: 0 } } });
    expect(issues.map((i) => i.path).sort()).toEqual(["guests.ci.allowHosts[0]", "guests.ci.hooksTimeoutMs", "logLevel", "workers"]);
  });
});

describe("the option schema: unknown keys", () => {
  it('an unknown key within two edits of a known one gets "did you mean"', () => {
    const issue = onlyIssue(fileIssues({ guests: { ci: { allowHost: ["x.test"] } } }));
    expect(issue.kind).toBe("unknown");
    expect(issue.path).toBe("guests.ci.allowHost");
    expect(optionError(issue).message).toMatch(/^unknown option "guests\.ci\.allowHost"; did you mean "allowHosts"\? \(known: .*sources/);
  });

  it("an unknown key far from every known one lists the known keys without a guess", () => {
    const issue = onlyIssue(fileIssues({ frobnicate: true }));
    expect(issue.reason).not.toMatch(/did you mean/);
    expect(issue.reason).toMatch(/\(known: listen, caDir/);
  });

  it("the API's spelling in a file is pointed at the file's", () => {
    expect(onlyIssue(fileIssues({ allowedHosts: ["x.test"] })).reason).toMatch(/did you mean "allowHosts"/);
    expect(onlyIssue(fileIssues({ port: 8080 })).reason).toMatch(/did you mean "listen"/);
  });

  it("edit distance is case-insensitive and closest gives nothing past two edits", () => {
    expect(editDistance("allowedhosts", "allowHosts")).toBe(2);
    expect(editDistance("kitten", "sitting")).toBe(3);
    expect(closest("logLvel", ["listen", "logLevel"])).toBe("logLevel");
    expect(closest("verbosity", ["listen", "logLevel"])).toBeUndefined();
  });
});

describe("the option schema: rules between options", () => {
  it("top-level guest keys cannot be mixed with guests", () => {
    const issue = onlyIssue(fileIssues({ allowHosts: ["a.test"], guests: { ci: {} } }));
    expect(issue.path).toBe("allowHosts");
    expect(issue.reason).toMatch(/single guest "default".*guests\.NAME/);
  });

  it("auth applies only without guests, in the file and in startProxy's options", () => {
    expect(onlyIssue(fileIssues({ auth: true, guests: { ci: {} } })).path).toBe("auth");
    expect(onlyIssue(issuesOf(apiOptionsSchema, { auth: true, guests: { ci: {} } })).path).toBe("auth");
    expect(fileIssues({ auth: false })).toEqual([]);
  });

  it("startProxy refuses guests together with top-level httpHooks or env", () => {
    const issues = issuesOf(apiOptionsSchema, { env: {}, httpHooks: {}, guests: { ci: {} } });
    expect(issues.map((i) => i.path).sort()).toEqual(["env", "httpHooks"]);
  });

  it("hooksTimeoutMs needs hooksScript, and followRedirectsTo needs a refusing mode", () => {
    expect(onlyIssue(fileIssues({ hooksTimeoutMs: 50 })).path).toBe("hooksTimeoutMs");
    expect(onlyIssue(fileIssues({ followRedirectsTo: ["a.test"] })).path).toBe("followRedirectsTo");
    expect(fileIssues({ followRedirectsTo: ["a.test"], secretRedirects: "refuse" })).toEqual([]);
    const secret = { hosts: ["a.test"], value: "env:A", followRedirectsTo: ["b.test"] };
    expect(onlyIssue(fileIssues({ guests: { ci: { secrets: { A: secret } } } })).path).toBe("guests.ci.secrets.A.followRedirectsTo");
    expect(fileIssues({ guests: { ci: { secrets: { A: { ...secret, secretRedirects: "refuse" } } } } })).toEqual([]);
  });

  it("guests must name at least one guest", () => {
    expect(onlyIssue(fileIssues({ guests: {} })).path).toBe("guests");
  });

  it("a secret needs hosts and a value", () => {
    const issues = fileIssues({ secrets: { A: {} } });
    expect(issues.map((i) => `${i.path} ${i.reason}`).sort()).toEqual(["secrets.A.hosts is required", "secrets.A.value is required"]);
  });
});

describe("the option schema: secret values", () => {
  const secret = (value: unknown): unknown => ({ secrets: { GH_TOKEN: { hosts: ["api.test"], value } } });

  it('a file names a source ("env:VAR" or "file:PATH"), never the value, and the message never quotes it', () => {
    const issue = onlyIssue(fileIssues(secret("ghp_literalvalue123")));
    expect(issue.path).toBe("secrets.GH_TOKEN.value");
    expect(issue.reason).toMatch(/"env:VAR" or "file:PATH", never the value itself: a config file is read/);
    expect(issue.reason).not.toContain("ghp_literalvalue123");
    expect(fileIssues(secret("env:GH_TOKEN"))).toEqual([]);
    expect(fileIssues(secret("file:./gh-token"))).toEqual([]);
  });

  it("bad sources are refused: env: with no name, file: with no path, a number", () => {
    expect(onlyIssue(fileIssues(secret("env:1BAD"))).reason).toMatch(/names no environment variable/);
    expect(onlyIssue(fileIssues(secret("file:"))).reason).toMatch(/names no file/);
    expect(onlyIssue(fileIssues(secret(12345678))).reason).not.toContain("12345678");
  });

  it("an inline value passes only where the flags put it", () => {
    const inline = secret(new InlineSecret("s3cret-value"));
    expect(issuesOf(configFileSchema, inline, true)).toEqual([]);
    const issue = onlyIssue(issuesOf(configFileSchema, inline, false));
    expect(JSON.stringify(issue)).not.toContain("s3cret-value");
  });
});

describe("one table of defaults", () => {
  /** The defaults-table entry for a schema path: top-level keys, nested objects, a guest's keys. */
  function tableDefault(path: string): unknown {
    let at: unknown = defaults;
    for (const segment of path.split(".")) at = (at as Record<string, unknown> | undefined)?.[segment];
    if (at !== undefined) return at;
    return (defaults.guest as Record<string, unknown>)[path.split(".").at(-1)!];
  }

  it("every default in startProxy's schema is the table's value at the same path", () => {
    const withDefaults = schemaPaths(apiOptionsSchema).filter(({ node }) => "default" in node && node.default !== undefined);
    expect(withDefaults.map((p) => p.path)).toEqual(expect.arrayContaining(["listen.port", "maxRedirects", "timeouts.dnsMs", "limits.pipelinedRequests"]));
    for (const { path, node } of withDefaults) expect([path, (node as { default: unknown }).default]).toEqual([path, tableDefault(path)]);
  });

  it("every default in the file's schema is the table's value (listen as HOST:PORT)", () => {
    for (const { path, node } of schemaPaths(configFileSchema)) {
      if (!("default" in node) || node.default === undefined) continue;
      const expected = path === "listen" ? `${defaults.listen.host}:${defaults.listen.port}` : tableDefault(path.replace(/^guests\.\*\./, ""));
      expect([path, node.default]).toEqual([path, expected]);
    }
  });

  it("the table agrees with what createHttpHooks and createDjsHooks do when given nothing", () => {
    expect(declarativeConfigOf(createHttpHooks({}).httpHooks)?.blockInternalRanges).toBe(defaults.guest.blockInternalRanges);
    expect(defaults.guest.hooksTimeoutMs).toBe(defaultDjsLimits.timeoutMs);
    expect(Object.isFrozen(defaults.guest)).toBe(true);
  });
});

describe("the flags table", () => {
  it("every flag stands for an option the config file has", () => {
    const paths = new Set(schemaPaths(configFileSchema).map((p) => p.path));
    for (const path of Object.keys(optionFlags)) expect([path, paths.has(path)]).toEqual([path, true]);
    for (const path of configOverrides) expect(Object.keys(optionFlags)).toContain(path);
  });

  it("every flag name is unique, so an error's flag names one option", () => {
    const names = Object.values(optionFlags);
    expect(new Set(names).size).toBe(names.length);
  });

  it.each([
    ["maxRedirects", "--max-redirects"],
    ["timeouts.upstreamBodyMs", "--upstream-body-timeout-ms"],
    ["limits.connectionsPerSource", "--max-connections-per-source"],
    ["listen.port", "--listen"],
    ["allowedHosts[1]", "--allow-host"],
    ["allowInternalHosts[0]", "--allow-internal-host"],
    ["secrets.GH_TOKEN.hosts[0]", "--host-secret GH_TOKEN"],
    ["resolve.api.test", "--resolve api.test"],
    ["deploymentKey", "$EGRESSGATE_PLACEHOLDER_KEY"],
    ["secretPlaceholderKey", "$EGRESSGATE_PLACEHOLDER_KEY"],
  ])("%s is %s", (path, flag) => {
    expect(flagFor(path)).toBe(flag);
  });

  it("an option that needs another names that one as a flag too, and as a key in the file's words", () => {
    const timeout = onlyIssue(fileIssues({ hooksTimeoutMs: 50 }));
    expect(issueText(timeout)).toBe("hooksTimeoutMs only applies with hooksScript");
    expect(flagText(timeout)).toBe("--hooks-timeout-ms: only applies with --hooks-script");
    const follow = onlyIssue(fileIssues({ followRedirectsTo: ["a.test"] }));
    expect(issueText(follow)).toBe('followRedirectsTo only applies with secretRedirects: "refuse"');
    expect(flagText(follow)).toBe("--follow-redirects-to: only applies with --secret-redirects refuse");
  });

  it("an option no flag sets keeps its path", () => {
    expect(flagFor("timeouts.dnsMs")).toBeUndefined();
    const issue = onlyIssue(fileIssues({ timeouts: { dnsMs: 0 } }));
    expect(flagText(issue)).toBe("timeouts.dnsMs must be an integer from 1 to 86400000 (got 0)");
    expect(flagText(onlyIssue(fileIssues({ maxRedirects: 101 })))).toBe("--max-redirects: must be an integer from 0 to 100 (got 101)");
  });
});
