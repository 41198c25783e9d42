import type { IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import { denied, EgressError, guestError } from "../errors.js";
import { errorFields, type DecisionLog } from "./decision-log.js";
import type { Pipeline } from "../pipeline/pipeline.js";
import { connectPinned, type PinnedSocketOptions } from "../upstream/pinned-socket.js";
import type { ResolvedAddress } from "../upstream/resolve.js";
import { loggableRequestTarget, loggableUrl, toOutboundRequest } from "./guest-request.js";
import { errorBody, writeRawError } from "./respond.js";
import { GuestGone, type TraceEntry } from "../pipeline/exchange.js";
import type { Decision } from "../policy/decision.js";
import { tunnelOf } from "./tunnel.js";
import { withFields } from "../objects.js";
import { relay } from "./relay.js";
import { SwitchReader, type Switched } from "./switch-head.js";
import type { OpenRelay, RelayRefusal } from "./open-relays.js";
import { declarativeEntry } from "../pipeline/verdicts.js";

export interface UpgradeDeps {
  /** The guest the upgrade is for: its pipeline, and its name in the decision log. */
  readonly guest: string;
  readonly pipeline: Pipeline;
  readonly decide: DecisionLog;
  readonly idleMs: number;
  /** How long the upstream has to answer the upgrade (then 504). */
  readonly headersMs: number;
  readonly redact: ((text: string) => string) | undefined;
  readonly connect: Omit<PinnedSocketOptions, "url" | "address">;
  /** Set while replaying a recording (`--replay`): why no upgrade can be served (502, after every check). */
  readonly offline?: string | undefined;
  /**
   * Hands the relay about to start to the guest that holds it now, which keeps it for a reload
   * to judge again. A reload that replaced the guest while this upgrade was checked judges it
   * first: its refusal answers the guest 403 instead of the 101.
   */
  readonly admit?: ((relay: OpenRelay) => RelayRefusal | undefined) | undefined;
}

/** What a guest may send after its upgrade request and before the 101 (WebSocket frames, say). */
const maxEarlyBytes = 64 * 1024;

/** The guest's connection went before the 101 (the guest, or the proxy's own close): nobody is left to answer. */
class GuestLeft extends Error {
  constructor() {
    super("the guest left before the upgrade completed");
  }
}
/** The answer to a guest that sent too much before its upgrade completed (also while it waited its turn). */
export const tooEarly = (): EgressError =>
  new EgressError("EG_BAD_REQUEST", 400, `the guest sent more than ${maxEarlyBytes / 1024} KiB before the upgrade completed; the proxy closed the connection`);

/**
 * A WebSocket (or other) upgrade is checked like any request: head validation, onRequest,
 * secrets, and every policy check. The proxy then connects to the approved address itself and
 * sends only the request head. Bytes are relayed both ways only once the upstream has answered
 * `101 Switching Protocols`: an upstream that ignores the Upgrade must never receive further
 * unchecked requests on the same connection.
 */
export async function serveUpgrade(
  req: IncomingMessage,
  socket: Socket,
  head: Buffer,
  deps: UpgradeDeps,
  /** Why the guest's connection went, when it goes first: the guest, or the end of the proxy's drain. */
  leftReason: () => string = () => "guest closed the connection",
): Promise<void> {
  const started = performance.now();
  // As other requests log it: the URL, the method apart (a target inside a tunnel is only a path).
  let target = loggableRequestTarget(req.url ?? "", tunnelOf(socket));
  let upstream: Socket | undefined;
  let switched: Switched;
  let connected: ResolvedAddress;
  // With an audit log or onDecision: each source's say, and the decision that let it out.
  const trace: TraceEntry[] | undefined = deps.decide.auditing ? [] : undefined;
  let decision: Decision | undefined;
  // Until the upstream switches, nothing else ties the two sockets together: a guest that leaves
  // (or a proxy that closes, which destroys guest sockets) must take the upstream connection too.
  let guestGone = false;
  let overflowed = false;
  const gone = (): Error => (overflowed ? tooEarly() : new GuestLeft());
  // Settles when the guest's connection goes: a hook or a policy still deciding is not waited
  // for (not every source stops on a signal), so the end of a drain, which closes that connection, is
  // decided then, while the audit log is open; what the hook answers later is let go.
  let departed!: () => void;
  const departure = new Promise<never>((_resolve, reject) => (departed = () => reject(gone())));
  departure.catch(() => undefined);
  // A tier-3 hook's call still pending is let go then too, as a request's is: its hookMs timer
  // held the process (and the pipeline's count of work under way) for hookMs after the guest left.
  const leaving = new GuestGone();
  const onGuestClose = (): void => {
    if (guestGone) return;
    guestGone = true;
    upstream?.destroy(gone());
    // Named as the decision line names it: a drain's end, the proxy's bound on early bytes, or
    // the guest. A plain Error: an EgressError there reads as a deadline that passed (requestEnded).
    leaving.abort(new Error(overflowed ? tooEarly().message : leftReason()));
    // The call let go settles its trace entry (a block with 499) in the microtasks that follow:
    // decided after them, the record says so, not "did not settle" of kind time, a hook failure
    // counted for a guest that left (as DrainCuts does for a request).
    setImmediate(departed);
  };
  // The guest's socket is half-open after the upgrade event: a guest that leaves is seen as "end",
  // which a socket only emits while it is read. Bytes the guest sends early are kept for the
  // upstream, up to a bound.
  const early: Buffer[] = [];
  let earlyBytes = 0;
  const onEarly = (chunk: Buffer): void => {
    earlyBytes += chunk.length;
    if (earlyBytes <= maxEarlyBytes) return void early.push(chunk);
    overflowed = true;
    socket.destroy();
  };
  socket.on("data", onEarly);
  socket.once("end", onGuestClose);
  socket.once("close", onGuestClose);
  try {
    const guestRequest = toOutboundRequest(req, tunnelOf(socket));
    target = loggableUrl(guestRequest.url, deps.redact ?? ((text) => text));
    const upgrade = req.headers.upgrade;
    if (upgrade === undefined || upgrade === "") throw new EgressError("EG_BAD_REQUEST", 400, "Upgrade header missing");
    // After a 101 the connection carries whatever the new protocol does, unseen by any tier. For
    // WebSocket that is messages to the URL that was judged; for h2c it would be new HTTP requests
    // that no policy sees, so only WebSocket is relayed (and only it is asked of the upstream).
    if (upgrade.trim().toLowerCase() !== "websocket") {
      throw new EgressError("EG_BAD_REQUEST", 400, `only WebSocket upgrades are relayed, not ${JSON.stringify(upgrade.slice(0, 64))}: the requests after the switch would not be judged`);
    }
    if (guestRequest.body !== null) throw new EgressError("EG_BAD_REQUEST", 400, "an upgrade request must not have a body");
    const authorizing = deps.pipeline.authorizeUpgrade(guestRequest, trace, leaving);
    authorizing.catch(() => undefined);
    const authorized = await Promise.race([authorizing, departure]);
    const { request, addresses } = authorized;
    decision = authorized.decision;
    if (guestGone) throw gone();
    ({ socket: upstream, address: connected } = await connectFirst(request.url, addresses, deps));
    if (guestGone) throw gone();
    const lines = [`${request.method} ${request.url.pathname}${request.url.search} HTTP/1.1`, `host: ${request.url.host}`];
    for (let i = 0; i < request.headers.length; i += 2) lines.push(`${request.headers[i]}: ${request.headers[i + 1]}`);
    lines.push("connection: Upgrade", "upgrade: websocket");
    // Latin-1, as Node writes every other head: a header's string holds one byte a character (a
    // substituted value's UTF-8 bytes, a guest's own bytes), which UTF-8 would encode again.
    upstream.write(`${lines.join("\r\n")}\r\n\r\n`, "latin1");
    switched = await awaitSwitch(upstream, request.url.host, deps.headersMs);
    if (guestGone || socket.destroyed) throw gone();
    // Last: once admitted, the relay is its guest's, and nothing here may fail any more.
    const judged = performance.now();
    const refusal = deps.admit?.({ guestSide: socket, upstream, url: request.url, address: connected, target });
    if (refusal !== undefined) {
      trace?.push(declarativeEntry(refusal.phase, refusal.decision, judged));
      throw denied(refusal.decision.reason, refusal.decision.detail);
    }
  } catch (error) {
    socket.off("data", onEarly);
    socket.off("end", onGuestClose);
    socket.off("close", onGuestClose);
    upstream?.destroy();
    // Gone: seen as an end or a close, or destroyed by the proxy's close in this same turn.
    if (!overflowed && (guestGone || socket.destroyed)) {
      // Nobody is left to answer, and the upstream did not fail: 499, as a plain request whose
      // guest leaves first (nginx's "client closed request"), for the log only.
      socket.destroy();
      deps.decide(
        { started, guest: deps.guest, method: req.method, target, status: 499, reason: leftReason(), upgrade: true },
        trace !== undefined ? { trace, bytesDown: 0 } : undefined,
      );
      return;
    }
    // Past the bound on early bytes the proxy cut the guest, whatever else settled first (the
    // pending hook call let go when the socket closed rejects before the departure does).
    const failure = overflowed ? tooEarly() : error;
    const err = guestError(
      failure instanceof EgressError
        ? failure
        : new EgressError("EG_UPSTREAM", 502, `upgrade failed: ${(failure as NodeJS.ErrnoException).code ?? "error"}`, { cause: failure, detail: (failure as Error)?.message ?? String(failure) }),
      deps.redact,
    );
    deps.decide(
      {
        started,
        guest: deps.guest,
        method: req.method,
        target,
        // The guest is told to see the proxy log: the hook that failed, and its error, are there.
        ...errorFields(err),
        upgrade: true,
      },
      // A guest cut for sending too much gets no answer.
      // A HEAD's answer is its head alone (writeRawError).
      trace !== undefined ? { trace, bytesDown: socket.writable && req.method !== "HEAD" ? Buffer.byteLength(errorBody(err)) : 0 } : undefined,
    );
    writeRawError(socket, err, { method: req.method });
    return;
  }
  // Paused before its listener goes, so nothing arrives unread before the relay's pipe resumes it.
  socket.pause();
  socket.off("data", onEarly);
  socket.off("end", onGuestClose);
  socket.off("close", onGuestClose);
  deps.decide(
    { started, guest: deps.guest, method: req.method, target, status: 101, reason: "upgrade relayed", upgrade: true },
    trace !== undefined ? { trace, ...(decision !== undefined ? { rule: decision } : {}) } : undefined,
  );
  socket.write(switched.head);
  if (switched.rest.length > 0) socket.write(switched.rest);
  if (head.length > 0) upstream.write(head);
  for (const chunk of early) upstream.write(chunk);
  relay(socket, upstream, deps.idleMs);
}

async function connectFirst(url: URL, addresses: readonly ResolvedAddress[], deps: UpgradeDeps): Promise<{ socket: Socket; address: ResolvedAddress }> {
  if (deps.offline !== undefined) throw new EgressError("EG_REPLAY_UNSUPPORTED", 502, deps.offline);
  let lastError: unknown;
  for (const address of addresses) {
    try {
      return { socket: await connectPinned(withFields(deps.connect, { url, address })), address };
    } catch (error) {
      if (error instanceof EgressError) throw error;
      lastError = error;
    }
  }
  const code = (lastError as NodeJS.ErrnoException | undefined)?.code ?? "connection failed";
  throw new EgressError("EG_UPSTREAM", 502, `upstream ${url.host} refused the upgrade connection: ${code}`);
}

/**
 * Reads the upstream's answer, for at most `timeoutMs` (interim responses included). Resolves
 * with the 101 the guest gets (and any bytes after it); anything else is refused, and the
 * connection is dropped, never reused.
 */
function awaitSwitch(upstream: Socket, host: string, timeoutMs: number): Promise<Switched> {
  return new Promise((resolve, reject) => {
    const reader = new SwitchReader(host);
    const timer = setTimeout(
      () => fail(new EgressError("EG_UPSTREAM_TIMEOUT", 504, `upstream ${host} did not answer the upgrade within ${timeoutMs} ms`)),
      timeoutMs,
    );
    const fail = (error: Error): void => {
      cleanup();
      reject(error);
    };
    const onData = (chunk: Buffer): void => {
      let switched: Switched | undefined;
      try {
        switched = reader.push(chunk);
      } catch (error) {
        fail(error as Error);
        return;
      }
      if (switched === undefined) return;
      cleanup();
      upstream.pause();
      resolve(switched);
    };
    const onEnd = (): void => fail(new EgressError("EG_UPSTREAM", 502, `upstream ${host} closed before answering the upgrade`));
    const cleanup = (): void => {
      clearTimeout(timer);
      upstream.off("data", onData);
      upstream.off("end", onEnd);
      upstream.off("error", fail);
    };
    upstream.on("data", onData);
    upstream.once("end", onEnd);
    upstream.once("error", fail);
  });
}
