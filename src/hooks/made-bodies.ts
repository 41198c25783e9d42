import type { Readable } from "node:stream";

/**
 * The body of a Response a hook made, as a later source or the guest gets it. Only the hook's
 * code produces it: when it breaks or falls silent under a later source's read, the failure is
 * that hook's, not the upstream's. Blamed on the upstream (502 `EG_UPSTREAM` "the upstream
 * response body failed while a decider read it"), the log named the reader and the audit record
 * said the hook had rewritten the response without trouble (black-box finding).
 */
export interface MadeBody {
  /** What it is, for messages: "the body of the Response onResponse returned". */
  readonly subject: string;
  /** `timeouts.upstreamBodyMs`, when its silence is timed. */
  readonly silenceMs: number | undefined;
  /** The phase whose call returned the Response: `onRequest`, `onResponse` or `handle`. */
  readonly phase: string;
  /** The source whose hook made it (`hooks[0]`), once the pipeline knows it. */
  source: string | undefined;
}

const made = new WeakMap<Readable, MadeBody>();

/** Marks `body` as one a hook made in `phase`; returns it. */
export function markMadeBody(body: Readable, subject: string, silenceMs: number | undefined, phase: string): Readable {
  made.set(body, { subject, silenceMs, phase, source: undefined });
  return body;
}

/** What made `body`, when a hook did. */
export function madeBodyOf(body: Readable | null): MadeBody | undefined {
  return body === null ? undefined : made.get(body);
}

/** `to` goes on with what is left of `from` (a replay after a partial read): it is the same hook's. */
export function carryMadeBody(from: Readable | null, to: Readable | null): void {
  const of = madeBodyOf(from);
  if (of !== undefined && to !== null) made.set(to, of);
}

/** The pipeline names the source that made a body, once its call returned it. */
export function claimMadeBody(body: Readable | null, source: string): void {
  const of = madeBodyOf(body);
  if (of !== undefined) of.source ??= source;
}
