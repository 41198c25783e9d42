// @ts-check
// TextEncoder, TextDecoder (UTF-8 only, through the worker), atob, btoa and DOMException.
import { utf8Decode, utf8Encode } from "./host.js";

/** @param {unknown} data */
export function toBytes(data) {
  if (data instanceof Uint8Array) return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  throw new TypeError("expected an ArrayBuffer or a typed array");
}
/**
 * @param {Uint8Array} bytes
 * @returns {ArrayBuffer}
 */
export function copyBuffer(bytes) {
  // The sandbox has no SharedArrayBuffer to slice.
  return /** @type {ArrayBuffer} */ (bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}
export class TextEncoder {
  get encoding() {
    return "utf-8";
  }
  /** @param {unknown} [text] */
  encode(text = "") {
    return new Uint8Array(utf8Encode(String(text)));
  }
}
export class TextDecoder {
  /** @type {boolean} */
  #fatal;
  /** @type {boolean} */
  #bom;
  /**
   * @param {unknown} [label]
   * @param {{ fatal?: unknown, ignoreBOM?: unknown }} [options]
   */
  constructor(label = "utf-8", options = {}) {
    const l = String(label).trim().toLowerCase();
    if (l !== "utf-8" && l !== "utf8" && l !== "unicode-1-1-utf-8") throw new RangeError(`only UTF-8 is supported, not ${label}`);
    this.#fatal = options.fatal === true;
    this.#bom = options.ignoreBOM === true;
  }
  get encoding() {
    return "utf-8";
  }
  get fatal() {
    return this.#fatal;
  }
  get ignoreBOM() {
    return this.#bom;
  }
  /** @param {unknown} [data] */
  decode(data) {
    if (data === undefined) return "";
    const text = utf8Decode(copyBuffer(toBytes(data)), this.#fatal, this.#bom);
    if (text === undefined) throw new TypeError("the data is not valid UTF-8");
    return text;
  }
}
const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
/** @param {unknown} data */
export function btoa(data) {
  const s = String(data);
  let out = "";
  for (let i = 0; i < s.length; i += 3) {
    const a = s.charCodeAt(i);
    const b = s.charCodeAt(i + 1);
    const c = s.charCodeAt(i + 2);
    if (a > 255 || b > 255 || c > 255) throw new DOMException("btoa: the string contains characters outside Latin-1", "InvalidCharacterError");
    const n = (a << 16) | ((b || 0) << 8) | (c || 0);
    out += b64[n >> 18] + b64[(n >> 12) & 63] + (i + 1 < s.length ? b64[(n >> 6) & 63] : "=") + (i + 2 < s.length ? b64[n & 63] : "=");
  }
  return out;
}
/** @param {unknown} data */
export function atob(data) {
  let s = String(data).replace(/[\t\n\f\r ]/g, "");
  if (s.length % 4 === 0) s = s.replace(/==?$/, "");
  if (s.length % 4 === 1 || /[^A-Za-z0-9+/]/.test(s)) throw new DOMException("atob: the string is not valid base64", "InvalidCharacterError");
  let out = "";
  let bits = 0;
  let buffer = 0;
  for (const ch of s) {
    buffer = (buffer << 6) | b64.indexOf(ch);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += String.fromCharCode((buffer >> bits) & 255);
    }
  }
  return out;
}
export class DOMException extends Error {
  constructor(message = "", name = "Error") {
    super(message);
    Object.defineProperty(this, "name", { value: name, configurable: true, writable: true });
  }
}

