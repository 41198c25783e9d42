/**
 * The bench's external decider: a local webhook that allows every request, as a decision
 * service on the same machine would (200 with `{"decision":"allow"}`, keep-alive). It runs in a
 * process of its own, like the upstream, so its CPU is not the proxy's; bench/targets.ts starts
 * it for the `egressgate+webhook` target and passes its URL to bench/hooked-proxy.ts.
 *
 *   node decider-webhook.mjs     prints `decider webhook listening on http://127.0.0.1:PORT`
 */
import { createServer } from "node:http";

const answer = Buffer.from('{"decision":"allow"}');
const server = createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
  // The document is read whole (a decision service parses it), then answered.
  req.on("data", () => undefined);
  req.on("end", () => {
    res.writeHead(200, { "content-type": "application/json", "content-length": answer.length });
    res.end(answer);
  });
  req.on("error", () => undefined);
});
server.on("clientError", (_error, socket) => socket.destroy());
server.listen(0, "127.0.0.1", () => {
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  process.stdout.write(`decider webhook listening on http://127.0.0.1:${port}\n`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
