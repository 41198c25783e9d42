/**
 * What HTTP/2 guests that reconnect again and again leave in the proxy. Each guest opens a
 * connection through a CONNECT tunnel, never acknowledges the proxy's SETTINGS, writes `--bombs`
 * HPACK bombs (streams referencing one 4 KB table entry 250 times: 1 MB decoded from 300 bytes)
 * every 20 ms until the proxy closes the connection, and reconnects at once. With `--bombs 0`
 * each connection says its preface, waits 50 ms and closes. A bystander on a connection of its
 * own sends one request after another; its slowest answer is printed.
 *
 *   node --import tsx bench/h2-reconnect-rss.ts [--guests 4] [--seconds 8] [--rounds 3] [--bombs 40]
 *
 * The proxy runs in a child process with --expose-gc. After each round it is collected twice and
 * its RSS, JS heap and main malloc arena (`[heap]` in /proc/PID/smaps) are printed. Figures are in
 * docs/reliability.md (eighth session).
 */
import { fork } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, readFileSync } from "node:fs";
import { createServer } from "node:https";
import { connect as h2Connect } from "node:http2";
import { connect as netConnect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect as tlsConnect, type TLSSocket } from "node:tls";
import { parseArgs } from "node:util";
import { createHttpHooks, startProxy } from "../src/index.js";
import { createCaCertificate, importKeyPair, LeafSigner, parseCertificate } from "../src/tls/x509.js";

interface Reading {
  readonly rss: number;
  readonly heapUsed: number;
  readonly mallocHeap: number;
}

const mib = (bytes: number): string => (bytes / 1048576).toFixed(1);

/** The main malloc arena: the `[heap]` mapping's resident bytes. */
function mallocHeapBytes(): number {
  let inHeap = false;
  let bytes = 0;
  for (const line of readFileSync("/proc/self/smaps", "utf8").split("\n")) {
    if (/^[0-9a-f]+-[0-9a-f]+ /.test(line)) inHeap = line.trimEnd().endsWith("[heap]");
    else if (inHeap && line.startsWith("Rss:")) bytes += Number(line.split(/\s+/)[1]) * 1024;
  }
  return bytes;
}

async function child(upstreamCa: string): Promise<void> {
  const { httpHooks, env } = createHttpHooks({ allowedInternalHosts: ["api.test"] });
  const proxy = await startProxy({
    httpHooks,
    env,
    listen: { host: "127.0.0.1", port: 0 },
    caDir: mkdtempSync(join(tmpdir(), "egressgate-h2-rss-")),
    upstreamCa: [upstreamCa],
    logSink: () => undefined,
    resolve: { "api.test": ["127.0.0.1"] },
  });
  const gc = (globalThis as { gc?: () => void }).gc!;
  process.on("message", () => {
    gc();
    gc();
    const { rss, heapUsed } = process.memoryUsage();
    process.send!({ rss, heapUsed, mallocHeap: mallocHeapBytes() } satisfies Reading);
  });
  process.send!({ port: proxy.port, ca: proxy.caCertPem });
}

/** An HPACK integer with an N-bit prefix (RFC 7541 §5.1). */
function hpackInteger(value: number, prefixBits: number, first: number): Buffer {
  const max = (1 << prefixBits) - 1;
  if (value < max) return Buffer.from([first | value]);
  const bytes = [first | max];
  let rest = value - max;
  for (; rest >= 128; rest = Math.floor(rest / 128)) bytes.push((rest % 128) + 128);
  bytes.push(rest);
  return Buffer.from(bytes);
}

function field(name: string, value: string, indexing: boolean): Buffer {
  const string = (text: string): Buffer => Buffer.concat([hpackInteger(text.length, 7, 0), Buffer.from(text, "latin1")]);
  return Buffer.concat([Buffer.from([indexing ? 0x40 : 0x00]), string(name), string(value)]);
}

function frame(type: number, flags: number, streamId: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head[3] = type;
  head[4] = flags;
  head.writeUInt32BE(streamId, 5);
  return Buffer.concat([head, payload]);
}

/** `count` GET streams, each pointing 250 times at one 4 KB dynamic-table entry (index 62). */
function bombs(authority: string, count: number): Buffer {
  const frames: Buffer[] = [];
  for (let i = 0; i < count; i++) {
    const head = [field(":method", "GET", false), field(":scheme", "https", false), field(":authority", authority, false), field(":path", "/attack", false)];
    const refs = Array.from({ length: i === 0 ? 249 : 250 }, () => hpackInteger(62, 7, 0x80));
    frames.push(frame(0x1, 0x4 | 0x1, 2 * i + 1, Buffer.concat([...head, ...(i === 0 ? [field("x-bomb", "b".repeat(4000), true)] : []), ...refs])));
  }
  return Buffer.concat(frames);
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { guests: { type: "string", default: "4" }, seconds: { type: "string", default: "8" }, rounds: { type: "string", default: "3" }, bombs: { type: "string", default: "40" } } });
  const guests = Number(values.guests);
  const seconds = Number(values.seconds);
  const rounds = Number(values.rounds);
  const perWrite = Number(values.bombs);

  const caPems = await createCaCertificate("egressgate bench upstream CA");
  const signer = await LeafSigner.create({ cert: parseCertificate(caPems.certPem), key: await importKeyPair(caPems.keyPem) }, "ecdsa");
  const leaf = await signer.sign("api.test", 30);
  const upstream = createServer({ key: signer.leafKey.privateKeyPem, cert: leaf.certPem }, (req, res) => {
    req.resume();
    req.on("end", () => res.end("ok"));
  });
  await new Promise<void>((resolve) => upstream.listen(0, "127.0.0.1", resolve));
  const authority = `api.test:${(upstream.address() as { port: number }).port}`;

  const proxy = fork(new URL(import.meta.url).pathname, ["--child", caPems.certPem], { execArgv: ["--import", "tsx", "--expose-gc"], stdio: ["ignore", "inherit", "inherit", "ipc"] });
  const [ready] = (await once(proxy, "message")) as [{ port: number; ca: string }];
  const measure = async (): Promise<Reading> => {
    proxy.send("measure");
    return ((await once(proxy, "message")) as [Reading])[0];
  };
  const tunnel = async (): Promise<TLSSocket> => {
    const plain = netConnect({ host: "127.0.0.1", port: ready.port });
    await once(plain, "connect");
    plain.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
    let head = "";
    while (!head.includes("\r\n\r\n")) head += ((await once(plain, "data")) as [Buffer])[0].toString("latin1");
    const socket = tlsConnect({ socket: plain, servername: "api.test", ca: ready.ca, ALPNProtocols: ["h2"] });
    await once(socket, "secureConnect");
    socket.on("error", () => undefined);
    return socket;
  };

  const session = h2Connect(`https://${authority}`, { createConnection: await tunnel().then((s) => () => s) });
  session.on("error", () => undefined);
  const ask = (): Promise<number> =>
    new Promise((resolve, reject) => {
      const started = performance.now();
      const stream = session.request({ ":path": "/echo" });
      stream.on("error", reject);
      stream.resume();
      stream.on("end", () => resolve(performance.now() - started));
    });
  await ask();
  const show = (label: string, r: Reading): void => console.log(`${label}: RSS ${mib(r.rss)} MiB, JS heap ${mib(r.heapUsed)} MiB, malloc [heap] ${mib(r.mallocHeap)} MiB`);
  show("start", await measure());

  const payload = bombs(authority, perWrite);
  const preface = Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1"), frame(0x4, 0, 0, Buffer.alloc(0))]);
  for (let round = 1; round <= rounds; round++) {
    const end = Date.now() + seconds * 1000;
    let connections = 0;
    let slowest = 0;
    let stopping = false;
    const bystander = (async () => {
      while (!stopping) slowest = Math.max(slowest, await ask());
    })();
    await Promise.all(
      Array.from({ length: guests }, async () => {
        while (Date.now() < end) {
          const socket = await tunnel();
          connections++;
          socket.resume();
          socket.write(preface);
          if (perWrite === 0) await new Promise((resolve) => setTimeout(resolve, 50));
          else while (!socket.destroyed && socket.writable && Date.now() < end) {
            socket.write(payload);
            await new Promise((resolve) => setTimeout(resolve, 20));
          }
          socket.destroy();
        }
      }),
    );
    stopping = true;
    await bystander;
    show(`round ${round}: ${connections} connections, the bystander's slowest answer ${slowest.toFixed(0)} ms`, await measure());
  }
  session.destroy();
  upstream.close();
  proxy.kill("SIGKILL");
}

if (process.argv[2] === "--child") await child(process.argv[3]!);
else await main();
