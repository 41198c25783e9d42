/**
 * What the requests under way from one source address may make the proxy hold, together
 * (`limits.sourceBufferBytes`). Each HTTP/2 guest stream is charged, as it arrives, the most its
 * flow-control windows let the proxy hold for it ({@link h2StreamCharge}), and gives it back when
 * it closes; a stream whose charge does not fit is answered 503 before any work, and what it sent
 * is let go. Nothing under way is ever reset or slowed: the windows a stream was given stay its
 * own (docs/performance.md, "What one source holds").
 *
 * Per source, as `limits.connectionsPerSource` counts: one guest's stopped streams must not take
 * what another guest's requests need. A window was the bound of one stream and
 * `limits.h2ConnectionBufferBytes` of one connection, but a source may open 256 connections of 100
 * streams each: 64 connections of stopped uploads held 1.1 GiB (docs/performance.md).
 */
export class SourceBudgets {
  private readonly accounts = new Map<string, SourceAccount>();

  constructor(readonly limitBytes: number) {}

  /** The account of `source`, for one more connection of it; {@link close} it with the connection. */
  open(source: string): SourceAccount {
    let account = this.accounts.get(source);
    if (account === undefined) {
      account = new SourceAccount(source, this.limitBytes);
      this.accounts.set(source, account);
    }
    account.connections += 1;
    return account;
  }

  /** One connection of the account's source is gone; the account goes with the last one. */
  close(account: SourceAccount): void {
    account.connections -= 1;
    if (account.connections === 0 && this.accounts.get(account.source) === account) this.accounts.delete(account.source);
  }

  /** Bytes charged to `source` now (0 for a source with no connection open). */
  heldBy(source: string): number {
    return this.accounts.get(source)?.held ?? 0;
  }
}

/** One source's charges: a counter, added to as a stream arrives and taken from as it closes. */
export class SourceAccount {
  /** Bytes charged to the streams under way. */
  held = 0;
  /** Connections that use the account (SourceBudgets.close). */
  connections = 0;

  constructor(
    readonly source: string,
    readonly limitBytes: number,
  ) {}

  /** Charges `bytes` if they fit within the limit; false, with nothing charged, if not. */
  take(bytes: number): boolean {
    if (this.held + bytes > this.limitBytes) return false;
    this.held += bytes;
    return true;
  }

  give(bytes: number): void {
    this.held -= bytes;
  }
}
