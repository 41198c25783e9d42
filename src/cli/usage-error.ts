/** Thrown for bad command-line usage; the CLI prints the message and exits 2. */
export class UsageError extends Error {
  override readonly name = "UsageError";
  /** Stable, like every egressgate error's: bad usage of the command line. */
  readonly code = "EG_USAGE";
}
