import { Counter, Histogram, type Registry } from "prom-client";

/**
 * Counters and histograms counted on the request path without prom-client's per-call work, and
 * handed to prom-client's own metric objects when a scrape (or the cluster aggregator) reads them.
 *
 * prom-client's `inc()` and `observe()` check and hash the label object on every call; with a
 * record per request that was a measurable share of the metrics' cost on small GETs (the bench's
 * `egressgate+metrics`). Here a series is found by its label values (SeriesIndex) and counted in place,
 * and the scrape pays once per series, not per request. Exposition, HELP, TYPE and the cluster
 * aggregation stay prom-client's.
 */

interface Series {
  readonly values: readonly string[];
  readonly labels: Record<string, string>;
  value: number;
}

interface HistogramSeries {
  readonly values: readonly string[];
  readonly labels: Record<string, string>;
  /** Observations per bucket, not cumulative; the last slot is past every bound (+Inf only). */
  readonly counts: number[];
  sum: number;
  count: number;
}

function keyOf(values: readonly string[]): string {
  return values.length === 1 ? values[0]! : values.join("\u0000");
}

/**
 * Series by their label values, one Map level per label: a lookup hashes each value (a label
 * value is most often a string the configuration or a constant holds, whose hash V8 keeps)
 * instead of building and hashing a joined key string on every request.
 */
class SeriesIndex<S extends { readonly values: readonly string[] }> {
  private readonly root = new Map<string, unknown>();
  private only: S | undefined;
  /** Every series, in the order first seen, with its joined key. */
  readonly all = new Map<string, S>();

  // The series found last, and the values it was found by: most requests repeat the labels of
  // the one before (same guest, same rule), which then costs a few comparisons, no Map lookup.
  private lastValues: readonly string[] = [];
  private last: S | undefined;

  get(values: readonly string[]): S | undefined {
    if (values.length === 0) return this.only;
    const lastValues = this.lastValues;
    if (this.last !== undefined && lastValues.length === values.length) {
      let i = 0;
      while (i < values.length && values[i] === lastValues[i]) i++;
      if (i === values.length) return this.last;
    }
    const found = this.lookUp(values);
    if (found !== undefined) {
      this.lastValues = values.slice();
      this.last = found;
    }
    return found;
  }

  private lookUp(values: readonly string[]): S | undefined {
    let level: Map<string, unknown> | undefined = this.root;
    for (let i = 0; i < values.length - 1 && level !== undefined; i++) level = level.get(values[i]!) as Map<string, unknown> | undefined;
    return level?.get(values[values.length - 1]!) as S | undefined;
  }

  add(values: readonly string[], series: S): S {
    this.all.set(keyOf(values), series);
    if (values.length === 0) return (this.only = series);
    let level = this.root;
    for (let i = 0; i < values.length - 1; i++) {
      let next = level.get(values[i]!) as Map<string, unknown> | undefined;
      if (next === undefined) level.set(values[i]!, (next = new Map<string, unknown>()));
      level = next;
    }
    level.set(values[values.length - 1]!, series);
    return series;
  }

  /** Keeps only the series `keep` accepts; the lookup maps are made again from those. */
  retain(keep: (series: S) => boolean): void {
    const kept = [...this.all.values()].filter(keep);
    if (kept.length === this.all.size) return;
    this.all.clear();
    this.root.clear();
    this.only = undefined;
    this.last = undefined;
    this.lastValues = [];
    for (const series of kept) this.add(series.values, series);
  }
}

function labelsOf(names: readonly string[], values: readonly string[]): Record<string, string> {
  const labels: Record<string, string> = {};
  names.forEach((name, i) => (labels[name] = values[i] ?? ""));
  return labels;
}

export interface TallyCounter {
  /**
   * Adds `by` (default 1) to the series of these label values, in `labelNames` order. True when
   * that made a new series, for a caller that bounds them (see {@link TallyCounter.forget}).
   */
  inc(values: readonly string[], by?: number): boolean;
  /** The sum of every series' count, by the value of the label at `label` (its index in `labelNames`). */
  totalsBy(label: number): Map<string, number>;
  /** Drops every series whose label at `label` is one of `values`: they leave the exposition, as prom-client's remove() does. */
  forget(label: number, values: ReadonlySet<string>): void;
}

export function tallyCounter(options: {
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly string[];
  readonly registry: Registry;
  /** Runs first at each scrape: what may drop series (see {@link TallyCounter.forget}) does it before they are read. */
  readonly beforeCollect?: () => void;
}): TallyCounter {
  const series = new SeriesIndex<Series>();
  const beforeCollect = options.beforeCollect;
  new Counter({
    name: options.name,
    help: options.help,
    labelNames: options.labelNames,
    registers: [options.registry],
    collect() {
      beforeCollect?.();
      this.reset();
      for (const { labels, value } of series.all.values()) this.inc(labels, value);
    },
  });
  return {
    inc(values, by = 1) {
      const found = series.get(values);
      if (found !== undefined) {
        found.value += by;
        return false;
      }
      const copy = values.slice();
      series.add(copy, { values: copy, labels: labelsOf(options.labelNames, copy), value: by });
      return true;
    },
    totalsBy(label) {
      const totals = new Map<string, number>();
      for (const { values, value } of series.all.values()) totals.set(values[label]!, (totals.get(values[label]!) ?? 0) + value);
      return totals;
    },
    forget(label, values) {
      if (values.size > 0) series.retain((entry) => !values.has(entry.values[label]!));
    },
  };
}

export interface TallyHistogram {
  /** Observes `value` in the series of these label values, in `labelNames` order. */
  observe(values: readonly string[], value: number): void;
}

/** prom-client's own per-series shape inside a Histogram (15.x), which its get() exports. */
interface PromHistogramEntry {
  labels: Record<string, string>;
  bucketValues: Record<number, number>;
  sum: number;
  count: number;
}

export function tallyHistogram(options: {
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly string[];
  readonly buckets: readonly number[];
  readonly registry: Registry;
}): TallyHistogram {
  const bounds = options.buckets;
  const series = new SeriesIndex<HistogramSeries>();
  new Histogram({
    name: options.name,
    help: options.help,
    labelNames: options.labelNames,
    buckets: [...bounds],
    registers: [options.registry],
    collect() {
      // prom-client 15 (pinned) keeps each series as { labels, bucketValues, sum, count } in
      // hashMap and exports from there after collect(); the metrics tests read every histogram
      // back, so a change of that shape fails them rather than the scrape.
      const map: Record<string, PromHistogramEntry> = {};
      for (const [key, s] of series.all) {
        const bucketValues: Record<number, number> = {};
        bounds.forEach((bound, i) => (bucketValues[bound] = s.counts[i]!));
        map[key] = { labels: s.labels, bucketValues, sum: s.sum, count: s.count };
      }
      (this as unknown as { hashMap: Record<string, PromHistogramEntry> }).hashMap = map;
    },
  });
  const newSeries = (values: readonly string[]): HistogramSeries =>
    series.add(values, { values, labels: labelsOf(options.labelNames, values), counts: new Array<number>(bounds.length + 1).fill(0), sum: 0, count: 0 });
  return {
    observe(values, value) {
      const found = series.get(values) ?? newSeries(values.slice());
      let i = 0;
      while (i < bounds.length && value > bounds[i]!) i++;
      found.counts[i]! += 1;
      found.sum += value;
      found.count += 1;
    },
  };
}
