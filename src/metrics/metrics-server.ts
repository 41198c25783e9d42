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
  readonly what: Ask;
  readonly status: number;
  readonly contentType: string;
  readonly body: string;
}

/** How long the listener waits for the proxy's thread before answering 503 itself. */
const answerTimeoutMs = 10_000;
/** How long a connection to the listener may take to send a request's head. */
export const metricsHeadersMs = 5_000;

/**
 * After a render of the metrics text, the proxy's thread waits this many times as long before the
 * next, so scrapes, however many and however fast, take at most a tenth of its time (a render of
 * 2 ms delays the next by 18 ms); never more than `renderGapMaxMs`, well inside the listener's
 * own wait (a cluster's render includes waiting on its workers, not only work on this thread).
 */
const renderGapFactor = 9;
const renderGapMaxMs = 2_000;

/** Connections the listener holds at once; it closes the ones past this as it takes them. */
export const metricsMaxConnections = 64;

/** Requests one connection may have waiting for their answers (pipelined); past this it is closed. */
export const metricsMaxPipelined = 8;

/**
 * The listener thread's code, plain CommonJS evaluated in a worker (the same from dist and from the
 * TypeScript sources). It parses HTTP and answers; every answer but a refusal (405, 404) comes from
 * the proxy's thread, so `/healthz` says that thread's event loop is turning, not only this one's.
 *
 * Asks are shared: for each path at most one is out at a time, and every request that came while
 * it was out waits for the next one, whose answer was made after they came. However many scrapes
 * come, the proxy's thread makes one text at a time and posts it once, and the listener bounds
 * what it holds (connections, and requests pipelined on one).
 */
const listenerSource = `
const { createServer } = require("node:http");
const { parentPort, workerData } = require("node:worker_threads");
const paths = { "/metrics": "metrics", "/healthz": "healthz", "/readyz": "readyz" };
// Per path: the requests the ask that is out will answer, and those that came after it went.
const asks = {};
for (const what of Object.values(paths)) asks[what] = { out: undefined, next: new Set() };
let nextId = 1;
function answer(res, status, contentType, body, extra) {
  if (res.destroyed) return;
  try {
    res.writeHead(status, ["content-type", contentType, "content-length", String(body.length), ...(extra || [])]);
    res.end(body);
  } catch {
    // A head Node refuses (a content type with a character it will not write): the connection ends instead.
    res.destroy();
  }
}
function send(what) {
  const state = asks[what];
  if (state.out !== undefined || state.next.size === 0) return;
  const id = nextId++;
  const waiting = state.next;
  state.next = new Set();
  const timer = setTimeout(() => settle(what, id, 503, "text/plain", Buffer.from("the proxy did not answer within ${answerTimeoutMs} ms\\n")), ${answerTimeoutMs});
  state.out = { id, waiting, timer };
  parentPort.postMessage({ kind: "ask", id, what });
}
function settle(what, id, status, contentType, body) {
  const state = asks[what];
  if (state.out === undefined || state.out.id !== id) return;
  clearTimeout(state.out.timer);
  const waiting = state.out.waiting;
  state.out = undefined;
  for (const res of waiting) answer(res, status, contentType, body);
  send(what);
}
// A connection that sends no head (or one a byte at a time) is closed within seconds: with Node's
// defaults (60 s, checked every 30 s) 64 silent ones held every place for 90 s, /healthz included.
const server = createServer({ headersTimeout: ${metricsHeadersMs}, requestTimeout: ${metricsHeadersMs * 3}, connectionsCheckingInterval: 1000 }, (req, res) => {
  res.on("error", () => undefined);
  const socket = req.socket;
  // No path takes a body, and a body sent a byte at a time held the connection, unread, until
  // requestTimeout (${metricsHeadersMs * 3} ms): 64 such held every place, /healthz included,
  // three times as long as a head does. Its answer closes the connection instead.
  if (req.headers["transfer-encoding"] !== undefined || (req.headers["content-length"] !== undefined && req.headers["content-length"] !== "0")) res.shouldKeepAlive = false;
  socket.egWaiting = (socket.egWaiting || 0) + 1;
  res.once("close", () => socket.egWaiting--);
  // Node parses every request pipelined in one read before the first answer is written: a client
  // that sends hundreds and reads nothing would have them all answered into its socket's buffer.
  if (socket.egWaiting > ${metricsMaxPipelined}) return socket.destroy();
  const url = req.url || "/";
  const query = url.indexOf("?");
  const what = paths[query === -1 ? url : url.slice(0, query)];
  if (req.method !== "GET" && req.method !== "HEAD") return answer(res, 405, "text/plain", Buffer.from("method not allowed\\n"), ["allow", "GET, HEAD"]);
  if (what === undefined) return answer(res, 404, "text/plain", Buffer.from("not found: /metrics, /healthz, /readyz\\n"));
  const state = asks[what];
  state.next.add(res);
  res.once("close", () => state.next.delete(res));
  send(what);
});
server.maxConnections = ${metricsMaxConnections};
// A scraper may half-close once its requests are sent (shutdown(SHUT_WR): nc -N, some probes).
// Node's server took that FIN as the client gone and dropped the requests it had not answered, so
// such a scraper got nothing; with this it answers them, in order, and then ends the connection.
server.httpAllowHalfOpen = true;
server.on("clientError", (_error, socket) => socket.destroy());
server.once("error", (error) => parentPort.postMessage({ kind: "listen-error", code: error.code, message: error.message }));
server.listen(workerData.port, workerData.host, () => {
  server.on("error", () => undefined);
  const address = server.address();
  parentPort.postMessage({ kind: "listening", address: address.address, family: address.family, port: address.port });
});
parentPort.on("message", (message) => {
  if (message.kind === "answer") {
    settle(message.what, message.id, message.status, message.contentType, Buffer.from(message.body));
  } else if (message.kind === "close") {
    for (const state of Object.values(asks)) if (state.out !== undefined) clearTimeout(state.out.timer);
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
  // The listener has one scrape out at a time; the next render starts no sooner than this.
  let nextRender = 0;
  const delayed = new Set<NodeJS.Timeout>();
  const onAsk = (worker: Worker, id: number, what: Ask): void => {
    const reply = (status: number, contentType: string, body: string): void => {
      if (!closing) worker.postMessage({ kind: "answer", id, what, status, contentType, body } satisfies Answer);
    };
    if (what === "healthz") return reply(200, "text/plain", "ok\n");
    if (what === "readyz") {
      const ready = options.ready();
      return reply(ready ? 200 : 503, "text/plain", ready ? "ready\n" : "not ready\n");
    }
    const render = (): void => {
      const started = performance.now();
      let scraped: Promise<{ readonly text: string; readonly contentType: string }>;
      try {
        scraped = options.scrape();
      } catch (error) {
        scraped = Promise.reject(error);
      }
      void scraped
        .then(
          ({ text, contentType }) => reply(200, contentType, text),
          (error: unknown) => {
            options.log.warn("metrics scrape failed", { error });
            reply(500, "text/plain", "metrics scrape failed\n");
          },
        )
        .finally(() => (nextRender = performance.now() + Math.min(renderGapMaxMs, renderGapFactor * (performance.now() - started))));
    };
    const wait = nextRender - performance.now();
    if (wait <= 0) return render();
    const timer = setTimeout(() => {
      delayed.delete(timer);
      if (!closing) render();
    }, wait);
    timer.unref();
    delayed.add(timer);
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
      for (const timer of delayed) clearTimeout(timer);
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
