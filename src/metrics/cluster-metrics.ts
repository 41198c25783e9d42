import cluster from "node:cluster";
import { AggregatorRegistry, type Registry } from "prom-client";
import type { Logger } from "../log.js";
import { startMetricsServer, type MetricsServer } from "./metrics-server.js";
import { withFields } from "../objects.js";

/**
 * `--workers N` with `--metrics-listen`: the primary serves `/metrics` as the sum over its
 * workers (prom-client's AggregatorRegistry asks each worker over the cluster's IPC channel),
 * and the workers listen for no metrics of their own, so a scrape never lands on one worker.
 */
export function serveClusterMetrics(listen: { readonly host: string; readonly port: number }, log: Logger, ready: () => boolean): Promise<MetricsServer> {
  const aggregator = new AggregatorRegistry();
  return startMetricsServer(
    withFields(listen, {
      scrape: async () => ({ text: await aggregator.clusterMetrics(), contentType: aggregator.contentType }),
      ready,
      log,
    }),
  );
}

/** In a worker: the registry the primary's aggregator reads. */
export function shareWithPrimary(registry: Registry): void {
  if (!cluster.isWorker) return;
  // Constructing one is what installs prom-client's worker-side answer to the primary's requests.
  new AggregatorRegistry();
  AggregatorRegistry.setRegistries([registry]);
}
