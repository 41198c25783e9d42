import type { LogFields, Logger } from "../log.js";
import { withFields } from "../objects.js";

/**
 * A warning that a flood could repeat thousands of times a second (a guest over its connection
 * limit, EMFILE at accept). The first of each kind is logged at once; the rest within
 * `intervalMs` are counted and summarised in one line when the interval ends. That line carries
 * the fields of the last one counted, so a kind must tell apart whatever its fields do (the
 * source and the reason, say): warnings of one kind with different reasons were summarised
 * under the last reason with the count of all.
 */
export class ThrottledWarning {
  private readonly kinds = new Map<string, { suppressed: number; timer: NodeJS.Timeout | undefined; fields: LogFields }>();

  constructor(
    private readonly log: Logger,
    private readonly intervalMs = 10_000,
  ) {}

  warn(kind: string, msg: string, fields: LogFields = {}): void {
    const state = this.kinds.get(kind);
    if (state !== undefined) {
      state.suppressed += 1;
      state.fields = fields;
      return;
    }
    this.log.warn(msg, fields);
    const fresh = { suppressed: 0, timer: undefined as NodeJS.Timeout | undefined, fields };
    fresh.timer = setTimeout(() => {
      this.kinds.delete(kind);
      if (fresh.suppressed > 0) this.log.warn(`${msg} (repeated)`, withFields(fresh.fields, { repeated: fresh.suppressed, withinMs: this.intervalMs }));
    }, this.intervalMs);
    fresh.timer.unref();
    this.kinds.set(kind, fresh);
  }

  /** Drops pending summaries (the proxy is closing). */
  clear(): void {
    for (const state of this.kinds.values()) clearTimeout(state.timer);
    this.kinds.clear();
  }
}
