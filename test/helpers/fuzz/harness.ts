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
import { deciderCase, type DeciderCase } from "./decider-inputs.js";
import { h2GuestChoices, h2Request, h2Session, judgeH2Upstream, type H2GuestChoices } from "./h2-guest-run.js";
import { deciderPaths, startHostileDecider, type HostileDecider } from "./hostile-decider.js";
import { startHostileWebSocket, type HostileWebSocket } from "./hostile-websocket.js";
import { websocketCase, type WsCase } from "./websocket-inputs.js";
import { normalBody, startHostile, type HostileRequest, type HostileStep, type HostileUpstream } from "./hostile-upstream.js";
import { startRecorder, type Recorder } from "./recorder.js";
import { Rng } from "./rng.js";
import { SecretScanner } from "./scanner.js";
import { badServerFrame, parseFrames, parseGuestResponse, type UpstreamRequest } from "./wire.js";
import { hostileKinds, hostileLabel, upstreamCase, type HostileKind, type HostileName, type UpstreamCase } from "./upstream-inputs.js";
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
 *
 * Six hostile upstreams besides (HTTP/1.1 over TLS and plain, and HTTP/2, for `api.test` and
 * `secret.test`: hostile-upstream.ts) answer the `upstream` target's cases badly, as each case's
 * script says (upstream-inputs.ts). Those cases are judged further: the guest got an answer its
 * outcome allows (the upstream's whole, a proxy error of the codes allowed, or a cut where the
 * answer was broken), never bytes the upstream sent past an answer's end, and its second request
 * on the connection got its own answer; no upstream saw a request a hook answered or refused.
 * With `guests`, several guests' cases run at once, and none gets another's value of the secret
 * or an answer naming another's request.
 *
 * `h2guest` sends the `upstream` target's cases from an HTTP/2 guest (h2-guest-run.ts), now and
 * then with a tiny flow-control window or resetting its first stream, judged the same way.
 * `decider` (with `deciders`) has an external decider answer a request's call badly
 * (hostile-decider.ts): the guest gets what the answer means by the decider contract, and a
 * request-phase decider that did not allow never lets its request reach the upstream
 * (`fail-open`). `websocket` upgrades to WebSocket upstreams that answer badly
 * (hostile-websocket.ts): a 101 relayed is followed by exactly the bytes the upstream sent
 * after it (`ws-relay`), and a refused upgrade lets none of the guest's bytes through
 * (`ws-unchecked`).
 */
export type FuzzTarget = "h1" | "plain" | "connect" | "h2" | "tls" | "upstream" | "guests" | "h2guest" | "decider" | "websocket";

/** Every target; `guests` needs a harness started with `guests`, `decider` one started with `deciders`. */
export const fuzzTargets: readonly FuzzTarget[] = ["h1", "plain", "connect", "h2", "tls", "upstream", "guests", "h2guest", "decider", "websocket"];

/** A case of `guests`: several guests' `upstream` cases at once, each with its own credentials and secret's value. */
export interface GuestsCase {
  readonly guests: readonly { readonly guest: number; readonly sub: UpstreamCase }[];
  readonly steps: readonly string[];
}

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
  /** Tier-3 hooks in the embedding that answer as each request's `x-fuzz-hooks` says (fuzz-proxy-child.ts). */
  readonly hooks?: boolean;
  /**
   * This many guests (2 or more), each with its own credentials and its own value of the secret;
   * the other targets run as the first.
   */
  readonly guests?: number;
  /**
   * External deciders in every guest's chain (a webhook asked in both phases, and OPA), served
   * by test/helpers/fuzz/hostile-decider.ts: they allow every request but the `decider` target's.
   */
  readonly deciders?: boolean;
}

/** The deciders' own deadline (`timeoutMs`): below the proxy's other timeouts, so a silent decider is a failure, not a hook timeout. */
const deciderTimeoutMs = 1_000;

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
  readonly guests?: readonly { readonly name: string; readonly proxyAuthorization: string; readonly placeholder: string }[];
}

/** Who a request is from: its credentials, and the value its placeholder stands for. */
interface Identity {
  readonly proxyAuthorization: string | undefined;
  readonly value: string;
}

/** Where `upstream` cases' scripts wait for their request (`c=TAG`, `seq=1`), by tag. */
interface Scripted {
  readonly name: HostileName;
  readonly kind: HostileKind;
  readonly script: readonly HostileStep[];
  readonly redirect: boolean;
}

interface LedgerEntry {
  /** The most requests the case's bytes hold; infinite while it runs. */
  bound: number;
  requests: number;
  /** The first few targets the upstreams saw, so a count past the bound says which request went twice. */
  readonly seen: string[];
  redirects: number;
  reported: boolean;
  readonly target: FuzzTarget;
  readonly seed: string;
  readonly index: number;
  readonly steps: readonly string[];
  /** The content each valid request (`seq`) must reach the upstream with. */
  readonly bodies: ReadonlyMap<number, string>;
  /** Requests (by their full `c=` value) a hook was to answer or refuse: no upstream may see them (`seq=2` only). */
  readonly unreachable: ReadonlySet<string>;
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

/** A request's full `c=` value: a case's tag, or a guest's part of it (`guests-3-g1`). */
function fullTagOf(target: string): string | undefined {
  return /[?&]c=([^&]+)/.exec(target)?.[1];
}

/** An outcome, for a report. */
function describe(outcome: UpstreamCase["outcome"]): string {
  const relays = outcome.relays.map((r) => `${r.status} ${typeof r.body === "string" ? JSON.stringify(r.body.slice(0, 80)) : String(r.body)}`);
  return `${relays.length > 0 ? relays.join(" or ") : "no relay"}; errors ${outcome.errors === "any" ? "any" : outcome.errors.join(",") || "none"}${outcome.cut ? "; a cut" : ""}`;
}

const blankLine = /\r\n\r\n|\n\n|\r\n\n|\n\r\n/;

export class FuzzHarness {
  private child: ChildProcess | undefined;
  private ready!: ChildReady;
  private stderr = "";
  private readonly logTail: string[] = [];
  private logScanner: SecretScanner;
  private readonly upstreamScanners = new Map<Recorder | HostileUpstream | HostileWebSocket, SecretScanner>();
  private readonly caDir = mkdtempSync(join(tmpdir(), "egressgate-fuzz-"));
  readonly timeoutMs: number;
  readonly hangMs: number;
  private readonly policy: boolean;
  private readonly auth: boolean;
  private readonly hooks: boolean;
  private readonly deciders: boolean;
  /** The secret's value of each guest (one without `guests`): the first is `secretValue`. */
  private readonly values: readonly string[];
  private guestIds: readonly Identity[] = [];
  private hostile!: Readonly<Record<HostileName, Readonly<Record<HostileKind, HostileUpstream>>>>;
  /** The WebSocket upstreams (hostile-websocket.ts), TLS and plain, for `api.test` and `secret.test`. */
  private ws!: Readonly<Record<HostileName, { readonly tls: HostileWebSocket; readonly plain: HostileWebSocket }>>;
  private decider: HostileDecider | undefined;
  /** The `decider` and `websocket` cases under way, by tag: what their upstream answers. */
  private readonly deciderCases = new Map<string, DeciderCase>();
  private readonly wsCases = new Map<string, WsCase>();
  /** Hostile HTTP/2 upstreams whose connection the proxy's HTTP/2 client gave up on in this case (below, settleSession). */
  private readonly deadSessions = new Set<HostileName>();
  /** Times a case waited for the proxy to give up such a session. */
  settled = 0;
  /** The scripts of the last cases of `upstream`, by tag. */
  private readonly scripts = new Map<string, Scripted>();
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
    this.hooks = options.hooks === true;
    this.deciders = options.deciders === true;
    this.values = [secretValue, ...Array.from({ length: Math.max(0, (options.guests ?? 1) - 1) }, () => `fuzzsecret${randomBytes(12).toString("hex")}`)];
    this.hangMs = this.timeoutMs * 4;
    this.logScanner = new SecretScanner(this.values);
    for (const name of upstreamNames) {
      if (name === "secret") continue;
      for (const recorder of [recorders[name].tls, recorders[name].plain]) this.upstreamScanners.set(recorder, new SecretScanner(this.values));
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
    const hostile = {} as Record<HostileName, Record<HostileKind, HostileUpstream>>;
    for (const name of ["api", "secret"] as const) {
      hostile[name] = {} as Record<HostileKind, HostileUpstream>;
      for (const kind of hostileKinds) {
        hostile[name][kind] = await startHostile({
          label: hostileLabel(name, kind),
          host: upstreamAddress[name],
          ...(kind === "h1plain" ? {} : { tls: credentials.get(hostName(name))!, h2: kind === "h2" }),
          script: (request) => harness.scriptFor(name, kind, request),
          onRequest: (request, scripted) => harness.count(request, scripted && harness.scripts.get(fullTagOf(request.target) ?? "")?.redirect === true),
          onGoaway: (code) => void (code !== 0 && harness.deadSessions.add(name)),
        });
      }
    }
    harness.hostile = hostile;
    const ws = {} as Record<HostileName, { tls: HostileWebSocket; plain: HostileWebSocket }>;
    for (const name of ["api", "secret"] as const) {
      const script = (request: UpstreamRequest): ReturnType<WsCase["script"]> => harness.wsCases.get(fullTagOf(request.target) ?? "")?.script(request) ?? ["destroy"];
      ws[name] = {
        tls: await startHostileWebSocket({ label: `${name}-ws-tls`, host: upstreamAddress[name], tls: credentials.get(hostName(name))!, script }),
        plain: await startHostileWebSocket({ label: `${name}-ws-plain`, host: upstreamAddress[name], script }),
      };
      if (name === "api") for (const upstream of [ws[name].tls, ws[name].plain]) harness.upstreamScanners.set(upstream, new SecretScanner(harness.values));
    }
    harness.ws = ws;
    if (options.deciders === true) {
      harness.decider = await startHostileDecider({
        script: (call) => {
          const input = harness.deciderCases.get(fullTagOf(call.url) ?? "");
          if (input === undefined || !/[?&]seq=1(?:&|$)/.test(call.url) || call.phase !== input.phase || call.path !== deciderPaths[input.decider]) return undefined;
          return input.script;
        },
      });
    }
    for (const upstream of harness.allHostile) if (upstream.label.startsWith("api")) harness.upstreamScanners.set(upstream, new SecretScanner(harness.values));
    await harness.startChild();
    return harness;
  }

  private get allRecorders(): Recorder[] {
    return upstreamNames.flatMap((name) => [this.recorders[name].tls, this.recorders[name].plain]);
  }

  private get allWebSocket(): HostileWebSocket[] {
    return (["api", "secret"] as const).flatMap((name) => [this.ws[name].tls, this.ws[name].plain]);
  }

  private get allHostile(): HostileUpstream[] {
    return (["api", "secret"] as const).flatMap((name) => hostileKinds.map((kind) => this.hostile[name][kind]));
  }

  /** The script for a hostile upstream's request: its case's, for the first request of the case, at the upstream the case chose. */
  private scriptFor(name: HostileName, kind: HostileKind, request: HostileRequest): readonly HostileStep[] | undefined {
    const scripted = this.scripts.get(fullTagOf(request.target) ?? "");
    if (scripted === undefined || scripted.name !== name || scripted.kind !== kind || !/[?&]seq=1(?:&|$)/.test(request.target)) return undefined;
    return scripted.script;
  }

  private async startChild(): Promise<void> {
    const t = this.timeoutMs;
    const options = {
      ...(this.policy ? { policy: fuzzPolicy } : {}),
      ...(this.hooks ? { hooks: { apiTls: this.recorders.api.tls.port, deniedTls: this.recorders.denied.tls.port, deniedPlain: this.recorders.denied.plain.port } } : {}),
      allowedInternalHosts: [hostName("api"), hostName("secret")],
      secret: { name: secretName, hosts: [hostName("secret")], value: this.secretValue },
      ...(this.decider !== undefined
        ? { deciders: { webhook: `http://127.0.0.1:${this.decider.port}${deciderPaths.webhook}`, opa: `http://127.0.0.1:${this.decider.port}${deciderPaths.opa}`, timeoutMs: deciderTimeoutMs } }
        : {}),
      ...(this.values.length > 1 ? { guests: this.values.map((value, i) => ({ name: `g${i}`, value })) } : {}),
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
    this.guestIds = ready.guests?.map((g, i) => ({ proxyAuthorization: g.proxyAuthorization, value: this.values[i]! })) ?? [{ proxyAuthorization: ready.proxyAuthorization, value: this.secretValue }];
    const ports = Object.fromEntries(upstreamNames.map((name) => [name, { tls: this.recorders[name].tls.port, plain: this.recorders[name].plain.port }])) as FuzzWorld["ports"];
    const hostile = Object.fromEntries(
      (["api", "secret"] as const).map((name) => [name, Object.fromEntries(hostileKinds.map((kind) => [kind, this.hostile[name][kind].port]))]),
    ) as unknown as NonNullable<FuzzWorld["hostile"]>;
    this.world = {
      placeholder: ready.placeholder,
      ports,
      hostile,
      secretValue: this.secretValue,
      ...(ready.proxyAuthorization !== undefined ? { proxyAuthorization: ready.proxyAuthorization } : {}),
    };
  }

  /**
   * An upstream request, counted against the case its path's tag names (one that lost its tag
   * to a mutation, against the case running): a request that reaches the upstream after its
   * case has ended is still its case's.
   */
  private count(request: Pick<UpstreamRequest, "target"> & { readonly body?: Buffer }, redirected: boolean): void {
    const entry = this.ledger.get(tagOf(request.target) ?? this.current ?? "");
    if (entry === undefined) return;
    entry.requests += 1;
    if (entry.seen.length < 6) entry.seen.push(request.target.slice(0, 120));
    if (entry.unreachable.has(fullTagOf(request.target) ?? "") && !/[?&]seq=2(?:&|$)/.test(request.target)) {
      this.late.push({
        target: entry.target,
        seed: entry.seed,
        index: entry.index,
        oracle: entry.target === "decider" ? "fail-open" : "unchecked",
        detail: `an upstream saw ${JSON.stringify(request.target.slice(0, 300))}, a request ${entry.target === "decider" ? "its decider refused or failed on" : "a hook answered or refused"}`,
        steps: entry.steps,
      });
    }
    if (redirected) entry.redirects += 1;
    this.judgeCount(entry);
    // A hop the proxy followed has no `seq` (the Location carries the tag alone).
    const seq = /[?&]seq=([0-9]+)/.exec(request.target)?.[1];
    const expected = seq === undefined ? undefined : entry.bodies.get(Number(seq));
    const body = (request.body ?? Buffer.alloc(0)).toString("latin1");
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
      detail: `${entry.requests} upstream requests from ${entry.bound} request line(s) and ${entry.redirects} redirect(s): ${JSON.stringify(entry.seen)}`,
      steps: entry.steps,
    });
  }

  alive(): boolean {
    return this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
  }

  /** The case `index` of `target` under `seed`: a pure function of the three (and the world's ports and placeholder). */
  caseOf(target: FuzzTarget, seed: string, index: number): H1Case | H2Case | HelloCase | (UpstreamCase & { readonly h2guest?: H2GuestChoices }) | GuestsCase | DeciderCase | WsCase {
    const rng = new Rng(seed, target, index);
    const world: FuzzWorld = { ...this.world, tag: `${target}-${index}` };
    if (target === "upstream") return upstreamCase(rng, world, { hooks: this.hooks });
    // An HTTP/2 guest is in a TLS tunnel: the upstreams it reaches speak TLS.
    if (target === "h2guest") {
      const sub = upstreamCase(rng, world, { hooks: this.hooks, kinds: ["h1tls", "h2"] });
      const steps = [...sub.steps];
      return { ...sub, steps, h2guest: h2GuestChoices(rng, steps) };
    }
    if (target === "decider") {
      if (!this.deciders) throw new Error("--target decider needs a harness started with deciders (--deciders)");
      return deciderCase(rng, world);
    }
    if (target === "websocket") return websocketCase(rng, world);
    if (target === "guests") {
      if (this.guestIds.length < 2) throw new Error("--target guests needs a harness started with guests (--guests N)");
      // Two or more guests at once, each a case of its own with its placeholder: the answers quote what each sent.
      const order = this.guestIds.map((_, i) => i);
      for (let i = order.length - 1; i > 0; i--) {
        const j = rng.int(i + 1);
        [order[i], order[j]] = [order[j]!, order[i]!];
      }
      const chosen = order.slice(0, rng.range(2, this.guestIds.length));
      const guests = chosen.map((guest) => {
        const sub = upstreamCase(rng, { ...world, tag: `${target}-${index}-g${guest}`, placeholder: this.ready.guests![guest]!.placeholder, secretValue: this.values[guest]! }, { hooks: this.hooks, echo: true });
        return { guest, sub };
      });
      return { guests, steps: guests.flatMap(({ guest, sub }) => sub.steps.map((step) => `g${guest}: ${step}`)) };
    }
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
    if ("decider" in input) {
      this.deciderCases.set(tag, input);
      if (this.deciderCases.size > 50) this.deciderCases.delete(this.deciderCases.keys().next().value!);
    }
    if ("early" in input) {
      this.wsCases.set(tag, input);
      if (this.wsCases.size > 50) this.wsCases.delete(this.wsCases.keys().next().value!);
    }
    const bodies = "bodies" in input && input.bodies !== undefined ? input.bodies : new Map<number, string>();
    const subs: { readonly tag: string; readonly sub: UpstreamCase }[] =
      "outcome" in input ? [{ tag, sub: input }] : "guests" in input ? input.guests.map(({ guest, sub }) => ({ tag: `${tag}-g${guest}`, sub })) : [];
    const unreachable = new Set(subs.filter(({ sub }) => !sub.outcome.reaches).map(({ tag: t }) => t));
    // A decider that refused or failed in the request phase: the request must not reach the upstream.
    if ("decider" in input && input.phase === "request" && !input.verdicts.allow) unreachable.add(tag);
    const entry: LedgerEntry = { bound: Number.POSITIVE_INFINITY, requests: 0, seen: [], redirects: 0, reported: false, target, seed, index, steps: input.steps, bodies, unreachable };
    for (const { tag: t, sub } of subs) {
      this.scripts.set(t, { name: sub.name, kind: sub.kind, script: sub.script, redirect: sub.slack >= 11 });
      if (this.scripts.size > 400) this.scripts.delete(this.scripts.keys().next().value!);
    }
    this.ledger.delete(tag);
    this.ledger.set(tag, entry);
    if (this.ledger.size > 200) this.ledger.delete(this.ledger.keys().next().value!);
    this.current = tag;
    const malformedBefore = new Map(this.allRecorders.map((r) => [r, r.malformed.length]));
    const guestScanner = new SecretScanner(this.values);
    const conns: GuestConn[] = [];
    let bound: number;
    try {
      if ("decider" in input) bound = await this.runDecider(input, tag, conns, report, guestScanner);
      else if ("early" in input) bound = await this.runWebsocket(input, tag, conns, report, guestScanner);
      else if ("outcome" in input && target === "h2guest") bound = await this.runH2Guest(input, conns, report, guestScanner);
      else if ("outcome" in input) bound = await this.runUpstream(input, tag, this.guestIds[0]!, conns, report, guestScanner);
      else if ("guests" in input) bound = await this.runGuests(input, tag, conns, report);
      else if ("targetNamed" in input) bound = await this.runHello(input, conns, report, guestScanner);
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
    for (const name of this.deadSessions) await this.settleSession(name, report);
    this.deadSessions.clear();
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
          this.upstreamScanners.set(recorder, new SecretScanner(this.values));
        }
      }
    }
    for (const upstream of this.allHostile) {
      for (const bad of upstream.malformed.splice(0)) {
        report("upstream-malformed", `${upstream.label} read ${bad.reason}; it received ${JSON.stringify(bad.bytes.toString("latin1").slice(-1500))}`);
      }
      const scanner = this.upstreamScanners.get(upstream);
      for (const chunk of upstream.received) scanner?.push(chunk);
      upstream.received.length = 0;
      if (scanner?.found !== undefined) {
        report("secret-upstream", `${upstream.label} received the secret's value: ${JSON.stringify(scanner.found)}`);
        this.upstreamScanners.set(upstream, new SecretScanner(this.values));
      }
    }
    for (const upstream of this.allWebSocket) {
      for (const bad of upstream.malformed.splice(0)) report("upstream-malformed", `${upstream.label} read ${bad.reason}; it received ${JSON.stringify(bad.bytes.toString("latin1").slice(-1500))}`);
      const scanner = this.upstreamScanners.get(upstream);
      for (const chunk of upstream.received) scanner?.push(chunk);
      upstream.received.length = 0;
      if (scanner?.found !== undefined) {
        report("secret-upstream", `${upstream.label} received the secret's value: ${JSON.stringify(scanner.found)}`);
        this.upstreamScanners.set(upstream, new SecretScanner(this.values));
      }
    }
    if (this.decider !== undefined) {
      for (const bad of this.decider.malformed.splice(0)) report("upstream-malformed", `the decider read ${bad.reason}; it received ${JSON.stringify(bad.bytes.toString("latin1").slice(0, 1500))}`);
    }
    if ("early" in input) this.judgeWsUpstream(input, tag, report);
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
      this.logScanner = new SecretScanner(this.values);
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
    if (!this.policy && !this.hooks) {
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

  /**
   * Once nghttp2 has refused a frame, it sends GOAWAY and stops reading: Node never sees the
   * upstream's FIN. The session stayed in the proxy's pool until its PING went unanswered, taking
   * every request to that origin meanwhile; now the PING sent as the next stream goes on it, held
   * unsent, gives it up at once (reliability.md, fourteenth session), and this checks that it does:
   * requests go to the origin until one is answered, at most a few.
   */
  private async settleSession(name: HostileName, report: (oracle: string, detail: string) => void): Promise<void> {
    this.settled += 1;
    // Each guest has pools of its own: any of them may hold the session.
    for (const who of this.guestIds) await this.settleSessionOf(name, who, report);
  }

  private async settleSessionOf(name: HostileName, who: Identity, report: (oracle: string, detail: string) => void): Promise<void> {
    const authority = `${hostName(name)}:${this.world.hostile![name].h2}`;
    const credentials = who.proxyAuthorization === undefined ? "" : `Proxy-Authorization: ${who.proxyAuthorization}\r\n`;
    for (let attempt = 0; attempt < 5; attempt++) {
      const outer = await GuestConn.open(this.ready.port);
      try {
        outer.write(Buffer.from(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${credentials}\r\n`));
        await outer.until(() => headComplete(outer.received), Date.now() + this.hangMs);
        if (!outer.received.toString("latin1").startsWith("HTTP/1.1 200")) continue;
        const conn = await outer.startTls(hostName(name), this.ready.caCertPem, ["http/1.1"]);
        try {
          conn.write(Buffer.from(`GET /settle?c=probe-0 HTTP/1.1\r\nHost: ${authority}\r\nConnection: close\r\n\r\n`));
          await conn.closedBy(Date.now() + this.hangMs * 2);
          if (conn.received.toString("latin1").startsWith("HTTP/1.1 200")) return;
        } finally {
          conn.destroy();
        }
      } catch {
        // Tried again.
      } finally {
        outer.destroy();
      }
    }
    report("liveness", `${authority} was still not answered after 5 requests, after the proxy gave up an HTTP/2 connection to it`);
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

  /**
   * A case of `upstream`: the guest's request to a hostile upstream, then a second one on the same
   * connection (pipelined, `Connection: close`), each answered as its outcome allows.
   */
  private async runUpstream(input: UpstreamCase, tag: string, who: Identity, conns: GuestConn[], report: (oracle: string, detail: string) => void, scanner: SecretScanner): Promise<number> {
    const credentialsField = who.proxyAuthorization === undefined ? "" : `Proxy-Authorization: ${who.proxyAuthorization}\r\n`;
    const port = this.world.hostile![input.name][input.kind];
    const authority = `${hostName(input.name)}:${port}`;
    const plain = input.kind === "h1plain";
    let conn: GuestConn;
    if (plain) {
      conn = await GuestConn.open(this.ready.port);
      conns.push(conn);
    } else {
      const outer = await GuestConn.open(this.ready.port);
      conns.push(outer);
      outer.write(Buffer.from(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${credentialsField}\r\n`));
      await outer.until(() => headComplete(outer.received), Date.now() + this.hangMs);
      if (!outer.received.toString("latin1").startsWith("HTTP/1.1 200")) {
        report("harness", `CONNECT ${authority} got ${JSON.stringify(outer.received.toString("latin1").slice(0, 300))}`);
        return 2 + input.slack;
      }
      conn = await outer.startTls(hostName(input.name), this.ready.caCertPem, ["http/1.1"]);
      conns.push(conn);
    }
    const second = input.second.target;
    const line = (target: string): string => (plain ? `http://${authority}${target}` : target);
    const credentials = plain ? credentialsField : "";
    const upload = Buffer.from(input.upload, "latin1");
    const fields = input.fields.map(([n, v]) => `${n}: ${v}\r\n`).join("");
    const first = Buffer.concat([
      Buffer.from(`${input.method} ${line(input.target)} HTTP/1.1\r\nHost: ${authority}\r\n${credentials}${fields}${input.method === "POST" ? `Content-Length: ${upload.length}\r\n` : ""}\r\n`, "latin1"),
      upload,
    ]);
    const secondFields = input.second.fields.map(([n, v]) => `${n}: ${v}\r\n`).join("");
    const next = Buffer.from(`GET ${line(second)} HTTP/1.1\r\nHost: ${authority}\r\n${credentials}${secondFields}Connection: close\r\n\r\n`);
    await conn.writeAll([first, next]);
    if (!(await conn.closedBy(Date.now() + this.hangMs))) report("hang", `the connection was still open ${this.hangMs} ms after the guest's last request; received ${JSON.stringify(conn.received.toString("latin1").slice(0, 500))}`);
    scanner.push(conn.received);
    // An answer that quotes the request's Authorization quotes the guest's own value (substituted for its placeholder).
    const echo = /[?&]echo=1/.test(second) ? `auth=${input.second.fields.length > 0 ? `Bearer ${who.value}` : ""}\n` : "";
    this.judgeUpstream(conn.received, input, normalBody(hostileLabel(input.name, input.kind), second) + echo, report);
    return 2 + input.slack;
  }

  /**
   * A case of `guests`: each guest's case at once, on connections of its own. Besides each case's
   * own oracles, a guest never gets another guest's value of the secret (its answers quote its
   * own), nor an answer that names another guest's request.
   */
  private async runGuests(input: GuestsCase, tag: string, conns: GuestConn[], report: (oracle: string, detail: string) => void): Promise<number> {
    const bounds = await Promise.all(
      input.guests.map(async ({ guest, sub }) => {
        const who = this.guestIds[guest]!;
        const others = this.values.filter((_, i) => i !== guest);
        const own: GuestConn[] = [];
        const prefixed = (oracle: string, detail: string): void => report(oracle, `g${guest}: ${detail}`);
        const scanner = new SecretScanner(others);
        let bound: number;
        try {
          bound = await this.runUpstream(sub, `${tag}-g${guest}`, who, own, prefixed, scanner);
        } finally {
          conns.push(...own);
        }
        if (scanner.found !== undefined) prefixed("cross-guest", `got another guest's value of the secret: ${JSON.stringify(scanner.found)}`);
        const received = Buffer.concat(own.map((c) => c.received)).toString("latin1");
        for (const match of received.matchAll(/c=guests-[0-9]+-g([0-9]+)/g)) {
          if (Number(match[1]) !== guest) {
            prefixed("cross-guest", `got an answer naming g${match[1]}'s request: ${JSON.stringify(received.slice(Math.max(0, match.index - 200), match.index + 100))}`);
            break;
          }
        }
        return bound;
      }),
    );
    return bounds.reduce((a, b) => a + b, 0);
  }

  /** A CONNECT tunnel to `authority` and TLS inside it with `alpn`, or undefined (reported) if the tunnel was refused. */
  private async tunnel(name: UpstreamName, authority: string, alpn: readonly string[], conns: GuestConn[], report: (oracle: string, detail: string) => void): Promise<GuestConn | undefined> {
    const outer = await GuestConn.open(this.ready.port);
    conns.push(outer);
    outer.write(Buffer.from(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n${this.credentialsField()}\r\n`));
    await outer.until(() => headComplete(outer.received), Date.now() + this.hangMs);
    if (!outer.received.toString("latin1").startsWith("HTTP/1.1 200")) {
      report("harness", `CONNECT ${authority} got ${JSON.stringify(outer.received.toString("latin1").slice(0, 300))}`);
      return undefined;
    }
    const conn = await outer.startTls(hostName(name), this.ready.caCertPem, alpn);
    conns.push(conn);
    return conn;
  }

  /**
   * A case of `h2guest`: an `upstream` case's two requests from a `node:http2` guest, on one
   * session in a TLS tunnel (h2-guest-run.ts), judged as the HTTP/1.1 guest's are; the session
   * then closes within `hangMs` of the guest's GOAWAY.
   */
  private async runH2Guest(input: UpstreamCase & { readonly h2guest?: H2GuestChoices }, conns: GuestConn[], report: (oracle: string, detail: string) => void, scanner: SecretScanner): Promise<number> {
    const authority = `${hostName(input.name)}:${this.world.hostile![input.name][input.kind]}`;
    const conn = await this.tunnel(input.name, authority, ["h2"], conns, report);
    if (conn === undefined) return 2 + input.slack;
    if ((conn.socket as { alpnProtocol?: string | false }).alpnProtocol !== "h2") {
      report("harness", "ALPN did not choose h2");
      return 2 + input.slack;
    }
    const choices = input.h2guest ?? { initialWindowSize: undefined, cancel: "none" };
    const { session, errors } = h2Session(conn, authority, choices);
    try {
      const upload = input.method === "POST" ? Buffer.from(input.upload, "latin1") : undefined;
      const fields = Object.fromEntries(input.fields.map(([n, v]) => [n.toLowerCase(), v]));
      const first = await h2Request(
        session,
        { ":method": input.method, ":path": input.target, ":authority": authority, ...fields, ...(upload === undefined ? {} : { "content-length": String(upload.length) }) },
        upload,
        Date.now() + this.hangMs,
        scanner,
        choices.cancel,
      );
      const key = first.kind === "answer" ? String(first.answer.status) : first.kind;
      this.stats.set(key, (this.stats.get(key) ?? 0) + 1);
      const second = await h2Request(session, { ":method": "GET", ":path": input.second.target, ":authority": authority, ...Object.fromEntries(input.second.fields) }, undefined, Date.now() + this.hangMs, scanner);
      const echo = /[?&]echo=1/.test(input.second.target) ? `auth=${input.second.fields.length > 0 ? `Bearer ${this.guestIds[0]!.value}` : ""}\n` : "";
      judgeH2Upstream(input, first, second, normalBody(hostileLabel(input.name, input.kind), input.second.target) + echo, report, choices.cancel !== "none", choices.initialWindowSize === 1);
      if (errors.length > 0) report("guest-malformed", `the guest's HTTP/2 session failed: ${errors.join("; ")}`);
    } finally {
      session.close();
    }
    if (!(await conn.closedBy(Date.now() + this.hangMs))) report("hang", `the HTTP/2 connection was still open ${this.hangMs} ms after the guest's GOAWAY`);
    return 2 + input.slack;
  }

  /**
   * A case of `decider`: a request whose decider call is answered badly, then a second on the
   * same connection (pipelined, `Connection: close`). The first gets what the decider's answer
   * means by its contract (an allow: the upstream's answer; a block: its status; a failure:
   * 502); a request-phase decider that did not allow must not let it reach the upstream (the
   * ledger's `fail-open`); the second is allowed and answered.
   */
  private async runDecider(input: DeciderCase, tag: string, conns: GuestConn[], report: (oracle: string, detail: string) => void, scanner: SecretScanner): Promise<number> {
    const plain = input.via === "plain";
    const port = plain ? this.world.ports.api.plain : this.world.ports.api.tls;
    const authority = `${hostName("api")}:${port}`;
    let conn: GuestConn | undefined;
    if (plain) {
      conn = await GuestConn.open(this.ready.port);
      conns.push(conn);
    } else conn = await this.tunnel("api", authority, ["http/1.1"], conns, report);
    if (conn === undefined) return 2;
    const line = (target: string): string => (plain ? `http://${authority}${target}` : target);
    const credentials = plain ? this.credentialsField() : "";
    const upload = Buffer.from(input.upload, "latin1");
    const second = `/d?c=${tag}&seq=2`;
    await conn.writeAll([
      Buffer.concat([Buffer.from(`${input.method} ${line(input.target)} HTTP/1.1\r\nHost: ${authority}\r\n${credentials}${input.method === "POST" ? `Content-Length: ${upload.length}\r\n` : ""}\r\n`), upload]),
      Buffer.from(`GET ${line(second)} HTTP/1.1\r\nHost: ${authority}\r\n${credentials}Connection: close\r\n\r\n`),
    ]);
    if (!(await conn.closedBy(Date.now() + this.hangMs))) report("hang", `the connection was still open ${this.hangMs} ms after the guest's last request; received ${JSON.stringify(conn.received.toString("latin1").slice(0, 500))}`);
    scanner.push(conn.received);
    const received = (): string => JSON.stringify(conn.received.toString("latin1").slice(0, 1200));
    const label = plain ? "api-plain" : "api-tls";
    const allowed = (): string => `allowed ${[input.verdicts.allow ? "the upstream's answer" : "", ...input.verdicts.block.map((s) => `a ${s} block`), input.verdicts.fail ? "a 502 failure" : ""].filter((x) => x !== "").join(", ")}`;
    const parsed = parseGuestResponse(conn.received, true, () => input.method === "HEAD");
    if (parsed.kind !== "done") {
      report(parsed.kind === "bad" ? "guest-malformed" : "wrong-answer", `${parsed.kind === "bad" ? parsed.reason : "no whole answer to the first request"}; ${allowed()}; received ${received()}`);
      return 2;
    }
    const answer = parsed.value;
    this.stats.set(String(answer.status), (this.stats.get(String(answer.status)) ?? 0) + 1);
    const code = answer.fields.find(([n]) => n.toLowerCase() === "x-egressgate-error")?.[1];
    const body = answer.body.toString("latin1");
    const upstreamAnswer = input.method === "HEAD" ? body === "" : new RegExp(`^upstream ${label} [0-9]+ /d\\?c=${tag}&seq=1\n$`).test(body);
    const ok =
      (code === undefined && input.verdicts.allow && answer.status === 200 && upstreamAnswer) ||
      (code === "EG_HOOK_BLOCKED" && input.verdicts.block.includes(answer.status)) ||
      (code === "EG_HOOK_FAILED" && answer.status === 502 && input.verdicts.fail);
    if (!ok) report(code === undefined && answer.status === 200 && !input.verdicts.allow ? "fail-open" : "wrong-answer", `the first request got ${answer.status} ${code ?? ""} ${JSON.stringify(body.slice(0, 300))}; ${allowed()}`);
    const rest = conn.received.subarray(parsed.consumed);
    const closing = answer.fields.some(([n, v]) => n.toLowerCase() === "connection" && /\bclose\b/i.test(v));
    if (rest.length === 0) {
      if (!closing) report("next-request", `the connection closed without answering the second request, after a ${answer.status} that did not say it would close`);
      return 2;
    }
    const next = parseGuestResponse(rest, true, () => false);
    if (next.kind !== "done" || next.value.status !== 200 || !new RegExp(`^upstream ${label} [0-9]+ /d\\?c=${tag}&seq=2\n$`).test(next.value.body.toString("latin1"))) {
      report("next-request", `the second request got ${JSON.stringify(rest.toString("latin1").slice(0, 600))}, not the upstream's answer`);
    }
    return 2;
  }

  /**
   * A case of `websocket`: an upgrade to a hostile WebSocket upstream, with the guest's bytes on
   * both sides of the 101. A 101 must be one the outcome allows, and be followed by exactly what
   * the upstream sent after its head (or that first, when it closed); a refusal must be a proxy
   * error the outcome allows (and judgeWsUpstream checks nothing reached the upstream past it).
   */
  private async runWebsocket(input: WsCase, tag: string, conns: GuestConn[], report: (oracle: string, detail: string) => void, scanner: SecretScanner): Promise<number> {
    const upstream = this.ws[input.name][input.via === "plain" ? "plain" : "tls"];
    const authority = `${hostName(input.name)}:${upstream.port}`;
    let conn: GuestConn | undefined;
    if (input.via === "plain") {
      conn = await GuestConn.open(this.ready.port);
      conns.push(conn);
    } else conn = await this.tunnel(input.name, authority, ["http/1.1"], conns, report);
    if (conn === undefined) return 1;
    const target = input.via === "plain" ? `http://${authority}${input.target}` : input.target;
    const credentials = input.via === "plain" ? this.credentialsField() : "";
    const fields = input.fields.map(([n, v]) => `${n}: ${v}\r\n`).join("");
    await conn.writeAll([Buffer.from(`GET ${target} HTTP/1.1\r\nHost: ${authority}\r\n${credentials}${fields}\r\n`, "latin1"), ...(input.early.length > 0 ? [input.early] : [])]);
    // The answer's head (a 101 has no body; a refusal's body has a length).
    const head = (): ReturnType<typeof parseGuestResponse> => parseGuestResponse(conn.received, conn.closed, (status) => status === 101);
    await conn.until(() => head().kind !== "more", Date.now() + this.hangMs);
    const parsed = head();
    const outcome = input.expect;
    const received = (): string => JSON.stringify(conn.received.subarray(0, 600).toString("latin1"));
    if (parsed.kind === "more") {
      if (conn.closed) {
        // Closed with no whole answer: only past the 64 KiB the proxy holds before a 101.
        if (outcome.errors !== "any") report("wrong-answer", `the connection closed without a whole answer to the upgrade; received ${received()}`);
      } else report("hang", `no answer to the upgrade within ${this.hangMs} ms; received ${received()}`);
      return 1;
    }
    if (parsed.kind === "bad") {
      report("guest-malformed", `${parsed.reason}; received ${received()}`);
      return 1;
    }
    const answer = parsed.value;
    this.stats.set(String(answer.status), (this.stats.get(String(answer.status)) ?? 0) + 1);
    const code = answer.fields.find(([n]) => n.toLowerCase() === "x-egressgate-error")?.[1];
    if (answer.status !== 101) {
      if (outcome.switched === "yes" || code === undefined || (outcome.errors !== "any" && !outcome.errors.includes(code))) {
        report("wrong-answer", `the upgrade got ${answer.status} ${code ?? ""} ${JSON.stringify(answer.body.toString("latin1").slice(0, 300))}; allowed ${outcome.switched === "no" ? "" : "a 101 or "}${outcome.errors === "any" ? "any error" : outcome.errors.join(",")}`);
      }
      conn.end();
      if (!(await conn.closedBy(Date.now() + this.hangMs))) report("hang", `the connection was still open ${this.hangMs} ms after a refused upgrade and the guest's end`);
      scanner.push(conn.received);
      return 1;
    }
    if (outcome.switched === "no") report("wrong-answer", `the upgrade was switched (${received()}); allowed ${outcome.errors === "any" ? "any error" : outcome.errors.join(",")}`);
    const start = parsed.consumed;
    if (input.late.length > 0) conn.write(input.late);
    if (input.cut) {
      conn.destroy();
      scanner.push(conn.received);
      return 1;
    }
    const after = (): Buffer => conn.received.subarray(start);
    const expected = outcome.after;
    // Not an oracle: how long the guest reads before its end. An exact relay ends once it is whole.
    await conn.until(() => (expected?.exact === true ? after().length >= expected.bytes.length : false), Date.now() + (expected?.exact === true ? this.hangMs : 200));
    conn.end();
    if (!(await conn.closedBy(Date.now() + this.hangMs))) report("hang", `the relay was still open ${this.hangMs} ms after the guest's end`);
    scanner.push(conn.received);
    if (expected !== undefined) {
      const got = after();
      const same = expected.exact ? got.equals(expected.bytes) : got.subarray(0, expected.bytes.length).equals(expected.bytes);
      if (!same) {
        let at = 0;
        while (at < got.length && at < expected.bytes.length && got[at] === expected.bytes[at]) at++;
        report("ws-relay", `after the 101 the guest got ${got.length} bytes, ${expected.exact ? "not exactly" : "not starting with"} the ${expected.bytes.length} the upstream sent (they differ from byte ${at}: got ${JSON.stringify(got.subarray(at, at + 80).toString("latin1"))}, sent ${JSON.stringify(expected.bytes.subarray(at, at + 80).toString("latin1"))})`);
      }
    }
    return 1;
  }

  /** A refused upgrade let nothing of the guest's past its head reach the upstream. */
  private judgeWsUpstream(input: WsCase, tag: string, report: (oracle: string, detail: string) => void): void {
    const upstream = this.ws[input.name][input.via === "plain" ? "plain" : "tls"];
    const connections = upstream.byTag.get(tag) ?? [];
    if (input.expect.switched === "no") {
      for (const c of connections) {
        if (c.after.length > 0) report("ws-unchecked", `${upstream.label} got ${c.after.length} bytes past the head of an upgrade the proxy refused: ${JSON.stringify(c.after.subarray(0, 200).toString("latin1"))}`);
      }
    }
    if (connections.length > 1) report("smuggling", `${upstream.label} got ${connections.length} upgrade requests for one`);
  }

  /** Judges what the guest got for an `upstream` case against the outcome its answer allows. */
  private judgeUpstream(buf: Buffer, input: UpstreamCase, secondBody: string, report: (oracle: string, detail: string) => void): void {
    const received = (): string => JSON.stringify(buf.toString("latin1").slice(0, 1500));
    if (buf.includes("SMUGGLED")) report("response-smuggling", `the guest got bytes an upstream sent past the end of an answer: ${received()}`);
    const { outcome } = input;
    let rest = buf;
    // The first request's answer, past any 1xx.
    let parsed: ReturnType<typeof parseGuestResponse>;
    for (;;) {
      if (rest.length === 0) {
        if (!outcome.cut) report("wrong-answer", `no answer to the first request at the close; allowed ${describe(outcome)}`);
        return;
      }
      parsed = parseGuestResponse(rest, true, () => input.method === "HEAD");
      if (parsed.kind === "bad") {
        report("guest-malformed", `${parsed.reason}; received ${received()}`);
        return;
      }
      if (parsed.kind === "more") {
        if (!outcome.cut) report("wrong-answer", `the first answer was cut; allowed ${describe(outcome)}; received ${received()}`);
        return;
      }
      rest = rest.subarray(parsed.consumed);
      if (parsed.value.status >= 200) break;
    }
    const answer = parsed.value;
    const statKey = process.env["FUZZ_REASONS"] ? `${answer.status} ${answer.body.toString("latin1").slice(0, 140)}` : `${answer.status}`;
    this.stats.set(statKey, (this.stats.get(statKey) ?? 0) + 1);
    const code = answer.fields.find(([n]) => n.toLowerCase() === "x-egressgate-error")?.[1];
    const body = answer.body.toString("latin1");
    if (code !== undefined) {
      if (outcome.errors !== "any" && !outcome.errors.includes(code)) report("wrong-answer", `the proxy answered ${answer.status} ${code} (${JSON.stringify(body.slice(0, 300))}); allowed ${describe(outcome)}`);
    } else if (!outcome.relays.some((r) => r.status === answer.status && (typeof r.body === "string" ? r.body === body : r.body.test(body)))) {
      report("wrong-answer", `the guest got ${answer.status} with ${JSON.stringify(body.slice(0, 300))} (${body.length} bytes); allowed ${describe(outcome)}`);
    }
    const closing = answer.fields.some(([n, v]) => n.toLowerCase() === "connection" && /\bclose\b/i.test(v));
    // The second request's answer: its own, or none once the connection was to close. After an
    // answer that broke its protocol, the upstream's connection may be lost under the second
    // request too (an HTTP/2 session the proxy's client ended, an upstream's close): a 502 or 504
    // of the proxy's, or a connection closed, is then no finding.
    if (rest.length === 0) {
      if (!closing && !outcome.cut) report("next-request", `the connection closed without answering the second request, after a whole ${answer.status} that did not say it would close`);
      return;
    }
    const next = parseGuestResponse(rest, true, () => false);
    const lost = (value: { fields: readonly (readonly [string, string])[] }): boolean =>
      (outcome.cut || outcome.lostNext === true) && value.fields.some(([n, v]) => n.toLowerCase() === "x-egressgate-error" && (v === "EG_UPSTREAM" || v === "EG_UPSTREAM_TIMEOUT"));
    if (next.kind !== "done" || (!lost(next.value) && (next.value.status !== 200 || next.value.body.toString("latin1") !== secondBody))) {
      report("next-request", `the second request got ${JSON.stringify(rest.toString("latin1").slice(0, 600))}, not its own answer ${JSON.stringify(secondBody)}`);
      return;
    }
    if (next.consumed < rest.length) report("guest-malformed", `bytes after the last answer: ${JSON.stringify(rest.subarray(next.consumed).toString("latin1").slice(0, 300))}`);
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
    await Promise.all([...this.allRecorders.map((r) => r.close()), ...this.allHostile.map((h) => h.close()), ...this.allWebSocket.map((w) => w.close()), this.decider?.close()]);
  }
}
