// The upstream's answer to a WebSocket upgrade: read strictly, and rebuilt for the guest.
import { maxHeaderSize } from "node:http";
import { EgressError, quoteShort } from "../errors.js";
import { endToEndHeaders, httpToken, type HeaderList } from "../headers.js";

/**
 * Informational responses (1xx other than 101) skipped before the 101. RFC 9110 §15.2 lets a
 * server send them first (a 100, a 103 Early Hints), and Node's client skips them too; they were
 * answered 502 "did not switch protocols (answered 103)". Bounded, so an upstream cannot keep an
 * upgrade waiting by streaming them: at most this many, as for every other request (the
 * pipeline's `maxInformational`), and {@link maxSwitchHeadBytes} in all.
 * `timeouts.upstreamHeadersMs` still counts from the request to the 101's end.
 */
export const maxInformational = 16;

/** The most bytes of heads read before the 101 ends, informational responses and the 101's own included. */
export const maxSwitchHeadBytes = 64 * 1024;

/**
 * The most one head may hold, its status line and CRLFs included: `http.maxHeaderSize` (16 KiB
 * unless `--max-http-header-size`), what undici takes of every other upstream response head
 * (src/pipeline/head-bounds.ts bounds only the heads a source makes).
 */
const maxHeadBytes = maxHeaderSize;

/** What the guest gets once the upstream switched: the 101 as the proxy writes it, and the new protocol's first bytes. */
export interface Switched {
  readonly head: Buffer;
  readonly rest: Buffer;
}

/** What Node's parser refuses in a field value: HTAB, visible ASCII and obs-text only. */
const invalidValueChar = /[^\t\x20-\x7e\x80-\xff]/;
/** A 101's framing fields describe no content (RFC 9110 §8.6, RFC 9112 §6.1: a 1xx MUST NOT carry them); `te` is a request's. */
const framing: ReadonlySet<string> = new Set(["content-length", "te"]);
const cr = 0x0d;
const lf = 0x0a;
const httpPrefix = Buffer.from("HTTP/", "latin1");

/**
 * Reads an upstream's response heads as they arrive, the way Node's and undici's clients
 * (llhttp) read them: CRLF line ends only (a bare LF, which neither takes, was never seen, and
 * the guest waited `upstreamHeadersMs` for a 504), no obs-fold, token field names, no control
 * characters in values; and, stricter than they are, HTTP/1.1 status lines only. Interim
 * responses are skipped; any other status, or anything malformed, is refused at once (bytes no
 * status line starts with before its line ends). The 101 is rebuilt from its parsed fields: it went to the guest
 * byte for byte, `Transfer-Encoding`, `Content-Length`, `Keep-Alive` and folded lines included.
 */
export class SwitchReader {
  private buffer = Buffer.alloc(0);
  private length = 0;
  /** Where the line being read starts, and how far it has been searched for its LF. */
  private lineStart = 0;
  private searched = 0;
  private messageStart = 0;
  /** The current head's status code, once its status line is read. */
  private status: string | undefined;
  private fields: HeaderList = [];
  private informational = 0;

  constructor(private readonly host: string) {}

  /** Takes the upstream's next bytes: the 101 once it is complete, else undefined. Throws 502 `EG_UPSTREAM` for any other answer. */
  push(chunk: Buffer): Switched | undefined {
    this.append(chunk);
    const bytes = this.buffer.subarray(0, this.length);
    for (;;) {
      const end = bytes.indexOf(lf, this.searched);
      if (end < 0) {
        // No LF after it: a CR followed by anything is a bare CR (llhttp: "Expected LF after CR").
        const at = bytes.indexOf(cr, Math.max(this.lineStart, this.searched - 1));
        if (at >= 0 && at < this.length - 1) throw this.malformed("a CR not followed by LF");
        this.searched = this.length;
        if (this.status === undefined) this.checkPrefix(bytes.subarray(this.lineStart));
        this.checkBounds(this.length);
        return undefined;
      }
      if (end === this.lineStart || bytes[end - 1] !== cr) throw this.malformed("a line that ends in a bare LF, not CRLF");
      const line = bytes.toString("latin1", this.lineStart, end - 1);
      this.lineStart = this.searched = end + 1;
      this.checkBounds(this.lineStart);
      if (line.includes("\r")) throw this.malformed("a CR not followed by LF");
      if (this.status === undefined && line === "") {
        // Empty lines before a status line are skipped, as llhttp skips them (RFC 9112 §2.2's
        // robustness rule): Node's client took such a 101, and the guest got a 502 here.
        this.messageStart = this.lineStart;
      } else if (this.status === undefined) {
        this.status = this.statusOf(line);
      } else if (line !== "") {
        this.fields.push(...this.fieldOf(line));
      } else if (this.status === "101") {
        return this.switched(Buffer.from(bytes.subarray(this.lineStart)));
      } else {
        this.informational += 1;
        if (this.informational > maxInformational) {
          throw new EgressError("EG_UPSTREAM", 502, `upstream ${this.host} sent more than ${maxInformational} informational (1xx) responses`);
        }
        this.status = undefined;
        this.fields = [];
        this.messageStart = this.lineStart;
      }
    }
  }

  private append(chunk: Buffer): void {
    const needed = this.length + chunk.length;
    if (needed > this.buffer.length) {
      // Grown by doubling: an upstream that sends its head a byte at a time costs no copy per byte.
      const grown = Buffer.allocUnsafe(Math.max(needed, this.buffer.length * 2, 1024));
      this.buffer.copy(grown, 0, 0, this.length);
      this.buffer = grown;
    }
    chunk.copy(this.buffer, this.length);
    this.length = needed;
  }

  /** `upTo` is where the bytes read so far end. */
  private checkBounds(upTo: number): void {
    if (upTo - this.messageStart > maxHeadBytes) {
      throw new EgressError("EG_UPSTREAM", 502, `upstream ${this.host} sent a response head over ${maxHeadBytes} bytes in answer to the upgrade`);
    }
    if (upTo > maxSwitchHeadBytes) {
      throw new EgressError("EG_UPSTREAM", 502, `upstream ${this.host} sent more than ${maxSwitchHeadBytes / 1024} KiB of response heads before switching protocols`);
    }
  }

  /** A status line's first bytes are "HTTP/": anything else (an SSH banner, a TLS alert) is refused before its line ends. */
  private checkPrefix(partial: Buffer): void {
    // A CR that may start an empty line: its LF is yet to come (a CR followed by anything else is refused above).
    if (partial.length === 1 && partial[0] === cr) return;
    const n = Math.min(partial.length, httpPrefix.length);
    if (partial.subarray(0, n).equals(httpPrefix.subarray(0, n))) return;
    throw this.notSwitched("a malformed status line");
  }

  /**
   * RFC 9112 §4: `HTTP-version SP status-code SP [reason-phrase]`, exactly three digits; some
   * servers leave out the SP before an empty reason, as Node's parser allows. "1010" is no 101.
   */
  private statusOf(line: string): string {
    const match = /^HTTP\/(\d\.\d) (\d{3})(?: |$)/.exec(line);
    if (match === null) throw this.notSwitched("a malformed status line");
    const status = match[2]!;
    if (!status.startsWith("1")) throw this.notSwitched(status);
    // HTTP/1.0 has no 1xx (RFC 9110 §15.2): a server that answers in it has not switched,
    // whatever its code says; Node's and undici's clients took an HTTP/1.0 101.
    if (match[1] !== "1.1") throw this.notSwitched(`${status} with HTTP/${match[1]}; a switch needs HTTP/1.1`);
    return status;
  }

  private fieldOf(line: string): [string, string] {
    // RFC 9112 §5.2: a proxy that receives obs-fold in a response either answers 502 explaining
    // so or unfolds it; undici, which reads every other upstream response, refuses it.
    if (line.startsWith(" ") || line.startsWith("\t")) throw this.malformed("a folded header line (obs-fold)");
    const colon = line.indexOf(":");
    if (colon < 0) throw this.malformed(`a header line without a colon: ${quoteShort(line)}`);
    const name = line.slice(0, colon);
    // Whitespace before the colon included: RFC 9112 §5.1 has a proxy remove it from a response,
    // but undici refuses such a response from any other upstream, and so does this.
    if (!httpToken.test(name)) throw this.malformed(`a header name that is not an HTTP token: ${quoteShort(name)}`);
    const value = trimOws(line.slice(colon + 1));
    if (invalidValueChar.test(value)) throw this.malformed(`a control character in the value of ${quoteShort(name)}`);
    return [name, value];
  }

  private switched(rest: Buffer): Switched {
    // The guest asked for WebSocket only; a switch to anything else would be a tunnel no tier sees.
    const upgrades: string[] = [];
    for (let i = 0; i < this.fields.length; i += 2) {
      if (this.fields[i]!.toLowerCase() === "upgrade") upgrades.push(...this.fields[i + 1]!.split(",").map((v) => v.trim().toLowerCase()));
    }
    if (upgrades.length !== 1 || upgrades[0] !== "websocket") {
      const named = upgrades.length === 0 ? "an unnamed protocol" : quoteShort(upgrades.join(", "));
      throw new EgressError("EG_UPSTREAM", 502, `upstream ${this.host} switched to ${named}, not to WebSocket`);
    }
    // Hop-by-hop fields, those Connection names and framing are the upstream's connection's, not
    // the guest's. Upgrade and Connection are the proxy's own on its hop (RFC 9110 §7.8: a 101
    // names the protocol, and the sender of Upgrade sends the "upgrade" connection option);
    // Sec-WebSocket-*, Set-Cookie and other end-to-end fields pass as the upstream sent them.
    const kept = endToEndHeaders(this.fields, framing);
    let head = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n";
    for (let i = 0; i < kept.length; i += 2) head += `${kept[i]}: ${kept[i + 1]}\r\n`;
    return { head: Buffer.from(`${head}\r\n`, "latin1"), rest };
  }

  private notSwitched(answered: string): EgressError {
    return new EgressError("EG_UPSTREAM", 502, `upstream ${this.host} did not switch protocols (answered ${answered})`);
  }

  private malformed(what: string): EgressError {
    return new EgressError("EG_UPSTREAM", 502, `upstream ${this.host} answered the upgrade with a malformed head: ${what}`);
  }
}

/** A field value without its surrounding OWS (SP and HTAB): by hand, as a regex's `[\t ]+$` backtracks on long runs. */
function trimOws(text: string): string {
  let start = 0;
  let end = text.length;
  while (start < end && (text[start] === " " || text[start] === "\t")) start += 1;
  while (end > start && (text[end - 1] === " " || text[end - 1] === "\t")) end -= 1;
  return text.slice(start, end);
}
