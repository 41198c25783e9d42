import type { Rng } from "./rng.js";
import { hostName, tagged, type FuzzWorld, type UpstreamName } from "./world.js";

/**
 * HTTP/1.1 inputs for the fuzzer: a valid request (or a pipelined pair) built from fields, then
 * mutated twice over: as fields (duplicated, removed, odd Content-Length and Transfer-Encoding,
 * obs-fold, placeholders sprinkled) and as bytes (flips, inserted CR, LF, NUL, SP, HTAB, colon
 * and high bytes, cuts), and written in pieces split at random points.
 */
export interface H1Case {
  /**
   * `tunnel`: CONNECT (unmutated) then TLS, and `writes` inside; `listener`: `writes` on the
   * proxy's listener as they are (absolute-form requests, or a mutated CONNECT).
   */
  readonly via: "tunnel" | "listener";
  /** For `tunnel`: the CONNECT target. */
  readonly connect?: { readonly name: UpstreamName; readonly authority: string };
  readonly writes: readonly Buffer[];
  /** For a CONNECT on the listener: what is written inside once it is answered 200 (plain or after TLS). */
  readonly inside?: { readonly tls: boolean; readonly servername: string; readonly bytes: Buffer };
  /** The content each request left valid (`seq=N`) must reach its upstream with. */
  readonly bodies?: ReadonlyMap<number, string>;
  /** What was done, for the report. */
  readonly steps: readonly string[];
}

type Field = [name: string, value: string];

interface Message {
  method: string;
  target: string;
  version: string;
  fields: Field[];
  body: string;
  /** The content `body` frames (the chunks' data for a chunked body): what the upstream must get. */
  payload: string;
}

const methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"];

/** A path: plain, or `/r/STATUS/N`, which the upstream answers with a redirect the proxy follows (world.ts). */
export function fuzzPath(rng: Rng, world: FuzzWorld): string {
  if (rng.chance(0.3)) return tagged(world, `/r/${rng.pick([301, 302, 303, 307, 308])}/${rng.int(13)}`);
  return tagged(world, rng.pick(["/", "/a?x=1", "/echo"]));
}

/** Content-Length values a parser may read differently from the next hop. */
const oddLengths = ["99999999999999999999", "-1", "+5", "0x5", " 5", "5, 5", "5 5", "05", "", "5\t", "1e1", "٥", "4294967301", "18446744073709551621", "0"];

const oddTransferEncodings = [
  "chunked",
  "Chunked",
  " chunked",
  "chunked, chunked",
  "gzip, chunked",
  "chunked, gzip",
  "chunked\t",
  "identity",
  "xchunked",
  "chunked;q=1",
  "\u000bchunked",
  "chunke",
  "chunked\u0000",
];

const oddChunkedBodies = [
  "5\r\nhello\r\n0\r\n\r\n",
  "5;ext=1\r\nhello\r\n0\r\n\r\n",
  "5 \r\nhello\r\n0\r\n\r\n",
  "0x5\r\nhello\r\n0\r\n\r\n",
  "-5\r\nhello\r\n0\r\n\r\n",
  "ffffffffffffffff1\r\nhello\r\n0\r\n\r\n",
  "5\r\nhello\r\n0\r\nX-Trailer: PLACEHOLDER\r\n\r\n",
  "5\nhello\n0\n\n",
  "5\r\nhelloXX0\r\n\r\n",
  "5\r\nhello\r\n0\r\n",
  "3\r\nhello\r\n0\r\n\r\n",
  "5\r\nhello\r\n",
  "000000000000000000005\r\nhello\r\n0\r\n\r\n",
];

const insertable = ["\r", "\n", "\u0000", " ", "\t", ":", "\r\n", "\r\n ", "\r\n\t", ",", "\u0080", "\u00ff", "\u00e9", ";", "@", "%00", "\r\n\r\n"];

function authorityOf(world: FuzzWorld, name: UpstreamName, tls: boolean): string {
  const ports = world.ports[name];
  return `${hostName(name)}:${tls ? ports.tls : ports.plain}`;
}

/** The guest's credentials (`--auth`), now and then spelt oddly or wrong. */
export function credentials(rng: Rng, valid: string): string {
  // Rarely: past a few failures a second the proxy answers 429 to the address, valid credentials too.
  if (rng.chance(0.96)) return valid;
  const token = valid.slice("Basic ".length);
  const decoded = Buffer.from(token, "base64").toString("latin1");
  return rng.pick([
    `basic ${token}`,
    `Basic  ${token}`,
    `Basic ${token}==`,
    `Basic ${Buffer.from(decoded.toUpperCase()).toString("base64")}`,
    `Basic ${Buffer.from(`${decoded}x`).toString("base64")}`,
    `Basic ${Buffer.from(decoded.replace(":", "")).toString("base64")}`,
    `Bearer ${token}`,
    `${valid}, ${valid}`,
    `Basic ${token.slice(0, -2)}`,
    "Basic",
    "",
  ]);
}

function baseMessage(rng: Rng, world: FuzzWorld, host: string, target: string, on: "listener" | "tunnel" = "tunnel"): Message {
  const method = rng.chance(0.6) ? rng.pick(["GET", "POST"]) : rng.pick(methods);
  const fields: Field[] = [
    ["Host", host],
    ["User-Agent", "fuzz/1"],
    ["Accept", "*/*"],
  ];
  const p = world.placeholder;
  if (rng.chance(0.35)) fields.push(["Authorization", rng.chance(0.5) ? `Bearer ${p}` : `Basic ${Buffer.from(`u:${p}`).toString("base64")}`]);
  if (rng.chance(0.25)) fields.push(["X-Token", p]);
  if (rng.chance(0.2)) fields.push(["Cookie", `a=${p}; b=1`]);
  if (rng.chance(0.2)) fields.push(["Connection", rng.pick(["keep-alive", "close", "X-Token", "Upgrade", "keep-alive, X-Token"])]);
  if (rng.chance(0.1)) fields.push(["Upgrade", rng.pick(["websocket", "h2c", "foo"])]);
  if (rng.chance(0.12)) {
    // A WebSocket upgrade: the proxy writes this head upstream itself (src/proxy/upgrade.ts), and
    // the fuzz upstream switches (world.ts), so what follows is relayed as it is.
    fields.push(["Connection", rng.pick(["Upgrade", "keep-alive, Upgrade", "upgrade"])], ["Upgrade", rng.pick(["websocket", "WebSocket", " websocket "])]);
    fields.push(["Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="], ["Sec-WebSocket-Version", "13"]);
    if (rng.chance(0.3)) fields.push(["Sec-WebSocket-Protocol", rng.chance(0.5) ? p : "chat"]);
  }
  if (rng.chance(0.1)) fields.push(["Expect", rng.pick(["100-continue", "100-Continue", "200-ok"])]);
  if (rng.chance(0.1)) fields.push(["Proxy-Authorization", `Basic ${Buffer.from(`u:${p}`).toString("base64")}`]);
  if (world.proxyAuthorization !== undefined && on === "listener") fields.splice(1, 0, ["Proxy-Authorization", credentials(rng, world.proxyAuthorization)]);
  let body = "";
  let payload = "";
  if (method !== "GET" && method !== "HEAD" && rng.chance(0.8)) {
    body = payload = rng.chance(0.3) ? `a=${p}` : "hello";
    if (rng.chance(0.3)) {
      fields.push(["Transfer-Encoding", "chunked"]);
      body = `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
    } else fields.push(["Content-Length", String(body.length)]);
  }
  return { method, target, version: "HTTP/1.1", fields, body, payload };
}

function render(message: Message): Buffer {
  const head = `${message.method} ${message.target} ${message.version}\r\n${message.fields.map(([n, v]) => `${n}: ${v}\r\n`).join("")}\r\n`;
  return Buffer.from(head + message.body, "latin1");
}

/** Field-level mutations, each a small change a parser may get wrong. */
function mutateFields(rng: Rng, world: FuzzWorld, message: Message, steps: string[]): void {
  const p = world.placeholder;
  const count = rng.chance(0.4) ? 0 : rng.range(1, 3);
  for (let i = 0; i < count; i++) {
    const fields = message.fields;
    const op = rng.int(17);
    const at = rng.int(Math.max(1, fields.length));
    switch (op) {
      case 0:
        if (fields[at] !== undefined) {
          fields.splice(at, 0, [...fields[at]!]);
          steps.push(`duplicate field ${fields[at]![0]}`);
        }
        break;
      case 1:
        if (fields[at] !== undefined) {
          steps.push(`remove field ${fields[at]![0]}`);
          fields.splice(at, 1);
        }
        break;
      case 2: {
        const value = rng.pick(oddLengths);
        fields.push(["Content-Length", value]);
        steps.push(`Content-Length ${JSON.stringify(value)}`);
        break;
      }
      case 3: {
        const value = rng.pick(oddTransferEncodings);
        fields.push(["Transfer-Encoding", value]);
        if (rng.chance(0.6)) message.body = rng.pick(oddChunkedBodies).replace("PLACEHOLDER", p);
        steps.push(`Transfer-Encoding ${JSON.stringify(value)}`);
        break;
      }
      case 4:
        if (fields[at] !== undefined) {
          // obs-fold (RFC 9112 §5.2): a value continued on the next line.
          fields[at] = [fields[at]![0], `${fields[at]![1]}\r\n ${rng.chance(0.5) ? p : "folded"}`];
          steps.push(`obs-fold in ${fields[at]![0]}`);
        }
        break;
      case 5:
        if (fields[at] !== undefined) {
          fields[at] = [`${fields[at]![0]}${rng.pick([" ", "\t", "\u0000", "\u00e9"])}`, fields[at]![1]];
          steps.push(`odd byte after name ${JSON.stringify(fields[at]![0])}`);
        }
        break;
      case 6: {
        const name = rng.pick(["X-Token", "Authorization", "Cookie", "Host", "Via", "Forwarded", "X-Forwarded-For", "Te", "Trailer"]);
        fields.splice(at, 0, [name, rng.pick([p, `${p}${p}`, `x${p}y`, `Bearer ${p}`, `Basic ${Buffer.from(`${p}:${p}`).toString("base64")}`])]);
        steps.push(`placeholder in ${name}`);
        break;
      }
      case 7: {
        const host = rng.pick([
          hostName("denied") + `:${world.ports.denied.tls}`,
          hostName("secret") + `:${world.ports.secret.tls}`,
          "API.TEST",
          "api.test.",
          `u:${p}@api.test`,
          `api.test:${world.ports.api.tls}@denied.test`,
          "[::1]",
          "127.0.0.3",
          "api.test:0",
          "api.test:99999",
          "api.test:-1",
          "api%2etest",
          "a".repeat(300) + ".test",
          "",
          "api.test\\@denied.test",
        ]);
        const index = fields.findIndex(([n]) => n.toLowerCase() === "host");
        if (index >= 0) fields[index] = ["Host", host];
        else fields.push(["Host", host]);
        steps.push(`Host ${JSON.stringify(host)}`);
        break;
      }
      case 8:
        message.method = rng.pick(["TRACE", "CONNECT", "get", "G ET", "PRI", "M-SEARCH", "GET\u0000", "PROPFIND", "QUERY", "X".repeat(40)]);
        steps.push(`method ${JSON.stringify(message.method)}`);
        break;
      case 9:
        message.version = rng.pick(["HTTP/1.0", "HTTP/1.2", "HTTP/2.0", "http/1.1", "HTTP/1.1 ", "HTTP/1", "HTTP/0.9", "HTTP/11"]);
        steps.push(`version ${JSON.stringify(message.version)}`);
        break;
      case 10:
        message.target = rng.pick([
          `http://${authorityOf(world, "denied", false)}/x`,
          `https://${authorityOf(world, "denied", true)}/x`,
          `http://${authorityOf(world, "secret", false)}/x`,
          `http://${authorityOf(world, "api", false)}/${p}`,
          "*",
          "api.test:443",
          `/?q=${p}`,
          "/a b",
          "/%0d%0aX-Injected:%201",
          "//denied.test/x",
          "/\u00e9",
          `/${"a".repeat(9000)}`,
          "http://api.test@denied.test/",
          "/#frag",
        ]);
        steps.push(`target ${JSON.stringify(message.target.slice(0, 80))}`);
        break;
      case 11:
        fields.splice(at, 0, [rng.pick(["X-Many", "Cookie", "Accept"]), "v".repeat(rng.pick([10, 8000, 70_000]))]);
        steps.push("long field");
        break;
      case 12:
        for (let n = rng.pick([50, 500, 1100]); n > 0; n--) fields.push([`X-F${n}`, "1"]);
        steps.push("many fields");
        break;
      case 13:
        fields.push(["Content-Length", "5"], ["Transfer-Encoding", rng.pick(oddTransferEncodings)]);
        message.body = rng.pick(["hello", ...oddChunkedBodies]).replace("PLACEHOLDER", p);
        steps.push("Content-Length and Transfer-Encoding");
        break;
      case 14:
        if (fields[at] !== undefined) {
          fields[at] = [fields[at]![0], ` ${fields[at]![1]}${rng.pick(["\t", " ", "\u0000", "\u007f", "\u00ff"])}`];
          steps.push(`odd bytes around value of ${fields[at]![0]}`);
        }
        break;
      case 15:
        fields.push([rng.pick(["Connection", "Keep-Alive", "Proxy-Connection", "TE", "Upgrade"]), rng.pick(["close", "X-Token, Host", "Content-Length", "Transfer-Encoding", "trailers", "Authorization"])]);
        steps.push("hop-by-hop field");
        break;
      default:
        if (fields.length > 1) {
          const a = rng.int(fields.length);
          const b = rng.int(fields.length);
          [fields[a], fields[b]] = [fields[b]!, fields[a]!];
          steps.push("swap fields");
        }
    }
  }
}

/** Byte-level mutations of the rendered request. */
export function mutateBytes(rng: Rng, bytes: Buffer, steps: string[], maxOps = 3): Buffer {
  let out = bytes;
  const count = rng.range(0, maxOps);
  for (let i = 0; i < count && out.length > 0; i++) {
    const at = rng.int(out.length);
    switch (rng.int(7)) {
      case 0: {
        out = Buffer.from(out);
        out[at] = out[at]! ^ (1 << rng.int(8));
        steps.push(`flip bit at ${at}`);
        break;
      }
      case 1: {
        out = Buffer.from(out);
        out[at] = rng.int(256);
        steps.push(`byte ${out[at]} at ${at}`);
        break;
      }
      case 2:
      case 3: {
        const text = rng.pick(insertable);
        out = Buffer.concat([out.subarray(0, at), Buffer.from(text, "latin1"), out.subarray(at)]);
        steps.push(`insert ${JSON.stringify(text)} at ${at}`);
        break;
      }
      case 4: {
        const n = rng.range(1, 8);
        out = Buffer.concat([out.subarray(0, at), out.subarray(at + n)]);
        steps.push(`delete ${n} at ${at}`);
        break;
      }
      case 5: {
        const n = rng.range(1, 24);
        out = Buffer.concat([out.subarray(0, at + n), out.subarray(at, at + n), out.subarray(at + n)]);
        steps.push(`repeat ${n} at ${at}`);
        break;
      }
      default:
        if (rng.chance(0.3)) {
          out = out.subarray(0, at);
          steps.push(`truncate at ${at}`);
        }
    }
  }
  return out;
}

/** Splits `bytes` into writes at random points (each split a write of its own). */
export function splitWrites(rng: Rng, bytes: Buffer, steps: string[]): Buffer[] {
  if (bytes.length < 2 || rng.chance(0.5)) return [bytes];
  const cuts = new Set<number>();
  const n = rng.range(1, 4);
  for (let i = 0; i < n; i++) cuts.add(rng.range(1, bytes.length - 1));
  const sorted = [...cuts].sort((a, b) => a - b);
  steps.push(`split at ${sorted.join(",")}`);
  const writes: Buffer[] = [];
  let from = 0;
  for (const cut of sorted) {
    writes.push(bytes.subarray(from, cut));
    from = cut;
  }
  writes.push(bytes.subarray(from));
  return writes;
}

/** `target` with `seq=N`, which the upstream echoes: answers out of order are a finding. */
function numbered(target: string, n: number): string {
  return `${target}${target.includes("?") ? "&" : "?"}seq=${n}`;
}

/**
 * The requests' bytes, and the content each valid one (`seq` → body) must reach the upstream
 * with: those before the one whose fields changed, when no byte was changed. A body boundary
 * read otherwise upstream shows as another body.
 */
function messages(
  rng: Rng,
  world: FuzzWorld,
  host: string,
  target: string,
  steps: string[],
  on: "listener" | "tunnel" = "tunnel",
): { bytes: Buffer; bodies: Map<number, string> } {
  const count = rng.chance(0.75) ? 1 : rng.range(2, 4);
  if (count > 1) steps.push(`${count} pipelined`);
  const parts: Buffer[] = [];
  // A quarter of the cases stay valid, and a pipelined group changes one request of its own.
  const changed = rng.chance(0.25) ? 0 : rng.range(1, count);
  const bodies = new Map<number, string>();
  for (let n = 1; n <= count; n++) {
    const message = baseMessage(rng, world, host, numbered(target, n), on);
    if (n === changed) mutateFields(rng, world, message, steps);
    if (changed === 0 || n < changed) bodies.set(n, message.payload);
    parts.push(render(message));
  }
  const bytes = Buffer.concat(parts);
  if (changed === 0) return { bytes, bodies };
  // Bytes changed in a minority of cases: most changes end in the parser's 400, and the paths
  // behind a valid head (secrets, redirects, upgrades, pipelining) need heads that pass.
  if (!rng.chance(0.4)) return { bytes, bodies };
  return { bytes: mutateBytes(rng, bytes, steps, 2), bodies: new Map() };
}

/** Target `h1`: a request inside a CONNECT tunnel after TLS, to `api.test` or `secret.test`. */
export function tunnelCase(rng: Rng, world: FuzzWorld): H1Case {
  const name: UpstreamName = rng.chance(0.5) ? "api" : "secret";
  const authority = authorityOf(world, name, true);
  const steps: string[] = [`tunnel to ${authority}`];
  const path = fuzzPath(rng, world);
  const { bytes, bodies } = messages(rng, world, rng.chance(0.9) ? authority : hostName(name), path, steps);
  return { via: "tunnel", connect: { name, authority }, writes: splitWrites(rng, bytes, steps), bodies, steps };
}

/** Target `plain`: an absolute-form request on the listener, to a plain upstream. */
export function absoluteCase(rng: Rng, world: FuzzWorld): H1Case {
  const name: UpstreamName = rng.pick(["api", "secret", "secret", "denied"]);
  const authority = authorityOf(world, name, false);
  const steps: string[] = [`absolute-form to ${authority}`];
  const path = fuzzPath(rng, world);
  const { bytes, bodies } = messages(rng, world, authority, `http://${authority}${path}`, steps, "listener");
  return { via: "listener", writes: splitWrites(rng, bytes, steps), bodies, steps };
}

const oddConnectTargets = (world: FuzzWorld): string[] => [
  `api.test:${world.ports.api.tls}`,
  `API.TEST:${world.ports.api.tls}`,
  `api.test.:${world.ports.api.tls}`,
  `api.test..:${world.ports.api.tls}`,
  `denied.test:${world.ports.denied.tls}`,
  `denied.test.:${world.ports.denied.tls}`,
  `DENIED.test:${world.ports.denied.tls}`,
  `u:p@api.test:${world.ports.api.tls}`,
  `api.test@denied.test:${world.ports.denied.tls}`,
  `denied.test@api.test:${world.ports.api.tls}`,
  `api%2etest:${world.ports.api.tls}`,
  `api.test%00.denied.test:${world.ports.denied.tls}`,
  `api.test:0${world.ports.api.tls}`,
  `api.test:+${world.ports.api.tls}`,
  `api.test:${world.ports.api.tls}:${world.ports.api.tls}`,
  `api.test:${world.ports.api.tls + 65536}`,
  "api.test:65536",
  "api.test:0",
  "api.test:-443",
  "api.test:0x1bb",
  "api.test:",
  "api.test",
  ":443",
  `[::1]:${world.ports.api.tls}`,
  `[::ffff:127.0.0.3]:${world.ports.denied.tls}`,
  `[::ffff:7f00:3]:${world.ports.denied.tls}`,
  `[0:0:0:0:0:ffff:127.0.0.1]:${world.ports.api.tls}`,
  `[fe80::1%25eth0]:${world.ports.api.tls}`,
  `[api.test]:${world.ports.api.tls}`,
  `127.0.0.3:${world.ports.denied.tls}`,
  `127.1:${world.ports.api.tls}`,
  `0x7f000003:${world.ports.denied.tls}`,
  `2130706435:${world.ports.denied.tls}`,
  `${"a".repeat(64)}.test:443`,
  `${"a".repeat(300)}.test:443`,
  `${"a.".repeat(130)}test:443`,
  `api.test\\denied.test:${world.ports.denied.tls}`,
  `api.test/denied.test:${world.ports.denied.tls}`,
  `api.test#denied.test:${world.ports.denied.tls}`,
  `api.test?denied.test:${world.ports.denied.tls}`,
  `api..test:${world.ports.api.tls}`,
  `.api.test:${world.ports.api.tls}`,
  `api.tést:${world.ports.api.tls}`,
  `xn--api-.test:${world.ports.api.tls}`,
  `*.test:${world.ports.api.tls}`,
  `api.test:${world.ports.api.tls}/`,
  `http://api.test:${world.ports.api.tls}`,
  `api.test ${world.ports.api.tls}`,
];

/** Target `connect`: a mutated CONNECT request line and headers, then a request inside if it is answered 200. */
export function connectCase(rng: Rng, world: FuzzWorld): H1Case {
  const p = world.placeholder;
  const target = rng.chance(0.2) ? `api.test:${world.ports.api.tls}` : rng.pick(oddConnectTargets(world));
  const steps: string[] = [`CONNECT ${JSON.stringify(target.slice(0, 80))}`];
  const fields: Field[] = [["Host", rng.chance(0.8) ? target : rng.pick([`api.test:${world.ports.api.tls}`, `denied.test:${world.ports.denied.tls}`, ""])]];
  if (world.proxyAuthorization !== undefined) fields.push(["Proxy-Authorization", credentials(rng, world.proxyAuthorization)]);
  else if (rng.chance(0.3)) fields.push(["Proxy-Authorization", rng.pick([`Basic ${Buffer.from(`default:${p}`).toString("base64")}`, "Basic", "Bearer x", `Basic ${p}`])]);
  if (rng.chance(0.2)) fields.push(["X-Token", p]);
  if (rng.chance(0.1)) fields.push(["Content-Length", rng.pick(["5", "0", "-1"])]);
  if (rng.chance(0.1)) fields.push(["Transfer-Encoding", "chunked"]);
  if (rng.chance(0.1)) fields.push(["Proxy-Connection", "keep-alive"]);
  const message: Message = { method: "CONNECT", target, version: "HTTP/1.1", fields, body: "", payload: "" };
  if (rng.chance(0.3)) mutateFields(rng, world, message, steps);
  message.method = "CONNECT";
  if (rng.chance(0.1)) message.method = rng.pick(["connect", "CONNECT ", "CONNEC", "CONNECTX"]);
  let bytes = mutateBytes(rng, render(message), steps, 2);
  const insideHost = (() => {
    const colon = target.lastIndexOf(":");
    return colon > 0 ? target.slice(0, colon).replace(/^\[|\]$/g, "") : target;
  })();
  const inner = Buffer.from(`GET ${tagged(world, "/inside")} HTTP/1.1\r\nHost: ${target}\r\nX-Token: ${p}\r\n\r\n`, "latin1");
  if (rng.chance(0.15)) {
    // The request behind the CONNECT in the same write: it must never be read as the tunnel's
    // first bytes when the CONNECT is refused.
    bytes = Buffer.concat([bytes, inner]);
    steps.push("request in the CONNECT's write");
    return { via: "listener", writes: splitWrites(rng, bytes, steps), steps };
  }
  const tls = rng.chance(0.5);
  return { via: "listener", writes: splitWrites(rng, bytes, steps), inside: { tls, servername: insideHost, bytes: inner }, steps };
}
