import type { HostileStep } from "./hostile-upstream.js";
import type { Rng } from "./rng.js";
import { hostName, type FuzzWorld } from "./world.js";

/**
 * Cases of the `decider` target: a guest's well-formed request (absolute-form to `api.test`'s
 * plain recorder, or inside a TLS tunnel to its TLS one) while one external decider answers the
 * call about it badly (test/helpers/fuzz/hostile-decider.ts): slow, never, cut before or inside
 * its answer, JSON that is malformed, of the wrong shape or over 1 MiB, the wrong content-type,
 * a redirect, a 5xx, odd framing. The proxy's chain (fuzz-proxy-child.ts) has a webhook asked
 * in both phases and an OPA decider asked about requests, neither `failOpen`: what the guest may
 * get is the decider's verdict as its contract reads (README, "External deciders"), and a
 * decider that failed must never let its request reach the upstream (the fail-open oracle).
 */
export type DeciderKind = "webhook" | "opa";
export type DeciderPhase = "request" | "response";

/** What the answer may mean: an allow, a block with one of these statuses, a failure (502). */
export interface Verdicts {
  readonly allow: boolean;
  readonly block: readonly number[];
  readonly fail: boolean;
}

export interface DeciderCase {
  readonly via: "plain" | "tunnel";
  readonly method: "GET" | "POST" | "HEAD";
  /** The first request's target (origin-form): `/d?c=TAG&seq=1`. */
  readonly target: string;
  readonly upload: string;
  readonly decider: DeciderKind;
  readonly phase: DeciderPhase;
  readonly script: readonly HostileStep[];
  readonly verdicts: Verdicts;
  readonly steps: readonly string[];
}

const allow: Verdicts = { allow: true, block: [], fail: false };
const fail: Verdicts = { allow: false, block: [], fail: true };
const block = (...statuses: number[]): Verdicts => ({ allow: false, block: statuses, fail: false });

const bytes = (text: string): Buffer => Buffer.from(text, "latin1");

function answer(status: string, fields: readonly string[], body: string | Buffer): Buffer {
  const content = typeof body === "string" ? bytes(body) : body;
  return Buffer.concat([bytes(`HTTP/1.1 ${status}\r\n${[...fields, `content-length: ${content.length}`].map((f) => `${f}\r\n`).join("")}\r\n`), content]);
}

const json = (status: string, body: string): Buffer => answer(status, ["content-type: application/json"], body);

function chunked(status: string, fields: readonly string[], body: string, chunkSize: number): Buffer {
  let out = `HTTP/1.1 ${status}\r\n${[...fields, "transfer-encoding: chunked"].map((f) => `${f}\r\n`).join("")}\r\n`;
  for (let at = 0; at < body.length; at += chunkSize) {
    const part = body.slice(at, at + chunkSize);
    out += `${part.length.toString(16)}\r\n${part}\r\n`;
  }
  return bytes(`${out}0\r\n\r\n`);
}

type Choice = readonly [label: string, script: () => HostileStep[], verdicts: Verdicts];

/** Answers either kind may give: the transport's failures, which mean the same to both. */
function transportChoices(rng: Rng): Choice[] {
  const huge = " ".repeat(1024 * 1024 + 10);
  return [
    ["no answer", () => ["stall"], fail],
    ["a close before any byte", () => ["destroy"], fail],
    ["a FIN before any byte", () => ["end"], fail],
    ["a close inside the status line", () => [{ write: bytes("HTTP/1.1 20") }, "destroy"], fail],
    ["a close inside the head", () => [{ write: bytes("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n") }, "destroy"], fail],
    ["a close inside the body", () => [{ write: bytes('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{"decision":') }, "destroy"], fail],
    ["a body shorter than its length, then silence", () => [{ write: bytes('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{"result":true}') }, "stall"], fail],
    ["a head without its blank line, then silence", () => [{ write: bytes("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n") }, "stall"], fail],
    ["an answer over 1 MiB with its length", () => [{ write: json("200 OK", `${huge}{}`) }], fail],
    ["an answer over 1 MiB, chunked", () => [{ write: chunked("200 OK", ["content-type: application/json"], `${huge}{}`, 65_536) }], fail],
    ["an answer over 1 MiB to the close", () => [{ write: bytes(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n${huge}{}`) }, "end"], fail],
    ["500", () => [{ write: answer("500 Internal Server Error", ["content-type: text/plain"], "boom") }], fail],
    ["503 with Retry-After", () => [{ write: answer("503 Service Unavailable", ["retry-after: 1"], "") }], fail],
    ["404", () => [{ write: json("404 Not Found", "{}") }], fail],
    ...["301", "302", "303", "307", "308"].map((s): Choice => [`a ${s} redirect`, () => [{ write: answer(`${s} Moved`, [`location: /elsewhere`], "") }], fail]),
    ["a status line of garbage", () => [{ write: bytes("HTTP/1.1 abc\r\ncontent-length: 0\r\n\r\n") }], fail],
    ["not HTTP at all", () => [{ write: bytes("SSH-2.0-OpenSSH\r\n") }, "end"], fail],
    ["two different Content-Lengths", () => [{ write: bytes('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\ncontent-length: 2\r\n\r\n{"result":true}') }], fail],
    ["a bad chunk size", () => [{ write: bytes("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n") }], fail],
    ["a bare-LF head", () => [{ write: bytes('HTTP/1.1 200 OK\ncontent-type: application/json\ncontent-length: 15\n\n{"result":true}') }], { allow: true, block: [], fail: true }],
    ["a NUL in a field value", () => [{ write: bytes('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-a: a\u0000b\r\ncontent-length: 15\r\n\r\n{"result":true}') }], fail],
    [
      "a slow answer, in time",
      () => {
        const pause = rng.pick([5, 50, 200]);
        return [{ pause }];
      },
      allow,
    ],
  ];
}

/** A webhook's answers (README's webhook table): 2xx JSON is the contract, 2xx other is allow, 422 blocks, anything else fails. */
function webhookChoices(rng: Rng, tag: string, phase: DeciderPhase): Choice[] {
  const rewriteOk = phase === "request" ? allow : fail;
  return [
    ["204", () => [{ write: bytes("HTTP/1.1 204 No Content\r\n\r\n") }], allow],
    ["an empty 200", () => [{ write: answer("200 OK", [], "") }], allow],
    ["200 ok as text", () => [{ write: answer("200 OK", ["content-type: text/plain"], "ok") }], allow],
    ["200 html", () => [{ write: answer("200 OK", ["content-type: text/html"], "<html>no</html>") }], allow],
    ["JSON allow", () => [{ write: json("200 OK", '{"decision":"allow"}') }], allow],
    ["JSON {}", () => [{ write: json("200 OK", "{}") }], allow],
    ["JSON allow as 201", () => [{ write: json("201 Created", '{"decision":"allow"}') }], allow],
    ["JSON allow with a BOM", () => [{ write: json("200 OK", '\u00ef\u00bb\u00bf{"decision":"allow"}') }], allow],
    ["JSON allow, chunked by bytes", () => [{ write: chunked("200 OK", ["content-type: application/json"], '{"decision":"allow"}', rng.range(1, 4)) }], allow],
    ["JSON allow to the close, HTTP/1.0", () => [{ write: bytes('HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n{"decision":"allow"}') }, "end"], allow],
    ["JSON allow without a content-type", () => [{ write: answer("200 OK", [], '{"decision":"allow"}') }], allow],
    ["JSON allow as text/plain", () => [{ write: answer("200 OK", ["content-type: text/plain"], '{"decision":"allow"}') }], allow],
    ["a 103 first", () => [{ write: bytes("HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n") }, { write: json("200 OK", '{"decision":"allow"}') }], { allow: true, block: [], fail: true }],
    ["a 100 first", () => [{ write: bytes("HTTP/1.1 100 Continue\r\n\r\n") }, { write: bytes("HTTP/1.1 204 No Content\r\n\r\n") }], { allow: true, block: [], fail: true }],
    ["a set_headers rewrite", () => [{ write: json("200 OK", '{"decision":"allow","set_headers":{"x-decided":"1"},"remove_headers":["x-nothing"]}') }], rewriteOk],
    ["422 as text", () => [{ write: answer("422 Unprocessable Entity", ["content-type: text/plain"], `no ${tag}`) }], block(403)],
    ["422 empty", () => [{ write: answer("422 Unprocessable Entity", [], "") }], block(403)],
    ["422 with a JSON block", () => [{ write: json("422 Unprocessable Entity", '{"decision":"block","status":451,"reason":"json 422"}') }], block(451)],
    ["JSON block", () => [{ write: json("200 OK", '{"decision":"block"}') }], block(403)],
    ["JSON block 599", () => [{ write: json("200 OK", '{"decision":"block","status":599,"reason":"odd"}') }], block(599)],
    ["JSON block 400 with a long reason", () => [{ write: json("200 OK", `{"decision":"block","status":400,"reason":"${"r".repeat(50_000)}"}`) }], block(400)],
    ["JSON block with a control character in its reason", () => [{ write: json("200 OK", '{"decision":"block","reason":"a\\r\\nx-injected: 1\\u0000"}') }], block(403)],
    ["JSON block 399", () => [{ write: json("200 OK", '{"decision":"block","status":399}') }], fail],
    ["JSON block 600", () => [{ write: json("200 OK", '{"decision":"block","status":600}') }], fail],
    ["JSON block with a string status", () => [{ write: json("200 OK", '{"decision":"block","status":"451"}') }], fail],
    ["JSON decision null", () => [{ write: json("200 OK", '{"decision":null}') }], fail],
    ["JSON decision maybe", () => [{ write: json("200 OK", '{"decision":"maybe"}') }], fail],
    ["JSON ALLOW", () => [{ write: json("200 OK", '{"decision":"ALLOW"}') }], fail],
    ["JSON status without block", () => [{ write: json("200 OK", '{"status":451}') }], fail],
    ["JSON with an unknown key", () => [{ write: json("200 OK", '{"decision":"allow","why":1}') }], fail],
    ["JSON __proto__", () => [{ write: json("200 OK", '{"__proto__":{"decision":"block"}}') }], fail],
    ["JSON an array", () => [{ write: json("200 OK", '["allow"]') }], fail],
    ["JSON a string", () => [{ write: json("200 OK", '"allow"') }], fail],
    ["JSON null", () => [{ write: json("200 OK", "null") }], fail],
    ["JSON true", () => [{ write: json("200 OK", "true") }], fail],
    ["JSON cut short", () => [{ write: json("200 OK", '{"decision":"allow"') }], fail],
    ["JSON declared, text sent", () => [{ write: json("200 OK", "allow") }], fail],
    ["JSON declared, empty", () => [{ write: json("200 OK", "") }], { allow: true, block: [], fail: true }],
    ["JSON two objects", () => [{ write: json("200 OK", '{"decision":"allow"}{"decision":"block"}') }], fail],
    ["JSON nested 100,000 deep", () => [{ write: json("200 OK", `${"[".repeat(100_000)}${"]".repeat(100_000)}`) }], fail],
    ["JSON set_headers host", () => [{ write: json("200 OK", '{"decision":"allow","set_headers":{"host":"denied.test"}}') }], fail],
    ["JSON set_headers content-length", () => [{ write: json("200 OK", '{"decision":"allow","set_headers":{"content-length":"5"}}') }], fail],
    ["JSON set_headers transfer-encoding", () => [{ write: json("200 OK", '{"decision":"allow","set_headers":{"transfer-encoding":"chunked"}}') }], fail],
    ["JSON set_headers with a bad name", () => [{ write: json("200 OK", '{"decision":"allow","set_headers":{"x a":"1"}}') }], fail],
    ["JSON set_headers with a CRLF value", () => [{ write: json("200 OK", '{"decision":"allow","set_headers":{"x-a":"1\\r\\nx-b: 2"}}') }], fail],
    ["JSON set_headers not an object", () => [{ write: json("200 OK", '{"decision":"allow","set_headers":["x-a"]}') }], fail],
    ["JSON remove_headers host", () => [{ write: json("200 OK", '{"decision":"allow","remove_headers":["host"]}') }], fail],
    ["JSON block with set_headers", () => [{ write: json("200 OK", '{"decision":"block","set_headers":{"x-a":"1"}}') }], fail],
    ["a second answer behind the first", () => [{ write: Buffer.concat([bytes("HTTP/1.1 204 No Content\r\n\r\n"), json("200 OK", '{"decision":"block","reason":"smuggled"}')]) }], { allow: true, block: [], fail: true }],
  ];
}

/** OPA's answers (README's OPA table): `result` decides, undefined denies, any status but 200 fails. */
function opaChoices(): Choice[] {
  return [
    ["result true", () => [{ write: json("200 OK", '{"result":true}') }], allow],
    ["result false", () => [{ write: json("200 OK", '{"result":false}') }], block(403)],
    ["no result", () => [{ write: json("200 OK", "{}") }], block(403)],
    ["result allow", () => [{ write: json("200 OK", '{"result":{"allow":true}}') }], allow],
    ["result allow with set_headers", () => [{ write: json("200 OK", '{"result":{"allow":true,"set_headers":{"x-decided":"1"}}}') }], allow],
    ["result block 451", () => [{ write: json("200 OK", '{"result":{"allow":false,"status":451,"reason":"opa says no"}}') }], block(451)],
    ["result without allow", () => [{ write: json("200 OK", '{"result":{"reason":"quiet"}}') }], block(403)],
    ["result with decision_id", () => [{ write: json("200 OK", '{"decision_id":"x","result":true}') }], { allow: true, block: [], fail: true }],
    ["result a string", () => [{ write: json("200 OK", '{"result":"yes"}') }], fail],
    ["result 1", () => [{ write: json("200 OK", '{"result":1}') }], fail],
    ["result null", () => [{ write: json("200 OK", '{"result":null}') }], { allow: false, block: [403], fail: true }],
    ["result an array", () => [{ write: json("200 OK", '{"result":[true]}') }], fail],
    ["result allow a string", () => [{ write: json("200 OK", '{"result":{"allow":"true"}}') }], fail],
    ["result block 700", () => [{ write: json("200 OK", '{"result":{"allow":false,"status":700}}') }], fail],
    ["result true as 201", () => [{ write: json("201 Created", '{"result":true}') }], fail],
    ["result true as 204", () => [{ write: bytes("HTTP/1.1 204 No Content\r\n\r\n") }], fail],
    ["result true, chunked", () => [{ write: chunked("200 OK", ["content-type: application/json"], '{"result":true}', 3) }], allow],
    ["result true with a BOM", () => [{ write: json("200 OK", '\u00ef\u00bb\u00bf{"result":true}') }], allow],
    ["result true as text/html", () => [{ write: answer("200 OK", ["content-type: text/html"], '{"result":true}') }], { allow: true, block: [], fail: true }],
    ["an HTML page", () => [{ write: answer("200 OK", ["content-type: text/html"], "<html>login</html>") }], fail],
    ["an empty 200", () => [{ write: answer("200 OK", [], "") }], fail],
    ["JSON cut short", () => [{ write: json("200 OK", '{"result":tru') }], fail],
  ];
}

/** Target `decider`: one request whose decider call answers badly, then a second on the same connection. */
export function deciderCase(rng: Rng, world: FuzzWorld): DeciderCase {
  const steps: string[] = [];
  const tag = world.tag ?? "decider-0";
  const via = rng.chance(0.5) ? "plain" : "tunnel";
  const method = rng.pick(["GET", "GET", "POST", "HEAD"] as const);
  const decider: DeciderKind = rng.chance(0.65) ? "webhook" : "opa";
  const phase: DeciderPhase = decider === "webhook" && rng.chance(0.35) ? "response" : "request";
  steps.push(`${method} ${via} to ${hostName("api")}; the ${decider} decider in the ${phase} phase`);
  const choices = [...transportChoices(rng), ...(decider === "webhook" ? webhookChoices(rng, tag, phase) : opaChoices())];
  const [label, make, verdicts] = rng.pick(choices);
  let script = make();
  // A slow answer is the allow of its kind after the pause.
  if (label.startsWith("a slow answer")) script = [...script, { write: decider === "opa" ? json("200 OK", '{"result":true}') : bytes("HTTP/1.1 204 No Content\r\n\r\n") }];
  steps.push(label);
  // Now and then the answer arrives in pieces.
  if (rng.chance(0.3)) {
    const split: HostileStep[] = [];
    for (const step of script) {
      if (typeof step === "object" && "write" in step && step.write.length > 2) {
        const at = rng.range(1, step.write.length - 1);
        split.push({ write: step.write.subarray(0, at) }, { pause: rng.pick([0, 1, 5]) }, { write: step.write.subarray(at) });
      } else split.push(step);
    }
    script = split;
    steps.push("answer split");
  }
  const upload = method === "POST" ? `upload ${tag} ${"x".repeat(rng.pick([0, 5, 300]))}` : "";
  return { via, method, target: `/d?c=${tag}&seq=1`, upload, decider, phase, script, verdicts, steps };
}
