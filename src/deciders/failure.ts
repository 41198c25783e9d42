/**
 * How asking a decider can go wrong, apart from an answer (a block is an answer). A failure
 * means 502, or an allow with `failOpen`; a busy decider (its queue is full) means 503 whatever
 * `failOpen` says, so an overload never waves requests through.
 */
export class DeciderFailure extends Error {
  override readonly name = "DeciderFailure";
}

export class DeciderBusy extends Error {
  override readonly name = "DeciderBusy";
}
