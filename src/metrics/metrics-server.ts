import { createServer, type Server } from "node:http";
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

/**
 * The operator's listener (`--metrics-listen`): `/metrics`, `/healthz` and `/readyz`, on a socket
 * of its own. It is not the proxy's listener, so a guest cannot reach it as a proxy request; the
 * proxy also refuses it as a target (its address joins the proxy's own, which are always refused).
 */
export async function startMetricsServer(options: MetricsServerOptions): Promise<MetricsServer> {
  const server: Server = createServer((req, res) => {
    res.on("error", () => undefined);
    const path = (req.url ?? "/").split("?")[0];
    if (req.method !== "GET" && req.method !== "HEAD") {
      res.writeHead(405, { allow: "GET, HEAD", "content-type": "text/plain" }).end("method not allowed\n");
      return;
    }
    if (path === "/healthz") {
      res.writeHead(200, { "content-type": "text/plain" }).end("ok\n");
      return;
    }
    if (path === "/readyz") {
      const ready = options.ready();
      res.writeHead(ready ? 200 : 503, { "content-type": "text/plain" }).end(ready ? "ready\n" : "not ready\n");
      return;
    }
    if (path === "/metrics") {
      options.scrape().then(
        ({ text, contentType }) => res.writeHead(200, { "content-type": contentType }).end(text),
        (error: unknown) => {
          options.log.warn("metrics scrape failed", { error });
          if (!res.headersSent) res.writeHead(500, { "content-type": "text/plain" });
          res.end("metrics scrape failed\n");
        },
      );
      return;
    }
    res.writeHead(404, { "content-type": "text/plain" }).end("not found: /metrics, /healthz, /readyz\n");
  });
  server.on("clientError", (_error, socket) => socket.destroy());
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port, options.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  server.on("error", (error) => options.log.warn("metrics listener error", { error }));
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("unexpected metrics listen address");
  const host = address.family === "IPv6" ? `[${address.address}]` : address.address;
  return {
    host: address.address,
    port: address.port,
    url: `http://${host}:${address.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
