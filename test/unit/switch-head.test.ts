import { describe, expect, it } from "vitest";
import { SwitchReader, type Switched } from "../../src/proxy/switch-head.js";

// The reader gets the upstream's bytes as the socket splits them: every answer must read the same
// whole and a byte at a time (a CR that ends one chunk, its LF or not in the next).

const ok = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: abc\r\n";

/** What the reader makes of `bytes` fed in pieces of `size`: the 101's head and rest, or the refusal's message, or "more". */
function read(bytes: string, size: number): string {
  const reader = new SwitchReader("api.test:80");
  try {
    for (let at = 0; at < bytes.length; at += size) {
      const switched: Switched | undefined = reader.push(Buffer.from(bytes.slice(at, at + size), "latin1"));
      if (switched !== undefined) return `${switched.head.toString("latin1")}|${switched.rest.toString("latin1")}${bytes.slice(at + size)}`;
    }
    return "more";
  } catch (error) {
    return (error as Error).message;
  }
}

describe("SwitchReader", () => {
  it.each([
    { what: "a 101", bytes: `${ok}\r\nframes`, expected: /^HTTP\/1\.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: abc\r\n\r\n\|frames$/ },
    { what: "a 103 then a 101", bytes: `HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n${ok}\r\n`, expected: /^HTTP\/1\.1 101 [^|]*\|$/ },
    { what: "a 101 not yet ended", bytes: `${ok}X-A: 1\r`, expected: /^more$/ },
    { what: "a bare CR before a field", bytes: `${ok}\rX-A: 1\r\n\r\n`, expected: /a CR not followed by LF/ },
    { what: "a bare CR inside a field, no LF yet", bytes: `${ok}X-A: 1\rX`, expected: /a CR not followed by LF/ },
    { what: "a bare LF", bytes: `${ok}X-A: 1\n\r\n`, expected: /a line that ends in a bare LF/ },
    { what: "a bare-LF status line", bytes: "HTTP/1.1 101 Switching Protocols\n", expected: /a line that ends in a bare LF/ },
    // Skipped, as llhttp skips them (RFC 9112 §2.2): Node's client takes this 101.
    { what: "empty lines before the status line", bytes: `\r\n\r\n${ok}\r\nframes`, expected: /^HTTP\/1\.1 101 Switching Protocols\r\n[^|]*\|frames$/ },
    { what: "an empty line between a 103 and the 101", bytes: `HTTP/1.1 103 Early Hints\r\n\r\n\r\n${ok}\r\n`, expected: /^HTTP\/1\.1 101 [^|]*\|$/ },
    { what: "an empty line, then no HTTP", bytes: "\r\nSSH-2.0", expected: /malformed status line/ },
    { what: "an empty line ended by a bare LF", bytes: "\r\n\nHTTP/1.1 101 Switching Protocols\r\n", expected: /a line that ends in a bare LF/ },
    { what: "a CR then no LF before the status line", bytes: "\rHTTP/1.1 101 Switching Protocols\r\n", expected: /a CR not followed by LF/ },
    { what: "empty lines past the bound on heads", bytes: "\r\n".repeat(40 * 1024), expected: /KiB of response heads before switching protocols/ },
    { what: "no HTTP at all", bytes: "SSH-2.0", expected: /malformed status line/ },
    { what: "a 200", bytes: "HTTP/1.1 200 OK\r\n", expected: /did not switch protocols \(answered 200\)/ },
    { what: "HTTP/2 in the status line", bytes: "HTTP/2 101 Switching Protocols\r\n", expected: /malformed status line/ },
    { what: "an empty field name", bytes: `${ok}: x\r\n\r\n`, expected: /not an HTTP token: ""/ },
    { what: "a DEL in a value", bytes: `${ok}X-A: a\x7fb\r\n\r\n`, expected: /a control character in the value of "X-A"/ },
  ])("$what reads the same whole and a byte at a time", ({ bytes, expected }) => {
    const whole = read(bytes, bytes.length);
    expect(whole).toMatch(expected);
    expect(read(bytes, 1)).toBe(whole);
    expect(read(bytes, 7)).toBe(whole);
  });

  it("drops hop-by-hop and framing fields and keeps end-to-end ones in order, their values without surrounding whitespace", () => {
    const bytes = `HTTP/1.1 101 Whatever\r\nSet-Cookie: a=b\r\nUpgrade: WebSocket\r\nConnection: keep-alive, Upgrade, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\nTE: trailers\r\nSec-WebSocket-Protocol: \t chat \t\r\n\r\n`;
    expect(read(bytes, bytes.length)).toBe("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSet-Cookie: a=b\r\nSec-WebSocket-Protocol: chat\r\n\r\n|");
  });
});
