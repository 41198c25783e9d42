import { EgressError } from "../errors.js";
import type { Logger } from "../log.js";
import type { Verdict } from "./answer.js";
import { DecisionCache, cacheKey } from "./cache.js";
import { CommandRunner } from "./command.js";
import type { DecisionDocument } from "./document.js";
import { DeciderBusy, DeciderCancelled, DeciderFailure, type CallSignal, type FailedOpen } from "./failure.js";
import { HttpDecider } from "./http.js";
import { deciderDefaults, type DeciderPhase, type ResolvedDecider } from "./options.js";

/** Who is asking, for the log line of a decider that failed open. */
export interface DecideContext {
  readonly log: Logger | undefined;
  /** The decision line's id, which the warning carries (undefined: the line has none). */
  readonly requestId: number | undefined;
  /** The request's end: a call still queued or running for it is ended then. */
  readonly signal?: CallSignal | undefined;
}

/**
 * One external decider, whatever its kind: asks it (through its cache, when `cacheMs` is set)
 * and turns every way of failing into an EgressError for the guest: 502 when it broke (or an
 * allow, with `failOpen`), 503 when its queue is full. A block is not an error here; the caller
 * decides what a block means in its phase ({@link blockError}).
 */
export class Decider {
  readonly label: string;
  private readonly transport: CommandRunner | HttpDecider;
  private readonly cache: DecisionCache | undefined;

  constructor(readonly options: ResolvedDecider) {
    this.label = options.label;
    this.transport = options.kind === "command" ? new CommandRunner(options) : new HttpDecider(options);
    this.cache = options.cacheMs > 0 ? new DecisionCache(options.cacheMs, deciderDefaults.cacheEntries) : undefined;
  }

  get phases(): ReadonlySet<DeciderPhase> {
    return this.options.phases;
  }

  /** A command's running and queued calls; undefined for the HTTP kinds. */
  get load(): { readonly running: number; readonly queued: number } | undefined {
    return this.transport instanceof CommandRunner ? this.transport.load : undefined;
  }

  /** The answer; with `failOpen`, a failure is an allow that says how it failed ({@link FailedOpen}). */
  async decide(document: DecisionDocument, context: DecideContext): Promise<Verdict | FailedOpen> {
    const key = this.cache === undefined ? undefined : keyOf(document);
    if (key !== undefined) {
      const hit = this.cache!.get(key);
      if (hit !== undefined) return hit;
    }
    let verdict: Verdict;
    try {
      verdict = await this.ask(document, context.signal);
    } catch (error) {
      // Its guest left: the request is over, and no failure of the decider's (no failOpen allow,
      // no failure counted). A block with nginx's 499 ends the phase; the line says 499 anyway.
      if (error instanceof DeciderCancelled) return { decision: "block", status: 499, reason: error.message };
      if (error instanceof DeciderBusy) {
        throw new EgressError("EG_LIMIT", 503, `${this.label} is busy: ${error.message}`, { headers: { "retry-after": "1" }, failure: "busy" });
      }
      const reason = error instanceof DeciderFailure ? error.message : `failed: ${(error as Error)?.message ?? String(error)}`;
      const failure = error instanceof DeciderFailure ? error.kind : "throw";
      if (this.options.failOpen) {
        context.log?.warn("decider failed open", { id: context.requestId, source: this.label, reason });
        return { decision: "allow", failedOpen: { failure, reason } };
      }
      throw new EgressError("EG_HOOK_FAILED", 502, `${this.label} could not decide (see the proxy log)`, {
        detail: `${this.label} ${reason}`,
        cause: error,
        failure,
      });
    }
    if (key !== undefined) this.cache!.set(key, verdict);
    return verdict;
  }

  private ask(document: DecisionDocument, signal: CallSignal | undefined): Promise<Verdict> {
    if (this.transport instanceof CommandRunner) return this.transport.ask(JSON.stringify(document), document.phase, signal);
    return this.transport.ask(document, document.phase, signal);
  }

  /** Ends what is under way (a webhook's or OPA's calls and connections, a command's processes): the proxy is closing. */
  async close(): Promise<void> {
    if (this.transport instanceof HttpDecider) await this.transport.close();
    else this.transport.close();
  }
}

function keyOf(document: DecisionDocument): string {
  const { url_parsed: url, method } = document.request;
  return cacheKey({ phase: document.phase, guest: document.guest, method, scheme: url.scheme, host: url.host, port: url.port, path: url.path });
}

/** A block, as the guest's answer: the decider's status and reason, attributed to it in the log. */
export function blockError(verdict: Extract<Verdict, { decision: "block" }>, label: string, phase: DeciderPhase): EgressError {
  const reason = verdict.reason === "" ? `refused by ${label}` : verdict.reason;
  return new EgressError("EG_HOOK_BLOCKED", verdict.status, reason, { detail: `${label} blocked the ${phase}` });
}
