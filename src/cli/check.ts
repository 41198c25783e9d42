import { lookup } from "node:dns/promises";
import { isIP } from "node:net";
import { createSecureContext } from "node:tls";
import { Readable } from "node:stream";
import { EgressError, badRequest } from "../errors.js";
import { createLogger } from "../log.js";
import type { BuiltProxyOptions } from "../config/build.js";
import { GuestGone, type Executor, type ExecutorResponse, type TraceEntry } from "../pipeline/exchange.js";
import { hookSources } from "../pipeline/hook-source.js";
import { Pipeline } from "../pipeline/pipeline.js";
import { DeclarativePolicy, type ListenAddress } from "../policy/declarative-policy.js";
import { foreignSecret } from "../proxy/foreign-secret.js";
import { absoluteFormUrl, checkMethod, checkRequestHead, checkTunnelHostHeader, forwardedFields, token } from "../proxy/guest-request.js";
import { h2ExpectsContinue } from "../proxy/h2-request.js";
import { listenAddresses } from "../proxy/listen-addresses.js";
import { resolveProxyOptions, type ResolvedProxyOptions } from "../proxy/options.js";
import { PinnedPools } from "../upstream/pinned-pools.js";
import { Resolver, type ResolvedAddress } from "../upstream/resolve.js";
import { UsageError } from "./usage-error.js";
import { shownUrl } from "../policy/hidden-url.js";

/** `egressgate check`: one request, evaluated offline by the real pipeline. */
export interface CheckCommand {
  readonly options: BuiltProxyOptions;
  readonly guest: string | undefined;
  readonly method: string;
  readonly url: string;
  /** `Name: value` lines; `{{NAME}}` in a value stands for the guest's placeholder of secret NAME. */
  readonly headers: readonly string[];
  readonly json: boolean;
  readonly dns: boolean;
  readonly response: { readonly status: number; readonly headers: readonly string[] } | undefined;
}

/** What `check` found, as `--json` prints it. */
export interface CheckReport {
  readonly guest: string;
  readonly request: { readonly method: string; readonly url: string };
  /** Every source that spoke, in order (DESIGN §3), with what it returned. */
  readonly steps: readonly TraceEntry[];
  readonly resolution: ReadonlyArray<{ readonly host: string; readonly addresses: readonly string[] } | { readonly host: string; readonly skipped: string }>;
  /** The declarative verdict on each resolved address (the internal-range block), whether or not the request got that far. */
  readonly addresses: ReadonlyArray<{ readonly ip: string; readonly allowed: boolean; readonly rule: string; readonly reason: string }>;
  /** What would have been sent upstream (nothing is). */
  readonly wouldSend: ReadonlyArray<{ readonly method: string; readonly url: string; readonly address: string }>;
  readonly answer: {
    readonly allowed: boolean;
    readonly status: number;
    readonly reason: string;
    readonly rule?: string;
    readonly source?: string;
    readonly code?: string;
    /** For the operator: what the proxy's decision line would carry as `detail` (redacted). */
    readonly detail?: string;
  };
  /** What the policies and hooks logged while the request ran (their console lines), redacted. */
  readonly log: ReadonlyArray<Record<string, unknown>>;
}

/** Thrown by the executor when no `--response` was given: the request got as far as the upstream. */
class ReachedUpstream extends Error {}


function parseHeader(line: string, flag: string): [string, string] {
  const colon = line.indexOf(":");
  if (colon <= 0) throw new UsageError(`${flag}: expected 'Name: value', got ${JSON.stringify(line)}`);
  return [line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim()];
}

/**
 * A request header value as a guest's client puts it on the wire and the proxy's parsers hand it
 * on: the argument's UTF-8 bytes, one Latin-1 character each (HTTP/1.1 and HTTP/2 alike). Taken
 * as the argument's own characters, `-H 'X-Title: ☃'` (past U+00FF) was refused 400 "invalid
 * header" where the proxy forwards those bytes, and `é` reached the tiers as one character where
 * they get two.
 */
function asWireValue(value: string): string {
  // ASCII alone (every byte one character) is the same either way.
  return Buffer.byteLength(value) === value.length ? value : Buffer.from(value, "utf8").toString("latin1");
}

/**
 * A field name that is not a token, or a value with a control character other than tab, never
 * reaches a tier: the guest side's HTTP/1.1 parser answers 400 first. (Over HTTP/2, nghttp2 drops
 * such a field as it decodes the head, and the request goes on without it: check answers as
 * HTTP/1.1 does.)
 */
function checkHeaderFields(headers: readonly string[]): void {
  for (let i = 0; i < headers.length; i += 2) {
    const name = headers[i]!;
    if (!token.test(name) || /[^\t\x20-\x7e\x80-\xff]/.test(headers[i + 1]!)) throw badRequest(`invalid header ${JSON.stringify(name)}`);
  }
}

/**
 * The addresses the proxy of this configuration would listen on, which it refuses as
 * destinations (DESIGN §4): its listener, its metrics listener and `ownAddresses`, a wildcard one on every
 * interface of this machine. Port 0 is picked when the proxy starts, so there is no port to
 * refuse: such a listener adds nothing. A listener named by a host name binds where
 * `dns.lookup` says, as `server.listen` does; with `--no-dns` it is not looked up, and adds
 * nothing.
 */
async function ownAddresses(config: ResolvedProxyOptions, dns: boolean): Promise<ListenAddress[]> {
  const own: ListenAddress[] = [];
  for (const listener of [config.listen, config.metricsListen, ...config.ownAddresses]) {
    if (listener === undefined || listener.port === 0) continue;
    let bound = listener.host;
    if (isIP(bound) === 0) {
      if (!dns) continue;
      try {
        bound = (await lookup(bound)).address;
      } catch {
        // The proxy could not listen there at all: nothing of its own to refuse.
        continue;
      }
    }
    own.push(...listenAddresses(bound, listener.port));
  }
  return own;
}

/** Runs the check; resolves with the exit code (0 allowed, 1 denied), having printed the report. */
export async function runCheck(command: CheckCommand, print: (text: string) => void): Promise<number> {
  let url: URL;
  try {
    url = new URL(command.url);
  } catch {
    throw new UsageError(`check: ${JSON.stringify(command.url)} is not a URL`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new UsageError(`check: only http: and https: URLs (got ${url.protocol})`);
  const config = resolveProxyOptions(command.options);
  const names = config.guests.map((guest) => guest.name);
  const guestName = command.guest ?? (names.length === 1 ? names[0] : undefined);
  if (guestName === undefined) throw new UsageError(`check: name a guest with --guest (served: ${names.join(", ")})`);
  const guest = config.guests.find((entry) => entry.name === guestName);
  if (guest === undefined) throw new UsageError(`check: no guest named "${guestName}" (served: ${names.join(", ")})`);

  const own = await ownAddresses(config, command.dns);
  const policy = new DeclarativePolicy(guest.declarative, () => own);
  const secrets = policy.config.secrets;
  const neighbours = config.guests.filter((entry) => entry !== guest).map((entry) => entry.declarative.secrets);
  const redact = (text: string): string => secrets?.redact(text) ?? text;
  const held = (secrets?.list() ?? []).filter((info) => !info.deleted).map((info) => info.name);
  const placeholderOf = (secret: string, line: string): string => {
    const placeholder = held.includes(secret) ? guest.env[secret] : undefined;
    if (placeholder !== undefined) return placeholder;
    const holds = held.length === 0 ? "it holds none" : `it holds ${held.join(", ")}`;
    throw new UsageError(`-H ${JSON.stringify(line)}: {{${secret}}} names no secret of guest "${guest.name}" (${holds})`);
  };
  const headers: string[] = [];
  for (const line of command.headers) {
    const [name, value] = parseHeader(line, "-H");
    // {{NAME}} is the guest's placeholder for secret NAME, as the guest's environment has it. A
    // name the guest holds no secret by is a mistake, not text to send: left as it was, a typo
    // checked a request with no placeholder in it, and the answer said the secret could go.
    headers.push(name, asWireValue(value.replace(/\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}/g, (_whole, secret: string) => placeholderOf(secret, line))));
  }
  const responseHeaders: string[] = [];
  for (const line of command.response?.headers ?? []) responseHeaders.push(...parseHeader(line, "-R"));

  const resolution: Array<{ host: string; addresses: string[] } | { host: string; skipped: string }> = [];
  const resolved: Array<{ host: string; port: number; address: ResolvedAddress }> = [];
  let dnsSkipped = false;
  const skipDns = async (): Promise<never> => {
    dnsSkipped = true;
    throw new EgressError("EG_UPSTREAM", 502, "not resolved (--no-dns)");
  };
  const base = new Resolver(guest.staticHosts, config.timeouts.dnsMs, ...(command.dns ? [] : [skipDns]));
  const resolver = Object.assign(Object.create(base) as Resolver, {
    async resolve(hostname: string): Promise<readonly ResolvedAddress[]> {
      try {
        const found = await base.resolve(hostname);
        resolution.push({ host: hostname, addresses: found.map((entry) => entry.ip) });
        for (const address of found) resolved.push({ host: hostname, port: Number(url.port || (url.protocol === "https:" ? 443 : 80)), address });
        return found;
      } catch (error) {
        resolution.push({ host: hostname, skipped: error instanceof EgressError ? error.message : String(error) });
        throw error;
      }
    },
  });

  const wouldSend: Array<{ method: string; url: string; address: string }> = [];
  let reachedUpstream = false;
  const offline: Executor = {
    async send(request, address) {
      // A hop whose Location held a value is named by its origin, as the proxy's own outputs name it.
      wouldSend.push({ method: request.method, url: redact(shownUrl(request.url, request.hiddenPath)), address: address.ip });
      if (command.response === undefined) {
        reachedUpstream = true;
        throw new ReachedUpstream("would send upstream");
      }
      const location = responseHeaders.filter((_, i) => i % 2 === 0).filter((name) => name === "location");
      const response: ExecutorResponse = {
        status: command.response.status,
        headers: responseHeaders,
        body: Readable.from([]),
        location: location.length === 1 ? responseHeaders[responseHeaders.indexOf("location") + 1] : undefined,
      };
      return response;
    },
  };
  const logs: string[] = [];
  const log = createLogger("info", (line) => logs.push(line), redact);
  const pools = new PinnedPools({
    upstreamContext: createSecureContext(),
    maxPools: 1,
    connectionsPerPool: 1,
    connectTimeoutMs: 1,
    headersTimeoutMs: 1,
    bodyTimeoutMs: 1,
    keepAliveTimeoutMs: 1,
    h2PingMs: config.timeouts.h2PingMs,
    h2Windows: { streamBytes: config.limits.h2StreamWindowBytes, connectionBytes: config.limits.h2ConnectionWindowBytes, budgetBytes: config.limits.h2ConnectionBufferBytes },
    recheck: () => "offline",
  });
  const pipeline = new Pipeline({
    guest: guest.name,
    policy,
    sources: hookSources(guest.djs, guest.chain, guest.checkHooks, log, secrets, () => neighbours),
    resolver,
    pools,
    maxRedirects: config.maxRedirects,
    limits: { requestBodyBytes: config.maxHttpBodyBytes, responseBodyBytes: config.maxHttpResponseBodyBytes, hookMs: config.timeouts.hookMs },
    requestMs: config.timeouts.requestMs,
    // Another guest's placeholder is refused, as the proxy that serves them all refuses it.
    foreignSecret: (request) => foreignSecret(request, neighbours),
    // Nothing leaves: the innermost executor records where the request would go.
    executor: () => offline,
  });
  const trace: TraceEntry[] = [];
  const method = command.method.toUpperCase();
  let answer: CheckReport["answer"];
  try {
    // What every guest side refuses before any tier runs (its parser, or the proxy's own checks).
    checkMethod(method);
    checkHeaderFields(headers);
    // The guest side's own checks of a head, from the same functions: too many fields (431), a
    // Transfer-Encoding other than chunked (501), a Content-Length such as `010`, a second Host
    // (400); and an Expect other than 100-continue (417), as Node's server and the HTTP/2 side
    // answer it. They said ALLOWED where the proxy refuses.
    const { hostHeader } = checkRequestHead(headers, "1.1");
    h2ExpectsContinue(headers);
    // The destination as the proxy takes it: `api.test.` is `api.test`, `2130706433` is
    // `127.0.0.1`, and a host it cannot normalise (`a..b`, `a$b`) is 400 before any tier.
    url = absoluteFormUrl(command.url);
    // An https:// request goes through a tunnel, whose Host must name the CONNECT target (421).
    if (url.protocol === "https:" && hostHeader !== undefined) checkTunnelHostHeader(hostHeader, { hostname: url.hostname, port: Number(url.port || 443) });
    // The tiers see what the proxy hands on: no hop-by-hop field, no Host, no Expect.
    const response = await pipeline.handle({ method, url, headers: forwardedFields(headers), body: null }, { id: undefined, signal: new GuestGone(), trace });
    response.body?.resume();
    response.cleanup?.();
    answer = {
      allowed: true,
      status: response.status,
      reason: redact(response.decision.reason),
      rule: response.decision.rule,
      ...(response.decision.source !== undefined ? { source: response.decision.source } : {}),
    };
  } catch (error) {
    const err = error instanceof EgressError ? error : undefined;
    if (reachedUpstream) {
      // The last allow that let it out: the allowlist's (or the answering source's) rule.
      const allowed = [...trace].reverse().find((entry) => entry.phase === "allowlist" && entry.decision === "allow");
      answer = { allowed: true, status: 0, reason: `allowed: would be sent upstream${allowed?.reason !== undefined ? ` (${redact(allowed.reason)})` : ""}` };
    } else if (dnsSkipped) {
      answer = { allowed: true, status: 0, reason: "allowed up to resolution; the address checks were skipped (--no-dns)" };
    } else {
      answer = {
        allowed: false,
        status: err?.status ?? 502,
        reason: redact(err?.message ?? String(error)),
        ...(err?.code !== undefined ? { code: err.code } : {}),
        ...(err?.source !== undefined ? { source: err.source } : {}),
        // What the proxy's decision line would carry (a hook's throw, a refused address's why):
        // `check` has no proxy log for the reason's "see the proxy log" to send the reader to.
        ...(err?.detail !== undefined ? { detail: redact(err.detail) } : {}),
      };
    }
  } finally {
    await pools.destroy();
  }
  const report: CheckReport = {
    guest: guest.name,
    request: { method, url: redact(url.href) },
    steps: trace.map((entry) => ({ ...entry, ...(entry.reason !== undefined ? { reason: redact(entry.reason) } : {}) })),
    resolution,
    addresses: resolved.map(({ host, port, address }) => {
      const decision = policy.checkAddress(host, address, port);
      return { ip: address.ip, allowed: decision.allowed, rule: decision.rule, reason: redact(decision.reason) };
    }),
    wouldSend,
    answer,
    log: logs.map((line) => JSON.parse(line) as Record<string, unknown>),
  };
  print(command.json ? `${JSON.stringify(report, null, 2)}\n` : textReport(report));
  return answer.allowed ? 0 : 1;
}

function textReport(report: CheckReport): string {
  const lines = [`${report.request.method} ${report.request.url} (guest ${report.guest})`, ""];
  lines.push("steps:");
  if (report.steps.length === 0) lines.push("  (none)");
  report.steps.forEach((step, i) => {
    lines.push(`  ${i + 1}. ${step.source} ${step.phase} (${step.tier}): ${step.decision}${step.status !== undefined ? ` ${step.status}` : ""}${step.reason !== undefined ? ` — ${step.reason}` : ""}`);
  });
  lines.push("resolution:");
  if (report.resolution.length === 0) lines.push("  (not reached)");
  for (const entry of report.resolution) lines.push(`  ${entry.host}: ${"addresses" in entry ? entry.addresses.join(", ") : entry.skipped}`);
  lines.push("addresses:");
  if (report.addresses.length === 0) lines.push("  (none resolved)");
  for (const entry of report.addresses) lines.push(`  ${entry.ip}: ${entry.allowed ? "allowed" : "refused"} (${entry.rule}) — ${entry.reason}`);
  for (const send of report.wouldSend) lines.push(`would send: ${send.method} ${send.url} to ${send.address} (nothing was sent)`);
  const a = report.answer;
  lines.push(
    "",
    `answer: ${a.allowed ? "ALLOWED" : "DENIED"}${a.status !== 0 ? ` ${a.status}` : ""}${a.rule !== undefined ? ` by ${a.rule}` : ""}${a.source !== undefined ? ` (source ${a.source})` : ""}${a.code !== undefined ? ` [${a.code}]` : ""}: ${a.reason}`,
  );
  if (a.detail !== undefined) lines.push(`  detail: ${a.detail}`);
  if (report.log.length > 0) {
    lines.push("log:");
    for (const entry of report.log) lines.push(`  ${JSON.stringify(entry)}`);
  }
  return `${lines.join("\n")}\n`;
}
