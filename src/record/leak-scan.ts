/**
 * A fast search of large bodies for a secret's value in the spellings it is most often found in:
 * as it is (any letter case), base64 (at each of the three alignments), hex, percent-encoded
 * and JSON-escaped, each of its UTF-8 bytes and of those bytes encoded in UTF-8 again (a
 * non-ASCII value echoed by an upstream that read the header as Latin-1). The full scan (SecretStore.findValue) decodes text recursively and costs
 * about half a second per MiB, so it is kept for URLs, headers and small text bodies; bodies
 * above {@link fullScanLimit} and every binary body are searched here, a chunk at a time, with
 * the tail of each chunk kept so a spelling split across two chunks is still found.
 */

/** Text bodies up to this size get the full, decoding scan (and redaction). */
export const fullScanLimit = 64 * 1024;

interface Form {
  readonly name: string;
  readonly bytes: Buffer;
  /** Compared with the chunk lowercased (ASCII): every spelling but base64, whose case matters. */
  readonly folded: boolean;
}

/** The spellings of one value that this scan looks for. */
function formsOf(name: string, value: string): Form[] {
  const forms: Form[] = [];
  // Every form as bytes in Latin-1 form, so it is folded as a chunk is.
  const add = (text: string, folded: boolean): void => {
    if (text.length < 4) return;
    const bytes = Buffer.from(folded ? text.toLowerCase() : text, "latin1");
    if (!forms.some((f) => f.folded === folded && f.bytes.equals(bytes))) forms.push({ name, bytes, folded });
  };
  const utf8 = Buffer.from(value, "utf8");
  // A header holds the UTF-8 bytes one Latin-1 character each; an upstream that echoes it as
  // UTF-8 (a JSON echo, `Buffer.from(header)`) encodes them again. The same as utf8 for ASCII.
  const twice = Buffer.from(utf8.toString("latin1"), "utf8");
  for (const bytes of [utf8, twice]) {
    add(bytes.toString("latin1"), true);
    add(bytes.toString("hex"), true);
    add(encodeURIComponent(bytes.toString("utf8")), true);
    add(Buffer.from(JSON.stringify(bytes.toString("utf8")).slice(1, -1), "utf8").toString("latin1"), true);
    // base64 at each alignment: the characters that depend only on the value's own bytes.
    for (let shift = 0; shift < 3; shift++) {
      const padded = Buffer.concat([Buffer.alloc(shift), bytes]);
      const encoded = padded.toString("base64").replace(/=+$/, "");
      const start = shift === 0 ? 0 : Math.ceil((shift * 4) / 3);
      const whole = Math.floor((padded.length * 4) / 3);
      const core = encoded.slice(start, whole);
      add(core, false);
      add(core.replaceAll("+", "-").replaceAll("/", "_"), false);
    }
  }
  return forms;
}

/** Streams chunks through {@link LiteralScanner.push}; `found` is the first secret name seen. */
export class LiteralScanner {
  private readonly forms: Form[];
  private readonly keep: number;
  private tail = Buffer.alloc(0);
  found: string | undefined;

  constructor(values: readonly { readonly name: string; readonly value: string }[]) {
    this.forms = values.flatMap(({ name, value }) => formsOf(name, value));
    this.keep = Math.max(0, ...this.forms.map((f) => f.bytes.length)) - 1;
  }

  get active(): boolean {
    return this.forms.length > 0;
  }

  push(chunk: Uint8Array): void {
    if (this.found !== undefined || this.forms.length === 0) return;
    const window = this.tail.length === 0 ? Buffer.from(chunk) : Buffer.concat([this.tail, chunk]);
    let folded: Buffer | undefined;
    for (const form of this.forms) {
      const hay = form.folded ? (folded ??= Buffer.from(window.toString("latin1").toLowerCase(), "latin1")) : window;
      if (hay.includes(form.bytes)) {
        this.found = form.name;
        return;
      }
    }
    this.tail = this.keep === 0 ? Buffer.alloc(0) : Buffer.from(window.subarray(Math.max(0, window.length - this.keep)));
  }
}
