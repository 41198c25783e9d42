import { once } from "node:events";
import { createServer, type AddressInfo, type Socket } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { mutateBytes, splitWrites } from "./h1-inputs.js";
import type { Rng } from "./rng.js";
import { hostName, type FuzzWorld } from "./world.js";

/**
 * TLS ClientHello inputs (the proxy reads the SNI itself, src/tls/client-hello.ts, before any
 * TLS work): Node's own ClientHello for `api.test`, rebuilt with other server_name lists (other
 * names, odd spellings, two names, other name types, two extensions, none), cut into records of
 * random sizes, and with bytes flipped.
 */
export interface HelloCase {
  readonly authority: string;
  readonly writes: readonly Buffer[];
  /** Whether some name in the hello is the CONNECT target's: otherwise a ServerHello is a finding. */
  readonly targetNamed: boolean;
  readonly steps: readonly string[];
}

/** Node's ClientHello for `servername`, captured from a listener that answers nothing. */
export async function captureClientHello(servername: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let done: () => void = () => undefined;
  const got = new Promise<void>((resolve) => (done = resolve));
  const server = createServer((socket: Socket) => {
    socket.on("data", (chunk: Buffer) => {
      chunks.push(chunk);
      const all = Buffer.concat(chunks);
      if (all.length >= 5 && all.length >= 5 + all.readUInt16BE(3)) {
        done();
        socket.destroy();
      }
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const client = tlsConnect({ host: "127.0.0.1", port: (server.address() as AddressInfo).port, servername, ALPNProtocols: ["http/1.1"], rejectUnauthorized: false });
  client.on("error", () => undefined);
  await got;
  client.destroy();
  server.close();
  return Buffer.concat(chunks);
}

interface HelloParts {
  /** Handshake body before the extensions block (version, random, session id, suites, compression). */
  readonly prefix: Buffer;
  readonly extensions: { type: number; data: Buffer }[];
}

function splitHello(record: Buffer): HelloParts {
  const body = record.subarray(9, 9 + record.readUIntBE(6, 3));
  let at = 34;
  at += 1 + body[at]!;
  at += 2 + body.readUInt16BE(at);
  at += 1 + body[at]!;
  const prefix = body.subarray(0, at);
  const end = at + 2 + body.readUInt16BE(at);
  const extensions: { type: number; data: Buffer }[] = [];
  for (at += 2; at < end; ) {
    const length = body.readUInt16BE(at + 2);
    extensions.push({ type: body.readUInt16BE(at), data: body.subarray(at + 4, at + 4 + length) });
    at += 4 + length;
  }
  return { prefix, extensions };
}

function u16(n: number): Buffer {
  const out = Buffer.alloc(2);
  out.writeUInt16BE(n & 0xffff, 0);
  return out;
}

function serverNameData(entries: readonly { type: number; name: Buffer }[]): Buffer {
  const list = Buffer.concat(entries.map((e) => Buffer.concat([Buffer.from([e.type]), u16(e.name.length), e.name])));
  return Buffer.concat([u16(list.length), list]);
}

function buildHello(parts: HelloParts, recordVersion: number): Buffer {
  const extensions = Buffer.concat(parts.extensions.map((e) => Buffer.concat([u16(e.type), u16(e.data.length), e.data])));
  const body = Buffer.concat([parts.prefix, u16(extensions.length), extensions]);
  const handshake = Buffer.concat([Buffer.from([0x01, (body.length >> 16) & 0xff, (body.length >> 8) & 0xff, body.length & 0xff]), body]);
  return Buffer.concat([Buffer.from([0x16, 0x03, recordVersion]), u16(handshake.length), handshake]);
}

/** Cuts one record's handshake bytes into several records (RFC 8446 §5.1 allows it). */
function fragment(rng: Rng, record: Buffer, steps: string[]): Buffer {
  const handshake = record.subarray(5);
  const out: Buffer[] = [];
  for (let at = 0; at < handshake.length; ) {
    const size = Math.min(handshake.length - at, rng.pick([1, 5, 63, 64, 100, 512, 4096]));
    out.push(Buffer.concat([record.subarray(0, 3), u16(size), handshake.subarray(at, at + size)]));
    at += size;
  }
  steps.push(`${out.length} records`);
  return Buffer.concat(out);
}

const oddNames = ["API.TEST", "api.test.", "denied.test", "api.test\u0000", "api.test:443", "[::1]", "::1", "127.0.0.3", "127.0.0.1", "", "a".repeat(300), "api.test\u0000.denied.test", "api%2etest", "api.test\\", "xn--api-.test", "api.tést", "*.test", "api.test..", "API.test:65536", "[api.test]:1"];

/** Target `tls`: CONNECT to `api.test` (unmutated), then a mutated ClientHello, then the guest's end. */
export function helloCase(rng: Rng, world: FuzzWorld, captured: Buffer): HelloCase {
  const authority = `${hostName("api")}:${world.ports.api.tls}`;
  const steps: string[] = [`tunnel to ${authority}`];
  const parts = splitHello(captured);
  const sni = parts.extensions.findIndex((e) => e.type === 0);
  const names: { type: number; name: Buffer }[] = [{ type: 0, name: Buffer.from("api.test") }];
  const choice = rng.int(8);
  if (choice === 0) {
    names[0] = { type: 0, name: Buffer.from(rng.pick(oddNames), "latin1") };
  } else if (choice === 1) {
    names.push({ type: 0, name: Buffer.from(rng.pick(oddNames), "latin1") });
    if (rng.chance(0.5)) names.reverse();
  } else if (choice === 2) {
    names.unshift({ type: rng.pick([1, 2, 255]), name: Buffer.from(rng.pick(["denied.test", "api.test"])) });
  }
  steps.push(`server_name ${JSON.stringify(names.map((n) => `${n.type}:${n.name.toString("latin1").slice(0, 40)}`))}`);
  const extensions = [...parts.extensions];
  if (sni >= 0) extensions[sni] = { type: 0, data: serverNameData(names) };
  if (choice === 3) {
    extensions.splice(sni, 1);
    steps.push("no server_name");
  } else if (choice === 4) {
    extensions.push({ type: 0, data: serverNameData([{ type: 0, name: Buffer.from(rng.pick(["denied.test", "api.test"])) }]) });
    steps.push("two server_name extensions");
  } else if (choice === 5) {
    extensions.unshift({ type: rng.pick([0x0010, 0xfe0d, 0x1234]), data: rng.bytes(rng.pick([0, 3, 300])) });
    steps.push("an extension before");
  }
  let bytes = buildHello({ prefix: parts.prefix, extensions }, rng.pick([1, 1, 3, 3, 0, 4]));
  // As the proxy reads an SNI (tunnel.ts, sniHostname): `host:port` names the host, any case, one trailing dot.
  const named = (name: Buffer): boolean => name.toString("latin1").toLowerCase().replace(/:[0-9]*$/, "").replace(/\.$/, "") === "api.test";
  let targetNamed = choice === 3 || names.some((n) => n.type === 0 && named(n.name));
  if (rng.chance(0.3)) bytes = fragment(rng, bytes, steps);
  if (rng.chance(0.3)) {
    bytes = mutateBytes(rng, bytes, steps, 2);
    // A flipped byte may spell the name anew: no judging what the handshake may do then.
    targetNamed = true;
  }
  if (rng.chance(0.1)) bytes = Buffer.concat([bytes, Buffer.from("GET / HTTP/1.1\r\nHost: api.test\r\n\r\n")]);
  return { authority, writes: splitWrites(rng, bytes, steps), targetNamed, steps };
}
