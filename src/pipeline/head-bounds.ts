import { EgressError } from "../errors.js";
import { fieldBytes, headerListSize, type HeaderList } from "../headers.js";
import { normalizeHost } from "../hostname.js";
import { maxSubstitutedHeadBytes } from "../policy/secrets.js";
import { discardBody } from "../streams.js";
import type { OutboundRequest } from "./exchange.js";
import type { HookedResponse } from "./hook-phases.js";

/**
 * Bounds on the heads a source builds: a Response it answers with, and a request it hands on to
 * be sent. The guest's own request head is bounded where it is parsed (64 KiB, 431), and an
 * upstream's response head by undici (16 KiB, `UND_ERR_HEADERS_OVERFLOW`); what a hook, a policy
 * or a decider built went out whatever its size. A policy Response with a 70 KB field, or 20,000
 * fields, was logged and audited 200 "answered by the policy" while HTTP/1.1 guests failed with
 * "Header overflow" and HTTP/2 guests had the stream reset; a rewrite with a 3 MB field went
 * upstream (black-box findings). Past these bounds the head is its maker's failure, 502
 * `EG_HOOK_FAILED` naming the size, and nothing is sent.
 */

/**
 * The most a response head a source made may hold, counted as HTTP/2 counts a header list
 * ({@link madeHeadSize}): the 64 KiB the proxy takes in a guest's request head
 * (`maxHeaderBytes`, and `limits.h2HeaderListBytes` by default), so what the proxy would refuse
 * to read it does not send. Counted as HTTP/1.1 writes the fields (name, value and 4), a head of
 * 990 fields of 61 characters was 64,350 bytes and passed, and nghttp2, which sends at most
 * 64 KiB counting 12 a field, refused it: an HTTP/2 guest's stream was reset (FRAME_SIZE_ERROR)
 * and the answer logged 200 (helper finding). By this count the head can be sent to either
 * guest, and a hook's answer does not depend on the protocol its guest speaks. Not the 16 KiB
 * of Node's and undici's clients (`--max-http-header-size`): a hook that passes on an upstream's
 * head, itself up to 16 KiB (and 1,000 fields at most, 32 KiB more by this count), with fields of
 * its own added must not fail. curl takes 100 KiB a field, browsers about 256 KiB.
 */
export const maxMadeResponseHeadBytes = 64 * 1024;

/** `:status` and its three digits, and 32, as {@link madeHeadSize} counts the field every head is sent with. */
const statusFieldSize = ":status".length + 3 + 32;
/** `date` and an IMF-fixdate (29 characters), and 32: Node's HTTP/2 server adds one to a head that has none. */
const dateFieldSize = "date".length + 29 + 32;

/**
 * A made response head's size as an HTTP/2 guest is sent it: its fields as RFC 9113 §6.5.2 counts
 * them ({@link headerListSize}), with the `:status` and the `date` the proxy's server adds.
 * Joined repeats and dropped hop-by-hop fields only make the block sent smaller.
 */
function madeHeadSize(headers: HeaderList): number {
  let hasDate = false;
  for (let i = 0; i < headers.length && !hasDate; i += 2) hasDate = headers[i]!.toLowerCase() === "date";
  return headerListSize(headers) + statusFieldSize + (hasDate ? 0 : dateFieldSize);
}

/**
 * The most fields such a head may have: Node's HTTP/1.1 client keeps 1,023 (its parser's
 * `maxHeadersCount` of 2000 counts names and values apart) and drops the rest without a word,
 * `Content-Length` among them, so a Node guest would get the response without them. Node's HTTP/2 client resets a stream past 128 by default, and Python's
 * `http.client` refuses more than 100: clients that low are their own setting.
 */
export const maxMadeResponseFields = 1000;

/**
 * The most a request head a source hands on may hold, URL and fields counted as secret
 * substitution counts them: the 128 KiB a head may grow to once its secrets are substituted
 * (`maxSubstitutedHeadBytes`), which applied only when there were secrets to substitute. A head
 * over it that the source did not grow (the guest's own, under a raised
 * `limits.h2HeaderListBytes`, passed on) is not the source's doing, and is not refused here.
 */
export const maxHandedRequestHeadBytes = maxSubstitutedHeadBytes;

/** A request's head as {@link maxHandedRequestHeadBytes} counts it. */
function requestHeadBytes(request: OutboundRequest): number {
  return request.url.href.length + fieldBytes(request.headers);
}

/**
 * Throws 502 `EG_HOOK_FAILED` when `after`, the request `who` hands on (`"the onRequest policy
 * handed on"`), names port 0 or an invalid host, or has a head over
 * {@link maxHandedRequestHeadBytes} that is larger than the head of `before`, the request it was
 * given. Its host is spelled as a guest's own is, in place (`api.test.` becomes `api.test`).
 */
export function checkHandedRequest(before: OutboundRequest, after: OutboundRequest, who: string): void {
  if (after === before) return;
  // Held to the rules of a guest's own target (400 "invalid port 0") and a redirect's: the URL
  // parser takes port 0, and the proxy dialled it (ECONNREFUSED, a 502 blamed on the upstream).
  if (after.url.port === "0") throw new EgressError("EG_HOOK_FAILED", 502, `${who} a request to port 0 (${after.url.origin}), where no request may go`);
  normalizeHandedHost(after.url, who);
  const bytes = requestHeadBytes(after);
  if (bytes <= maxHandedRequestHeadBytes || bytes <= requestHeadBytes(before)) return;
  throw new EgressError("EG_HOOK_FAILED", 502, `${who} a request whose head (URL and header fields) is ${bytes} bytes, over the ${maxHandedRequestHeadBytes} a request sent upstream may have`);
}

/**
 * Spells the host of a URL a source handed on as a guest's own target and a redirect's are
 * spelled (`normalizeHost`), in place; throws 502 `EG_HOOK_FAILED` for one that no guest could
 * name. The URL parser lowercases, decodes and punycodes a host, but keeps a trailing dot, empty
 * labels, characters no host name has (`a$b.test`) and labels over 63 characters: a rewrite to
 * `https://api.test./` was matched by the allowlist and the secrets' hosts (which ignore one
 * trailing dot) while isRequestAllowed, isIpAllowed, the upstream's Host and SNI, and the pools
 * got `api.test.`, a name a guest's own request never carries there (helper finding).
 */
function normalizeHandedHost(url: URL, who: string): void {
  let host: string;
  try {
    host = normalizeHost(url.hostname);
  } catch (error) {
    // The length messages quote no part of the host, which may hold a copy of a value that the
    // parser lowercased past redaction's recognition; "invalid host" quotes it whole.
    const message = (error as Error).message;
    throw new EgressError("EG_HOOK_FAILED", 502, `${who} a request to an invalid host${message.startsWith("invalid host") ? " name (an empty label, or a character no host name has)" : `: ${message}`}`);
  }
  if (host !== url.hostname) url.hostname = host;
}

/** Why a response head `who` made (`"the onRequest policy answered with"`) cannot be sent, or undefined when it can. */
function responseHeadRefusal(headers: HeaderList, who: string): EgressError | undefined {
  const fields = headers.length / 2;
  if (fields > maxMadeResponseFields) {
    return new EgressError("EG_HOOK_FAILED", 502, `${who} a response of ${fields} header fields, over the ${maxMadeResponseFields} the proxy sends a guest`);
  }
  const bytes = madeHeadSize(headers);
  if (bytes <= maxMadeResponseHeadBytes) return undefined;
  return new EgressError(
    "EG_HOOK_FAILED",
    502,
    `${who} a response whose header fields are ${bytes} bytes, over the ${maxMadeResponseHeadBytes} the proxy sends a guest (counted as HTTP/2 counts them: each field's name and value, and 32, with the :status and date it is sent with)`,
  );
}

/**
 * Throws 502 `EG_HOOK_FAILED` when the head of `response`, which `who` made, is over
 * {@link maxMadeResponseHeadBytes} or {@link maxMadeResponseFields}; its body is released first
 * unless `keepBody` says it is another's to release.
 */
export function checkMadeResponse(response: HookedResponse, who: string, keepBody = false): void {
  const refusal = responseHeadRefusal(response.headers, who);
  if (refusal === undefined) return;
  if (!keepBody) discardBody(response.body);
  throw refusal;
}
