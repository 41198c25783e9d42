/**
 * Looks for a secret's value in a stream of bytes, as it is and in base64 at each of the three
 * alignments (a Basic credential carries it encoded), across chunk boundaries.
 */
export class SecretScanner {
  private tail = "";
  private readonly needles: readonly string[];
  private readonly keep: number;
  found: string | undefined;

  /** `values`: one secret's value, or several (many guests: any of them). */
  constructor(values: string | readonly string[]) {
    const forms: string[] = [];
    for (const value of typeof values === "string" ? [values] : values) {
      forms.push(value);
      const bytes = Buffer.from(value, "latin1");
      for (let offset = 0; offset < 3; offset++) {
        const text = Buffer.concat([Buffer.alloc(offset, 0x41), bytes]).toString("base64");
        // Only the characters the value alone decides: whole groups, past the padding's.
        const start = offset === 0 ? 0 : offset === 1 ? 2 : 3;
        const end = Math.floor((offset + bytes.length) / 3) * 4;
        forms.push(text.slice(start, end));
      }
    }
    this.needles = forms;
    this.keep = Math.max(...forms.map((f) => f.length));
  }

  /** Scans `chunk`; true once the value has been seen (in this chunk or before). */
  push(chunk: Buffer | string): boolean {
    if (this.found !== undefined) return true;
    const text = this.tail + (typeof chunk === "string" ? chunk : chunk.toString("latin1"));
    for (const needle of this.needles) {
      const at = text.indexOf(needle);
      if (at >= 0) {
        this.found = text.slice(Math.max(0, at - 200), at + needle.length + 80);
        return true;
      }
    }
    this.tail = text.slice(-this.keep);
    return false;
  }
}
