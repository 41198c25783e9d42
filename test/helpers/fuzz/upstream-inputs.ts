import { gzipSync } from "node:zlib";
import { literal } from "../h2-frames.js";
import { frame, settingsFrame, type } from "./h2-inputs.js";
import type { HostileStep } from "./hostile-upstream.js";
import type { Rng } from "./rng.js";
import { hostName, type FuzzWorld } from "./world.js";

/**
 * Cases of the `upstream` target: a guest's well-formed request to an upstream that answers it
 * badly (test/helpers/fuzz/hostile-upstream.ts), and what the guest may get for it. HTTP/1.1
 * answers: odd status lines, duplicate and conflicting Content-Length, Transfer-Encoding tricks,
 * bad chunk sizes, forbidden trailers, bytes past the end (a second response smuggled behind the
 * first), a close or a cut at any point, redirects to odd Locations. HTTP/2 answers: frames out
 * of order (DATA before HEADERS, HEADERS after END_STREAM), bad padding, RST_STREAM and GOAWAY at
 * odd moments, oversized and malformed header blocks, SETTINGS oddities. With `hooks`, each
 * request also names what the embedding's tier-3 hooks do with it (fuzz-proxy-child.ts).
 */
export type HostileName = "api" | "secret";
export type HostileKind = "h1tls" | "h1plain" | "h2";

/** What the guest may get for the case's first request. */
export interface Outcome {
  /** Answers it may get whole: a status and its body (exactly, or matching a pattern). */
  relays: { readonly status: number; readonly body: string | RegExp }[];
  /** Proxy errors (`X-Egressgate-Error` codes) it may get instead, or any. */
  errors: readonly string[] | "any";
  /** A cut (a response left incomplete, or none at the close) is acceptable. */
  cut: boolean;
  /** Whether the upstream may see the request at all (not when a hook answered or refused it). */
  reaches: boolean;
  /** The body cannot be decoded (a Content-Encoding it does not have): a hook's read of it fails. */
  undecodable?: boolean;
  /**
   * The upstream closes its connection after the answer (HTTP/2, without GOAWAY): a next request
   * the proxy put on it before the FIN came is sent once more on a new connection when it can be
   * (an idempotent one; http2-upstream-crossed-close.test.ts), and may still get 502 there.
   */
  lostNext?: boolean;
}

export interface UpstreamCase {
  readonly name: HostileName;
  readonly kind: HostileKind;
  /** The first request's method, target (origin-form), fields and body. */
  readonly method: "GET" | "POST" | "HEAD";
  readonly target: string;
  readonly fields: readonly (readonly [string, string])[];
  readonly upload: string;
  /** The hostile upstream's answer to the first request. */
  readonly script: readonly HostileStep[];
  readonly outcome: Outcome;
  /** The second request, on the same connection: well-behaved answers quote its Authorization when it asks (`echo=1`). */
  readonly second: { readonly target: string; readonly fields: readonly (readonly [string, string])[] };
  /** Upstream requests a case may make past one per request line (redirects, resends after a close). */
  readonly slack: number;
  readonly steps: readonly string[];
}

export const hostileKinds: readonly HostileKind[] = ["h1tls", "h1plain", "h2"];

/** Each hostile upstream's label: what its well-behaved answers name. */
export const hostileLabel = (name: HostileName, kind: HostileKind): string => `${name}-${kind}`;

/** The tier-3 hooks' choices (fuzz-proxy-child.ts reads them from `x-fuzz-hooks`). */
export const requestHookChoices = ["pass", "edit", "slow", "same", "response", "throw", "reject", "garbage", "blocked", "rewrite-denied", "rewrite-internal", "rewrite-leak", "stream-error", "stream-late-error", "hang"] as const;
export const responseHookChoices = ["pass", "slow", "read", "read-replace", "replace", "clone-read", "throw", "reject", "garbage", "stream-error", "hang"] as const;

const code = (text: string): Buffer => Buffer.from(text, "latin1");

function filler(rng: Rng, n: number): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 \n";
  let out = "";
  for (let i = 0; i < n; i++) out += alphabet[rng.int(alphabet.length)];
  return out;
}

/** Splits `bytes` into writes with short pauses between some, so the proxy reads them in pieces. */
function pieces(rng: Rng, bytes: Buffer, steps: string[]): HostileStep[] {
  if (bytes.length < 2 || rng.chance(0.6)) return [{ write: bytes }];
  const cuts = [...new Set(Array.from({ length: rng.range(1, 3) }, () => rng.range(1, bytes.length - 1)))].sort((a, b) => a - b);
  steps.push(`answer split at ${cuts.join(",")}`);
  const out: HostileStep[] = [];
  let from = 0;
  for (const cut of cuts) {
    out.push({ write: bytes.subarray(from, cut) }, { pause: rng.pick([0, 1, 5]) });
    from = cut;
  }
  out.push({ write: bytes.subarray(from) });
  return out;
}

interface Context {
  readonly rng: Rng;
  readonly world: FuzzWorld;
  readonly name: HostileName;
  readonly kind: HostileKind;
  readonly tag: string;
  readonly method: "GET" | "POST" | "HEAD";
  /** The request carries the secret's placeholder (to its own host, over TLS): the upstream gets its value. */
  readonly carries: boolean;
  readonly steps: string[];
}

const relayOf = (status: number, body: string | RegExp): Outcome => ({ relays: [{ status, body }], errors: [], cut: false, reaches: true });
const errorOf = (errors: readonly string[] | "any", cut = false): Outcome => ({ relays: [], errors, cut, reaches: true });

/** A hop the proxy follows to a recording upstream: what comes back names it and the path. */
function recorderAnswer(label: string, method: string): RegExp {
  return method === "HEAD" ? /^$/ : new RegExp(`^upstream ${label} [0-9]+ /hop`);
}

/**
 * Redirect answers: where `Location` points, and what the guest gets once the proxy has
 * followed (or refused) the hop. Loopback names only, through the proxy's `resolve`.
 */
function redirectAnswer(c: Context): { status: number; location: string; outcome: Outcome } {
  const { rng, world, tag, method } = c;
  const p = world.ports;
  const hostile = world.hostile!;
  const status = rng.pick([301, 302, 303, 307, 308]);
  const hopMethod = (status === 303 && method !== "HEAD") || ((status === 301 || status === 302) && method === "POST") ? "GET" : method;
  const t = `c=${tag}`;
  const selfKind = c.kind;
  const selfAuthority = `${hostName(c.name)}:${hostile[c.name][selfKind]}`;
  const scheme = selfKind === "h1plain" ? "http" : "https";
  const hostileHop = (path: string): RegExp => (hopMethod === "HEAD" ? /^$/ : new RegExp(`^hostile ${hostileLabelRe(c.name, selfKind)} ${escapeRe(path)}`));
  const denied = errorOf(["EG_DENIED"]);
  const choices: (() => { location: string; outcome: Outcome })[] = [
    () => ({ location: `http://api.test:${p.api.plain}/hop?${t}`, outcome: relayOf(200, recorderAnswer("api-plain", hopMethod)) }),
    () => ({ location: `https://api.test:${p.api.tls}/hop?${t}`, outcome: relayOf(200, recorderAnswer("api-tls", hopMethod)) }),
    () => ({ location: `https://secret.test:${p.secret.tls}/hop?${t}`, outcome: relayOf(200, recorderAnswer("secret-tls", hopMethod)) }),
    () => ({ location: `/hop-rel?${t}`, outcome: relayOf(200, hostileHop(`/hop-rel?${t}`)) }),
    () => ({ location: `hop-rel2?${t}`, outcome: relayOf(200, hostileHop(`/hop-rel2?${t}`)) }),
    () => ({ location: `//${selfAuthority}/hop-pr?${t}`, outcome: relayOf(200, hostileHop(`/hop-pr?${t}`)) }),
    () => ({ location: `${scheme}://user:pw@${selfAuthority}/hop-ui?${t}`, outcome: relayOf(200, hostileHop(`/hop-ui?${t}`)) }),
    () => ({ location: `${scheme}://${hostName(c.name).toUpperCase()}.:${hostile[c.name][selfKind]}/hop-up?${t}`, outcome: relayOf(200, hostileHop(`/hop-up?${t}`)) }),
    () => ({ location: `https://user:pw@api.test:${p.api.tls}/hop?${t}`, outcome: relayOf(200, recorderAnswer("api-tls", hopMethod)) }),
    () => ({ location: `http://denied.test:${p.denied.plain}/hop?${t}`, outcome: denied }),
    () => ({ location: `https://denied.test:${p.denied.tls}/hop?${t}`, outcome: denied }),
    () => ({ location: `https://DENIED.TEST.:${p.denied.tls}/hop?${t}`, outcome: denied }),
    () => ({ location: `http://api.test:${p.api.plain}@denied.test:${p.denied.plain}/hop?${t}`, outcome: denied }),
    () => ({ location: `http://127.0.0.3:${p.denied.plain}/hop?${t}`, outcome: denied }),
    () => ({ location: `http://127.0.0.1:${p.api.plain}/hop?${t}`, outcome: denied }),
    () => ({ location: `http://[::ffff:127.0.0.3]:${p.denied.plain}/hop?${t}`, outcome: denied }),
    () => ({ location: `http://0x7f000003:${p.denied.plain}/hop?${t}`, outcome: denied }),
    () => ({ location: `http://2130706435:${p.denied.plain}/hop?${t}`, outcome: denied }),
    () => ({ location: `http://127.1:${p.denied.plain}/hop?${t}`, outcome: denied }),
    () => ({ location: `http://api.test:0/hop?${t}`, outcome: errorOf(["EG_UPSTREAM"]) }),
    () => ({ location: "file:///etc/passwd", outcome: errorOf(["EG_UPSTREAM"]) }),
    () => ({ location: "javascript:alert(1)", outcome: errorOf(["EG_UPSTREAM"]) }),
    () => ({ location: `ftp://api.test:${p.api.plain}/hop`, outcome: errorOf(["EG_UPSTREAM"]) }),
    () => ({ location: `http://api..test:${p.api.plain}/hop`, outcome: errorOf(["EG_UPSTREAM"]) }),
    () => ({ location: `http://[::1:${p.api.plain}/hop`, outcome: errorOf(["EG_UPSTREAM"]) }),
    // Back to itself: the hop asks the same question and gets the same answer, up to the limit.
    () => ({ location: "", outcome: errorOf(["EG_REDIRECT_LOOP"]) }),
    () => ({ location: `?${t}&seq=1`, outcome: errorOf(["EG_REDIRECT_LOOP"]) }),
  ];
  if (c.carries && world.secretValue !== undefined) {
    // The secret's own upstream quotes the value it received into a Location that leaves its hosts.
    const value = world.secretValue;
    choices.push(
      () => ({ location: `https://api.test:${p.api.tls}/hop?${t}&state=${value}`, outcome: denied }),
      () => ({ location: `https://api.test:${p.api.tls}/hop?${t}&state=${Buffer.from(value).toString("base64")}`, outcome: denied }),
      () => ({ location: `http://secret.test:${p.secret.plain}/hop?${t}&state=${value.toUpperCase()}`, outcome: denied }),
      // A label over 63 characters: refused as an invalid host, or as a copy of the value.
      () => ({ location: `https://${Buffer.from(value).toString("hex")}.denied.test:${p.denied.tls}/hop?${t}`, outcome: errorOf(["EG_DENIED", "EG_UPSTREAM"]) }),
    );
  }
  const picked = rng.pick(choices)();
  c.steps.push(`redirect ${status} to ${JSON.stringify(picked.location.slice(0, 120))}`);
  let outcome = picked.outcome;
  if (hopMethod === method && method === "POST" && outcome.errors !== "any") {
    // 307 and 308 re-send the body: a streamed one cannot be (502, before the hop is judged), a
    // buffered one (hooks, a policy) is.
    outcome = { ...outcome, errors: [...outcome.errors, "EG_UPSTREAM"] };
  }
  return { status, location: picked.location, outcome };
}

function escapeRe(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

function hostileLabelRe(name: HostileName, kind: HostileKind): string {
  return escapeRe(hostileLabel(name, kind));
}

interface H1Response {
  statusLine: string;
  status: number;
  fields: [string, string][];
  framing: "cl" | "chunked" | "close" | "none";
  body: Buffer;
  chunked: Buffer | undefined;
  tail: Buffer;
  /** A second response follows the first on the connection. */
  smuggle: boolean;
  end: "keep" | "end" | "destroy" | "stall";
  eol: string;
  /** A mutation made the answer one no correct relay may pass on as it is. */
  broken: boolean;
  /** The bodies a relay may give whole, if the answer is broken (the intended one by default). */
  bodies: Buffer[] | undefined;
  /** Only a proxy error or a cut is acceptable. */
  noRelay: boolean;
  /** The status line is one no reader takes a status from. */
  statusNoRelay: boolean;
  /** The chunked body was changed: a change that writes it afresh would undo the first's verdict (upstream seed 20 case 4405). */
  chunkedChanged?: boolean;
  undecodable: boolean;
  /** 1xx answers written before the status line. */
  informational: string;
  /** Those are ones the proxy refuses. */
  infoNoRelay: boolean;
  slack: number;
  errorCodes: string[] | "any";
}

function chunk(body: Buffer, rng: Rng): Buffer {
  const parts: Buffer[] = [];
  let at = 0;
  while (at < body.length) {
    const n = Math.min(body.length - at, rng.range(1, Math.max(1, body.length)));
    parts.push(code(`${n.toString(16)}\r\n`), body.subarray(at, at + n), code("\r\n"));
    at += n;
  }
  parts.push(code("0\r\n\r\n"));
  return Buffer.concat(parts);
}

/** A second response behind the first, quoting the request's Authorization (hostile-upstream.ts writes it). */
const smuggle = (tag: string): HostileStep => ({ smuggle: tag });

/** The HTTP/1.1 mutations: each changes the answer and says what a relay of it may be. */
const h1Mutations: readonly [string, (r: H1Response, c: Context) => void][] = [
  [
    "HTTP/1.0",
    (r) => {
      r.statusLine = r.statusLine.replace("HTTP/1.1", "HTTP/1.0");
      if (r.framing === "chunked") {
        // Chunked is HTTP/1.1's: a reader may take the bytes as they are, up to the close.
        r.broken = true;
        r.bodies = [r.body, r.chunked!];
      }
    },
  ],
  ["empty reason", (r) => void ((r.statusLine = `HTTP/1.1 ${r.status} `), (r.statusNoRelay = false))],
  ["obs-text reason", (r) => void ((r.statusLine = `HTTP/1.1 ${r.status} caf\xe9 \xff`), (r.statusNoRelay = false))],
  ...(
    [
      "HTTP/1.1 2000 OK",
      "HTTP/1.1 99 OK",
      "HTTP/1.1 600 Odd",
      "HTTP/1.1 999 Odd",
      "HTTP/1.1 -200 OK",
      "HTTP/2 200 OK",
      "HTTP/1.1  200 OK",
      "ICY 200 OK",
      "HTTP/1.1 200 OK\x00",
      "HTTP/1.1 200 O\rK",
      "http/1.1 200 OK",
      "HTTP/1.1 200",
      "HTTP/1.1 20x OK",
      "HTTP/1.1 200 OK\x7f",
      "HTTP/1.2 200 OK",
      "HTTP/0.9 200 OK",
      "",
      "hello",
    ] as const
  ).map((line): [string, (r: H1Response) => void] => [
    `status line ${JSON.stringify(line)}`,
    (r) => {
      r.statusLine = line;
      r.broken = true;
      r.errorCodes = "any";
      // A lenient reader may take some of these: the status it relays is then the line's own.
      const status = /^\S+ +([0-9]{3})(?: |$)/.exec(line)?.[1];
      // The last line written decides, whatever an earlier change of it said.
      r.statusNoRelay = status === undefined || status < "100" || status > "599";
      if (status !== undefined) r.status = Number(status);
    },
  ]),
  ["leading empty line", (r) => ((r.statusLine = `\r\n${r.statusLine}`), (r.broken = true))],
  [
    "two equal Content-Length fields",
    (r) => {
      if (r.framing !== "cl") return;
      r.fields.push(["content-length", String(r.body.length)]);
      r.broken = true;
    },
  ],
  [
    "Content-Length listed twice in one field",
    (r) => {
      if (r.framing !== "cl") return;
      setField(r, "content-length", `${r.body.length}, ${r.body.length}`);
      r.broken = true;
    },
  ],
  [
    "conflicting Content-Length fields",
    (r) => {
      if (r.framing !== "cl") return;
      r.fields.push(["content-length", String(r.body.length + 7)]);
      r.broken = true;
      r.noRelay = true;
    },
  ],
  ...["+", "-", "0x", " ", "00", "1e"].map((prefix): [string, (r: H1Response) => void] => [
    `Content-Length with ${JSON.stringify(prefix)}`,
    (r) => {
      if (r.framing !== "cl") return;
      setField(r, "content-length", prefix === "1e" ? "1e1" : prefix === "0x" ? `0x${r.body.length.toString(16)}` : `${prefix}${r.body.length}`);
      r.broken = true;
      if (prefix === "1e" || prefix === "-") r.noRelay = true;
    },
  ]),
  [
    "a huge Content-Length",
    (r) => {
      if (r.framing !== "cl") return;
      setField(r, "content-length", "99999999999999999999");
      r.broken = true;
      r.noRelay = true;
    },
  ],
  [
    "Content-Length shorter than the body, a response smuggled behind it",
    (r) => {
      if (r.framing !== "cl" || r.body.length < 2) return;
      const keep = r.body.length >> 1;
      r.tail = Buffer.concat([r.body.subarray(keep), r.tail]);
      r.smuggle = true;
      r.body = r.body.subarray(0, keep);
      setField(r, "content-length", String(keep));
      // The first answer is whole and well framed: only what follows it is wrong.
      r.bodies = [r.body];
    },
  ],
  [
    "a response smuggled behind a whole one",
    (r) => {
      if (r.framing === "close") return;
      r.smuggle = true;
    },
  ],
  [
    "Content-Length longer than the body, then the close",
    (r) => {
      if (r.framing !== "cl") return;
      setField(r, "content-length", String(r.body.length + 100));
      r.end = "end";
      r.broken = true;
      r.noRelay = true;
    },
  ],
  [
    "Content-Length longer than the body, then a cut",
    (r) => {
      if (r.framing !== "cl") return;
      setField(r, "content-length", String(r.body.length + 100));
      r.end = "destroy";
      r.broken = true;
      r.noRelay = true;
    },
  ],
  ...["chunked, chunked", "gzip, chunked", "chunked, gzip", "xchunked", "identity", "Chunked", " chunked", "chunked\t", "chunked;q=1", "chunk"].map(
    (coding): [string, (r: H1Response) => void] => [
      `Transfer-Encoding ${JSON.stringify(coding)}`,
      (r) => {
        if (r.framing !== "chunked") return;
        setField(r, "transfer-encoding", coding);
        // A trailing tab is OWS, but llhttp reads no chunked there: refused (502).
        if (coding !== "Chunked" && coding !== " chunked") {
          r.broken = true;
          // Read as close-delimited (chunked not last, RFC 9112 §6.3), the body is the chunked bytes.
          r.bodies = [r.body, r.chunked!];
        }
      },
    ],
  ),
  [
    "Transfer-Encoding and Content-Length both",
    (r) => {
      if (r.framing !== "chunked") return;
      r.fields.push(["content-length", String(r.body.length + 3)]);
      r.broken = true;
    },
  ],
  [
    "Transfer-Encoding on an HTTP/1.0 answer",
    (r) => {
      if (r.framing !== "chunked") return;
      r.statusLine = r.statusLine.replace("HTTP/1.1", "HTTP/1.0");
      r.broken = true;
      r.bodies = [r.body, r.chunked!];
    },
  ],
  ...(
    [
      ["0x", (n: number) => `0x${n.toString(16)}`],
      ["-", (n: number) => `-${n.toString(16)}`],
      ["ext", (n: number) => `${n.toString(16)};a=b`],
      ["ws", (n: number) => `${n.toString(16)} `],
      ["zeros", (n: number) => `0000000000000000${n.toString(16)}`],
      ["overflow", (n: number) => `ffffffffffffffff${n.toString(16)}`],
      ["short", (n: number) => Math.max(0, n - 1).toString(16)],
      ["long", (n: number) => (n + 1).toString(16)],
      ["empty", () => ""],
    ] as const
  ).map(([label, size]): [string, (r: H1Response) => void] => [
    `chunk size ${label}`,
    (r) => {
      if (r.framing !== "chunked" || r.body.length === 0 || r.chunkedChanged === true) return;
      r.chunked = Buffer.concat([code(`${size(r.body.length)}\r\n`), r.body, code("\r\n0\r\n\r\n")]);
      r.chunkedChanged = true;
      if (label !== "ext" && label !== "zeros") {
        r.broken = true;
        r.noRelay = true;
        r.slack = 1;
      }
    },
  ]),
  [
    "chunk data not followed by CRLF",
    (r) => {
      if (r.framing !== "chunked" || r.body.length === 0 || r.chunkedChanged === true) return;
      r.chunked = Buffer.concat([code(`${r.body.length.toString(16)}\r\n`), r.body, code("XX0\r\n\r\n")]);
      r.chunkedChanged = true;
      r.broken = true;
      r.noRelay = true;
    },
  ],
  [
    "chunked with bare LF",
    (r) => {
      if (r.framing !== "chunked") return;
      r.chunked = Buffer.from(r.chunked!.toString("latin1").replace(/\r\n/g, "\n"), "latin1");
      r.chunkedChanged = true;
      r.broken = true;
    },
  ],
  [
    "no last chunk, then the close",
    (r) => {
      if (r.framing !== "chunked") return;
      r.chunked = r.chunked!.subarray(0, r.chunked!.length - 5);
      r.chunkedChanged = true;
      r.end = "end";
      r.broken = true;
      r.noRelay = true;
    },
  ],
  [
    "the last chunk's CRLF missing, then the close",
    (r) => {
      if (r.framing !== "chunked") return;
      r.chunked = r.chunked!.subarray(0, r.chunked!.length - 2);
      r.chunkedChanged = true;
      r.end = "end";
      r.broken = true;
      r.noRelay = true;
    },
  ],
  ...(
    [
      ["content-length", "5"],
      ["transfer-encoding", "chunked"],
      ["host", "denied.test"],
      ["set-cookie", "a=b"],
      ["content-type", "text/html"],
      ["x-ok", "1"],
      ["trailer", "x-ok"],
      [":status", "500"],
      ["x-bad", "a\rb"],
      ["x-big", "y".repeat(20_000)],
      ["bad name", "1"],
    ] as const
  ).map(([name, value]): [string, (r: H1Response) => void] => [
    `trailer ${name}`,
    (r) => {
      if (r.framing !== "chunked") return;
      r.chunked = Buffer.concat([r.chunked!.subarray(0, r.chunked!.length - 2), code(`${name}: ${value}\r\n\r\n`)]);
      r.chunkedChanged = true;
      // llhttp refuses a Content-Length or Transfer-Encoding in the trailers, as RFC 9112 §7.1.2 allows.
      if (name === ":status" || name === "bad name" || name === "x-bad" || name === "x-big" || name === "content-length" || name === "transfer-encoding") r.broken = true;
    },
  ]),
  ["obs-fold", (r) => void (r.fields.push(["x-folded", "a\r\n b"]), (r.broken = true))],
  ["space before a colon", (r) => void (r.fields.push(["x-space ", "1"]), (r.broken = true))],
  ["space before the Content-Length colon", (r) => void (renameField(r, "content-length", "content-length "), (r.broken = true))],
  ["bare CR in a value", (r) => void (r.fields.push(["x-cr", "a\rb"]), (r.broken = true))],
  ["NUL in a value", (r) => void (r.fields.push(["x-nul", "a\x00b"]), (r.broken = true))],
  ["bare LF line ends", (r) => void ((r.eol = "\n"), (r.broken = true))],
  ["a field line without a colon", (r) => void (r.fields.push(["x-nocolon-line", noColon]), (r.broken = true))],
  ["obs-text in a value", (r) => void r.fields.push(["x-odd", "caf\xe9 \xff"])],
  ["a 20 KiB field", (r) => void (r.fields.push(["x-big", "z".repeat(20_000)]), (r.broken = true))],
  ["300 fields", (r) => void (r.fields.push(...Array.from({ length: 300 }, (_, i): [string, string] => [`x-f${i}`, String(i)])), (r.broken = true))],
  ["Connection: close", (r) => void r.fields.push(["connection", "close"])],
  ["Connection names a field", (r) => void r.fields.push(["connection", "keep-alive, x-drop"], ["x-drop", "1"], ["keep-alive", "timeout=1"])],
  ["upgrade fields on a 200", (r) => void r.fields.push(["connection", "upgrade"], ["upgrade", "websocket"])],
  ["Proxy-Authenticate and Proxy-Connection", (r) => void r.fields.push(["proxy-authenticate", "Basic"], ["proxy-connection", "keep-alive"])],
  ["several Set-Cookie", (r) => void r.fields.push(["set-cookie", "a=1"], ["set-cookie", "b=2; Path=/"], ["Set-Cookie", "c=3"])],
  ["two Content-Type", (r) => void r.fields.push(["content-type", "text/html"])],
  ["a 103 first", (r) => void (r.informational += "HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n")],
  ["a 102 first", (r) => void (r.informational += "HTTP/1.1 102 Processing\r\n\r\n")],
  // README: a 100 from an HTTP/1.1 upstream is a bad response (502), so are more than 16 1xx.
  ["a 100 first", (r) => void ((r.informational += "HTTP/1.1 100 Continue\r\n\r\n"), (r.broken = true), (r.infoNoRelay = true))],
  ["17 103s first", (r) => void ((r.informational += "HTTP/1.1 103 Early Hints\r\n\r\n".repeat(17)), (r.broken = true), (r.infoNoRelay = true))],
  ["a 101 unasked", (r) => void ((r.statusLine = "HTTP/1.1 101 Switching Protocols"), r.fields.push(["connection", "upgrade"], ["upgrade", "websocket"]), (r.broken = true), (r.statusNoRelay = true))],
  ["the close before any byte", (r) => void ((r.statusLine = ""), (r.fields = []), (r.framing = "none"), (r.end = "end"), (r.broken = true), (r.noRelay = true), (r.slack = 2))],
  ["a cut before any byte", (r) => void ((r.statusLine = ""), (r.fields = []), (r.framing = "none"), (r.end = "destroy"), (r.broken = true), (r.noRelay = true), (r.slack = 2))],
  ["the close after the answer", (r) => void (r.end = "end")],
  ["a cut after the answer", (r) => void (r.end = "destroy")],
  [
    "a stall after the head",
    (r, c) => {
      if (!c.rng.chance(0.2) || r.body.length === 0 || r.framing === "none") return;
      r.end = "stall";
      r.body = Buffer.alloc(0);
      r.chunked = Buffer.alloc(0);
      r.chunkedChanged = true;
      r.broken = true;
      r.noRelay = true;
    },
  ],
  ["gzip named, the body not gzip", (r) => void (r.fields.push(["content-encoding", "gzip"]), (r.undecodable = true))],
];

function setField(r: H1Response, name: string, value: string): void {
  const at = r.fields.findIndex(([n]) => n.toLowerCase() === name);
  if (at >= 0) r.fields[at] = [r.fields[at]![0], value];
  else r.fields.push([name, value]);
}

function renameField(r: H1Response, name: string, to: string): void {
  const at = r.fields.findIndex(([n]) => n.toLowerCase() === name);
  if (at >= 0) r.fields[at] = [to, r.fields[at]![1]];
}

/** A field value that renders its line as the name alone, without a colon. */
const noColon = "\u0001no colon";

function renderH1(r: H1Response): Buffer {
  const head = [r.statusLine, ...r.fields.map(([n, v]) => (v === noColon ? n : `${n}: ${v}`))].join(r.eol) + r.eol + r.eol;
  const body = r.framing === "chunked" ? r.chunked! : r.framing === "none" ? Buffer.alloc(0) : r.body;
  return Buffer.concat([r.statusLine === "" && r.fields.length === 0 ? Buffer.alloc(0) : code(r.informational + head), body, r.tail]);
}

/** The HTTP/1.1 answer for the case's first request: a valid response, then mutated (or a redirect). */
function h1Answer(c: Context): { script: HostileStep[]; outcome: Outcome; slack: number } {
  const { rng, tag, method, steps } = c;
  if (rng.chance(0.2)) {
    const redirect = redirectAnswer(c);
    const body = "moved\n";
    const location = redirect.location === "" && rng.chance(0.5) ? undefined : redirect.location;
    const fields = location === undefined ? "" : `location: ${location}\r\n`;
    const bytes = code(`HTTP/1.1 ${redirect.status} Moved\r\n${fields}content-length: ${body.length}\r\n\r\n${method === "HEAD" ? "" : body}`);
    // No Location at all: a 3xx the proxy cannot follow goes to the guest as it came.
    const outcome = location === undefined ? relayOf(redirect.status, method === "HEAD" ? "" : body) : redirect.outcome;
    return { script: pieces(rng, bytes, steps), outcome, slack: 11 };
  }
  const status = rng.pick([200, 200, 200, 200, 201, 203, 204, 206, 304, 404, 500, 300, 305]);
  const noBody = status === 204 || status === 304 || method === "HEAD";
  let text = noBody ? "" : `hostile-answer ${tag} ${filler(rng, rng.pick([0, 10, 100, 3000, 20_000]))}`;
  if (!noBody && rng.chance(0.1)) text = gzipSync(text).toString("latin1");
  const body = code(text);
  const framing: H1Response["framing"] = noBody && status !== 200 ? "none" : rng.pick(["cl", "cl", "chunked", "close"]);
  const fields: [string, string][] = [["content-type", "text/plain"]];
  if (framing === "cl" || (framing === "none" && method === "HEAD" && rng.chance(0.5))) fields.push(["content-length", String(framing === "cl" ? body.length : 40)]);
  if (framing === "chunked") fields.push(["transfer-encoding", "chunked"]);
  if (framing === "close") fields.push(["connection", "close"]);
  const r: H1Response = {
    statusLine: `HTTP/1.1 ${status} Answer`,
    status,
    fields,
    framing: method === "HEAD" && framing !== "none" ? "none" : framing,
    body: method === "HEAD" ? Buffer.alloc(0) : body,
    chunked: framing === "chunked" ? chunk(body, rng) : undefined,
    tail: Buffer.alloc(0),
    smuggle: false,
    end: framing === "close" ? "end" : "keep",
    eol: "\r\n",
    broken: false,
    bodies: undefined,
    noRelay: false,
    statusNoRelay: false,
    informational: "",
    infoNoRelay: false,
    undecodable: false,
    slack: 0,
    errorCodes: "any",
  };
  steps.push(`answer ${status}, ${r.framing}, ${r.body.length} bytes`);
  const n = rng.chance(0.25) ? 0 : rng.range(1, 2);
  const applied = new Set<string>();
  for (let i = 0; i < n; i++) {
    const [label, mutate] = rng.pick(h1Mutations);
    if (applied.has(label)) continue;
    applied.add(label);
    steps.push(label);
    mutate(r, c);
  }
  const statusKept = r.statusLine === `HTTP/1.1 ${status} Answer`;
  if (method === "HEAD" && !r.smuggle && r.statusLine !== "" && rng.chance(0.3)) {
    // A HEAD answered with a body anyway: bytes the next response on the connection would be read from.
    r.smuggle = true;
    steps.push("a body after a HEAD's answer");
  }
  // Behind a 204 or a 304 whose status line is as written (another status would make the bytes its body).
  if ((status === 204 || status === 304) && !r.smuggle && statusKept && rng.chance(0.3)) {
    r.smuggle = true;
    steps.push(`a body after a ${status}`);
  }
  const bytes = renderH1(r);
  const script: HostileStep[] = pieces(rng, bytes, steps);
  // Not behind a close-delimited body, which takes every byte up to the close.
  // Behind a body framed by its length or chunks, or none where none may be (a HEAD's, a 204's, a
  // 304's as written): anywhere else the bytes up to the close are the body.
  const bodiless = method === "HEAD" || (statusKept && (status === 204 || status === 304));
  if (r.smuggle && r.statusLine !== "" && (r.framing === "cl" || r.framing === "chunked" || (r.framing === "none" && bodiless))) script.push(smuggle(tag));
  if (r.end !== "keep") script.push(r.end);
  const bodies = r.bodies ?? [r.body];
  const relays = r.noRelay || r.statusNoRelay || r.infoNoRelay ? [] : bodies.map((b) => ({ status: r.status, body: b.toString("latin1") }));
  const outcome: Outcome = r.broken ? { relays, errors: r.errorCodes, cut: true, reaches: true } : { relays, errors: [], cut: false, reaches: true };
  if (r.undecodable && r.body.length > 0) outcome.undecodable = true;
  return { script, outcome, slack: r.slack };
}

function u32(value: number): Buffer {
  const out = Buffer.alloc(4);
  out.writeUInt32BE(value >>> 0, 0);
  return out;
}

function goaway(last: number, errorCode: number): Buffer {
  return frame(type.goaway, 0, 0, Buffer.concat([u32(last), u32(errorCode)]));
}

function rst(errorCode: number): (stream: number) => Buffer {
  return (stream) => frame(type.rst, 0, stream, u32(errorCode));
}

type F = (stream: number) => Buffer;

/** An HTTP/2 answer as its mutations leave it: the frames in their places, and what a relay of it may be. */
interface H2State {
  headers: F;
  dataFrames: F[];
  before: F[];
  after: F[];
  broken: boolean;
  noRelay: boolean;
  slack: number;
  end: HostileStep | undefined;
}

/** The HTTP/2 answer for the case's first request: valid frames, then changed. */
function h2Answer(c: Context): { script: HostileStep[]; outcome: Outcome; slack: number } {
  const { rng, tag, method, steps } = c;
  const head = (status: string, extra: Buffer[] = []): Buffer => Buffer.concat([literal(":status", status), literal("content-type", "text/plain"), ...extra]);
  if (rng.chance(0.15)) {
    const redirect = redirectAnswer(c);
    const block = Buffer.concat([literal(":status", String(redirect.status)), ...(redirect.location === "" ? [] : [literal("location", redirect.location)])]);
    const outcome = redirect.location === "" ? relayOf(redirect.status, "") : redirect.outcome;
    return { script: [{ frame: (s) => frame(type.headers, 0x5, s, block) }], outcome, slack: 11 };
  }
  const status = rng.pick([200, 200, 200, 201, 204, 404, 500]);
  const noBody = status === 204 || method === "HEAD";
  const text = noBody ? "" : `hostile-answer ${tag} ${filler(rng, rng.pick([0, 10, 100, 3000, 20_000]))}`;
  const body = code(text);
  const withLength = rng.chance(0.5);
  const lengthField = withLength ? [literal("content-length", String(body.length))] : [];
  const st: H2State = {
    headers: (s) => frame(type.headers, noBody ? 0x5 : 0x4, s, head(String(status), lengthField)),
    dataFrames: [],
    before: [],
    after: [],
    broken: false,
    noRelay: false,
    slack: 0,
    end: undefined,
  };
  const dataFrames = st.dataFrames;
  if (!noBody) {
    let at = 0;
    do {
      const n = Math.min(body.length - at, rng.range(1, 16_384));
      const part = body.subarray(at, at + n);
      at += n;
      const last = at >= body.length;
      dataFrames.push((s) => frame(type.data, last ? 0x1 : 0, s, part));
    } while (at < body.length);
  }
  const conn = (bytes: Buffer): F => () => bytes;
  const mutations: [string, () => void][] = [
    ["DATA before HEADERS", () => void ((st.before = [...st.before, (s) => frame(type.data, 0, s, code("early"))]), (st.broken = st.noRelay = true))],
    ["HEADERS after END_STREAM", () => void ((st.after = [...st.after, (s) => frame(type.headers, 0x5, s, head("200"))]), (st.broken = true))],
    ["DATA after END_STREAM", () => void ((st.after = [...st.after, (s) => frame(type.data, 0x1, s, code("late"))]), (st.broken = true))],
    [
      "padding past the DATA",
      () => {
        if (noBody || dataFrames.length === 0) return;
        dataFrames[0] = (s) => frame(type.data, 0x8, s, Buffer.concat([Buffer.from([200]), code("abc")]));
        st.broken = st.noRelay = true;
      },
    ],
    [
      "padded DATA",
      () => {
        if (noBody || dataFrames.length === 0) return;
        const first = dataFrames[0]!;
        dataFrames[0] = (s) => {
          const f = first(s);
          const payload = Buffer.concat([Buffer.from([7]), f.subarray(9), Buffer.alloc(7)]);
          return frame(type.data, f[4]! | 0x8, s, payload);
        };
      },
    ],
    ["padded HEADERS", () => void (st.headers = (s) => frame(type.headers, (noBody ? 0x5 : 0x4) | 0x8, s, Buffer.concat([Buffer.from([3]), head(String(status), lengthField), Buffer.alloc(3)])))],
    ["padding past the HEADERS", () => void ((st.headers = (s) => frame(type.headers, 0x4 | 0x8, s, Buffer.concat([Buffer.from([250]), head("200")]))), (st.broken = st.noRelay = true))],
    ...[0, 1, 2, 7, 8, 11].map((errorCode): [string, () => void] => [`RST_STREAM ${errorCode} before HEADERS`, () => void ((st.before = [...st.before, rst(errorCode)]), (st.broken = st.noRelay = true), (st.slack = Math.max(st.slack, 3)))]),
    ...[0, 2, 8].map((errorCode): [string, () => void] => [`RST_STREAM ${errorCode} after HEADERS`, () => void ((st.headers = withAfter(st.headers, rst(errorCode))), dataFrames.splice(0), (st.broken = true), (st.noRelay = !noBody))]),
    ["RST_STREAM NO_ERROR after END_STREAM", () => void (st.after = [...st.after, rst(0)])],
    ["RST_STREAM mid-body", () => void (dataFrames.length > 1 ? (dataFrames.splice(1, dataFrames.length, rst(8)), (st.broken = st.noRelay = true)) : undefined)],
    ["GOAWAY 0 before the answer, then the close", () => void ((st.before = [...st.before, conn(goaway(0, 0))]), (st.end = "end"), (st.broken = st.noRelay = true), (st.slack = Math.max(st.slack, 3)))],
    // A stream the proxy sent as the GOAWAY came is not processed, and goes again on a new connection.
    ["GOAWAY for this stream after the answer", () => void ((st.after = [...st.after, (s) => goaway(s, 0)]), (st.slack = Math.max(st.slack, 1)))],
    ["GOAWAY 2^31-1 mid-answer", () => void dataFrames.unshift(conn(goaway(0x7fffffff, 0)))],
    ["GOAWAY with an error, past every stream", () => void ((st.before = [...st.before, conn(goaway(0x7ffffffe, 1))]), (st.end = "end"), (st.broken = st.noRelay = true), (st.slack = Math.max(st.slack, 3)))],
    ["GOAWAY, last stream below this one, answer anyway", () => void ((st.before = [...st.before, (s) => goaway(Math.max(0, s - 2), 0)]), (st.broken = true), (st.slack = Math.max(st.slack, 3)))],
    ["GOAWAY of 4 bytes", () => void ((st.before = [...st.before, conn(frame(type.goaway, 0, 0, u32(0)))]), (st.broken = st.noRelay = true), (st.slack = Math.max(st.slack, 3)))],
    [
      "an oversized header block in CONTINUATION",
      () => {
        const big = Buffer.concat(Array.from({ length: 8 }, (_, i) => literal(`x-big-${i}`, "b".repeat(9_000))));
        const block = Buffer.concat([head(String(status)), big]);
        st.headers = (s) => Buffer.concat([frame(type.headers, 0, s, block.subarray(0, 16_000)), frame(type.continuation, 0, s, block.subarray(16_000, 32_000)), frame(type.continuation, 0, s, block.subarray(32_000, 48_000)), frame(type.continuation, 0x4, s, block.subarray(48_000))]);
        if (noBody) st.headers = withFlags(st.headers, 0x1);
        st.broken = st.noRelay = true;
        dataFrames.splice(0);
      },
    ],
    ["HEADERS without END_HEADERS, then DATA", () => void ((st.headers = (s) => frame(type.headers, 0, s, head(String(status)))), (st.broken = st.noRelay = true))],
    ["CONTINUATION on another stream", () => void ((st.headers = (s) => Buffer.concat([frame(type.headers, 0, s, literal(":status", "200")), frame(type.continuation, 0x4, s + 2, literal("x-a", "1"))])), (st.broken = st.noRelay = true))],
    ...(
      [
        ["MAX_FRAME_SIZE 16383", [[5, 16_383]]],
        ["INITIAL_WINDOW_SIZE 2^31", [[4, 0x80000000]]],
        ["ENABLE_PUSH 1", [[2, 1]]],
        ["ENABLE_PUSH 2", [[2, 2]]],
        ["an unknown setting", [[0x99, 7]]],
        ["HEADER_TABLE_SIZE 0", [[1, 0]]],
        ["MAX_CONCURRENT_STREAMS 0", [[3, 0]]],
        ["INITIAL_WINDOW_SIZE 0", [[4, 0]]],
        ["MAX_HEADER_LIST_SIZE 1", [[6, 1]]],
      ] as const
    ).map(([label, pairs]): [string, () => void] => [
      `SETTINGS ${label}`,
      () => {
        st.before = [...st.before, conn(settingsFrame(pairs))];
        if (/16383|2\^31|ENABLE/.test(label)) st.broken = st.noRelay = true;
      },
    ]),
    ["SETTINGS ACK with a payload", () => void ((st.before = [...st.before, conn(frame(type.settings, 1, 0, Buffer.alloc(6)))]), (st.broken = st.noRelay = true))],
    ["SETTINGS of 5 bytes", () => void ((st.before = [...st.before, conn(frame(type.settings, 0, 0, Buffer.alloc(5)))]), (st.broken = st.noRelay = true))],
    ["SETTINGS on a stream", (): void => void ((st.before = [...st.before, (s) => frame(type.settings, 0, s, Buffer.alloc(0))]), (st.broken = st.noRelay = true))],
    ["PUSH_PROMISE", () => void ((st.before = [...st.before, (s) => frame(type.push, 0x4, s, Buffer.concat([u32(2), literal(":method", "GET"), literal(":path", "/p"), literal(":scheme", "https"), literal(":authority", "api.test")]))]), (st.broken = st.noRelay = true))],
    ["WINDOW_UPDATE 0 on the stream", () => void ((st.before = [...st.before, (s) => frame(type.window, 0, s, u32(0))]), (st.broken = st.noRelay = true))],
    ["WINDOW_UPDATE 0 on the connection", () => void ((st.before = [...st.before, conn(frame(type.window, 0, 0, u32(0)))]), (st.broken = st.noRelay = true))],
    [
      "content-length above the DATA",
      () => {
        if (noBody || dataFrames.length === 0) return;
        st.headers = (s) => frame(type.headers, 0x4, s, head(String(status), [literal("content-length", String(body.length + 10))]));
        st.broken = st.noRelay = true;
      },
    ],
    [
      "content-length below the DATA",
      () => {
        if (noBody || body.length === 0 || dataFrames.length === 0) return;
        st.headers = (s) => frame(type.headers, 0x4, s, head(String(status), [literal("content-length", String(body.length - 1))]));
        st.broken = st.noRelay = true;
      },
    ],
    ["an upper-case field name", () => void ((st.headers = (s) => frame(type.headers, noBody ? 0x5 : 0x4, s, head(String(status), [literal("X-Upper", "1")]))), (st.broken = st.noRelay = true))],
    ...["connection", "transfer-encoding", "keep-alive", "upgrade"].map((name): [string, () => void] => [
      `a ${name} field`,
      () => void ((st.headers = (s) => frame(type.headers, noBody ? 0x5 : 0x4, s, head(String(status), [literal(name, name === "transfer-encoding" ? "chunked" : "keep-alive")]))), (st.broken = st.noRelay = true)),
    ]),
    ...["", "2000", "20", "abc", "101", "099"].map((value): [string, () => void] => [
      `:status ${JSON.stringify(value)}`,
      () => void ((st.headers = (s) => frame(type.headers, noBody ? 0x5 : 0x4, s, Buffer.concat([literal(":status", value), literal("content-type", "text/plain")]))), (st.broken = st.noRelay = true)),
    ]),
    ["no :status", () => void ((st.headers = (s) => frame(type.headers, noBody ? 0x5 : 0x4, s, literal("content-type", "text/plain"))), (st.broken = st.noRelay = true))],
    ["two :status", () => void ((st.headers = (s) => frame(type.headers, noBody ? 0x5 : 0x4, s, Buffer.concat([literal(":status", "200"), literal(":status", "404")]))), (st.broken = st.noRelay = true))],
    ["a pseudo-header after a field", () => void ((st.headers = (s) => frame(type.headers, noBody ? 0x5 : 0x4, s, Buffer.concat([literal("content-type", "text/plain"), literal(":status", String(status))]))), (st.broken = st.noRelay = true))],
    ["a 103 first", () => void (st.before = [...st.before, (s) => frame(type.headers, 0x4, s, Buffer.concat([literal(":status", "103"), literal("link", "</a>; rel=preload")]))])],
    ["a 100 first", () => void ((st.before = [...st.before, (s) => frame(type.headers, 0x4, s, literal(":status", "100"))]), (st.broken = true))],
    // Malformed (RFC 9113 §8.1), but nghttp2 reads on to the final answer: a relay of it is no harm.
    ["a 1xx with END_STREAM", () => void ((st.before = [...st.before, (s) => frame(type.headers, 0x5, s, literal(":status", "103"))]), (st.broken = true))],
    [
      "trailers",
      () => {
        if (noBody || dataFrames.length === 0) return;
        const last = dataFrames.length - 1;
        const f = dataFrames[last]!;
        dataFrames[last] = (s) => withFlagsCleared(f(s), 0x1);
        st.after = [...st.after, (s) => frame(type.headers, 0x5, s, literal("x-trailer", "1"))];
      },
    ],
    [
      "a pseudo-header in the trailers",
      () => {
        if (noBody || dataFrames.length === 0) return;
        const last = dataFrames.length - 1;
        const f = dataFrames[last]!;
        dataFrames[last] = (s) => withFlagsCleared(f(s), 0x1);
        st.after = [...st.after, (s) => frame(type.headers, 0x5, s, literal(":status", "200"))];
        st.broken = true;
      },
    ],
    [
      "trailers without END_STREAM",
      () => {
        if (noBody || dataFrames.length === 0) return;
        const last = dataFrames.length - 1;
        const f = dataFrames[last]!;
        dataFrames[last] = (s) => withFlagsCleared(f(s), 0x1);
        st.after = [...st.after, (s) => frame(type.headers, 0x4, s, literal("x-trailer", "1"))];
        st.end = "end";
        st.broken = st.noRelay = true;
      },
    ],
    ["DATA on stream 0", () => void ((st.before = [...st.before, conn(frame(type.data, 0, 0, code("x")))]), (st.broken = st.noRelay = true))],
    ["DATA on an idle stream", () => void ((st.before = [...st.before, (s) => frame(type.data, 0, s + 98, code("x"))]), (st.broken = st.noRelay = true))],
    ["HEADERS on an even stream", () => void ((st.before = [...st.before, (s) => frame(type.headers, 0x5, s + 1, head("200"))]), (st.broken = st.noRelay = true))],
    ["an unknown frame type", () => void (st.before = [...st.before, (s) => frame(0x20, 0xff, s, code("whatever"))])],
    ["a PING", () => void (st.before = [...st.before, conn(frame(type.ping, 0, 0, Buffer.alloc(8)))])],
    // A stream error by RFC 7540 §5.3.1; RFC 9113 leaves priority signals to be ignored.
    ["HEADERS depending on itself", () => void ((st.headers = (s) => frame(type.headers, (noBody ? 0x5 : 0x4) | 0x20, s, Buffer.concat([u32(s), Buffer.from([15]), head(String(status), lengthField)]))), (st.broken = true))],
    ["a DATA frame over 16384 bytes", () => void (noBody ? undefined : ((dataFrames.splice(0, dataFrames.length, (s) => frame(type.data, 0x1, s, Buffer.alloc(20_000, 0x61)))), (st.broken = st.noRelay = true)))],
    ["the close after the answer", () => void (st.end = "end")],
    // A HEAD's or a 204's HEADERS end the stream: the answer is whole before the cut.
    ["a cut after the HEADERS", () => void ((dataFrames.splice(0)), (st.end = "destroy"), (st.broken = true), (st.noRelay = !noBody))],
    ["a cut before any frame", () => void ((st.headers = () => Buffer.alloc(0)), dataFrames.splice(0), (st.before = []), (st.after = []), (st.end = "destroy"), (st.broken = st.noRelay = true), (st.slack = Math.max(st.slack, 3)))],
    ["garbage instead of frames", () => void ((st.before = [...st.before, conn(code("HTTP/1.1 200 OK\r\n\r\n"))]), (st.broken = st.noRelay = true))],
  ];
  steps.push(`h2 answer ${status}, ${body.length} bytes${withLength ? " with content-length" : ""}`);
  const n = rng.chance(0.25) ? 0 : rng.range(1, 2);
  let headersChanged = false;
  const applied = new Set<string>();
  for (let i = 0; i < n; i++) {
    const [label, mutate] = rng.pick(mutations);
    if (applied.has(label)) continue;
    applied.add(label);
    // A second change of the HEADERS would undo the first's, whose verdict would then be wrong: left out.
    const was = { ...st, dataFrames: [...st.dataFrames], headers: st.headers };
    mutate();
    // A frame put after END_STREAM and a change that moves END_STREAM off the last DATA (trailers)
    // undo each other's verdict: the "late" DATA then ends the stream, a valid answer with it in
    // the body (fuzzer finding, h2guest seed 20 case 2569). Left out too.
    const endsMoved = (l: string): boolean => /^trailers|in the trailers$/.test(l);
    const pastEnd = (l: string): boolean => l.endsWith("after END_STREAM");
    const clash = i > 0 && [...applied].some((other) => other !== label && ((endsMoved(label) && pastEnd(other)) || (pastEnd(label) && endsMoved(other))));
    if (clash || (i > 0 && st.headers !== was.headers && headersChanged)) {
      Object.assign(st, was);
      dataFrames.splice(0, dataFrames.length, ...was.dataFrames);
      continue;
    }
    if (st.headers !== was.headers) headersChanged = true;
    steps.push(label);
  }
  // A broken answer may end the proxy's session mid-PING: a GET or HEAD that got nothing of its
  // answer before the PING went unanswered goes once more on a new connection, as designed
  // (H2Unanswered; h2guest seed 20 case 3768 saw it).
  if (st.broken && method !== "POST") st.slack = Math.max(st.slack, 1);
  // An answer whole, then the upstream's FIN with no GOAWAY: the second request (a GET) the proxy
  // put on the session before the FIN came is sent once more on a new connection, as designed
  // (lostNext; H2Unanswered, http2-upstream-crossed-close.test.ts), and the upstream may have read
  // its HEADERS on the closing one: three requests from two lines (fuzzer seeds 171205 h2guest
  // case 364 and 181201 upstream case 206, neither replaying alone: the FIN races the proxy).
  if (st.end === "end") st.slack = Math.max(st.slack, 1);
  const { before, headers, after, broken, noRelay, slack, end } = st;
  const frames: F[] = [...before, headers, ...dataFrames, ...after];
  const script: HostileStep[] = [];
  for (const f of frames) {
    script.push({ frame: f });
    if (rng.chance(0.2)) script.push({ pause: rng.pick([0, 2]) });
  }
  if (end !== undefined) script.push(end);
  const relays = noRelay ? [] : [{ status, body: text }];
  const outcome: Outcome = broken ? { relays, errors: "any", cut: true, reaches: true } : { relays, errors: [], cut: false, reaches: true, lostNext: end === "end" };
  return { script, outcome, slack };
}

function withAfter(f: F, g: F): F {
  return (s) => Buffer.concat([f(s), g(s)]);
}

function withFlags(f: F, flags: number): F {
  return (s) => {
    const out = Buffer.from(f(s));
    out[4] = out[4]! | flags;
    return out;
  };
}

function withFlagsCleared(bytes: Buffer, flags: number): Buffer {
  const out = Buffer.from(bytes);
  out[4] = out[4]! & ~flags;
  return out;
}

/**
 * What the hooks do to the outcome: a request hook that answers or refuses keeps the request from
 * the upstream; a response hook replaces, or fails, every whole answer the upstream's would give.
 */
function hooked(outcome: Outcome, tag: string, req: string, res: string, method: string, refused: string | undefined): Outcome {
  const failed = (codes: readonly string[]): Outcome => ({ relays: [], errors: codes, cut: false, reaches: false });
  switch (req) {
    case "response":
      return { relays: [{ status: 200, body: method === "HEAD" ? "" : `hooked ${tag}\n` }], errors: [], cut: false, reaches: false };
    case "throw":
    case "reject":
    case "garbage":
      return failed(["EG_HOOK_FAILED"]);
    case "stream-error":
    case "stream-late-error":
      return method === "HEAD" ? { relays: [{ status: 200, body: "" }], errors: ["EG_HOOK_FAILED"], cut: false, reaches: false } : { ...failed(["EG_HOOK_FAILED"]), cut: true };
    case "blocked":
      return failed(["EG_HOOK_BLOCKED"]);
    case "hang":
      return failed(["EG_HOOK_TIMEOUT"]);
    case "rewrite-denied":
    case "rewrite-internal":
    case "rewrite-leak":
      return failed(["EG_DENIED"]);
    default:
      break;
  }
  if (refused !== undefined) return failed([refused]);
  // onResponse sees every answer whose head was whole, a broken body's too: replaced unread, the body goes unseen.
  if (res === "replace") return outcome.relays.length > 0 || outcome.cut ? { ...outcome, relays: [{ status: 201, body: method === "HEAD" ? "" : `replaced ${tag}\n` }] } : outcome;
  if (outcome.relays.length === 0) return outcome;
  const merge = (codes: readonly string[]): readonly string[] | "any" => (outcome.errors === "any" ? "any" : [...new Set([...outcome.errors, ...codes])]);
  // The body read before the answer: one that breaks, or cannot be decoded, is the upstream's 502, not a cut.
  const readFails = outcome.cut || outcome.undecodable === true;
  switch (res) {
    case "read":
      return { ...outcome, errors: readFails ? merge(["EG_UPSTREAM"]) : outcome.errors };
    case "clone-read":
      // A clone's failed read fails the hook.
      return { ...outcome, errors: readFails ? merge(["EG_UPSTREAM", "EG_HOOK_FAILED"]) : outcome.errors };
    case "read-replace":
      return { ...outcome, relays: outcome.relays.map((r) => ({ status: 200, body: method === "HEAD" ? "" : r.body })), errors: readFails ? merge(["EG_UPSTREAM"]) : outcome.errors };
    case "throw":
    case "reject":
    case "garbage":
      return { ...outcome, relays: [], errors: merge(["EG_HOOK_FAILED"]) };
    case "stream-error":
      // A HEAD's answer has no body to wait for: its head goes as it is.
      return { ...outcome, relays: method === "HEAD" ? [{ status: 200, body: "" }] : [], errors: merge(["EG_HOOK_FAILED"]) };
    case "hang":
      return { ...outcome, relays: [], errors: merge(["EG_HOOK_TIMEOUT"]) };
    default:
      return outcome;
  }
}

/** Target `upstream`: one well-formed request (then a second on the same connection) to a hostile upstream. */
export function upstreamCase(rng: Rng, world: FuzzWorld, options: { readonly hooks: boolean; readonly echo?: boolean; readonly kinds?: readonly HostileKind[] }): UpstreamCase {
  const steps: string[] = [];
  const name: HostileName = rng.chance(0.5) ? "api" : "secret";
  const kind: HostileKind = rng.pick(options.kinds ?? hostileKinds);
  const method = rng.pick(["GET", "GET", "GET", "POST", "HEAD"] as const);
  const tag = world.tag ?? "x-0";
  const placeholder = name === "secret" && rng.chance(0.6);
  steps.push(`${method} to ${name} ${kind}${placeholder ? " with the placeholder" : ""}`);
  const c: Context = { rng, world, name, kind, tag, method, carries: placeholder && kind !== "h1plain", steps };
  const answer = kind === "h2" ? h2Answer(c) : h1Answer(c);
  const fields: [string, string][] = [];
  if (placeholder) fields.push(["authorization", `Bearer ${world.placeholder}`]);
  let req = "pass";
  let res = "pass";
  if (options.hooks) {
    req = rng.chance(0.5) ? "pass" : rng.pick(requestHookChoices.filter((h) => h !== "hang" || rng.chance(0.1)));
    res = rng.chance(0.5) ? "pass" : rng.pick(responseHookChoices.filter((h) => h !== "hang" || rng.chance(0.1)));
    fields.push(["x-fuzz-hooks", `req=${req};res=${res}`]);
    steps.push(`hooks ${req}, ${res}`);
  }
  // onRequest runs before the secrets: a placeholder bound for plain http:// is refused after it
  // (a value never leaves in cleartext), whatever its host.
  const cleartext = placeholder && kind === "h1plain" ? "EG_DENIED" : undefined;
  const outcome = hooked(answer.outcome, tag, req, res, method, cleartext);
  const upload = method === "POST" ? `upload ${tag} ${filler(rng, rng.pick([0, 5, 200]))}` : "";
  const echo = options.echo === true ? "&echo=1" : "";
  // With echo, the second request carries the placeholder where it is substituted: its answer quotes the guest's own value.
  const second = {
    target: `/h?c=${tag}&seq=2${echo}`,
    fields: echo !== "" && name === "secret" && kind !== "h1plain" ? [["authorization", `Bearer ${world.placeholder}`] as const] : [],
  };
  return { name, kind, method, target: `/h?c=${tag}&seq=1${echo}`, fields, upload, script: answer.script, outcome, second, slack: answer.slack, steps };
}
