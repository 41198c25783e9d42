import { EventEmitter } from "node:events";
import { Pool, type Dispatcher } from "undici";
import { answerText, MalformedAnswer, opaVerdict, parseAnswer, parseAnswerText, reasonText, type Verdict } from "./answer.js";
import type { DeciderPhase, ResolvedHttpDecider } from "./options.js";
import { DeciderFailure, DeciderCancelled, type CallSignal } from "./failure.js";
import { isStaleConnection } from "../upstream/stale-connection.js";

/** The most of an answer body that is read; more is a failure. */
const maxAnswerBytes = 1024 * 1024;
/** The webhook contract's status for "block". */
const blockStatus = 422;

/** Aborts one call at its deadline. undici takes an emitter with `aborted` and `reason`, which costs less than an AbortController. */
class Deadline extends EventEmitter {
  aborted = false;
  reason: unknown = undefined;

  abort(reason: Error): void {
    if (this.aborted) return;
    this.aborted = true;
    this.reason = reason;
    this.emit("abort");
  }
}

/**
 * A webhook or OPA endpoint: one JSON POST per decision over a keep-alive undici Pool of its
 * own. The endpoint is operator configuration, so it is dialled directly: it does not pass the
 * guest's allowlist, its IP checks or its secrets (none of which describe the operator's own
 * services). The pool is made on the first call, so configuring a decider opens nothing.
 */
export class HttpDecider {
  private pool: Pool | undefined;
  private readonly path: string;
  private readonly headers: Record<string, string>;

  constructor(private readonly options: ResolvedHttpDecider) {
    this.path = `${options.url.pathname}${options.url.search}`;
    // Entries, not Object.assign: a header named "__proto__" stays a header (and fails as one), not a prototype.
    this.headers = Object.fromEntries([...Object.entries(options.headers ?? {}), ["content-type", "application/json"], ["accept", "application/json"]]);
  }

  private connect(): Pool {
    this.pool ??= new Pool(this.options.url.origin, {
      connections: 64,
      keepAliveTimeout: 4_000,
      connectTimeout: this.options.timeoutMs,
      headersTimeout: this.options.timeoutMs,
      bodyTimeout: this.options.timeoutMs,
    });
    return this.pool;
  }

  /**
   * The proxy is closing: calls still waiting for an answer fail (a webhook that never answers
   * held the process open for its whole timeoutMs, long after the drain), and the keep-alive
   * connections close. A later call opens a new pool.
   */
  async close(): Promise<void> {
    const pool = this.pool;
    this.pool = undefined;
    await pool?.destroy().catch(() => undefined);
  }

  async ask(document: unknown, phase: DeciderPhase, signal?: CallSignal): Promise<Verdict> {
    const { kind, timeoutMs } = this.options;
    if (signal?.aborted === true) throw new DeciderCancelled();
    const body = JSON.stringify(kind === "opa" ? { input: document } : document);
    const deadline = new Deadline();
    const timer = setTimeout(() => deadline.abort(new DeciderFailure(`did not answer within ${timeoutMs} ms (timeoutMs)`, "time")), timeoutMs);
    // A call whose guest left is ended, its connection freed for the others (the pool is bounded).
    const left = (): void => deadline.abort(new DeciderCancelled());
    signal?.once("abort", left);
    let status: number;
    let text: string;
    let contentType: string;
    try {
      const pool = this.connect();
      const call = { method: "POST", path: this.path, headers: this.headers, body, signal: deadline } as const;
      let response: Dispatcher.ResponseData;
      try {
        response = await pool.request(call);
      } catch (error) {
        // The decider's keep-alive close crossed this call on a pooled connection (gunicorn closes
        // idle ones after 2 s, before this pool's 4): 1 in 40 calls a second apart got 502
        // (black-box finding). The same document asked twice decides once, so it goes again on a
        // new connection, once, as the upstream side resends an idempotent request; the
        // deadline above still bounds both.
        if (deadline.aborted || !isStaleConnection(error)) throw error;
        response = await pool.request(call);
      }
      status = response.statusCode;
      const type = response.headers["content-type"];
      contentType = (Array.isArray(type) ? type[0] : type) ?? "";
      const length = Number(response.headers["content-length"]);
      // A declared small body is read in one go (undici's text() is cheaper than iterating); any other, bounded.
      text = Number.isInteger(length) && length <= maxAnswerBytes ? await response.body.text() : await readText(response.body);
    } catch (error) {
      if (error instanceof DeciderFailure) throw error;
      if (deadline.aborted) throw deadline.reason as DeciderFailure;
      const e = error as NodeJS.ErrnoException;
      throw new DeciderFailure(`request failed: ${e.code ?? e.name}${e.message ? `: ${e.message}` : ""}`);
    } finally {
      clearTimeout(timer);
      signal?.off("abort", left);
    }
    return kind === "opa" ? this.opaAnswer(status, text, phase) : this.webhookAnswer(status, text, contentType, phase);
  }

  private webhookAnswer(status: number, text: string, contentType: string, phase: DeciderPhase): Verdict {
    if (status === blockStatus) {
      // A JSON block answer is honoured as such; any other body is the reason as it is.
      const json = tryJson(text);
      if (json !== undefined && typeof json === "object" && json !== null && !Array.isArray(json) && (json as Record<string, unknown>)["decision"] === "block") {
        return answerOrFailure(() => parseAnswer(json, phase));
      }
      return { decision: "block", status: 403, reason: reasonText(text) };
    }
    if (status < 200 || status > 299) throw new DeciderFailure(`answered status ${status}${text.trim() === "" ? "" : `: ${reasonText(text).slice(0, 200)}`}`);
    // A 2xx decides when it carries JSON (declared, or an object as the body); any other body allows.
    const declared = /^application\/(?:[\w.+-]*\+)?json\b/i.test(contentType.trim());
    if (!declared && !text.trimStart().startsWith("{")) return { decision: "allow" };
    return answerOrFailure(() => parseAnswerText(text, phase));
  }

  private opaAnswer(status: number, text: string, phase: DeciderPhase): Verdict {
    if (status !== 200) throw new DeciderFailure(`OPA answered status ${status}${text.trim() === "" ? "" : `: ${reasonText(text).slice(0, 200)}`}`);
    const json = tryJson(text);
    if (json === undefined) throw new DeciderFailure("OPA's answer is not JSON", "invalid");
    return answerOrFailure(() => opaVerdict(json, phase));
  }
}

function answerOrFailure(parse: () => Verdict): Verdict {
  try {
    return parse();
  } catch (error) {
    if (error instanceof MalformedAnswer) throw new DeciderFailure(`malformed answer: ${error.message}`, "invalid");
    throw error;
  }
}

function tryJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

/** The body as text, at most {@link maxAnswerBytes}, read as undici's `text()` reads it (a byte order mark dropped). */
async function readText(body: Dispatcher.ResponseData["body"]): Promise<string> {
  // Leaving the loop early destroys the body; undici may then emit an error nobody else hears.
  body.on("error", () => undefined);
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of body) {
    size += chunk.byteLength;
    if (size > maxAnswerBytes) throw new DeciderFailure(`answered with more than ${maxAnswerBytes} bytes`, "invalid");
    chunks.push(Buffer.from(chunk));
  }
  return answerText(Buffer.concat(chunks));
}
