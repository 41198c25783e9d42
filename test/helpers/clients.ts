import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { createServer } from "node:https";
import { join } from "node:path";
import type { SecureContext } from "node:tls";
import { onTestFinished } from "vitest";
import type { RunningProxy } from "../../src/index.js";
import { tempDir } from "./proxy.js";
import { testCa } from "./test-ca.js";
import { listenForTest } from "./upstream.js";

/** What a client process left behind. `exitCode` is null when it was killed (see `signal`). */
export interface ClientRun {
  readonly exitCode: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stdoutBytes: Buffer;
  readonly stderr: string;
}

const killAfterMs = 20_000;

/**
 * Runs a real client with exactly `env` (nothing inherited from the test process), in its own
 * process group: git, for one, does its work in children (git-remote-https), which a kill of the
 * direct child alone would leave running. The group is killed after 20 s, and when the test ends.
 */
export function runClient(file: string, args: readonly string[], env: Readonly<Record<string, string>>, options: { input?: Buffer; outsideTest?: boolean } = {}): Promise<ClientRun> {
  const child = spawn(file, args, { env, detached: true, stdio: [options.input === undefined ? "ignore" : "pipe", "pipe", "pipe"] });
  const killGroup = (): void => {
    if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return;
    try {
      process.kill(-child.pid, "SIGKILL");
    } catch {
      // Already gone between the check and the kill.
    }
  };
  const timer = setTimeout(killGroup, killAfterMs);
  // A server's handler runs outside any test's context; its children have the timer only.
  if (options.outsideTest !== true) onTestFinished(killGroup);
  if (options.input !== undefined) {
    // A child may exit before it reads all its input; that EPIPE is its answer, not ours.
    child.stdin!.on("error", () => undefined);
    child.stdin!.end(options.input);
  }
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  child.stdout!.on("data", (c: Buffer) => out.push(c));
  child.stderr!.on("data", (c: Buffer) => err.push(c));
  return new Promise((resolve, reject) => {
    child.once("error", (error) => {
      clearTimeout(timer);
      reject(error);
    });
    child.once("close", (exitCode, signal) => {
      clearTimeout(timer);
      const stdoutBytes = Buffer.concat(out);
      resolve({ exitCode, signal, stdout: stdoutBytes.toString("utf8"), stdoutBytes, stderr: Buffer.concat(err).toString("utf8") });
    });
  });
}

/** PATH and a fresh HOME (so no ~/.curlrc, ~/.wgetrc or ~/.gitconfig of the machine's), plus `extra`. */
export function cleanEnv(extra: Readonly<Record<string, string>> = {}): Record<string, string> {
  return { PATH: process.env["PATH"] ?? "/usr/bin:/bin", HOME: tempDir("egressgate-home-"), LANG: "C", ...extra };
}

const proxyVariables = ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"] as const;

/** A guest's environment with the credentials taken out of its proxy URLs (and git's auth method with them). */
export function withoutCredentials(env: Readonly<Record<string, string>>, proxy: RunningProxy): Record<string, string> {
  const bare: Record<string, string> = { ...env };
  for (const name of proxyVariables) bare[name] = proxy.url;
  delete bare["GIT_HTTP_PROXY_AUTHMETHOD"];
  return bare;
}

/** A git repository served over smart HTTP(S), as a forge serves one. */
export interface GitServer {
  readonly port: number;
  /** The headers of every request the server received, in order. */
  readonly seen: IncomingMessage["headers"][];
  /** What the repository's one commit holds in README. */
  readonly readme: string;
}

/**
 * A bare repository with one pushed commit, served by `git http-backend` (as CGI, like Apache's
 * or nginx's setup for it) behind an HTTPS server with the test CA's certificates for `names`.
 */
export async function startGitServer(names: readonly string[]): Promise<GitServer> {
  const root = tempDir("egressgate-git-");
  const readme = `served through egressgate ${Date.now()}\n`;
  const gitEnv = cleanEnv({ GIT_CONFIG_NOSYSTEM: "1", GIT_AUTHOR_NAME: "t", GIT_AUTHOR_EMAIL: "t@example.test", GIT_COMMITTER_NAME: "t", GIT_COMMITTER_EMAIL: "t@example.test" });
  const git = async (...args: string[]): Promise<void> => {
    const run = await runClient("git", args, gitEnv);
    if (run.exitCode !== 0) throw new Error(`git ${args.join(" ")} failed: ${run.stderr}`);
  };
  await git("init", "-q", "--bare", "--initial-branch=main", join(root, "repo.git"));
  await git("init", "-q", "--initial-branch=main", join(root, "work"));
  writeFileSync(join(root, "work", "README"), readme);
  await git("-C", join(root, "work"), "add", "README");
  await git("-C", join(root, "work"), "commit", "-q", "-m", "one commit");
  await git("-C", join(root, "work"), "push", "-q", join(root, "repo.git"), "main");

  const seen: IncomingMessage["headers"][] = [];
  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    seen.push(req.headers);
    const body: Buffer[] = [];
    req.on("data", (c: Buffer) => body.push(c));
    req.on("end", () => {
      const url = new URL(req.url ?? "/", "https://git.test");
      // Built by hand: cleanEnv's temp HOME needs a test's context, which a handler lacks.
      const cgi: Record<string, string> = {
        PATH: gitEnv["PATH"]!,
        HOME: gitEnv["HOME"]!,
        GIT_CONFIG_NOSYSTEM: "1",
        GIT_PROJECT_ROOT: root,
        GIT_HTTP_EXPORT_ALL: "1",
        REQUEST_METHOD: req.method ?? "GET",
        PATH_INFO: decodeURIComponent(url.pathname),
        QUERY_STRING: url.search.slice(1),
        REMOTE_ADDR: req.socket.remoteAddress ?? "",
        ...(req.headers["content-type"] !== undefined ? { CONTENT_TYPE: req.headers["content-type"] } : {}),
        // git gzips large upload-pack requests; the backend undoes it when told.
        ...(req.headers["content-encoding"] !== undefined ? { HTTP_CONTENT_ENCODING: req.headers["content-encoding"] } : {}),
        // Protocol v2 is asked for in this header, which CGI passes as HTTP_*.
        ...(typeof req.headers["git-protocol"] === "string" ? { HTTP_GIT_PROTOCOL: req.headers["git-protocol"] } : {}),
      };
      void runClient("git", ["http-backend"], cgi, { input: Buffer.concat(body), outsideTest: true }).then((run) => answerCgi(res, run), (error: Error) => {
        res.writeHead(500, { "content-type": "text/plain" });
        res.end(error.message);
      });
    });
  };
  const ca = await testCa();
  const contexts = await ca.serverContexts(names);
  const fallback = contexts.get(names[0]!)!;
  const server = createServer(
    {
      SNICallback: (name: string, cb: (err: Error | null, ctx?: SecureContext) => void) => cb(null, contexts.get(name) ?? fallback),
      secureContext: fallback,
    } as Parameters<typeof createServer>[0],
    handler,
  );
  return { port: await listenForTest(server), seen, readme };
}

/** A CGI response (RFC 3875 §6): header lines, a blank line, the body; `Status:` sets the status. */
function answerCgi(res: ServerResponse, run: ClientRun): void {
  const output = run.stdoutBytes;
  // The first blank line ends the head, whichever line ending the script used (the pack data after it is binary).
  const crlf = output.indexOf("\r\n\r\n");
  const lf = output.indexOf("\n\n");
  const end = crlf >= 0 && (lf < 0 || crlf < lf) ? crlf + 4 : lf >= 0 ? lf + 2 : -1;
  if (run.exitCode !== 0 || end < 0) {
    res.writeHead(500, { "content-type": "text/plain" });
    res.end(`git http-backend failed (${run.exitCode ?? run.signal}): ${run.stderr}`);
    return;
  }
  let status = 200;
  const headers: Record<string, string> = {};
  for (const line of output.subarray(0, end).toString("latin1").split(/\r?\n/)) {
    const colon = line.indexOf(":");
    if (colon <= 0) continue;
    const name = line.slice(0, colon).trim().toLowerCase();
    const value = line.slice(colon + 1).trim();
    if (name === "status") status = Number(value.split(" ")[0]);
    else headers[name] = value;
  }
  res.writeHead(status, headers);
  res.end(output.subarray(end));
}

/**
 * A single-file Java program (run as `java Fetch.java URL`, no javac step) that GETs URL with
 * java.net.http.HttpClient. HttpClient reads the proxy from -Dhttps.proxyHost/-Dhttps.proxyPort
 * (through the default ProxySelector), but never credentials: those come from an Authenticator,
 * here fed from -Dhttps.proxyUser/-Dhttps.proxyPassword. Prints the body; `status N` or the
 * exception goes to stderr; exits 0 only on 200.
 */
export const javaFetchSource = `
import java.net.Authenticator;
import java.net.PasswordAuthentication;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

public class Fetch {
  public static void main(String[] args) throws Exception {
    String user = System.getProperty("https.proxyUser");
    String password = System.getProperty("https.proxyPassword");
    HttpClient.Builder builder = HttpClient.newBuilder();
    if (user != null && password != null) {
      builder.authenticator(new Authenticator() {
        @Override protected PasswordAuthentication getPasswordAuthentication() {
          return getRequestorType() == RequestorType.PROXY ? new PasswordAuthentication(user, password.toCharArray()) : null;
        }
      });
    }
    HttpResponse<String> res = builder.build().send(HttpRequest.newBuilder(URI.create(args[0])).build(), HttpResponse.BodyHandlers.ofString());
    System.err.println("status " + res.statusCode());
    System.out.print(res.body());
    System.exit(res.statusCode() == 200 ? 0 : 1);
  }
}
`;
