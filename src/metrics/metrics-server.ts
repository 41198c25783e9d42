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
  try {
    const buffer = Buffer.from(body);
    res.writeHead(status, ["content-type", contentType, "content-length", String(buffer.length), ...(extra || [])]);
    res.end(buffer);
  } catch {
    // A head Node refuses (a content type with a character it will not write): the connection ends instead.
    res.destroy();
  }
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
 * (docs/performance.md, "Metrics (issue 19)", side by side). The proxy's thread only makes the
 * text and answers the probes, over the worker's message port.
 */
export async function startMetricsServer(options: MetricsServerOptions): Promise<MetricsServer> {
  let closing = false;
  const onAsk = (worker: Worker, id: number, what: Ask): void => {
    const reply = (status: number, contentType: string, body: string): void => {
      if (!closing) worker.postMessage({ kind: "answer", id, status, contentType, body } satisfies Answer);
    };
    if (what === "healthz") return reply(200, "text/plain", "ok\n");
    if (what === "readyz") {
      const ready = options.ready();
      return reply(ready ? 200 : 503, "text/plain", ready ? "ready\n" : "not ready\n");
    }
    let scraped: Promise<{ readonly text: string; readonly contentType: string }>;
    try {
      scraped = options.scrape();
    } catch (error) {
      scraped = Promise.reject(error);
    }
    scraped.then(
      ({ text, contentType }) => reply(200, contentType, text),
      (error: unknown) => {
        options.log.warn("metrics scrape failed", { error });
        reply(500, "text/plain", "metrics scrape failed\n");
      },
    );
  };
  let current = await spawnListener(options.host, options.port, onAsk, options.log);
  const host = current.address.family === "IPv6" ? `[${current.address.address}]` : current.address.address;
  const port = current.address.port;
  // A thread that dies after start-up (it should not: its answers are guarded) is started again on
  // the same port, after a pause that grows to 30 s, so the probes do not stay down for the life of
  // the proxy. close() waits for a restart under way, and cuts its pause short.
  let restarting: Promise<void> | undefined;
  let wake: (() => void) | undefined;
  const watch = (listener: Listener): void => {
    void listener.exited.then(() => {
      if (!closing) restarting = restart();
    });
  };
  const restart = async (): Promise<void> => {
    options.log.warn("metrics listener stopped: its thread exited; starting it again", {});
    for (let attempt = 1; !closing; attempt++) {
      await new Promise<void>((resolve) => {
        wake = resolve;
        setTimeout(resolve, Math.min(30_000, 1_000 * attempt)).unref();
      });
      if (closing) return;
      try {
        current = await spawnListener(current.address.address, port, onAsk, options.log);
        // Closed while it started: close() stops it, having waited for this.
        if (!closing) watch(current);
        return;
      } catch (error) {
        options.log.warn("metrics listener could not start again", { error, attempt });
      }
    }
  };
  watch(current);
  return {
    host: current.address.address,
    port,
    url: `http://${host}:${port}`,
    close: async () => {
      closing = true;
      wake?.();
      await restarting;
      await stopListener(current);
    },
  };
}

interface Listener {
  readonly worker: Worker;
  readonly address: Extract<FromListener, { kind: "listening" }>;
  readonly exited: Promise<void>;
}

/** One listener thread, resolved once it listens; rejected with the listen error (its code kept) otherwise. */
async function spawnListener(host: string, port: number, onAsk: (worker: Worker, id: number, what: Ask) => void, log: Logger): Promise<Listener> {
  const worker = new Worker(listenerSource, {
    eval: true,
    // Not the embedding process's flags and preloads (a loader, a --cpu-prof): the listener needs none.
    execArgv: [],
    workerData: { host, port },
    resourceLimits: { maxOldGenerationSizeMb: 32 },
  });
  const exited = new Promise<void>((resolve) => worker.once("exit", () => resolve()));
  let failure: Error | undefined;
  // Listened for from the first moment: an unlistened `error` would end the proxy.
  worker.on("error", (error) => {
    failure = error;
    log.warn("metrics listener error", { error });
  });
  const address = await new Promise<Extract<FromListener, { kind: "listening" }>>((resolve, reject) => {
    worker.on("message", (message: FromListener) => {
      if (message.kind === "ask") onAsk(worker, message.id, message.what);
      else if (message.kind === "listening") resolve(message);
      else if (message.kind === "listen-error") reject(Object.assign(new Error(message.message), { code: message.code }));
    });
    void exited.then(() => reject(failure ?? new Error("the metrics listener's thread stopped before it listened")));
  }).catch(async (error: unknown) => {
    await worker.terminate();
    throw error;
  });
  return { worker, address, exited };
}

/** Asks the thread to close its server and waits for it to end; one that takes over a second is stopped. */
async function stopListener(listener: Listener): Promise<void> {
  listener.worker.postMessage({ kind: "close" });
  const timer = setTimeout(() => void listener.worker.terminate(), 1_000);
  await listener.exited;
  clearTimeout(timer);
}
