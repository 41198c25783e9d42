import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseCli, parseListen, parseResolve, UsageError } from "../../src/cli/args.js";
import { declarativeConfigOf } from "../../src/hooks/http-hooks.js";
import { ConfigFileError, isOptionError, type OptionError } from "../../src/config/option-error.js";
import { defaults, resolveProxyOptions, type ProxyOptions } from "../../src/proxy/options.js";
import { tempDir } from "../helpers/proxy.js";

/** Parses argv that must yield the serve command, and returns its startProxy options. */
function serveOptions(argv: readonly string[]): ProxyOptions {
  const command = parseCli(argv);
  if (command.kind !== "serve") throw new Error(`expected the serve command, got ${command.kind}`);
  return command.options;
}

/** The declarative configuration the CLI handed to startProxy through httpHooks. */
function declarativeOf(options: ProxyOptions): ReturnType<typeof declarativeConfigOf> {
  return declarativeConfigOf(options.httpHooks);
}

/** The error bad input gets: a UsageError, or an option error naming the flag (both exit 2). */
function usageErrorOf(argv: readonly string[], env: NodeJS.ProcessEnv = {}): Error & { code?: string; path?: string } {
  try {
    parseCli(argv, env);
  } catch (error) {
    if (!(error instanceof UsageError) && !(error instanceof ConfigFileError)) {
      expect(isOptionError(error)).toBe(true);
      expect((error as OptionError).code).toBe("EG_INVALID_OPTION");
    }
    return error as Error;
  }
  throw new Error(`parseCli(${JSON.stringify(argv)}) did not throw`);
}

describe("parseCli: serve flags become startProxy options", () => {
  it("--upstream-body-timeout-ms and the connection limits become timeouts and limits; absent, they are left to startProxy", () => {
    const options = serveOptions(["--upstream-body-timeout-ms", "1500", "--max-connections", "900", "--max-connections-per-source", "40"]);
    expect(options.timeouts).toEqual({ upstreamBodyMs: 1500 });
    expect(options.limits).toEqual({ connections: 900, connectionsPerSource: 40 });
    expect(serveOptions(["--max-connections-per-source", "7"]).limits).toEqual({ connectionsPerSource: 7 });
    const bare = serveOptions([]);
    expect("timeouts" in bare).toBe(false);
    expect("limits" in bare).toBe(false);
    expect(usageErrorOf(["--upstream-body-timeout-ms", "0"]).message).toBe("--upstream-body-timeout-ms: must be an integer from 1 to 86400000 (got 0)");
    expect(usageErrorOf(["--max-connections", "1.5"]).message).toBe("--max-connections: must be an integer (got 1.5)");
  });

  it("no flags give deny-all hooks and leave every other option to the one table of defaults", () => {
    const options = serveOptions([]);
    expect(Object.keys(options).sort()).toEqual(["env", "httpHooks"]);
    expect(options.env).toEqual({});
    expect(declarativeOf(options)).toEqual({ allowedHosts: [], allowedInternalHosts: [], blockInternalRanges: true });
    const resolved = resolveProxyOptions(options);
    expect(resolved.listen).toEqual(defaults.listen);
    expect([resolved.maxRedirects, resolved.leafKeyType, resolved.logLevel]).toEqual([defaults.maxRedirects, defaults.leafKeyType, defaults.logLevel]);
  });

  it("the explicit serve command parses like the default command", () => {
    expect(serveOptions(["serve", "--listen", "9000"]).listen).toEqual(serveOptions(["--listen", "9000"]).listen);
  });

  it("--allow-host and --allow-internal-host are repeatable and reach the declarative tier", () => {
    const options = serveOptions([
      "--allow-host",
      "api.github.com",
      "--allow-host",
      "*.npmjs.org",
      "--allow-internal-host",
      "api.test",
      "--allow-internal-host",
      "db.test",
    ]);
    expect(declarativeOf(options)).toEqual({
      allowedHosts: ["api.github.com", "*.npmjs.org"],
      allowedInternalHosts: ["api.test", "db.test"],
      blockInternalRanges: true,
    });
  });

  it("--no-block-internal-ranges switches the internal-range block off", () => {
    expect(declarativeOf(serveOptions(["--no-block-internal-ranges"]))?.blockInternalRanges).toBe(false);
    expect(declarativeOf(serveOptions(["--block-internal-ranges"]))?.blockInternalRanges).toBe(true);
  });

  it("--resolve HOST=IP[,IP] is repeatable and merges entries for the same host", () => {
    const options = serveOptions([
      "--resolve",
      "api.test=127.0.0.1,::1",
      "--resolve",
      "api.test=127.0.0.2",
      "--resolve",
      "db.test=10.0.0.5",
    ]);
    expect(options.resolve).toEqual({ "api.test": ["127.0.0.1", "::1", "127.0.0.2"], "db.test": ["10.0.0.5"] });
  });

  it("--upstream-ca is repeatable and passes the paths through", () => {
    const dir = tempDir();
    const [a, b] = [join(dir, "a.pem"), join(dir, "b.pem")];
    for (const file of [a, b]) writeFileSync(file, "-----BEGIN CERTIFICATE-----\n");
    expect(serveOptions(["--upstream-ca", a, "--upstream-ca", b]).upstreamCa).toEqual([a, b]);
    // Checked while parsing, so a missing file exits 2 before anything starts.
    expect(usageErrorOf(["--upstream-ca", join(dir, "missing.pem")]).message).toMatch(/^--upstream-ca: cannot read .*missing\.pem: ENOENT/);
    // A FIFO with no writer held the start, silently, until one came.
    const fifo = join(dir, "fifo.pem");
    execFileSync("mkfifo", [fifo]);
    expect(usageErrorOf(["--upstream-ca", fifo]).message).toMatch(/^--upstream-ca: cannot read .*fifo\.pem: a FIFO, not a regular file/);
  });

  it("--ca-dir, --guest-env-file, --log-level, --leaf-key and --max-redirects map to their options", () => {
    const options = serveOptions([
      "--ca-dir",
      "/tmp/eg-ca",
      "--guest-env-file",
      "/tmp/eg-guest.env",
      "--log-level",
      "debug",
      "--leaf-key",
      "rsa",
      "--max-redirects",
      "3",
    ]);
    expect(options.caDir).toBe("/tmp/eg-ca");
    expect(options.guestEnvFile).toBe("/tmp/eg-guest.env");
    expect(options.logLevel).toBe("debug");
    expect(options.leafKeyType).toBe("rsa");
    expect(options.maxRedirects).toBe(3);
  });

  // A shell expands a tilde only at a word's start: `--ca-dir=~/ca` reached the proxy as it is,
  // and made a folder named `~` in the working directory.
  it("--ca-dir=~/ca, and every other path flag, is under $HOME; ~user is refused", () => {
    const home = tempDir("egressgate-home-");
    const command = parseCli(["--ca-dir=~/ca", "--guest-env-file=~/guest.env", "--audit-log=~/audit.log"], { HOME: home });
    if (command.kind !== "serve") throw new Error(`expected serve, got ${command.kind}`);
    expect([command.options.caDir, command.options.guestEnvFile, command.options.auditLog]).toEqual([join(home, "ca"), join(home, "guest.env"), join(home, "audit.log")]);
    expect(parseCli(["ca", "--ca-dir=~/ca"], { HOME: home })).toEqual({ kind: "ca", caDir: join(home, "ca") });
    expect(parseCli(["env", "--ca-dir=~/ca", "--listen", "127.0.0.1:9999"], { HOME: home })).toMatchObject({ kind: "env", caDir: join(home, "ca") });
    const refused = 'starts with "~bob", which is not expanded: only ~ and ~/ are (the home folder, $HOME); write the folder out';
    expect(usageErrorOf(["--ca-dir=~bob/ca"], { HOME: home }).message).toBe(`--ca-dir: ${refused}`);
    expect(usageErrorOf(["ca", "--ca-dir=~bob/ca"], { HOME: home }).message).toBe(`--ca-dir: ${refused}`);
  });

  it("--refuse-in-tunnel sets refuseInTunnel, which is off without it", () => {
    expect(serveOptions(["--refuse-in-tunnel"]).refuseInTunnel).toBe(true);
    expect(serveOptions([]).refuseInTunnel).toBeUndefined();
  });

  it("--max-redirects 0 is allowed (redirects are answered with 508 at once)", () => {
    expect(serveOptions(["--max-redirects", "0"]).maxRedirects).toBe(0);
  });

  it("--listen takes HOST:PORT, [v6]:PORT and a bare PORT", () => {
    expect(serveOptions(["--listen", "0.0.0.0:3128"]).listen).toEqual({ host: "0.0.0.0", port: 3128 });
    expect(serveOptions(["--listen", "[::1]:9000"]).listen).toEqual({ host: "::1", port: 9000 });
    expect(serveOptions(["--listen", "9000"]).listen).toEqual({ host: "127.0.0.1", port: 9000 });
    expect(serveOptions(["--listen", "127.0.0.1:0"]).listen).toEqual({ host: "127.0.0.1", port: 0 });
  });
});

describe("parseCli: the ca and env commands", () => {
  it("ca takes --ca-dir, or leaves it to the default", () => {
    expect(parseCli(["ca", "--ca-dir", "/tmp/eg-ca"])).toEqual({ kind: "ca", caDir: "/tmp/eg-ca" });
    expect(parseCli(["ca"])).toEqual({ kind: "ca", caDir: undefined });
  });

  it("env takes --ca-dir and the proxy's --listen address", () => {
    expect(parseCli(["env", "--ca-dir", "/tmp/eg-ca", "--listen", "127.0.0.1:9999"])).toEqual({
      kind: "env",
      caDir: "/tmp/eg-ca",
      listen: { host: "127.0.0.1", port: 9999 },
    });
  });

  it("env refuses port 0, because a guest needs the real port", () => {
    expect(usageErrorOf(["env", "--listen", "127.0.0.1:0"]).message).toMatch(/--listen/);
  });
});

describe("parseCli: bad flags and values throw a UsageError naming the flag", () => {
  it.each([
    { argv: ["--bogus"], names: /bogus/ },
    { argv: ["--listen", "nope"], names: /^--listen: must be HOST:PORT \(got "nope"\)$/ },
    { argv: ["--listen", "70000"], names: /--listen.*"70000"/ },
    { argv: ["--resolve", "x"], names: /--resolve.*"x"/ },
    { argv: ["--resolve", "=127.0.0.1"], names: /--resolve/ },
    { argv: ["--allow-host", "https://x"], names: /--allow-host.*https:\/\/x/ },
    { argv: ["--allow-host", "ok.test", "--allow-host", "x.test/path"], names: /--allow-host.*x\.test\/path/ },
    { argv: ["--allow-internal-host", "db.test:5432"], names: /--allow-internal-host.*db\.test:5432/ },
    { argv: ["--log-level", "loud"], names: /log-level[\s\S]*loud/ },
    { argv: ["--leaf-key", "dsa"], names: /leaf-key[\s\S]*dsa/ },
    { argv: ["--max-redirects", "-1"], names: /--max-redirects.*-1/ },
    { argv: ["--max-redirects", "1.5"], names: /--max-redirects.*1\.5/ },
    { argv: ["--max-redirects", "many"], names: /--max-redirects/ },
    { argv: ["env", "--allow-host", "x.test"], names: /allow-host/ },
    { argv: ["--hooks-timeout-ms", "50"], names: /^--hooks-timeout-ms: only applies with --hooks-script$/ },
    { argv: ["--workers", "0"], names: /^--workers: must be an integer from 1 to 64 \(got 0\)$/ },
    { argv: ["--max-redirects", "many"], names: /^--max-redirects: must be a number \(got "many"\)$/ },
    { argv: ["--auth", "--no-auth"], names: /^--auth and --no-auth: given both ways; give one$/ },
    { argv: ["--noAuth", "--auth=true"], names: /^--noAuth and --auth=true: given both ways; give one$/ },
  ])("$argv", ({ argv, names }) => {
    expect(usageErrorOf(argv).message).toMatch(names);
  });
});

describe("parseListen", () => {
  it("parses HOST:PORT, [v6]:PORT and a bare PORT on 127.0.0.1", () => {
    expect(parseListen("127.0.0.1:8080")).toEqual({ host: "127.0.0.1", port: 8080 });
    expect(parseListen("localhost:80")).toEqual({ host: "localhost", port: 80 });
    expect(parseListen("[::1]:0")).toEqual({ host: "::1", port: 0 });
    expect(parseListen("[::]:65535")).toEqual({ host: "::", port: 65535 });
    expect(parseListen("8080")).toEqual({ host: "127.0.0.1", port: 8080 });
  });

  it.each(["nope", "", ":80", "host:", "::1:80", "[::1]", "65536", "127.0.0.1:99999", "127.0.0.1:-1", "1.2.3.4:80:80"])(
    "refuses %j with a UsageError naming --listen",
    (value) => {
      expect(() => parseListen(value)).toThrow(UsageError);
      expect(() => parseListen(value)).toThrow(/--listen/);
    },
  );

  // `env --listen 'a b:80'` printed HTTPS_PROXY='http://a b:80': the host is held to serve's rule.
  it.each(["a b:80", "a/b:80", "x_y:80", "a?b:80"])("refuses %j as serve's --listen does: no IP address or hostname", (value) => {
    const host = value.slice(0, value.lastIndexOf(":"));
    expect(() => parseListen(value)).toThrow(new UsageError(`--listen: must be an IP address or hostname (got ${JSON.stringify(host)})`));
    expect(usageErrorOf(["env", "--listen", value]).message).toBe(`--listen: must be an IP address or hostname (got ${JSON.stringify(host)})`);
  });
});

describe("parseResolve", () => {
  it("splits HOST=IP[,IP], trims the addresses and merges repeated hosts", () => {
    expect(parseResolve(["a.test=1.1.1.1, 2.2.2.2", "b.test=::1", "a.test=3.3.3.3"])).toEqual({
      "a.test": ["1.1.1.1", "2.2.2.2", "3.3.3.3"],
      "b.test": ["::1"],
    });
    expect(parseResolve([])).toEqual({});
  });

  it.each(["x", "=1.1.1.1", "a.test=", ""])("refuses %j with a UsageError naming --resolve", (value) => {
    expect(() => parseResolve([value])).toThrow(UsageError);
    expect(() => parseResolve([value])).toThrow(/--resolve/);
  });
});

describe("parseCli: --config FILE", () => {
  function configFile(text: string): string {
    const file = join(tempDir(), "egressgate.yaml");
    writeFileSync(file, text);
    return file;
  }
  const twoGuests = "listen: 0.0.0.0:3128\nlogLevel: warn\nguests:\n  ci: { allowHosts: [a.test] }\n  agent: { allowHosts: [b.test], sources: [10.88.0.2/32] }\n";

  it("runs the file's guests, with their hooks, in startProxy's guests form", () => {
    const options = serveOptions(["--config", configFile(twoGuests)]);
    expect(Object.keys(options.guests ?? {})).toEqual(["ci", "agent"]);
    expect(declarativeConfigOf(options.guests?.["ci"]?.httpHooks)?.allowedHosts).toEqual(["a.test"]);
    expect(options.guests?.["agent"]?.sources).toEqual(["10.88.0.2/32"]);
    expect(options.listen).toEqual({ host: "0.0.0.0", port: 3128 });
    expect(options.logLevel).toBe("warn");
  });

  it("--listen, --ca-dir, --guest-env-file, --upstream-ca, --log-level and --workers override the file", () => {
    const file = configFile(twoGuests);
    const ca = join(tempDir(), "ca.pem");
    writeFileSync(ca, "-----BEGIN CERTIFICATE-----\n");
    const command = parseCli(
      ["--config", file, "--listen", "127.0.0.1:0", "--ca-dir", "/tmp/eg-ca", "--guest-env-file", "/tmp/eg.env", "--upstream-ca", ca, "--log-level", "debug", "--workers", "2"],
      {},
    );
    if (command.kind !== "serve") throw new Error("expected serve");
    expect(command.options).toMatchObject({ listen: { host: "127.0.0.1", port: 0 }, caDir: "/tmp/eg-ca", guestEnvFile: "/tmp/eg.env", upstreamCa: [ca], logLevel: "debug" });
    expect(command.workers).toBe(2);
    expect(command.source).toBe(file);
  });

  it("--watch=false turns off the file's watch: true, and --watch turns it on over a file without it", () => {
    const watching = configFile(`watch: true\n${twoGuests}`);
    const watchOf = (argv: readonly string[]): unknown => {
      const command = parseCli(argv, {});
      if (command.kind !== "serve") throw new Error("expected serve");
      return command.config.watch;
    };
    expect(watchOf(["--config", watching])).toBe(true);
    expect(watchOf(["--config", watching, "--watch=false"])).toBeUndefined();
    expect(watchOf(["--config", configFile(twoGuests), "--watch"])).toBe(true);
    expect(watchOf(["--config", configFile(twoGuests)])).toBeUndefined();
  });

  it("a flag that describes a guest, or any other option, next to --config is a usage error naming it and the file", () => {
    const file = configFile(twoGuests);
    for (const argv of [["--allow-host", "x.test"], ["--host-secret", "T@a.test=v"], ["--auth"], ["--max-redirects", "3"]]) {
      const error = usageErrorOf(["--config", file, ...argv]);
      expect(error).toBeInstanceOf(UsageError);
      expect(error.code).toBe("EG_USAGE");
      expect(error.message).toContain(`${argv[0]}: cannot be combined with --config`);
      expect(error.message).toContain(file);
      // The list of what may go with it names every flag that does.
      expect(error.message).toMatch(/\(only .*--metrics-listen.*, --log-format override the file\)$/);
    }
    const command = parseCli(["--config", file, "--log-format", "pretty"], {});
    expect(command).toMatchObject({ kind: "serve", logFormat: "pretty" });
  });

  it("a bad override names the flag; a bad file names its line", () => {
    expect(usageErrorOf(["--config", configFile(twoGuests), "--listen", "nope"]).message).toMatch(/^--listen: must be HOST:PORT/);
    const bad = configFile("guests:\n  ci:\n    allowHosts: [https://x]\n");
    const error = usageErrorOf(["--config", bad]) as Error & { code?: string };
    expect(error.code).toBe("EG_INVALID_CONFIG");
    expect(error.message).toBe(`${bad}:3: guests.ci.allowHosts[0] is not a host pattern: letters, digits, ".", "-", "_" and "*" only, with no scheme, port or path (got "https://x")`);
  });
});

describe("parseCli: --auth, env --guest and check-config", () => {
  it("--auth makes the flags' one guest need credentials; --no-auth says it need not, even beyond loopback", () => {
    expect(serveOptions(["--auth"]).auth).toBe(true);
    expect(serveOptions(["--no-auth", "--listen", "0.0.0.0:0"]).auth).toBe(false);
    expect("auth" in serveOptions([])).toBe(false);
  });

  it("EGRESSGATE_PLACEHOLDER_KEY becomes the deployment key guest tokens derive from; a short one names the variable", () => {
    const key = "d".repeat(40);
    const command = parseCli(["--auth"], { EGRESSGATE_PLACEHOLDER_KEY: key });
    expect(command.kind === "serve" && command.options.deploymentKey).toBe(key);
    expect(usageErrorOf(["--auth"], { EGRESSGATE_PLACEHOLDER_KEY: "short" }).message).toBe("$EGRESSGATE_PLACEHOLDER_KEY: must be at least 32 characters long");
  });

  it("env --guest NAME needs the deployment key, since a token derives from it", () => {
    const key = "k".repeat(32);
    expect(parseCli(["env", "--guest", "ci", "--listen", "127.0.0.1:3128"], { EGRESSGATE_PLACEHOLDER_KEY: key })).toEqual({
      kind: "env",
      caDir: undefined,
      listen: { host: "127.0.0.1", port: 3128 },
      guest: "ci",
    });
    expect(usageErrorOf(["env", "--guest", "ci"]).message).toMatch(/env --guest ci: needs \$EGRESSGATE_PLACEHOLDER_KEY/);
    expect(usageErrorOf(["env", "--guest", "Not A Name"], { EGRESSGATE_PLACEHOLDER_KEY: key }).message).toMatch(/^--guest: a guest name must be/);
  });

  it("check takes one value per repeatable flag, with global flags first or not, while serving still takes several", async () => {
    for (const argv of [
      ["check", "-H", "x-a: 1", "--allow-host", "a.test", "GET", "https://a.test/"],
      ["--listen", "127.0.0.1:0", "check", "-H", "x-a: 1", "--allow-host", "a.test", "GET", "https://a.test/"],
    ]) {
      const command = parseCli(argv);
      if (command.kind !== "check") throw new Error(`expected check, got ${command.kind}`);
      expect(command.check).toMatchObject({ method: "GET", url: "https://a.test/", headers: ["x-a: 1"] });
      await command.built.close();
    }
    expect(declarativeOf(serveOptions(["--allow-host", "a.test", "b.test"]))?.allowedHosts).toEqual(["a.test", "b.test"]);
  });

  it.each([
    ["--replay", "x.har"],
    ["--record", "x.har"],
    ["--record-missing"],
    ["--replay-exhausted", "error"],
    ["--replay-ignore-query", "ts"],
    ["--record-cookies"],
    ["--replay-any-guest"],
  ])("check refuses %s, which it would ignore (it sends and records nothing)", (...flag) => {
    const error = usageErrorOf(["check", ...flag, "--allow-host", "a.test", "GET", "https://a.test/"]);
    expect(error.message).toBe(`check: ${flag[0]} has no effect: check sends nothing and records nothing; give the upstream's answer with --response STATUS [-R 'Name: v']...`);
  });

  it.each([["--workers", "2"], ["--watch"], ["--audit-log", "/tmp/a.log"], ["--guest-env-file", "/tmp/g.env"]])("check refuses %s, which only a running proxy uses", (...flag) => {
    const error = usageErrorOf(["check", ...flag, "--allow-host", "a.test", "GET", "https://a.test/"]);
    expect(error.message).toBe(`check: ${flag[0]} has no effect: check starts no proxy and writes no file`);
  });

  it("check-config takes the file to check", () => {
    expect(parseCli(["check-config", "egressgate.yaml"])).toEqual({ kind: "check-config", file: "egressgate.yaml" });
    expect(usageErrorOf(["check-config"]).message).toMatch(/Not enough non-option arguments/);
  });
});
