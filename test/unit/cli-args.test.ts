import { describe, expect, it } from "vitest";
import { parseCli, parseListen, parseResolve, UsageError } from "../../src/cli/args.js";
import { declarativeConfigOf } from "../../src/hooks/http-hooks.js";
import type { ProxyOptions } from "../../src/proxy/options.js";

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

function usageErrorOf(argv: readonly string[]): UsageError {
  try {
    parseCli(argv);
  } catch (error) {
    expect(error).toBeInstanceOf(UsageError);
    return error as UsageError;
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
    expect(usageErrorOf(["--upstream-body-timeout-ms", "0"]).message).toMatch(/--upstream-body-timeout-ms: expected a positive integer/);
    expect(usageErrorOf(["--max-connections", "1.5"]).message).toMatch(/--max-connections: expected a positive integer/);
  });

  it("no flags serve on 127.0.0.1:8080 with deny-all hooks and leave caDir and guestEnvFile to startProxy's defaults", () => {
    const options = serveOptions([]);
    expect(options.listen).toEqual({ host: "127.0.0.1", port: 8080 });
    expect(options.resolve).toEqual({});
    expect(options.upstreamCa).toEqual([]);
    expect(options.leafKeyType).toBe("ecdsa");
    expect(options.maxRedirects).toBe(10);
    expect(options.logLevel).toBe("info");
    expect(options.env).toEqual({});
    expect("caDir" in options).toBe(false);
    expect("guestEnvFile" in options).toBe(false);
    expect(declarativeOf(options)).toEqual({ allowedHosts: [], allowedInternalHosts: [], blockInternalRanges: true });
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
    expect(serveOptions(["--upstream-ca", "/etc/a.pem", "--upstream-ca", "/etc/b.pem"]).upstreamCa).toEqual([
      "/etc/a.pem",
      "/etc/b.pem",
    ]);
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
    { argv: ["--listen", "nope"], names: /--listen.*"nope"/ },
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
    { argv: ["--hooks-timeout-ms", "50"], names: /--hooks-timeout-ms: only applies with --hooks-script/ },
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
