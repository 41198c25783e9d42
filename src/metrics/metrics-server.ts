import { Worker } from "node:worker_threads";
import type { Logger } from "../log.js";

export interface MetricsServerOptions {
  readonly host: string;
  readonly port: number;
  /** The exposition text and its content type. */
  readonly scrape: () => Promise<{ readonly text: string; readonly contentType: string }>;
  /** Whether the proxy is listening with its CA and policy loaded. */
  readonly ready: () => boolean;
  readonly log: Logger;
}

export interface MetricsServer {
  readonly host: string;
  readonly port: number;
  /** `http://HOST:PORT`. */
  readonly url: string;
  close(): Promise<void>;
}

/** What the listener thread asks: one request's answer. */
type Ask = "metrics" | "healthz" | "readyz";

type FromListener =
  | { readonly kind: "listening"; readonly address: string; readonly family: string; readonly port: number }
  | { readonly kind: "listen-error"; readonly code: string | undefined; readonly message: string }
  | { readonly kind: "ask"; readonly id: number; readonly what: Ask };

interface Answer {
  readonly kind: "answer";
  readonly id: number;
  readonly status: number;
  readonly contentType: string;
  readonly body: string;
}

/** How long the listener waits for the proxy's thread before answering 503 itself. */
const answerTimeoutMs = 10_000;

/**
 * The listener thread's code, plain CommonJS evaluated in a worker (the same from dist and from the
 * TypeScript sources). It parses HTTP and answers; every answer but a refusal (405, 404) comes from
 * the proxy's thread, so `/healthz` says that thread's event loop is turning, not only this one's.
 */
const listenerSource = `
const { createServer } = require("node:http");
const { parentPort, workerData } = require("node:worker_threads");
const pending = new Map();
let nextId = 1;
const paths = { "/metrics": "metrics", "/healthz": "healthz", "/readyz": "readyz" };
function answer(res, status, contentType, body, extra) {
  if (res.destroyed) return;
  const buffer = Buffer.from(body);
  res.writeHead(status, ["content-type", contentType, "content-length", String(buffer.length), ...(extra || [])]);
  res.end(buffer);
}
const server = createServer((req, res) => {
  res.on("error", () => undefined);
  const url = req.url || "/";
  const query = url.indexOf("?");
  const what = paths[query === -1 ? url : url.slice(0, query)];
  if (req.method !== "GET" && req.method !== "HEAD") return answer(res, 405, "text/plain", "method not allowed\\n", ["allow", "GET, HEAD"]);
  if (what === undefined) return answer(res, 404, "text/plain", "not found: /metrics, /healthz, /readyz\\n");
  const id = nextId++;
  const timer = setTimeout(() => {
    pending.delete(id);
    answer(res, 503, "text/plain", "the proxy did not answer within ${answerTimeoutMs} ms\\n");
  }, ${answerTimeoutMs});
  pending.set(id, { res, timer });
  res.once("close", () => {
    clearTimeout(timer);
    pending.delete(id);
  });
  parentPort.postMessage({ kind: "ask", id, what });
});
server.on("clientError", (_error, socket) => socket.destroy());
server.once("error", (error) => parentPort.postMessage({ kind: "listen-error", code: error.code, message: error.message }));
server.listen(workerData.port, workerData.host, () => {
  server.on("error", () => undefined);
  const address = server.address();
  parentPort.postMessage({ kind: "listening", address: address.address, family: address.family, port: address.port });
});
parentPort.on("message", (message) => {
  if (message.kind === "answer") {
    const waiting = pending.get(message.id);
    if (waiting === undefined) return;
    pending.delete(message.id);
    clearTimeout(waiting.timer);
    answer(waiting.res, message.status, message.contentType, message.body);
  } else if (message.kind === "close") {
    for (const { timer } of pending.values()) clearTimeout(timer);
    pending.clear();
    server.close(() => parentPort.close());
    server.closeAllConnections();
  }
});
`;

/**
 * The operator's listener (`--metrics-listen`): `/metrics`, `/healthz` and `/readyz`, on a socket
 * of its own. It is not the proxy's listener, so a guest cannot reach it as a proxy request; the
 * proxy also refuses it as a target (its address joins the proxy's own, which are always refused).
 *
 * It runs on a thread of its own. Served on the proxy's thread, node:http's code (the parser's
 * callbacks, the socket writes) met plain sockets from this listener beside the guests' TLS
 * sockets, and once the first scrape had come every proxied small GET cost about 8% more CPU,
 * whether the scrape read `/metrics` or only `/healthz`, once a second or ten times
 * (docs/performance.md, "Metrics: the listener's thread"). The proxy's thread only makes the
 * text and answers the probes, over the worker's message port.
 */
export async function startMetricsServer(options: MetricsServerOptions): Promise<MetricsServer> {
  const worker = new Worker(listenerSource, {
    eval: true,
    // Not the embedding process's flags and preloads (a loader, a --cpu-prof): the listener needs none.
    execArgv: [],
    workerData: { host: options.host, port: options.port },
    resourceLimits: { maxOldGenerationSizeMb: 32 },
  });
  // The proxy's own listeners keep the process up; this one must not keep a closed proxy's.
  worker.unref();
  let closing = false;
  const reply = (id: number, status: number, contentType: string, body: string): void => {
    if (!closing) worker.postMessage({ kind: "answer", id, status, contentType, body } satisfies Answer);
  };
  const onAsk = (id: number, what: Ask): void => {
    if (what === "healthz") return reply(id, 200, "text/plain", "ok\n");
    if (what === "readyz") {
      const ready = options.ready();
      return reply(id, ready ? 200 : 503, "text/plain", ready ? "ready\n" : "not ready\n");
    }
    let scraped: Promise<{ readonly text: string; readonly contentType: string }>;
    try {
      scraped = options.scrape();
    } catch (error) {
      scraped = Promise.reject(error);
    }
    scraped.then(
      ({ text, contentType }) => reply(id, 200, contentType, text),
      (error: unknown) => {
        options.log.warn("metrics scrape failed", { error });
        reply(id, 500, "text/plain", "metrics scrape failed\n");
      },
    );
  };
  const exited = new Promise<void>((resolve) => worker.once("exit", () => resolve()));
  // Listened for from the first moment: an unlistened `error` would end the proxy.
  worker.on("error", (error) => options.log.warn("metrics listener error", { error }));
  const listening = await new Promise<Extract<FromListener, { kind: "listening" }>>((resolve, reject) => {
    worker.on("message", (message: FromListener) => {
      if (message.kind === "ask") onAsk(message.id, message.what);
      else if (message.kind === "listening") resolve(message);
      else if (message.kind === "listen-error") reject(Object.assign(new Error(message.message), { code: message.code }));
    });
    void exited.then(() => reject(new Error("the metrics listener's thread stopped before it listened")));
  }).catch(async (error: unknown) => {
    await worker.terminate();
    throw error;
  });
  void exited.then(() => {
    if (!closing) options.log.warn("metrics listener stopped: its thread exited", {});
  });
  const host = listening.family === "IPv6" ? `[${listening.address}]` : listening.address;
  return {
    host: listening.address,
    port: listening.port,
    url: `http://${host}:${listening.port}`,
    close: async () => {
      if (!closing) {
        closing = true;
        worker.postMessage({ kind: "close" });
        // A thread that does not finish closing within a second is stopped.
        const timer = setTimeout(() => void worker.terminate(), 1_000);
        await exited;
        clearTimeout(timer);
      }
      await exited;
    },
  };
}
