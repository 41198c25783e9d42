import { connect as h2Connect, constants, type ClientHttp2Session, type OutgoingHttpHeaders } from "node:http2";
import type { GuestConn } from "./guest-conn.js";
import type { Rng } from "./rng.js";
import type { SecretScanner } from "./scanner.js";
import type { Outcome, UpstreamCase } from "./upstream-inputs.js";

/**
 * The `h2guest` target's guest: an `upstream` case's two requests sent by a real `node:http2`
 * client on one session, inside a CONNECT tunnel with ALPN h2, to the hostile upstream the case
 * chose (HTTP/1.1 over TLS, or HTTP/2). The guest side is then the proxy's HTTP/2 server
 * (h2-guest.ts, h2-respond.ts) while the upstream answers badly: its odd framing, resets,
 * GOAWAYs, trailers and huge headers meet the code that turns an answer into HEADERS and DATA.
 */
export interface H2Answer {
  readonly status: number;
  readonly headers: Readonly<Record<string, string | string[] | undefined>>;
  readonly body: Buffer;
}

/** What one stream came to: an answer whole, a reset or error after (or before) its head, or nothing by the deadline. */
export type H2Result = { readonly kind: "answer"; readonly answer: H2Answer } | { readonly kind: "cut"; readonly why: string; readonly head?: number } | { readonly kind: "hang" };

/** What the HTTP/2 guest does besides its requests: its flow-control window, and whether it resets its first stream (at once, or once its head came). */
export interface H2GuestChoices {
  readonly initialWindowSize: number | undefined;
  readonly cancel: "none" | "at once" | "at the head";
}

export function h2GuestChoices(rng: Rng, steps: string[]): H2GuestChoices {
  const initialWindowSize = rng.chance(0.7) ? undefined : rng.pick([1, 100, 16_384]);
  const cancel = rng.chance(0.8) ? "none" : rng.pick(["at once", "at the head"] as const);
  if (initialWindowSize !== undefined) steps.push(`the guest's window ${initialWindowSize}`);
  if (cancel !== "none") steps.push(`the guest resets its first stream ${cancel}`);
  return { initialWindowSize, cancel };
}

/** One request on `session`; settles when its stream ends, resets or errors, or at `deadline`. */
export function h2Request(session: ClientHttp2Session, headers: OutgoingHttpHeaders, upload: Buffer | undefined, deadline: number, scanner: SecretScanner, cancel: H2GuestChoices["cancel"] = "none"): Promise<H2Result> {
  return new Promise((resolve) => {
    let settled = false;
    const done = (result: H2Result): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve(result);
    };
    const timer = setTimeout(() => done({ kind: "hang" }), Math.max(0, deadline - Date.now()));
    let stream;
    try {
      stream = session.request(headers, { endStream: upload === undefined });
    } catch (error) {
      done({ kind: "cut", why: `request() threw: ${(error as Error).message}` });
      return;
    }
    let head: { status: number; headers: Record<string, string | string[] | undefined> } | undefined;
    const chunks: Buffer[] = [];
    stream.on("response", (h) => {
      scanner.push(JSON.stringify(h));
      head = { status: Number(h[":status"]), headers: h as Record<string, string | string[] | undefined> };
      if (cancel === "at the head") stream.close(constants.NGHTTP2_CANCEL);
    });
    if (cancel === "at once") setImmediate(() => stream.close(constants.NGHTTP2_CANCEL));
    stream.on("trailers", (t) => scanner.push(JSON.stringify(t)));
    stream.on("data", (chunk: Buffer) => {
      scanner.push(chunk);
      chunks.push(chunk);
    });
    stream.on("error", (error: Error) => done({ kind: "cut", why: `stream error: ${error.message}`, ...(head === undefined ? {} : { head: head.status }) }));
    stream.on("end", () => {
      if (head !== undefined) done({ kind: "answer", answer: { status: head.status, headers: head.headers, body: Buffer.concat(chunks) } });
    });
    stream.on("close", () => {
      // An RST_STREAM NO_ERROR after END_STREAM still closes with the whole answer read ("end" first).
      if (head !== undefined && stream.rstCode === 0 && stream.readableEnded) done({ kind: "answer", answer: { status: head.status, headers: head.headers, body: Buffer.concat(chunks) } });
      done({ kind: "cut", why: `stream closed with code ${String(stream.rstCode)}`, ...(head === undefined ? {} : { head: head.status }) });
    });
    if (upload !== undefined) stream.end(upload);
  });
}

/** A session over the TLS socket `conn` holds (ALPN h2); errors are kept, never thrown. */
export function h2Session(conn: GuestConn, authority: string, choices: H2GuestChoices): { session: ClientHttp2Session; errors: string[]; goaway: () => number | undefined } {
  const errors: string[] = [];
  let goawayCode: number | undefined;
  const session = h2Connect(`https://${authority}`, { createConnection: () => conn.socket, ...(choices.initialWindowSize === undefined ? {} : { settings: { initialWindowSize: choices.initialWindowSize } }) });
  session.on("error", (error: Error) => errors.push(error.message));
  session.on("goaway", (code: number) => {
    goawayCode = code;
  });
  return { session, errors, goaway: () => goawayCode };
}

function describe(outcome: Outcome): string {
  const relays = outcome.relays.map((r) => `${r.status} ${typeof r.body === "string" ? JSON.stringify(r.body.slice(0, 80)) : String(r.body)}`);
  return `${relays.length > 0 ? relays.join(" or ") : "no relay"}; errors ${outcome.errors === "any" ? "any" : outcome.errors.join(",") || "none"}${outcome.cut ? "; a cut" : ""}`;
}

function codeOf(answer: H2Answer): string | undefined {
  const value = answer.headers["x-egressgate-error"];
  return Array.isArray(value) ? value.join(",") : value;
}

/** Judges an `upstream` case's two answers as an HTTP/2 guest got them (harness.ts judges the HTTP/1.1 guest's the same way). */
export function judgeH2Upstream(input: UpstreamCase, first: H2Result, second: H2Result, secondBody: string, report: (oracle: string, detail: string) => void, cancelled: boolean, slow: boolean): void {
  // A guest whose window lets one byte through per round trip may take longer than idleMs over
  // one write (a 16 KiB chunk, or up to 32 KiB handed over together), and be let go as one that
  // stopped reading (README, "HTTP/2 and gRPC").
  const outcome = slow ? { ...input.outcome, cut: true } : input.outcome;
  // A stream the guest reset is the guest's own cut: only the next one is judged.
  if (cancelled) {
    // Nothing to judge.
  } else if (first.kind === "hang") report("hang", `the first request's stream was still open at the deadline; allowed ${describe(outcome)}`);
  else if (first.kind === "cut") {
    if (!outcome.cut) report("wrong-answer", `the first request's stream was cut (${first.why}${first.head === undefined ? "" : `, after a ${first.head} head`}); allowed ${describe(outcome)}`);
  } else {
    const answer = first.answer;
    const code = codeOf(answer);
    const body = answer.body.toString("latin1");
    if (code !== undefined) {
      if (outcome.errors !== "any" && !outcome.errors.includes(code)) report("wrong-answer", `the proxy answered ${answer.status} ${code} (${JSON.stringify(body.slice(0, 300))}); allowed ${describe(outcome)}`);
    } else if (!outcome.relays.some((r) => r.status === answer.status && (typeof r.body === "string" ? r.body === body : r.body.test(body)))) {
      report("wrong-answer", `the guest got ${answer.status} with ${JSON.stringify(body.slice(0, 300))} (${body.length} bytes); allowed ${describe(outcome)}`);
    }
  }
  // The second stream, on the same session: its own answer. After a broken answer, the proxy may
  // have lost the upstream's connection under it (502 or 504 of its own); the guest's session
  // is never the upstream's to end.
  if (second.kind === "hang") {
    report("hang", "the second request's stream was still open at the deadline");
    return;
  }
  if (second.kind === "cut") {
    report("next-request", `the second request's stream was cut (${second.why}), not answered ${JSON.stringify(secondBody)}`);
    return;
  }
  const code = codeOf(second.answer);
  const lost = (outcome.cut || outcome.lostNext === true || cancelled) && (code === "EG_UPSTREAM" || code === "EG_UPSTREAM_TIMEOUT");
  if (!lost && (second.answer.status !== 200 || second.answer.body.toString("latin1") !== secondBody)) {
    report("next-request", `the second request got ${second.answer.status} ${code ?? ""} ${JSON.stringify(second.answer.body.toString("latin1").slice(0, 400))}, not its own answer ${JSON.stringify(secondBody)}`);
  }
}
