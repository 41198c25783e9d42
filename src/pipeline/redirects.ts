import { EgressError } from "../errors.js";
import type { OutboundRequest } from "./exchange.js";
import { getHeader, withoutHeaders, type HeaderList } from "../headers.js";
import { normalizeHost } from "../hostname.js";
import { endedEmpty } from "../streams.js";
import type { Readable } from "node:stream";

export const redirectStatuses = new Set([301, 302, 303, 307, 308]);

/** Fields that describe a body: dropped with the body when a redirect changes the method. */
const bodyHeaders = new Set(["content-length", "content-type", "content-encoding", "content-language", "content-location"]);

/** Credentials that must not follow a redirect to another origin (as fetch and curl do). */
const credentialHeaders = new Set(["authorization", "cookie", "proxy-authorization"]);

/** What a redirect hop looks like before it is followed: its fragment is still in `url`. */
export type HopCheck = (hop: { readonly from: URL; readonly url: URL; readonly location: string; readonly headers: HeaderList }) => void;

/**
 * The request for the next hop of a redirect, following DESIGN §3 step 6 (and fetch's rules):
 * 303 turns everything but HEAD into GET, 301/302 turn POST into GET, and a method change drops
 * the body. A body that was already streamed upstream cannot be sent again. `check` sees the
 * hop as the upstream wrote it, fragment included, and may throw to refuse it (the secrets'
 * redirect scan). `plain`: the Location holds no secret's value, so a refusal may quote its
 * scheme or host.
 */
export function nextHop(previous: OutboundRequest, status: number, written: string, check?: HopCheck, plain = true): OutboundRequest {
  const location = locationText(written);
  let url: URL;
  try {
    url = new URL(location, previous.url);
  } catch {
    throw new EgressError("EG_UPSTREAM", 502, `redirect from ${previous.url.origin} has an invalid Location`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    // The parser lowercases a scheme, which leaves a base64 copy of a value there unrecognisable
    // to redaction (`<base64>:x` was quoted whole; black-box finding): only a short one, from a
    // Location that holds no value, is named.
    const named = plain && quotableScheme.test(url.protocol);
    throw new EgressError("EG_UPSTREAM", 502, named ? `redirect to unsupported scheme "${url.protocol}"` : "redirect to an unsupported scheme (not http: or https:)");
  }
  // Held to the rules of a guest's own target: the URL parser takes port 0 and empty labels.
  if (url.port === "0") throw new EgressError("EG_UPSTREAM", 502, `redirect from ${previous.url.origin} to port 0`);
  try {
    // Judged, sent and named in SNI as a guest's own target is: `api.test.` is `api.test`.
    url.hostname = normalizeHost(url.hostname);
  } catch (error) {
    // The reason quotes the host, lowercased by the parser as a scheme is: not when the Location holds a value.
    throw new EgressError("EG_UPSTREAM", 502, `redirect from ${previous.url.origin} to an invalid host${plain ? `: ${(error as Error).message}` : ""}`);
  }
  // The hop as written, fragment and userinfo included, for the check only: a copy costs a parse per hop.
  const asWritten = check === undefined ? undefined : new URL(url.href);
  url.hash = "";
  // Credentials in a Location (`https://user:pw@host/`) are the upstream's, not the guest's: not
  // sent on (undici ignored them; a WHATWG Request, which hooks get, refuses such a URL).
  url.username = "";
  url.password = "";
  let method = previous.method;
  if ((status === 303 && method !== "HEAD") || ((status === 301 || status === 302) && method === "POST")) {
    method = "GET";
  }
  let headers = previous.headers;
  let body = previous.body;
  if (method !== previous.method) {
    headers = withoutHeaders(headers, bodyHeaders);
    body = null;
  } else if (body !== null && !(body instanceof Uint8Array)) {
    if (hasBodyBytes(previous, body)) {
      throw new EgressError(
        "EG_UPSTREAM",
        502,
        `upstream answered ${status} to ${previous.url.origin}, but the request body was already streamed and cannot be re-sent`,
      );
    }
    body = null; // an empty body was consumed; the next hop sends Content-Length: 0 again
  }
  if (url.origin !== previous.url.origin) headers = withoutHeaders(headers, credentialHeaders);
  if (check !== undefined) check({ from: previous.url, url: asWritten!, location, headers });
  return { method, url, headers, body };
}

/** A scheme a refusal may name: a short one, as schemes are (`ftp:`, `javascript:`, `com.example.app:`). */
const quotableScheme = /^[a-z][a-z0-9+.-]{0,31}:$/;

const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * A Location as its bytes say it. Header values reach the proxy one character per byte (Latin-1),
 * so `/résumé` sent as UTF-8 arrived as `/rÃ©sumÃ©` and the hop went to `/r%C3%83%C2%A9…`; curl,
 * browsers and fetch read the bytes as UTF-8. Bytes that are not UTF-8 stay as they came.
 */
function locationText(value: string): string {
  // Only a string of bytes with one past ASCII: a hook's Location may hold any character.
  if (!/[\x80-\xff]/.test(value) || /[\u0100-\uffff]/.test(value)) return value;
  try {
    return utf8.decode(Buffer.from(value, "latin1"));
  } catch {
    return value;
  }
}

function hasBodyBytes(request: OutboundRequest, body: Readable): boolean {
  const length = getHeader(request.headers, "content-length");
  if (length !== undefined) return Number(length) > 0;
  return !endedEmpty(body);
}
