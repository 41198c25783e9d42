import type { IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import { badRequest, type EgressError } from "../errors.js";
import { authenticationRequired, FailureLimiter, tooManyFailures } from "./auth.js";
import type { GuestRegistry, Identified } from "./guests.js";
import type { ThrottledWarning } from "./throttled-log.js";

/**
 * Who a request is from. Missing, malformed, unknown and wrong credentials all get the same 407;
 * the log says which it was, once per source and reason and then as a summary of each, so a
 * flood of bad attempts cannot fill it. Past a burst of wrong credentials a source gets 429 instead (see FailureLimiter);
 * a request with none is never counted.
 */
export class AuthGate {
  private readonly limiter = new FailureLimiter();

  constructor(
    private readonly guests: GuestRegistry,
    private readonly warnings: ThrottledWarning,
  ) {}

  /** The guest of a request on the listener (a CONNECT, an absolute-form request, an upgrade), from its head and its connection. */
  identify(req: IncomingMessage, socket: Socket): Identified | EgressError {
    // Node keeps the first Proxy-Authorization of several and drops the rest, so two guests'
    // credentials on one request passed as the first's, unseen. A singleton field sent twice
    // (RFC 9110 §5.3) is refused as a duplicate Host is; the single guest without credentials
    // reads none, so it has nothing to choose between.
    const sent = this.guests.open || req.headers["proxy-authorization"] === undefined ? 0 : countHeader(req.rawHeaders, "proxy-authorization");
    if (sent > 1) return badRequest(`the request carries ${sent} Proxy-Authorization headers: send one, with the credentials of one guest`);
    const found = this.guests.identify(req.headers["proxy-authorization"], socket.remoteAddress);
    if (typeof found !== "string") return found;
    const source = socket.remoteAddress ?? "";
    // A kind per source and reason: the summary says how often each reason repeated (one per
    // source gave the last reason with the count of every kind: 9 wrong tokens then 1 missing
    // read "missing", repeated 9). The reasons are a handful of fixed words, so still bounded.
    this.warnings.warn(`auth:${source}\u0000${found}`, "proxy authentication failed", { client: source, reason: found });
    // A request without credentials is no guess: git, Java and curl --proxy-anyauth send one on
    // every new connection and wait for the 407 before they send theirs, so counting them would
    // lock out guests whose credentials are valid (and let a neighbour behind the same NAT do it).
    const wait = found === "missing" ? undefined : this.limiter.fail(source);
    return wait === undefined ? authenticationRequired() : tooManyFailures(source, wait);
  }

  clear(): void {
    this.limiter.clear();
  }
}

/** How many field lines named `name` (lowercase) the head holds. */
function countHeader(rawHeaders: readonly string[], name: string): number {
  let count = 0;
  for (let i = 0; i < rawHeaders.length; i += 2) if (rawHeaders[i]!.toLowerCase() === name) count += 1;
  return count;
}
