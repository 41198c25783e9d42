import type { Socket } from "node:net";
import type { Decision } from "../policy/decision.js";
import type { ResolvedAddress } from "../upstream/resolve.js";
import { tunnelOf } from "./tunnel.js";

/**
 * An upgrade relayed now (a WebSocket after its 101), with what its opening was judged on: a
 * reload judges it again against the checks that need no request, as no hook can be asked again.
 */
export interface OpenRelay {
  /** The guest's side: the listener's socket, or the TLS (or clear) socket inside a tunnel. */
  readonly guestSide: Socket;
  readonly upstream: Socket;
  /** Where the upgrade went, after every onRequest. */
  readonly url: URL;
  /** The approved address the proxy connected to. */
  readonly address: ResolvedAddress;
  /** As the decision log showed it (redacted). */
  readonly target: string;
}

/** Which check refused a relay (`guest`: its guest was removed), and its decision. */
export interface RelayRefusal {
  readonly phase: "allowlist" | "address" | "guest";
  readonly decision: Decision;
}

/** A relay a reload no longer allows, with why. */
export interface RefusedRelay {
  readonly relay: OpenRelay;
  readonly refusal: RelayRefusal;
}

/** The set that holds a relay now: a reload moves it to the guest's successor. */
const holderOf = new WeakMap<OpenRelay, OpenRelays>();

/** One guest's open relays. */
export class OpenRelays {
  private readonly relays = new Set<OpenRelay>();

  get size(): number {
    return this.relays.size;
  }

  add(relay: OpenRelay): void {
    // One listener per relay, whichever set holds it now.
    if (!holderOf.has(relay)) relay.guestSide.once("close", () => holderOf.get(relay)?.relays.delete(relay));
    holderOf.set(relay, this);
    this.relays.add(relay);
  }

  /**
   * Takes every relay of `previous` (the same guest before a reload) that `judge` still allows;
   * the others are left out, and returned for the caller to cut.
   */
  takeOver(previous: OpenRelays, judge: (relay: OpenRelay) => RelayRefusal | undefined): RefusedRelay[] {
    const refused: RefusedRelay[] = [];
    for (const relay of previous.relays) {
      const refusal = judge(relay);
      if (refusal === undefined) this.add(relay);
      else {
        holderOf.delete(relay);
        refused.push({ relay, refusal });
      }
    }
    previous.relays.clear();
    return refused;
  }

  /** Cuts every relay held (the guest was removed). */
  cutAll(): void {
    for (const relay of this.relays) cutRelay(relay);
    this.relays.clear();
  }
}

/**
 * Closes a relay both ways at once, and the tunnel it runs in: its guest sees the connection
 * go, as at a removal, and not a TLS stream left hanging on an open CONNECT.
 */
export function cutRelay(relay: OpenRelay): void {
  relay.upstream.destroy();
  relay.guestSide.destroy();
  tunnelOf(relay.guestSide)?.connection.destroy();
}
