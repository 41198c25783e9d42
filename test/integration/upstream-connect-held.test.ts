import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { describe, expect, it, onTestFinished } from "vitest";
import { curlVia } from "../helpers/curl.js";
import { startTestProxy } from "../helpers/proxy.js";
import { testCa } from "../helpers/test-ca.js";

// An upstream connect judged while the proxy's event loop was held (a starved host, a long
// parse): the timer comes due before the poll that reads the server's handshake, which had come
// in time. Here the upstream is another process, so it answers while this one (the proxy's) is
// held; it holds its answer until told, so the hold starts before the answer and outlasts the
// deadline.

/** An HTTPS upstream in a child process: it says `accepted` once a connection's ClientHello is in, and answers it only on a `go` line. */
async function heldUpstream(): Promise<{ port: number; accepted: Promise<void>; go: () => Promise<void> }> {
  const credentials = (await (await testCa()).serverCredentials(["api.test"])).get("api.test")!;
  // It says `accepted` once the ClientHello is in its kernel (read from /proc/net/tcp, not from
  // the socket, which stays unread until `go`): the proxy has written it, and waits for the answer.
  const script = `
    const net = require("node:net"), https = require("node:https"), fs = require("node:fs");
    const web = https.createServer({ key: process.env.KEY, cert: process.env.CERT }, (req, res) => { req.resume(); req.on("end", () => res.end("held upstream")); });
    const hex = (port) => "0100007F:" + port.toString(16).toUpperCase().padStart(4, "0");
    const unread = (local, remote) => {
      for (const line of fs.readFileSync("/proc/net/tcp", "utf8").split("\\n").slice(1)) {
        const f = line.trim().split(/\\s+/);
        if (f[1] === hex(local) && f[2] === hex(remote)) return parseInt(f[4].split(":")[1], 16);
      }
      return 0;
    };
    const waiting = [];
    process.stdin.on("data", () => { for (const socket of waiting.splice(0)) web.emit("connection", socket); });
    const server = net.createServer({ pauseOnConnect: true }, (socket) => {
      const look = () => {
        if (unread(server.address().port, socket.remotePort) === 0) return void setTimeout(look, 5);
        waiting.push(socket);
        process.stdout.write("accepted\\n");
      };
      look();
    });
    server.listen(0, "127.0.0.1", () => process.stdout.write("port " + server.address().port + "\\n"));`;
  const child = spawn(process.execPath, ["-e", script], { env: { KEY: credentials.key, CERT: credentials.cert }, stdio: ["pipe", "pipe", "inherit"] });
  onTestFinished(() => {
    child.kill("SIGKILL");
  });
  let said = "";
  let onPort!: (port: number) => void;
  let onAccepted!: () => void;
  const port = new Promise<number>((resolve) => (onPort = resolve));
  const accepted = new Promise<void>((resolve) => (onAccepted = resolve));
  child.stdout.on("data", (chunk: Buffer) => {
    said += chunk.toString("utf8");
    const match = /port (\d+)\n/.exec(said);
    if (match !== null) onPort(Number(match[1]));
    if (said.includes("accepted\n")) onAccepted();
  });
  return { port: await port, accepted, go: () => new Promise<void>((resolve) => child.stdin.write("go\n", () => resolve())) };
}

/** Bytes the kernel holds unread for this process's connection to 127.0.0.1:`port` (/proc/net/tcp's rx_queue). */
function unreadFrom(port: number): number {
  const remote = `0100007F:${port.toString(16).toUpperCase().padStart(4, "0")}`;
  for (const line of readFileSync("/proc/net/tcp", "utf8").split("\n").slice(1)) {
    const fields = line.trim().split(/\s+/);
    if (fields[2] === remote) return parseInt(fields[4]!.split(":")[1]!, 16);
  }
  return 0;
}

describe("an upstream connect whose deadline passed while the proxy's event loop was held", () => {
  it("completes with the server handshake that came in time, not a 504", async () => {
    const upstream = await heldUpstream();
    const upstreamConnectMs = 1_000;
    const proxy = await startTestProxy({ allowedInternalHosts: ["api.test"] }, { timeouts: { upstreamConnectMs } });
    const answer = curlVia(proxy.url, proxy.caCertPath, `https://api.test:${upstream.port}/held`);
    await upstream.accepted;
    const heldFrom = performance.now();
    await upstream.go();
    // Held past the deadline (the dial came before the upstream's accept), and until the
    // upstream's handshake sits unread in the kernel: the proxy reads it only after the hold.
    while (performance.now() - heldFrom < upstreamConnectMs * 1.5 || unreadFrom(upstream.port) === 0) {
      // Busy: nothing of this process runs meanwhile.
    }
    const result = await answer;
    expect(result.status, JSON.stringify(proxy.logs.filter((l) => l["status"] !== undefined))).toBe(200);
    expect(result.body).toBe("held upstream");
  });
});
