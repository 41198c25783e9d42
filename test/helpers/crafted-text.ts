/**
 * `length` characters whose every decoder view holds printable text again (base64 at each
 * alignment, hex, percent, +), so without a budget the secret scan's views multiply to 9³
 * (review of issue 14): a text the scan cannot finish within its budget.
 */
export function craftedText(length: number): string {
  const b64 = (text: string): string => Buffer.from(text).toString("base64");
  const printable = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789%+-_";
  const parts: string[] = [];
  for (let k = 0, size = 0; size < length; k++) {
    const text = Array.from({ length: 60 }, (_, i) => printable[(i * 7 + k) % printable.length]).join("") + "%41%2541+";
    for (const part of [b64(text), `x${b64(text)}`, `xy${b64(text)}`, `xyz${b64(text)}`, Buffer.from(text).toString("hex"), encodeURIComponent(text), text.replaceAll("%", "+")]) {
      parts.push(part, "~");
      size += part.length + 1;
    }
  }
  return parts.join("").slice(0, length);
}
