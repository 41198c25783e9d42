import type { Content, Entry, Har, Header, PostData, Request, Response } from "har-format";

/**
 * The HAR 1.2 shapes a recording holds (http://www.softwareishard.com/blog/har-12-spec/), with
 * egressgate's own fields, which the spec lets any tool add when their names start with `_`.
 */

/** The guest a proxy without named guests records as (src/proxy/options.ts's `defaultGuest`). */
export const singleGuest = "default";

/** Bodies larger than this go to a sidecar file `FILE.har.d/<sha256>`, never into the HAR itself. */
export const inlineBodyLimit = 1024 * 1024;

/**
 * The longest recorded time (a timing, a chunk's offset) a replay takes: 2^31 - 1 ms, about 24.8
 * days, the longest one setTimeout waits (past it Node fires after 1 ms, with a warning). No
 * real exchange comes near it, so a file that says more is refused rather than cut.
 */
export const maxRecordedMs = 2 ** 31 - 1;

/** What egressgate adds to each entry it records. */
export interface EgressgateEntryInfo {
  /** The order the exchange started in, over the whole recording (1, 2, …). */
  readonly seq: number;
  /** The redirect hop within its request: 0 for the request the guest sent. */
  readonly hop: number;
  /** The guest the request came from. On replay the entry answers only that guest, unless it is the single guest's `default` (see replay-source.ts). */
  readonly guest: string;
  /**
   * `true` on the entries of a guest named `default` that was one of several (a guest under
   * `guests`, or the single guest once addGuest gave it neighbours): they answer only `default`,
   * where the `default` entries of a proxy without named guests answer any guest.
   */
  readonly named?: true;
  /** The response's chunks as they arrived, as `[bytes, ms since the head]`, for chunked and SSE bodies. */
  readonly chunks?: readonly (readonly [number, number])[];
}

/** A body kept outside the HAR: `_file` names it in the sidecar folder, by the SHA-256 of its bytes. */
export interface SidecarFields {
  /** `<sha256>`, a file in `FILE.har.d/`. */
  _file?: string;
  /**
   * Set when the stored bytes are still as the upstream encoded them (a sidecar body with a
   * Content-Encoding, or one that did not decode): they are replayed as they are.
   */
  _encoded?: string;
}

export type RecordedContent = Content & SidecarFields;
/** The request body: HAR's postData has no encoding, so `_encoding: "base64"` marks a binary one. */
export type RecordedPostData = PostData & SidecarFields & { _encoding?: string };
export type RecordedRequest = Omit<Request, "postData"> & { postData?: RecordedPostData };
/**
 * The response: `_trailers` holds its trailer fields (an HTTP/2 upstream's trailing HEADERS, as
 * gRPC sends grpc-status in; an HTTP/1.1 chunked response's trailer section), which HAR has no
 * field for. Redacted as the headers are, and sent again after the body on replay.
 */
export type RecordedResponse = Omit<Response, "content"> & { content: RecordedContent; _trailers?: Header[] };
export type RecordedEntry = Omit<Entry, "request" | "response"> & {
  request: RecordedRequest;
  response: RecordedResponse;
  _egressgate?: EgressgateEntryInfo;
};
export type RecordedHar = Omit<Har, "log"> & { log: Omit<Har["log"], "entries"> & { entries: RecordedEntry[] } };

/** A flat header list (`[name, value, …]`, as the pipeline holds them) as HAR headers. */
export function toHarHeaders(list: readonly string[]): Header[] {
  const out: Header[] = [];
  for (let i = 0; i < list.length; i += 2) out.push({ name: list[i]!, value: list[i + 1]! });
  return out;
}

/** The sidecar folder of a HAR file. */
export function sidecarDir(harPath: string): string {
  return `${harPath}.d`;
}

/** A body's sidecar file while it streams (`.<hex>.part`), before it is complete and named by its SHA-256. */
export function partialBodyName(id: string): string {
  return `.${id}.part`;
}

/** Whether a name in the sidecar folder is a partial body's ({@link partialBodyName}). */
export function isPartialBodyName(name: string): boolean {
  return /^\.[0-9a-f]+\.part$/.test(name);
}

/** The journal a recording appends to while it runs: one entry per line. */
export function journalPath(harPath: string): string {
  return `${harPath}.journal`;
}

/** Types that are text whatever their bytes (the rest is text only when it is valid UTF-8 without NUL). */
const textTypes = /^(text\/|application\/(json|[a-z0-9.+-]*\+json|xml|[a-z0-9.+-]*\+xml|javascript|x-www-form-urlencoded|x-ndjson|graphql))/i;
const binaryTypes = /^(image\/(?!svg)|audio\/|video\/|font\/|application\/(octet-stream|zip|gzip|pdf|wasm|x-tar|protobuf|grpc))/i;

/** Whether a body is stored as text (else base64): by its type where it says, else by its bytes. */
export function isText(bytes: Uint8Array, mimeType: string): boolean {
  if (binaryTypes.test(mimeType)) return false;
  if (bytes.includes(0)) return false;
  const buffer = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  // Text only when it survives the round trip: a HAR's text field is a JSON string of characters.
  if (!Buffer.from(buffer.toString("utf8"), "utf8").equals(buffer)) return false;
  // Control characters other than tab, CR, LF and form feed mark a binary body.
  return textTypes.test(mimeType) || !buffer.some((byte) => byte < 0x09 || (byte > 0x0d && byte < 0x20));
}
