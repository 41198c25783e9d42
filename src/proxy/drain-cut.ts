import type { GuestGone, PipelineResponse } from "../pipeline/exchange.js";
import { discardBody } from "../streams.js";

/**
 * The requests still in their pipeline when the proxy's drain ends, on either protocol. Closing
 * their connections aborts their signals, which ends an upstream exchange or a decider's call,
 * but not a tier-3 hook or a tier-2 policy call: the request was decided only once that settled
 * (up to hookMs, or the policy's timeoutMs), after close() had closed the audit log, and its
 * record was lost. At the drain's end each is cut instead: its signal aborts, and its wait
 * rejects at once, so the request is decided as the drain's cut while the audit log is open.
 * What its pipeline gives back later is let go.
 */
export class DrainCuts {
  private readonly waiting = new Set<(reason: Error) => void>();
  private reason: Error | undefined;

  /** `work`, unless the drain ends first: then `signal` aborts, and the promise rejects with the drain's reason. */
  until(work: Promise<PipelineResponse>, signal: GuestGone): Promise<PipelineResponse> {
    if (this.reason !== undefined) {
      const reason = this.reason;
      signal.abort(reason);
      void work.then(letGo, () => undefined);
      return Promise.reject(reason);
    }
    return new Promise<PipelineResponse>((resolve, reject) => {
      const cut = (reason: Error): void => {
        signal.abort(reason);
        // A hook's call the abort let go settles its trace entry in the microtasks that follow
        // (a block with 499): decided after them, the record says so, not "did not settle" of
        // kind time, which counted a hook failure for every request the drain cut.
        setImmediate(() => reject(reason));
      };
      this.waiting.add(cut);
      work.then(
        (response) => {
          if (this.waiting.delete(cut)) resolve(response);
          else letGo(response);
        },
        (error: unknown) => {
          if (this.waiting.delete(cut)) reject(error);
        },
      );
    });
  }

  /** The drain is over: every request still waiting on its pipeline is cut with `reason`. */
  end(reason: Error): void {
    this.reason = reason;
    const cuts = [...this.waiting];
    this.waiting.clear();
    for (const cut of cuts) cut(reason);
  }
}

/** A response that came after its request was cut: nobody will send it. */
function letGo(response: PipelineResponse): void {
  discardBody(response.body);
  response.cleanup?.();
}
