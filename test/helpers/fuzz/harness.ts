import { fork, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { once } from "node:events";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { testCa } from "../test-ca.js";
import { GuestConn } from "./guest-conn.js";
import { absoluteCase, connectCase, tunnelCase, type H1Case } from "./h1-inputs.js";
import { frame, h2Case, preface, type H2Case } from "./h2-inputs.js";
import { captureClientHello, helloCase, type HelloCase } from "./hello-inputs.js";
import { startRecorder, type Recorder } from "./recorder.js";
import { Rng } from "./rng.js";
import { SecretScanner } from "./scanner.js";
import { badServerFrame, parseFrames, parseGuestResponse, type UpstreamRequest } from "./wire.js";
import { hostName, redirectFor, secretName, tagOf, upstreamAddress, upstreamNames, type FuzzWorld, type UpstreamName } from "./world.js";

/**
 * The fuzz harness: a proxy in a child process, six recording upstreams (TLS and plain for
 * `api.test` and `secret.test`, which are allowed, and for `denied.test`, which is not), and one
 * case at a time through real sockets. Every case is judged by every oracle:
 *
 * - the proxy's process is alive, and a normal request through it is answered 200;
 * - the guest got well-formed responses (or HTTP/2 frames) or a close, and the connection was
 *   closed within `hangMs` of the guest's own end (the proxy's timeouts are set far below it);
 * - `denied.test`'s upstreams never saw a connection;
 * - the secret's value never reached an upstream but `secret.test`'s, nor the guest, nor the log;
 * - every upstream read every request strictly (one framing, nothing a second parser could read
 *   otherwise), and no case made more upstream requests than it had request lines.
 */
export type FuzzTarget = "h1" | "plain" | "connect" | "h2" | "tls";

export const fuzzTargets: readonly FuzzTarget[] = ["h1", "plain", "connect", "h2", "tls"];

export interface Finding {
  readonly target: FuzzTarget;
  readonly seed: string;
  readonly index: number;
  readonly oracle: string;
  readonly detail: string;
  readonly steps: readonly string[];
}

export interface HarnessOptions {
  /** The proxy's handshake, header, idle and upstream timeouts (ms); `hangMs` is four times this. */
  readonly timeoutMs?: number;
  /** Run the proxy with {@link fuzzPolicy} as its tier-2 policy: requests take the hooks' path. */
  readonly policy?: boolean;
  /** The guest authenticates (`auth: true`): every request on the listener carries `Proxy-Authorization`, now and then wrong. */
  readonly auth?: boolean;
}

/**
 * A tier-2 policy for the fuzz proxy: it reads every upload (so bodies are buffered, and GET or
 * HEAD with one is refused), answers some itself, rewrites some responses, and never touches a
 * header's value (a hook that echoed one would hand the guest the secret by design).
 */
export const fuzzPolicy = `
async function onRequest(request) {
  if (request.method === "POST" || request.method === "PUT" || request.method === "PATCH") {
    var text = await request.clone().text();
    if (text.indexOf("hel") === 0 && text.length === 4) return new Response("cut short", { status: 418 });
  }
  if (request.url.indexOf("seq=2") >= 0) request.headers.set("x-policy", "seen");
}
async function onResponse(response, request) {
  if (request.url.indexOf("seq=3") >= 0) return new Response("rewritten " + (await response.text()).length, { status: response.status });
}
`;

interface ChildReady {
  readonly port: number;
  readonly caCertPem: string;
  readonly placeholder: string;
  readonly proxyAuthorization?: string;
}

interface LedgerEntry {
  /** The most requests the case's bytes hold; infinite while it runs. */
  bound: number;
  requests: number;
  redirects: number;
  reported: boolean;
  readonly target: FuzzTarget;
  readonly seed: string;
  readonly index: number;
  readonly steps: readonly string[];
  /** The content each valid request (`seq`) must reach the upstream with. */
  readonly bodies: ReadonlyMap<number, string>;
}

const fixture = fileURLToPath(new URL("../../fixtures/fuzz-proxy-child.ts", import.meta.url));

/** Request lines anywhere in `bytes`: the most requests the proxy could read from them. */
function requestLines(bytes: Buffer): string[] {
  const methods: string[] = [];
  for (const line of bytes.toString("latin1").split("\n")) {
    // HTTP/0.9's `GET /` counts too: the proxy answers it (505), as a HEAD without a body. So
    // does a line that a body's last bytes run into (`helloGET / HTTP/1.1`): the method is then
    // a guess, which judgeResponses does not rely on.
    const match = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]+) +[^ \r]+(?: +HTTP\/[0-9]|\r?$)/i.exec(line);
    if (match !== null) methods.push(match[1]!);
    else {
      const method = methodBefore(line);
      if (method !== undefined) methods.push(method);
    }
  }
  return methods;
}

const tokenChar = /[!#$%&'*+\-.^_`|~0-9A-Za-z]/;

/**
 * The method of a request line inside `line` (`helloGET /x HTTP/1.1`): the token before the
 * target before ` HTTP/`. Scanned by hand: a regex over a 70,000-byte field line backtracked for
 * seconds.
 */
function methodBefore(line: string): string | undefined {
  const version = line.search(/ HTTP\/[0-9]/);
  if (version < 0) return undefined;
  let at = version;
  while (at > 0 && line[at - 1] === " ") at--;
  const targetEnd = at;
  while (at > 0 && line[at - 1] !== " ") at--;
  if (at === targetEnd) return undefined;
  while (at > 0 && line[at - 1] === " ") at--;
  const methodEnd = at;
  while (at > 0 && tokenChar.test(line[at - 1]!)) at--;
  return at === methodEnd ? undefined : line.slice(at, methodEnd);
}

function headComplete(buf: Buffer): boolean {
  return buf.indexOf("\r\n\r\n") >= 0;
}

const blankLine = /\r\n\r\n|\n\n|\r\n\n|\n\r\n/;

export class FuzzHarness {
  private child: ChildProcess | undefined;
  private ready!: ChildReady;
  private stderr = "";
  private readonly logTail: string[] = [];
  private logScanner: SecretScanner;
  private readonly upstreamScanners = new Map<Recorder, SecretScanner>();
  private readonly caDir = mkdtempSync(join(tmpdir(), "egressgate-fuzz-"));
  readonly timeoutMs: number;
  readonly hangMs: number;
  private readonly policy: boolean;
  private readonly auth: boolean;
  world!: FuzzWorld;
  /** HTTP/1.1 statuses the guests got, for a run's summary (what the cases reached). */
  readonly stats = new Map<string, number>();
  /** Upstream requests per case, by tag (the last 200 cases). */
  private readonly ledger = new Map<string, LedgerEntry>();
  private current: string | undefined;
  /** Findings about cases other than the one running (a late upstream request). */
  private readonly late: Finding[] = [];
  private hello!: Buffer;
  /** Times the proxy process had to be started again after it died. */
  restarts = 0;

  private constructor(
    private readonly recorders: Readonly<Record<UpstreamName, { readonly tls: Recorder; readonly plain: Recorder }>>,
    private readonly secretValue: string,
    private readonly upstreamCaPem: string,
    options: HarnessOptions,
  ) {
    this.timeoutMs = options.timeoutMs ?? 1_500;
    this.policy = options.policy === true;
    this.auth = options.auth === true;
    this.hangMs = this.timeoutMs * 4;
    this.logScanner = new SecretScanner(secretValue);
    for (const name of upstreamNames) {
      if (name === "secret") continue;
      for (const recorder of [recorders[name].tls, recorders[name].plain]) this.upstreamScanners.set(recorder, new SecretScanner(secretValue));
    }
  }

  static async start(options: HarnessOptions = {}): Promise<FuzzHarness> {
    const ca = await testCa();
    const credentials = await ca.serverCredentials(upstreamNames.map(hostName));
    const recorders = {} as Record<UpstreamName, { tls: Recorder; plain: Recorder }>;
    // The ports are known once every upstream listens; their redirects read them then.
    const ports = {} as Record<UpstreamName, { tls: number; plain: number }>;
    const redirect = (target: string): ReturnType<typeof redirectFor> => redirectFor(ports, target);
    for (const name of upstreamNames) {
      const host = upstreamAddress[name];
      recorders[name] = {
        tls: await startRecorder({ label: `${name}-tls`, host, tls: credentials.get(hostName(name))!, redirect }),
        plain: await startRecorder({ label: `${name}-plain`, host, redirect }),
      };
      ports[name] = { tls: recorders[name].tls.port, plain: recorders[name].plain.port };
    }
    // Letters and digits only: the same in a header, a query and percent-encoding.
    const harness = new FuzzHarness(recorders, `fuzzsecret${randomBytes(12).toString("hex")}`, ca.certPem, options);
    harness.hello = await captureClientHello(hostName("api"));
    for (const recorder of harness.allRecorders) recorder.onRequest = (request, redirected) => harness.count(request, redirected);
    await harness.startChild();
    return harness;
  }

  private get allRecorders(): Recorder[] {
    return upstreamNames.flatMap((name) => [this.recorders[name].tls, this.recorders[name].plain]);
  }

  private async startChild(): Promise<void> {
    const t = this.timeoutMs;
    const options = {
      ...(this.policy ? { policy: fuzzPolicy } : {}),
      allowedInternalHosts: [hostName("api"), hostName("secret")],
      secret: { name: secretName, hosts: [hostName("secret")], value: this.secretValue },
      proxy: {
        caDir: this.caDir,
        upstreamCa: [this.upstreamCaPem],
        resolve: Object.fromEntries(upstreamNames.map((name) => [hostName(name), [upstreamAddress[name]]])),
        ...(this.auth ? { auth: true } : {}),
        timeouts: { handshakeMs: t, headersMs: t, idleMs: t, h2PingMs: t, upstreamConnectMs: t, upstreamHeadersMs: t, upstreamBodyMs: t, requestMs: t * 2, hookMs: t, drainMs: t },
      },
    };
    const child = fork(fixture, [JSON.stringify(options)], { execArgv: ["--import", "tsx"], stdio: ["ignore", "pipe", "pipe", "ipc"] });
    this.child = child;
    child.stderr!.on("data", (chunk: Buffer) => {
      this.stderr = (this.stderr + chunk.toString()).slice(-20_000);
    });
    let partial = "";
    child.stdout!.on("data", (chunk: Buffer) => {
      const text = chunk.toString("latin1");
      this.logScanner.push(text);
      const lines = (partial + text).split("\n");
      partial = lines.pop() ?? "";
      this.logTail.push(...lines);
      if (this.logTail.length > 200) this.logTail.splice(0, this.logTail.length - 200);
    });
    const [ready] = (await Promise.race([
      once(child, "message"),
      once(child, "exit").then(([code]) => {
        throw new Error(`the fuzz proxy exited with ${String(code)} while starting: ${this.stderr}`);
      }),
    ])) as [ChildReady];
    this.ready = ready;
    const ports = Object.fromEntries(upstreamNames.map((name) => [name, { tls: this.recorders[name].tls.port, plain: this.recorders[name].plain.port }])) as FuzzWorld["ports"];
    this.world = { placeholder: ready.placeholder, ports, ...(ready.proxyAuthorization !== undefined ? { proxyAuthorization: ready.proxyAuthorization } : {}) };
  }

  /**
   * An upstream request, counted against the case its path's tag names (one that lost its tag
   * to a mutation, against the case running): a request that reaches the upstream after its
   * case has ended is still its case's.
   */
  private count(request: UpstreamRequest, redirected: boolean): void {
    const entry = this.ledger.get(tagOf(request.target) ?? this.current ?? "");
    if (entry === undefined) return;
    entry.requests += 1;
    if (redirected) entry.redirects += 1;
    this.judgeCount(entry);
    // A hop the proxy followed has no `seq` (the Location carries the tag alone).
    const seq = /[?&]seq=([0-9]+)/.exec(request.target)?.[1];
    const expected = seq === undefined ? undefined : entry.bodies.get(Number(seq));
    const body = request.body.toString("latin1");
    if (expected !== undefined && body !== expected) {
      this.late.push({
        target: entry.target,
        seed: entry.seed,
        index: entry.index,
        oracle: "smuggling",
        detail: `the upstream read the body of seq=${seq} as ${JSON.stringify(body.slice(0, 300))}, not ${JSON.stringify(expected)}`,
        steps: entry.steps,
      });
    }
  }

  /** No case may make more upstream requests than it had request lines, and one per redirect answered (the proxy's next hop). */
  private judgeCount(entry: LedgerEntry): void {
    if (entry.reported || entry.requests <= entry.bound + entry.redirects) return;
    entry.reported = true;
    this.late.push({
      target: entry.target,
      seed: entry.seed,
      index: entry.index,
      oracle: "smuggling",
      detail: `${entry.requests} upstream requests from ${entry.bound} request line(s) and ${entry.redirects} redirect(s)`,
      steps: entry.steps,
    });
  }

  alive(): boolean {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** The case `index` of `target` under `seed`: a pure function of the three (and the world's ports and placeholder). */
  caseOf(target: FuzzTarget, seed: string, index: number): H1Case | H2Case | HelloCase {
    const rng = new Rng(seed, target, index);
    const world: FuzzWorld = { ...this.world, tag: `${target}-${index}` };
    if (target === "tls") return helloCase(rng, world, this.hello);
    if (target === "h1") return tunnelCase(rng, world);
    if (target === "plain") return absoluteCase(rng, world);
    if (target === "connect") return connectCase(rng, world);
    return h2Case(rng, world);
  }

  /** Runs one case and judges it; the findings are empty when every oracle held. */
  async runCase(target: FuzzTarget, seed: string, index: number): Promise<Finding[]> {
    const input = this.caseOf(target, seed, index);
    const findings: Finding[] = [];
    const report = (oracle: string, detail: string): void => void findings.push({ target, seed, index, oracle, detail, steps: input.steps });
    if (!this.alive()) {
      // Died after the last case's checks (a timer that threw): reported here, with the case before this one to blame.
      report("crash", `the proxy exited before this case began (the case before it is the suspect): ${this.stderr.slice(-4000)}`);
      this.restarts += 1;
      await this.startChild();
    }
    const tag = `${target}-${index}`;
    const bodies = "bodies" in input && input.bodies !== undefined ? input.bodies : new Map<number, string>();
    const entry: LedgerEntry = { bound: Number.POSITIVE_INFINITY, requests: 0, redirects: 0, reported: false, target, seed, index, steps: input.steps, bodies };
    this.ledger.delete(tag);
    this.ledger.set(tag, entry);
    if (this.ledger.size > 200) this.ledger.delete(this.ledger.keys().next().value!);
    this.current = tag;
    const malformedBefore = new Map(this.allRecorders.map((r) => [r, r.malformed.length]));
    const guestScanner = new SecretScanner(this.secretValue);
    const conns: GuestConn[] = [];
    let bound: number;
    try {
      if ("targetNamed" in input) bound = await this.runHello(input, conns, report, guestScanner);
      else if ("streams" in input) bound = await this.runH2(input, conns, report, guestScanner);
      else bound = await this.runH1(input, conns, report, guestScanner);
    } catch (error) {
      report("harness", `the case threw: ${(error as Error).stack ?? String(error)}`);
      bound = Number.POSITIVE_INFINITY;
    } finally {
      for (const conn of conns) conn.destroy();
    }
    // The upstream may read a request the proxy wrote as the guest's connection closed.
    await new Promise((resolve) => setImmediate(resolve));
    if (!this.alive()) {
      report("crash", `the proxy exited (${String(this.child?.exitCode)} ${String(this.child?.signalCode)}): ${this.stderr.slice(-4000)}`);
      this.restarts += 1;
      await this.startChild();
      return findings;
    }
    for (const recorder of this.allRecorders) {
      for (const bad of recorder.malformed.slice(malformedBefore.get(recorder))) {
        report("upstream-malformed", `${recorder.label} read ${bad.reason}; it received ${JSON.stringify(bad.bytes.toString("latin1").slice(-1500))}`);
      }
      const scanner = this.upstreamScanners.get(recorder);
      if (scanner !== undefined) {
        for (const chunk of recorder.received) scanner.push(chunk);
        // denied.test's bytes stay for its own report below.
        if (!recorder.label.startsWith("denied")) recorder.received.length = 0;
        if (scanner.found !== undefined) {
          report("secret-upstream", `${recorder.label} received the secret's value: ${JSON.stringify(scanner.found)}`);
          this.upstreamScanners.set(recorder, new SecretScanner(this.secretValue));
        }
      }
    }
    for (const name of ["tls", "plain"] as const) {
      const denied = this.recorders.denied[name];
      if (denied.connections > 0) {
        report("denied-upstream", `${denied.label} accepted ${denied.connections} connection(s), ${denied.bytes} bytes: ${JSON.stringify(Buffer.concat(denied.received).toString("latin1").slice(0, 1500))}`);
        denied.connections = 0;
        denied.bytes = 0;
        denied.received.length = 0;
      }
    }
    entry.bound = bound;
    this.judgeCount(entry);
    findings.push(...this.late.splice(0));
    if (guestScanner.found !== undefined) report("secret-guest", `the guest received the secret's value: ${JSON.stringify(guestScanner.found)}`);
    if (this.logScanner.found !== undefined) {
      report("secret-log", `the log holds the secret's value: ${JSON.stringify(this.logScanner.found)}`);
      this.logScanner = new SecretScanner(this.secretValue);
    }
    const probe = await this.probe();
    if (probe !== undefined) {
      // A proxy that died as the probe went out: its exit may not have been seen yet.
      if (this.child !== undefined && this.alive()) await Promise.race([once(this.child, "exit"), new Promise((resolve) => setTimeout(resolve, 1_000))]);
      if (!this.alive()) {
        report("crash", `the proxy exited (${String(this.child?.exitCode)} ${String(this.child?.signalCode)}): ${this.stderr.slice(-4000)}`);
        this.restarts += 1;
        await this.startChild();
      } else report("liveness", probe);
    }
    return findings;
  }

  /**
   * Ends a case's HTTP/1.1 bytes. Without a policy, the guest half-closes at once. With one, the
   * hooks' turn outlasts that FIN, and the proxy treats a FIN as a guest that left (499, nothing
   * answered), so the guest instead sends a last request with `Connection: close` (tagged so it
   * counts against no case), whose answer closes the connection; bytes that swallow it (a body
   * announced longer than sent) leave the proxy's idle timeout to close it.
   */
  private finish(conn: GuestConn, target: string, authority: string): "end" | "last request" {
    if (!this.policy) {
      conn.end();
      return "end";
    }
    // Inside a tunnel credentials are no field of a request's: the CONNECT carried them.
    const credentials = target.startsWith("http:") ? this.credentialsField() : "";
    conn.write(Buffer.from(`GET ${target} HTTP/1.1\r\nHost: ${authority}\r\n${credentials}Connection: close\r\n\r\n`));
    return "last request";
  }

  /** The guest's `Proxy-Authorization` line (with `auth`), or nothing. */
  private credentialsField(): string {
    return this.ready.proxyAuthorization === undefined ? "" : `Proxy-Authorization: ${this.ready.proxyAuthorization}\r\n`;
  }

  /** A normal absolute-form request: undefined if it is answered 200 by `api.test`'s upstream. */
  async probe(): Promise<string | undefined> {
    const conn = await GuestConn.open(this.ready.port).catch((error: Error) => error);
    if (conn instanceof Error) return `connecting to the proxy failed: ${conn.message}`;
    try {
      const authority = `${hostName("api")}:${this.world.ports.api.plain}`;
      conn.write(Buffer.from(`GET http://${authority}/alive?c=probe-0 HTTP/1.1\r\nHost: ${authority}\r\n${this.credentialsField()}Connection: close\r\n\r\n`));
      await conn.closedBy(Date.now() + this.hangMs);
      const parsed = parseGuestResponse(conn.received, true, () => false);
      if (parsed.kind !== "done" || parsed.value.status !== 200 || !parsed.value.body.toString().startsWith("upstream api-plain")) {
        return `a normal request got ${JSON.stringify(conn.received.toString("latin1").slice(0, 500))}`;
      }
      return undefined;
    } finally {
      conn.destroy();
    }
  }

  /** Reads every response in `buf` (`methods` in order, for HEAD); reports what is malformed. */
  private judgeResponses(buf: Buffer, methods: readonly string[], firstIsConnect: boolean, report: (oracle: string, detail: string) => void): void {
    let rest = buf;
    let i = 0;
    let lastSeq = 0;
    while (rest.length > 0) {
      const connect = firstIsConnect && i === 0;
      // A 2xx to CONNECT has no body: what follows is the tunnel's.
      const head = methods[i]?.toUpperCase() === "HEAD";
      let parsed = parseGuestResponse(rest, true, (status) => head || (connect && status < 300));
      // Which request was a HEAD is a guess from the bytes (a body's last bytes may run into the
      // next request line): an answer is read the other way too, and taken that way when only
      // that way is it followed by a response or the end. The proxy's answer to a request its
      // parser refused carries a body even when the line said HEAD (it does not trust the method
      // of a request it could not read), and closes.
      const followedWell = (p: typeof parsed): boolean => p.kind === "done" && (p.consumed === rest.length || rest.subarray(p.consumed, p.consumed + 9).toString("latin1") === "HTTP/1.1 ");
      if (!connect && !followedWell(parsed)) {
        const other = parseGuestResponse(rest, true, (status) => !head && status >= 200);
        if (followedWell(other)) parsed = other;
      }
      if (parsed.kind === "bad") {
        report("guest-malformed", `${parsed.reason}; received ${JSON.stringify(buf.toString("latin1").slice(0, 1500))}`);
        return;
      }
      if (parsed.kind === "more") {
        report("guest-truncated", `an incomplete response at the close: ${JSON.stringify(rest.toString("latin1").slice(0, 1500))}`);
        return;
      }
      rest = rest.subarray(parsed.consumed);
      const statKey = process.env["FUZZ_REASONS"] ? `${parsed.value.status} ${parsed.value.body.toString("latin1").slice(0, 140)}` : String(parsed.value.status);
      this.stats.set(statKey, (this.stats.get(statKey) ?? 0) + 1);
      // After a 101 the bytes are the new protocol's (the upstream echoes the guest's).
      if (parsed.value.status === 101) return;
      if (parsed.value.status >= 200) i += 1;
      // Pipelined requests carry `seq=N` in their paths, which the upstream echoes: an answer
      // given to the wrong request shows as a number out of order.
      const seq = /^upstream \S+ \d+ \S*[?&]seq=([0-9]+)/.exec(parsed.value.body.toString("latin1"));
      if (seq !== null) {
        if (Number(seq[1]) <= lastSeq) report("guest-order", `the answer for seq=${seq[1]} came after the one for seq=${lastSeq}; received ${JSON.stringify(buf.toString("latin1").slice(0, 1500))}`);
        lastSeq = Number(seq[1]);
      }
    }
  }

  private async runH1(input: H1Case, conns: GuestConn[], report: (oracle: string, detail: string) => void, scanner: SecretScanner): Promise<number> {
    const all = Buffer.concat([...input.writes, input.inside?.bytes ?? Buffer.alloc(0)]);
    const bound = requestLines(all).length;
    const outer = await GuestConn.open(this.ready.port);
    conns.push(outer);
    if (input.via === "tunnel") {
      const { name, authority } = input.connect!;
      outer.write(Buffer.from(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${this.credentialsField()}\r\n`));
      await outer.until(() => headComplete(outer.received), Date.now() + this.hangMs);
      if (!outer.received.toString("latin1").startsWith("HTTP/1.1 200")) {
        report("harness", `CONNECT ${authority} got ${JSON.stringify(outer.received.toString("latin1").slice(0, 300))}`);
        return bound;
      }
      const inner = await outer.startTls(hostName(name), this.ready.caCertPem, ["http/1.1"]);
      conns.push(inner);
      await inner.writeAll(input.writes);
      const last = this.finish(inner, `/sentinel?c=probe-0`, authority);
      if (!(await inner.closedBy(Date.now() + this.hangMs))) report("hang", `the tunnel was still open ${this.hangMs} ms after the guest's ${last}; received ${JSON.stringify(inner.received.toString("latin1").slice(0, 500))}`);
      scanner.push(inner.received);
      this.judgeResponses(inner.received, [...requestLines(all), "GET"], false, report);
      return bound;
    }
    await outer.writeAll(input.writes);
    const written = Buffer.concat([...input.writes]);
    const isConnect = /^CONNECT/i.test(written.toString("latin1"));
    if (input.inside !== undefined && blankLine.test(written.toString("latin1"))) {
      await outer.until(() => headComplete(outer.received), Date.now() + this.hangMs);
      if (outer.received.toString("latin1").startsWith("HTTP/1.1 200") && !outer.closed) {
        const insideMethods = requestLines(input.inside.bytes);
        if (input.inside.tls) {
          const tls = await outer.startTls(input.inside.servername, this.ready.caCertPem, ["http/1.1"]).catch(() => undefined);
          scanner.push(outer.received);
          this.judgeResponses(outer.received, ["CONNECT"], true, report);
          if (tls === undefined) return bound;
          conns.push(tls);
          tls.write(input.inside.bytes);
          tls.end();
          if (!(await tls.closedBy(Date.now() + this.hangMs))) report("hang", `the TLS tunnel was still open ${this.hangMs} ms after the guest's end`);
          scanner.push(tls.received);
          this.judgeResponses(tls.received, insideMethods, false, report);
          return bound;
        }
        outer.write(input.inside.bytes);
        outer.end();
        if (!(await outer.closedBy(Date.now() + this.hangMs))) report("hang", `the tunnel was still open ${this.hangMs} ms after the guest's end`);
        scanner.push(outer.received);
        this.judgeResponses(outer.received, ["CONNECT", ...insideMethods], true, report);
        return bound;
      }
    }
    const apiPlain = `${hostName("api")}:${this.world.ports.api.plain}`;
    const last = isConnect ? "end" : this.finish(outer, `http://${apiPlain}/sentinel?c=probe-0`, apiPlain);
    if (isConnect) outer.end();
    if (!(await outer.closedBy(Date.now() + this.hangMs))) report("hang", `the connection was still open ${this.hangMs} ms after the guest's ${last}; received ${JSON.stringify(outer.received.toString("latin1").slice(0, 500))}`);
    scanner.push(outer.received);
    this.judgeResponses(outer.received, [...requestLines(written), "GET"], isConnect, report);
    return bound;
  }

  private async runHello(input: HelloCase, conns: GuestConn[], report: (oracle: string, detail: string) => void, scanner: SecretScanner): Promise<number> {
    const conn = await GuestConn.open(this.ready.port);
    conns.push(conn);
    conn.write(Buffer.from(`CONNECT ${input.authority} HTTP/1.1\r\nHost: ${input.authority}\r\n${this.credentialsField()}\r\n`));
    await conn.until(() => headComplete(conn.received), Date.now() + this.hangMs);
    const head = conn.received.indexOf("\r\n\r\n") + 4;
    if (!conn.received.toString("latin1").startsWith("HTTP/1.1 200")) {
      report("harness", `CONNECT ${input.authority} got ${JSON.stringify(conn.received.toString("latin1").slice(0, 300))}`);
      return 0;
    }
    await conn.writeAll(input.writes);
    conn.end();
    if (!(await conn.closedBy(Date.now() + this.hangMs))) report("hang", `the tunnel was still open ${this.hangMs} ms after the guest's end`);
    const answer = conn.received.subarray(head);
    scanner.push(answer);
    // What may come back before a handshake: an alert (0x15) or the server's flight (0x16).
    if (answer.length > 0 && answer[0] !== 0x15 && answer[0] !== 0x16) report("guest-malformed", `the answer to a ClientHello began ${answer.subarray(0, 32).toString("hex")}`);
    if (answer[0] === 0x16 && !input.targetNamed) report("sni", `the handshake went on for a ClientHello naming no CONNECT target: ${answer.subarray(0, 16).toString("hex")}`);
    return 0;
  }

  private async runH2(input: H2Case, conns: GuestConn[], report: (oracle: string, detail: string) => void, scanner: SecretScanner): Promise<number> {
    const outer = await GuestConn.open(this.ready.port);
    conns.push(outer);
    const { name, authority } = input.connect;
    outer.write(Buffer.from(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${this.credentialsField()}\r\n`));
    await outer.until(() => headComplete(outer.received), Date.now() + this.hangMs);
    if (!outer.received.toString("latin1").startsWith("HTTP/1.1 200")) {
      report("harness", `CONNECT ${authority} got ${JSON.stringify(outer.received.toString("latin1").slice(0, 300))}`);
      return input.streams.length;
    }
    const conn = await outer.startTls(hostName(name), this.ready.caCertPem, ["h2"]);
    conns.push(conn);
    if ((conn.socket as { alpnProtocol?: string | false }).alpnProtocol !== "h2") {
      report("harness", "ALPN did not choose h2");
      return 0;
    }
    // As a client does: the server's SETTINGS acknowledged, its PINGs answered (RFC 9113 §6.5.3, §6.7).
    let acked = 0;
    conn.socket.on("data", () => {
      const got = parseFrames(conn.received).frames;
      for (const f of got.slice(acked)) {
        if (f.type === 0x4 && (f.flags & 1) === 0 && input.ackSettings) conn.write(frame(0x4, 1, 0));
        if (f.type === 0x6 && (f.flags & 1) === 0) conn.write(frame(0x6, 1, 0, f.payload));
      }
      acked = got.length;
    });
    await conn.writeAll(input.writes);
    const written = Buffer.concat([...input.writes]);
    // Our own last frame whole (and the preface intact): a PING behind it is read as one, and its
    // ACK says every frame before it was processed.
    const whole = written.subarray(0, preface.length).equals(preface) && parseFrames(written.subarray(preface.length)).rest.length === 0;
    const frames = (): ReturnType<typeof parseFrames>["frames"] => parseFrames(conn.received).frames;
    const pingData = Buffer.from("fuzzping");
    if (whole) {
      conn.write(frame(0x6, 0, 0, pingData));
      const goaway = (): boolean => frames().some((f) => f.type === 0x7);
      await conn.until(() => goaway() || frames().some((f) => f.type === 0x6 && (f.flags & 1) === 1 && f.payload.equals(pingData)), Date.now() + this.hangMs);
      const ended = (streamId: number): boolean =>
        frames().some((f) => f.streamId === streamId && (f.type === 0x3 || ((f.type === 0x0 || f.type === 0x1) && (f.flags & 1) === 1)));
      // Not an oracle: how long the answers may take before the guest ends its side regardless.
      // A stream may wait on a window the case closed (SETTINGS_INITIAL_WINDOW_SIZE 0), or on a
      // stream the proxy never opened: the guest's end is the answer to both.
      await conn.until(() => goaway() || input.streams.every(ended), Date.now() + 500);
    }
    const goawayCode = frames().find((f) => f.type === 0x7)?.payload.readUInt32BE(4);
    if (goawayCode !== undefined && goawayCode !== 0) {
      // A connection error (RFC 9113 §5.4.1): the proxy has said so, and nghttp2 reads nothing
      // more, so the guest's end goes unseen until the proxy's silence timer (h2-guest.ts,
      // onSilence). The guest closes, as clients do after such a GOAWAY.
      conn.destroy();
    } else conn.end();
    const closedInTime = conn.socket.destroyed || (await conn.closedBy(Date.now() + this.hangMs));
    if (!closedInTime) report("hang", `the HTTP/2 connection was still open ${this.hangMs} ms after the guest's end`);
    // The server's preface is a SETTINGS frame, the first bytes it sends.
    const parsed = parseFrames(conn.received);
    if (parsed.rest.length > 0) report("guest-truncated", `an incomplete frame at the close: ${parsed.rest.subarray(0, 64).toString("hex")}`);
    if (parsed.frames.length > 0 && parsed.frames[0]!.type !== 0x4) report("guest-malformed", `the server's first frame is type ${parsed.frames[0]!.type}, not SETTINGS`);
    for (const f of parsed.frames) {
      const bad = badServerFrame(f, input.maxFrameSize);
      if (bad !== undefined) report("guest-malformed", bad);
      if (f.type === 0x0) scanner.push(f.payload);
    }
    scanner.push(conn.received);
    // A request of HTTP/2 is one stream: at most one upstream request per HEADERS frame sent.
    let headers = 0;
    for (const f of parseFrames(written.subarray(preface.length)).frames) if (f.type === 0x1) headers += 1;
    return headers;
  }

  /** Runs `cases` cases of each target; calls `onFinding` as they come. */
  async run(options: { readonly seed: string; readonly cases: number; readonly targets: readonly FuzzTarget[]; readonly first?: number; readonly onFinding?: (finding: Finding) => void; readonly onProgress?: (done: number) => void }): Promise<{ findings: Finding[]; cases: number; ms: number }> {
    const findings: Finding[] = [];
    const started = Date.now();
    let done = 0;
    for (let index = options.first ?? 0; index < (options.first ?? 0) + options.cases; index++) {
      for (const target of options.targets) {
        for (const finding of await this.runCase(target, options.seed, index)) {
          findings.push(finding);
          options.onFinding?.(finding);
        }
        done += 1;
        options.onProgress?.(done);
      }
    }
    return { findings, cases: done, ms: Date.now() - started };
  }

  /** The proxy's last log lines, for a report. */
  lastLog(): string[] {
    return [...this.logTail];
  }

  async close(): Promise<void> {
    const child = this.child;
    if (child !== undefined && child.exitCode === null && child.signalCode === null) {
      const exited = once(child, "exit");
      child.kill("SIGKILL");
      await exited;
    }
    rmSync(this.caDir, { recursive: true, force: true });
    await Promise.all(this.allRecorders.map((r) => r.close()));
  }
}
