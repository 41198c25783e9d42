import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { describe, expect, it } from "vitest";
import { cleanEnv, javaFetchSource, runClient, startGitServer, withoutCredentials, type ClientRun } from "../helpers/clients.js";
import { startGuestsProxy, type GuestsProxy } from "../helpers/guests.js";
import { tempDir } from "../helpers/proxy.js";
import { startUpstream, type Echo } from "../helpers/upstream.js";

type Env = Record<string, string>;
/** A real client fetching `url` as a guest would, with `env` as its whole environment; the body on stdout. */
type Client = (env: Env, url: string) => Promise<ClientRun>;

/** Guest `a` may reach a.test and `b` only b.test (both on loopback, through the proxy's resolve map). */
function twoGuests(): Promise<GuestsProxy> {
  return startGuestsProxy({ a: { allowedInternalHosts: ["a.test"] }, b: { allowedInternalHosts: ["b.test"] } });
}

/**
 * What the proxy logged since `mark`, in order: `[guest, status]` for each decision line (guest
 * undefined: nobody authenticated), and `["auth failed", reason]` for the auth gate's line. A 407
 * writes no decision line: the gate logs the first failure from a source at once and later ones
 * (within 10 s) only in a summary, so on a fresh proxy the first 407 is the one that shows.
 */
function loggedSince(proxy: GuestsProxy, mark: number): [unknown, unknown][] {
  return proxy.logs.slice(mark).flatMap((l): [unknown, unknown][] => {
    if (l["msg"] === "request") return [[l["guest"], l["status"]]];
    if (l["msg"] === "proxy authentication failed") return [["auth failed", l["reason"]]];
    return [];
  });
}

interface Expectations {
  /** Plain HTTP (absolute-form through the proxy) instead of HTTPS through CONNECT. */
  readonly http?: boolean;
  /** What the client says when the proxy answers 403, and when it answers 407. */
  readonly forbidden: RegExp;
  readonly required: RegExp;
  /** The exit code of both refusals, where the client has a documented one. */
  readonly refusedExitCode?: number;
  /** The client sends credentials only once a 407 asks for them, so its first run starts with one. */
  readonly waitsFor407?: boolean;
}

/**
 * The three runs every client gets. With guest a's environment from guestEnv(): 200, the
 * upstream's body, no Proxy-Authorization upstream, and the decision line names a. With guest b's:
 * a.test (which only a may reach) is refused with 403 on b's line. With the proxy URL stripped of
 * its credentials: 407. Nothing but the first run reaches the upstream.
 */
async function expectCredentialsDecide(makeClient: (proxy: GuestsProxy) => Client | Promise<Client>, expected: Expectations): Promise<void> {
  const upstream = await startUpstream(expected.http === true ? { tls: false, names: ["a.test", "b.test"] } : { names: ["a.test", "b.test"] });
  const proxy = await twoGuests();
  const client = await makeClient(proxy);
  const url = `${expected.http === true ? "http" : "https"}://a.test:${upstream.port}/echo?from=guest-clients`;
  const waits = expected.waitsFor407 === true;
  // Such a client meets a 407 on every run, but the gate logs only the first within 10 s: a
  // later run shows its own only if the machine was slow enough to pass that window.
  const laterRun = (events: [unknown, unknown][]): [unknown, unknown][] => (waits ? events.filter(([tag]) => tag !== "auth failed") : events);

  let mark = proxy.logs.length;
  const own = await client(cleanEnv(proxy.guestEnv("a")), url);
  expect(own.exitCode, own.stderr).toBe(0);
  const echo = JSON.parse(own.stdout) as Echo;
  expect(echo.path).toBe("/echo?from=guest-clients");
  expect(echo.headers["host"]).toBe(`a.test:${upstream.port}`);
  expect(upstream.seen).toHaveLength(1);
  expect(upstream.seen[0]!.rawHeaders.filter((_, i) => i % 2 === 0).map((h) => h.toLowerCase())).not.toContain("proxy-authorization");
  expect(loggedSince(proxy, mark)).toEqual(waits ? [["auth failed", "missing"], ["a", 200]] : [["a", 200]]);

  mark = proxy.logs.length;
  const other = await client(cleanEnv(proxy.guestEnv("b")), url);
  expect(other.exitCode, other.stdout).not.toBe(0);
  if (expected.refusedExitCode !== undefined) expect(other.exitCode).toBe(expected.refusedExitCode);
  expect(other.stderr).toMatch(expected.forbidden);
  expect(laterRun(loggedSince(proxy, mark))).toEqual([["b", 403]]);

  mark = proxy.logs.length;
  const none = await client(cleanEnv(withoutCredentials(proxy.guestEnv("a"), proxy)), url);
  expect(none.exitCode, none.stdout).not.toBe(0);
  if (expected.refusedExitCode !== undefined) expect(none.exitCode).toBe(expected.refusedExitCode);
  expect(none.stderr).toMatch(expected.required);
  expect(laterRun(loggedSince(proxy, mark))).toEqual(waits ? [] : [["auth failed", "missing"]]);
  expect(upstream.hits()).toBe(1);
}

describe("guest clients: curl", () => {
  // -f for plain HTTP: a 403 or 407 answered to an absolute-form request is then a failure (exit
  // 22), not a body. Over HTTPS it would turn the refused CONNECT's exit 56 into 22 as well.
  const curl = (env: Env, url: string, proxyArgs: string[]): Promise<ClientRun> =>
    runClient("curl", ["-sS", "--max-time", "15", ...(url.startsWith("http:") ? ["-f"] : []), ...proxyArgs, url], env);
  const viaEnv: Client = (env, url) => curl(env, url, []);
  const viaFlag: Client = (env, url) => curl(env, url, ["-x", url.startsWith("https:") ? env["HTTPS_PROXY"]! : env["HTTP_PROXY"]!]);

  it("curl over HTTPS, with https_proxy and CURL_CA_BUNDLE from guestEnv(), sends the credentials on CONNECT; refusals exit 56", async () => {
    await expectCredentialsDecide(() => viaEnv, { forbidden: /CONNECT tunnel failed, response 403/, required: /CONNECT tunnel failed, response 407/, refusedExitCode: 56 });
  });

  it("curl -x with the credentialed proxy URL over HTTPS sends the credentials on CONNECT; refusals exit 56", async () => {
    await expectCredentialsDecide(() => viaFlag, { forbidden: /CONNECT tunnel failed, response 403/, required: /CONNECT tunnel failed, response 407/, refusedExitCode: 56 });
  });

  it("curl over plain HTTP, with http_proxy from guestEnv(), sends the credentials on the absolute-form request", async () => {
    await expectCredentialsDecide(() => viaEnv, { http: true, forbidden: /returned error: 403/, required: /returned error: 407/, refusedExitCode: 22 });
  });

  it("curl -x with the credentialed proxy URL over plain HTTP sends the credentials on the absolute-form request", async () => {
    await expectCredentialsDecide(() => viaFlag, { http: true, forbidden: /returned error: 403/, required: /returned error: 407/, refusedExitCode: 22 });
  });
});

describe("guest clients: wget, Python, undici", () => {
  it("wget reads https_proxy with its credentials, but needs --ca-certificate (its GnuTLS build ignores SSL_CERT_FILE)", async () => {
    const wget: Client = (env, url) => runClient("wget", ["--tries=1", "--no-verbose", "-O", "-", `--ca-certificate=${env["SSL_CERT_FILE"]}`, url], env);
    await expectCredentialsDecide(() => wget, { forbidden: /Proxy tunneling failed: Forbidden/, required: /Proxy tunneling failed: Proxy Authentication Required/ });
  });

  const python = (code: string): Client => (env, url) => runClient("python3", ["-c", code, url], env);

  it("Python requests reads HTTPS_PROXY with its credentials and REQUESTS_CA_BUNDLE, and sends Basic on CONNECT", async () => {
    const code = "import sys, requests\nr = requests.get(sys.argv[1], timeout=15)\nsys.stdout.write(r.text)\nsys.exit(0 if r.status_code == 200 else 1)";
    await expectCredentialsDecide(() => python(code), { forbidden: /Tunnel connection failed: 403 Forbidden/, required: /Tunnel connection failed: 407 Proxy Authentication Required/ });
  });

  it("Python urllib (stdlib) reads https_proxy with its credentials and SSL_CERT_FILE, and sends Basic on CONNECT", async () => {
    const code = "import sys, urllib.request\nwith urllib.request.urlopen(sys.argv[1], timeout=15) as r:\n    sys.stdout.write(r.read().decode())";
    await expectCredentialsDecide(() => python(code), { forbidden: /Tunnel connection failed: 403 Forbidden/, required: /Tunnel connection failed: 407 Proxy Authentication Required/ });
  });

  it("undici's EnvHttpProxyAgent reads HTTPS_PROXY with its credentials and sends Basic on CONNECT; the CA comes from NODE_EXTRA_CA_CERTS", async () => {
    const undici = pathToFileURL(createRequire(import.meta.url).resolve("undici")).href;
    const code = `
      const [undiciUrl, url] = process.argv.slice(1);
      const { EnvHttpProxyAgent, request } = (await import(undiciUrl)).default;
      const dispatcher = new EnvHttpProxyAgent();
      try {
        const res = await request(url, { dispatcher });
        process.stdout.write(await res.body.text());
        if (res.statusCode !== 200) { console.error("status " + res.statusCode); process.exitCode = 1; }
      } catch (error) {
        console.error(error.message);
        process.exitCode = 1;
      } finally {
        await dispatcher.close();
      }`;
    const node: Client = (env, url) => runClient(process.execPath, ["--input-type=module", "-e", code, undici, url], env);
    await expectCredentialsDecide(() => node, { forbidden: /Proxy response \(403\)/, required: /Proxy response \(407\)/ });
  });
});

describe("guest clients: git", () => {
  const gitEnv = (env: Env): Env => cleanEnv({ ...env, GIT_CONFIG_NOSYSTEM: "1", GIT_TERMINAL_PROMPT: "0" });
  const clone = (env: Env, url: string): Promise<{ run: ClientRun; dest: string }> => {
    const dest = join(tempDir("egressgate-clone-"), "repo");
    return runClient("git", ["clone", "-q", url, dest], gitEnv(env)).then((run) => ({ run, dest }));
  };

  it("git clone over HTTPS with GIT_HTTP_PROXY_AUTHMETHOD=basic sends the credentials on the first CONNECT; another guest's get 403, none 407", async () => {
    const git = await startGitServer(["a.test", "b.test"]);
    const proxy = await twoGuests();
    const url = `https://a.test:${git.port}/repo.git`;
    expect(proxy.guestEnv("a")["GIT_HTTP_PROXY_AUTHMETHOD"]).toBe("basic");

    let mark = proxy.logs.length;
    const own = await clone(proxy.guestEnv("a"), url);
    expect(own.run.exitCode, own.run.stderr).toBe(0);
    expect(readFileSync(join(own.dest, "README"), "utf8")).toBe(git.readme);
    const events = loggedSince(proxy, mark);
    // At least the ref advertisement and the upload-pack POST, every one a's, and no 407 first.
    expect(events.length).toBeGreaterThanOrEqual(2);
    expect(events.every(([guest, status]) => guest === "a" && status === 200)).toBe(true);
    expect(git.seen.length).toBe(events.length);
    expect(git.seen.every((headers) => headers["proxy-authorization"] === undefined)).toBe(true);
    const served = git.seen.length;

    mark = proxy.logs.length;
    const other = await clone(proxy.guestEnv("b"), url);
    expect(other.run.exitCode).toBe(128);
    expect(other.run.stderr).toMatch(/CONNECT tunnel failed, response 403/);
    expect(loggedSince(proxy, mark)).toEqual([["b", 403]]);

    mark = proxy.logs.length;
    const none = await clone(withoutCredentials(proxy.guestEnv("a"), proxy), url);
    expect(none.run.exitCode).toBe(128);
    expect(none.run.stderr).toMatch(/CONNECT tunnel failed, response 407/);
    expect(loggedSince(proxy, mark)).toEqual([["auth failed", "missing"]]);
    expect(git.seen.length).toBe(served);
  });

  it("git clone without GIT_HTTP_PROXY_AUTHMETHOD still succeeds, after a 407 round trip the proxy logs first", async () => {
    const git = await startGitServer(["a.test"]);
    const proxy = await twoGuests();
    const { GIT_HTTP_PROXY_AUTHMETHOD: _method, ...env } = proxy.guestEnv("a");
    const mark = proxy.logs.length;
    const own = await clone(env, `https://a.test:${git.port}/repo.git`);
    expect(own.run.exitCode, own.run.stderr).toBe(0);
    expect(readFileSync(join(own.dest, "README"), "utf8")).toBe(git.readme);
    const [first, ...rest] = loggedSince(proxy, mark);
    // libcurl's CURLAUTH_ANY sends nothing until a 407 names the scheme; the 407 closes the
    // connection, and curl opens a new one with Basic.
    expect(first).toEqual(["auth failed", "missing"]);
    expect(rest.length).toBeGreaterThanOrEqual(2);
    expect(rest.every(([guest, status]) => guest === "a" && status === 200)).toBe(true);
    expect(git.seen.every((headers) => headers["proxy-authorization"] === undefined)).toBe(true);
  });
});

describe("guest clients: Java", () => {
  /**
   * java.net.http.HttpClient with the proxy split out of guestEnv()'s HTTPS_PROXY into system
   * properties, the credentials into an Authenticator, and the proxy's CA in a PKCS12 trust store
   * made by keytool. `tunnelingBasic: false` leaves out jdk.http.auth.tunneling.disabledSchemes=.
   */
  async function javaClient(proxy: GuestsProxy, tunnelingBasic = true): Promise<Client> {
    const dir = tempDir("egressgate-java-");
    const source = join(dir, "Fetch.java");
    writeFileSync(source, javaFetchSource);
    const trustStore = join(dir, "truststore.p12");
    const keytool = await runClient("keytool", ["-importcert", "-noprompt", "-alias", "egressgate", "-file", proxy.caCertPath, "-keystore", trustStore, "-storetype", "PKCS12", "-storepass", "changeit"], cleanEnv());
    expect(keytool.exitCode, keytool.stderr).toBe(0);
    return (env, url) => {
      const proxyUrl = new URL(env["HTTPS_PROXY"]!);
      return runClient(
        "java",
        [
          `-Dhttps.proxyHost=${proxyUrl.hostname}`,
          `-Dhttps.proxyPort=${proxyUrl.port}`,
          ...(proxyUrl.username !== "" ? [`-Dhttps.proxyUser=${proxyUrl.username}`, `-Dhttps.proxyPassword=${proxyUrl.password}`] : []),
          // The JDK refuses Basic for CONNECT unless this list (default "Basic") leaves it out.
          ...(tunnelingBasic ? ["-Djdk.http.auth.tunneling.disabledSchemes="] : []),
          `-Djavax.net.ssl.trustStore=${trustStore}`,
          "-Djavax.net.ssl.trustStorePassword=changeit",
          source,
          url,
        ],
        env,
      );
    };
  }

  it("Java's HttpClient, given https.proxyHost/Port, an Authenticator and an empty jdk.http.auth.tunneling.disabledSchemes, answers the 407 with Basic", async () => {
    await expectCredentialsDecide((proxy) => javaClient(proxy), {
      forbidden: /Tunnel failed, got: 403/,
      required: /status 407/,
      // HttpClient never sends proxy credentials before a 407 asks for them.
      waitsFor407: true,
    });
  }, 60_000);

  it("without jdk.http.auth.tunneling.disabledSchemes= Java's HttpClient never sends Basic on CONNECT and ends at the 407", async () => {
    const upstream = await startUpstream({ names: ["a.test"] });
    const proxy = await twoGuests();
    const java = await javaClient(proxy, false);
    const mark = proxy.logs.length;
    const run = await java(cleanEnv(proxy.guestEnv("a")), `https://a.test:${upstream.port}/echo`);
    expect(run.exitCode).toBe(1);
    expect(run.stderr).toMatch(/status 407/);
    expect(loggedSince(proxy, mark)).toEqual([["auth failed", "missing"]]);
    expect(upstream.hits()).toBe(0);
  }, 30_000);
});
