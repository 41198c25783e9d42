/**
 * The soak's guests: undici through the proxy (CONNECT tunnels with TLS to the proxy's CA, and
 * absolute-form requests for plain http://), and node:http2 sessions in CONNECT tunnels for the
 * HTTP/2 kinds (bench/soak-h2-guest.ts), `concurrency` requests at a time, each of a kind
 * drawn from the mix in bench/soak-plan.ts, each judged against what its kind must get:
 *
 * - a status from the kind's list, and for 200 every byte (sha256 against the pool slice the
 *   upstream sent, or the hook's replacement text, or the upstream's digest of the upload);
 * - for a fault mid-body, an error seen by the guest, never a clean end;
 * - for a guest that aborts, anything but a hang;
 * - for a kind with trailers, the trailer naming the body's sha256.
 *
 * A request with no outcome within `deadlineMs` is a hang. The client never retries.
 */
import { createHash } from "node:crypto";
import { performance } from "node:perf_hooks";
import { Readable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { ProxyAgent, request, type Dispatcher } from "undici";
import type { SoakUpstreamPorts } from "./soak-upstream.js";
import { H2GuestSessions, type H2Transfer } from "./soak-h2-guest.js";
import { deniedHost, digestTrailer, guestPauseMs, h2ResetCodes, headers, kinds, names, offsetFor, sizeFor, sliceBody, unresolvable, type KindSpec } from "./soak-plan.js";

export interface ClientSetup {
  readonly proxyUrl: string;
  readonly proxyCaPem: string;
  readonly ports: SoakUpstreamPorts;
  readonly pool: Buffer;
  readonly seed: number;
  readonly deadlineMs: number;
  readonly kinds: readonly KindSpec[];
}

export interface KindTally {
  sent: number;
  failed: number;
  /** Outcome label → count; labels of unexpected outcomes start with "✗". */
  readonly outcomes: Record<string, number>;
  /** The first few unexpected outcomes, with the request. */
  readonly examples: string[];
  /** Time to the outcome, ms: median, 99th percentile and worst. */
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
}

export interface RunResult {
  readonly requests: number;
  readonly failed: number;
  readonly elapsedMs: number;
  /** 200 answers whose body was compared, and of those, the ones that matched. */
  readonly bodiesChecked: number;
  readonly bodiesMatched: number;
  readonly bytesChecked: number;
  readonly perKind: Record<string, KindTally>;
  /** HTTP/2 guest sessions opened (each target's few, and any opened again), and the GOAWAYs the proxy sent unasked, by code. */
  readonly h2Sessions: { readonly opened: number; readonly goaways: Readonly<Record<string, number>> };
}

interface Plan {
  readonly kind: KindSpec;
  readonly url: string;
  readonly upload: Buffer | undefined;
  /** For a 200: the sha256 and length the body must have. */
  readonly expected: { readonly sha256: string; readonly bytes: number };
}

interface Outcome {
  readonly label: string;
  readonly ok: boolean;
  readonly detail?: string;
  readonly checked?: { readonly matched: boolean; readonly bytes: number };
}

/** mulberry32: a small seeded generator, so a run's mix can be repeated. */
function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const sha256 = (bytes: Buffer | string): string => createHash("sha256").update(bytes).digest("hex");

function describeError(error: unknown): string {
  const e = error as { code?: string; name?: string; message?: string; cause?: { code?: string; message?: string } };
  const cause = e.cause?.code ?? e.cause?.message;
  return `${e.code ?? e.name ?? "Error"}: ${e.message ?? String(error)}${cause !== undefined ? ` (${cause})` : ""}`;
}

/** An upload as a stream: 16 KiB pieces, slowly, or stopping with an abort after 32 KiB. */
function uploadStream(body: Buffer, pace: "slow" | "abort", abort: () => void): Readable {
  let at = 0;
  return new Readable({
    read() {
      if (pace === "abort" && at >= 32_768) {
        setTimeout(abort, 20);
        return;
      }
      if (at >= body.length) {
        this.push(null);
        return;
      }
      const piece = body.subarray(at, at + 16_384);
      at += piece.length;
      if (pace === "slow") setTimeout(() => this.push(piece), 25);
      else this.push(piece);
    },
  });
}

export class SoakClient {
  private readonly next: () => number;
  private readonly hashes = new Map<string, { sha256: string; bytes: number }>();
  private readonly totalWeight: number;
  private serial = 0;

  constructor(private readonly setup: ClientSetup) {
    this.next = random(setup.seed);
    this.totalWeight = setup.kinds.reduce((sum, k) => sum + k.weight, 0);
    if (this.totalWeight <= 0) throw new RangeError("soak: no request kinds selected");
  }

  private pick(): KindSpec {
    let r = this.next() * this.totalWeight;
    for (const kind of this.setup.kinds) {
      r -= kind.weight;
      if (r < 0) return kind;
    }
    return this.setup.kinds[this.setup.kinds.length - 1]!;
  }

  private expectedSlice(offset: number, bytes: number, gzip: boolean): { sha256: string; bytes: number } {
    const key = `${offset}:${bytes}:${gzip ? 1 : 0}`;
    let found = this.hashes.get(key);
    if (found === undefined) {
      const body = sliceBody(this.setup.pool, offset, bytes, gzip);
      found = { sha256: sha256(body), bytes: body.length };
      this.hashes.set(key, found);
    }
    return found;
  }

  private plan(kind: KindSpec): Plan {
    const { ports } = this.setup;
    const bytes = sizeFor(this.next(), kind.bytes);
    const offset = offsetFor(this.next(), bytes);
    const origin = {
      "https-a": `https://${names.a}:${ports.https}`,
      "https-b": `https://${names.b}:${ports.https}`,
      http: `http://${names.a}:${ports.http}`,
      "close-tls": `https://${names.a}:${ports.closeTls}`,
      "close-plain": `http://${names.a}:${ports.closePlain}`,
      nx: `https://${unresolvable(this.serial)}:${ports.https}`,
      denied: `https://${deniedHost}:${ports.https}`,
      h2: `https://${names.a}:${ports.h2}`,
      "h2-goaway": `https://${names.a}:${ports.h2Goaway}`,
    }[kind.server];
    const h2Upstream = kind.server === "h2" || kind.server === "h2-goaway";
    const slice = `o=${offset}&n=${bytes}`;
    const path = {
      bytes: `/bytes?${slice}${kind.chunked === true ? "&te=chunked" : ""}${kind.gzip === true ? "&gz=1" : ""}`,
      upload: "/upload",
      reset: `/reset?${slice}&at=${bytes >> 2}${h2Upstream ? `&code=${h2ResetCodes[this.serial % h2ResetCodes.length]}` : ""}`,
      "reset-head": "/reset-head",
      stall: `/stall?${slice}&at=${bytes >> 2}`,
      redirect: `/redirect?${slice}`,
      close: `/close?${slice}`,
      trailers: `/trailers?${slice}`,
    }[kind.route];
    const upload = kind.method === "POST" ? this.setup.pool.subarray(offset, offset + bytes) : undefined;
    let expected: Plan["expected"];
    if (kind.text !== undefined) expected = { sha256: sha256(kind.text), bytes: Buffer.byteLength(kind.text) };
    else if (upload !== undefined) {
      const answer = JSON.stringify({ bytes: upload.length, sha256: sha256(upload) });
      expected = { sha256: sha256(answer), bytes: Buffer.byteLength(answer) };
    } else expected = this.expectedSlice(offset, bytes, kind.gzip === true);
    return { kind, url: `${origin}${path}`, upload, expected };
  }

  private async once(plan: Plan, tunnel: Dispatcher, forward: Dispatcher, h2: H2GuestSessions): Promise<Outcome> {
    const { kind } = plan;
    if (kind.guest === "h2") return this.onceH2(plan, h2);
    const controller = new AbortController();
    let timedOut = false;
    const deadline = setTimeout(() => {
      timedOut = true;
      controller.abort(new Error("soak deadline"));
    }, this.setup.deadlineMs);
    let status: number | undefined;
    let received = 0;
    // The first bytes of the body, kept so that an unexpected status reports the proxy's reason
    // (its error bodies name it: "502 Bad Gateway: upstream …").
    let head = "";
    const hash = createHash("sha256");
    try {
      const requestHeaders: Record<string, string> = {};
      if (kind.hook2 !== undefined) requestHeaders[headers.tier2] = kind.hook2;
      if (kind.hook3 !== undefined) requestHeaders[headers.tier3] = kind.hook3;
      let body: Buffer | Readable | null = null;
      if (plan.upload !== undefined) {
        body = kind.upload === "slow" || kind.upload === "abort" ? uploadStream(plan.upload, kind.upload, () => controller.abort(new Error("guest aborts its upload"))) : plan.upload;
      }
      const res = await request(plan.url, {
        dispatcher: plan.url.startsWith("http:") ? forward : tunnel,
        method: kind.method,
        headers: requestHeaders,
        body,
        signal: controller.signal,
      });
      status = res.statusCode;
      for await (const chunk of res.body as AsyncIterable<Buffer>) {
        if (head.length < 300) head += chunk.subarray(0, 300 - head.length).toString("latin1");
        received += chunk.length;
        hash.update(chunk);
        if (kind.read === "abort") {
          controller.abort(new Error("guest aborts its download"));
          break;
        }
        if (kind.read === "slow") await sleep(15);
      }
    } catch (error) {
      if (timedOut) return { label: "✗ hung", ok: false, detail: `no outcome within ${this.setup.deadlineMs} ms (status ${status ?? "none"}, ${received} bytes)` };
      if (kind.expect.type === "abort") return { label: "aborted", ok: true };
      const refused = /Proxy response \((\d{3})\)/.exec((error as Error).message ?? "");
      if (status === undefined && refused?.[1] !== undefined) return this.judgeStatus(plan, Number(refused[1]), " (CONNECT)");
      if (kind.expect.type === "cut" && status !== undefined) return { label: "cut mid-body", ok: true };
      return { label: `✗ ${status === undefined ? "error before the head" : `${status}, then an error mid-body`}`, ok: false, detail: describeError(error) };
    } finally {
      clearTimeout(deadline);
    }
    if (kind.expect.type === "abort") return { label: kind.read === "abort" ? "aborted" : `${status} (finished before the abort)`, ok: true };
    if (kind.expect.type === "cut") {
      if (kind.expect.orStatus.includes(status)) return { label: String(status), ok: true };
      return { label: `✗ ${status} ended cleanly`, ok: false, detail: `${received} of ${plan.expected.bytes} bytes, and no error: a cut body passed off as complete` };
    }
    const judged = this.judgeStatus(plan, status, "");
    if (!judged.ok) return { ...judged, detail: `${judged.detail ?? ""}; body: ${JSON.stringify(head.trim())}` };
    if (status !== 200) return judged;
    const matched = received === plan.expected.bytes && hash.digest("hex") === plan.expected.sha256;
    if (!matched) return { label: "✗ 200, wrong bytes", ok: false, detail: `${received} bytes, expected ${plan.expected.bytes} with sha256 ${plan.expected.sha256.slice(0, 12)}…`, checked: { matched, bytes: received } };
    return { label: "200, bytes match", ok: true, checked: { matched, bytes: received } };
  }

  /** One request over HTTP/2, judged as {@link once} judges one over HTTP/1.1. */
  private async onceH2(plan: Plan, h2: H2GuestSessions): Promise<Outcome> {
    const { kind } = plan;
    const url = new URL(plan.url);
    const requestHeaders: Record<string, string> = {};
    if (kind.hook2 !== undefined) requestHeaders[headers.tier2] = kind.hook2;
    if (kind.hook3 !== undefined) requestHeaders[headers.tier3] = kind.hook3;
    let t: H2Transfer;
    try {
      t = await h2.exchange({ authority: url.host, path: `${url.pathname}${url.search}`, method: kind.method, headers: requestHeaders, upload: plan.upload, cancel: kind.read === "abort", pauseMs: kind.read === "pause" ? guestPauseMs : undefined, deadlineMs: this.setup.deadlineMs });
    } catch (error) {
      // The tunnel or the session could not be opened.
      return { label: "✗ no HTTP/2 session", ok: false, detail: describeError(error) };
    }
    if (t.timedOut) return { label: "✗ hung", ok: false, detail: `no outcome within ${this.setup.deadlineMs} ms (status ${t.status ?? "none"}, ${t.received} bytes)` };
    if (kind.expect.type === "abort") return { label: t.cancelled ? "reset by the guest" : `${t.status ?? "error"} (finished before the reset)`, ok: true };
    if (!t.clean) {
      if (kind.expect.type === "cut" && t.status !== undefined) return { label: "cut mid-body", ok: true };
      return { label: `✗ ${t.status === undefined ? "error before the head" : `${t.status}, then an error mid-body`}`, ok: false, detail: `${t.failure ?? ""} (${t.received} bytes)` };
    }
    const status = t.status!;
    if (kind.expect.type === "cut") {
      if (kind.expect.orStatus.includes(status)) return { label: String(status), ok: true };
      return { label: `✗ ${status} ended cleanly`, ok: false, detail: `${t.received} of ${plan.expected.bytes} bytes, and no error: a cut body passed off as complete` };
    }
    const judged = this.judgeStatus(plan, status, "");
    if (!judged.ok) return { ...judged, detail: `${judged.detail ?? ""}; body: ${JSON.stringify(t.head.trim())}` };
    if (status !== 200) return judged;
    const matched = t.received === plan.expected.bytes && t.sha256 === plan.expected.sha256;
    if (!matched) return { label: "✗ 200, wrong bytes", ok: false, detail: `${t.received} bytes, expected ${plan.expected.bytes} with sha256 ${plan.expected.sha256.slice(0, 12)}…`, checked: { matched, bytes: t.received } };
    if (kind.trailers === true && t.trailers?.[digestTrailer] !== plan.expected.sha256) {
      return { label: "✗ 200, trailer missing or wrong", ok: false, detail: `trailers ${JSON.stringify(t.trailers ?? null)}`, checked: { matched: false, bytes: t.received } };
    }
    return { label: kind.trailers === true ? "200, bytes and trailer match" : "200, bytes match", ok: true, checked: { matched, bytes: t.received } };
  }

  private judgeStatus(plan: Plan, status: number, via: string): Outcome {
    const allowed = plan.kind.expect.type === "status" ? plan.kind.expect.statuses : plan.kind.expect.type === "cut" ? plan.kind.expect.orStatus : [];
    if (allowed.includes(status)) return { label: `${status}${via}`, ok: true };
    return { label: `✗ ${status}${via}`, ok: false, detail: `expected ${allowed.join(" or ")}` };
  }

  /**
   * Runs `count` requests, `concurrency` at a time, over fresh agents closed at the end. The
   * first `everyKind × kinds` requests go through the kinds in turn (a warm-up that meets every
   * one-time cost, such as each policy worker's first limit hit); the rest are drawn at random.
   */
  async run(count: number, concurrency: number, progress?: (done: number, failed: number) => void, everyKind = 0): Promise<RunResult> {
    const forced = Array.from({ length: everyKind }, () => this.setup.kinds).flat();
    const common = { keepAliveTimeout: 4_000, keepAliveMaxTimeout: 4_000, headersTimeout: 120_000, bodyTimeout: 120_000 };
    const tunnel = new ProxyAgent({ ...common, uri: this.setup.proxyUrl, requestTls: { ca: this.setup.proxyCaPem } });
    const forward = new ProxyAgent({ ...common, uri: this.setup.proxyUrl, proxyTunnel: false });
    const h2 = new H2GuestSessions(this.setup.proxyUrl, this.setup.proxyCaPem);
    const perKind: Record<string, KindTally> = {};
    const latencies = new Map<string, number[]>();
    for (const kind of this.setup.kinds) {
      perKind[kind.name] = { sent: 0, failed: 0, outcomes: {}, examples: [], p50Ms: 0, p99Ms: 0, maxMs: 0 };
      latencies.set(kind.name, []);
    }
    let issued = 0;
    let done = 0;
    let failed = 0;
    let bodiesChecked = 0;
    let bodiesMatched = 0;
    let bytesChecked = 0;
    const started = performance.now();
    const lane = async (): Promise<void> => {
      while (issued < count) {
        issued += 1;
        this.serial += 1;
        const plan = this.plan(forced[issued - 1] ?? this.pick());
        const tally = perKind[plan.kind.name]!;
        tally.sent += 1;
        const t0 = performance.now();
        const outcome = await this.once(plan, tunnel, forward, h2);
        latencies.get(plan.kind.name)!.push(performance.now() - t0);
        tally.outcomes[outcome.label] = (tally.outcomes[outcome.label] ?? 0) + 1;
        if (outcome.checked !== undefined) {
          bodiesChecked += 1;
          bytesChecked += outcome.checked.bytes;
          if (outcome.checked.matched) bodiesMatched += 1;
        }
        if (!outcome.ok) {
          failed += 1;
          tally.failed += 1;
          if (tally.examples.length < 3) tally.examples.push(`${plan.kind.method} ${plan.url}: ${outcome.label.replace(/^✗ /, "")}${outcome.detail !== undefined ? ` — ${outcome.detail}` : ""}`);
        }
        done += 1;
        progress?.(done, failed);
      }
    };
    await Promise.all(Array.from({ length: concurrency }, lane));
    const elapsedMs = performance.now() - started;
    setPercentiles(perKind, latencies);
    // Every guest connection closes here, so the proxy's readings afterwards hold none of them.
    await Promise.all([tunnel.destroy(), forward.destroy(), h2.close()]);
    const result = { requests: done, failed, elapsedMs, bodiesChecked, bodiesMatched, bytesChecked, perKind, h2Sessions: { opened: h2.opened, goaways: h2.goaways } };
    rawLatencies.set(result, latencies);
    return result;
  }
}

/** Each result's latencies, kept out of the result itself (which goes into the JSON summary). */
const rawLatencies = new WeakMap<RunResult, Map<string, number[]>>();

function setPercentiles(perKind: Record<string, KindTally>, latencies: ReadonlyMap<string, number[]>): void {
  for (const [name, list] of latencies) {
    const sorted = [...list].sort((a, b) => a - b);
    const at = (q: number): number => Number((sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? 0).toFixed(1));
    Object.assign(perKind[name]!, { p50Ms: at(0.5), p99Ms: at(0.99), maxMs: at(1) });
  }
}

/** Several runs (the soak's rounds) as one. */
export function mergeResults(parts: readonly RunResult[]): RunResult {
  const perKind: Record<string, KindTally> = {};
  const latencies = new Map<string, number[]>();
  for (const part of parts) {
    for (const [name, tally] of Object.entries(part.perKind)) {
      const into = (perKind[name] ??= { sent: 0, failed: 0, outcomes: {}, examples: [], p50Ms: 0, p99Ms: 0, maxMs: 0 });
      into.sent += tally.sent;
      into.failed += tally.failed;
      for (const [label, n] of Object.entries(tally.outcomes)) into.outcomes[label] = (into.outcomes[label] ?? 0) + n;
      into.examples.push(...tally.examples.slice(0, Math.max(0, 3 - into.examples.length)));
      latencies.set(name, [...(latencies.get(name) ?? []), ...(rawLatencies.get(part)?.get(name) ?? [])]);
    }
  }
  setPercentiles(perKind, latencies);
  const sum = (key: "requests" | "failed" | "elapsedMs" | "bodiesChecked" | "bodiesMatched" | "bytesChecked"): number => parts.reduce((n, p) => n + p[key], 0);
  return {
    requests: sum("requests"),
    failed: sum("failed"),
    elapsedMs: sum("elapsedMs"),
    bodiesChecked: sum("bodiesChecked"),
    bodiesMatched: sum("bodiesMatched"),
    bytesChecked: sum("bytesChecked"),
    perKind,
    h2Sessions: { opened: parts.reduce((n, p) => n + p.h2Sessions.opened, 0), goaways: addCounts(parts.map((p) => p.h2Sessions.goaways)) },
  };
}

function addCounts(counts: readonly Readonly<Record<string, number>>[]): Record<string, number> {
  const sum: Record<string, number> = {};
  for (const count of counts) for (const [key, n] of Object.entries(count)) sum[key] = (sum[key] ?? 0) + n;
  return sum;
}

/** The kinds after `--only` and `--skip`. */
export function selectKinds(only: readonly string[], skip: readonly string[]): KindSpec[] {
  const known = new Set(kinds.map((k) => k.name));
  for (const name of [...only, ...skip]) if (!known.has(name)) throw new TypeError(`soak: unknown kind "${name}" (known: ${[...known].join(", ")})`);
  return kinds.filter((k) => (only.length === 0 || only.includes(k.name)) && !skip.includes(k.name));
}
