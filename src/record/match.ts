import { createHash } from "node:crypto";
import { bareHostname } from "../hostname.js";
import type { SecretStore } from "../policy/secrets.js";
import { maskCookieHeader } from "./cookies.js";

/**
 * The match key of a replay (issue 18): method, scheme, host, port, path, the query sorted, and
 * the body (JSON canonicalised, anything else by SHA-256); headers only when named. Fields are
 * kept apart, not only joined into a key, so a miss can name the field that differed.
 */

export interface MatchOptions {
  /** Header names (lowercase) whose values are part of the key. */
  readonly matchHeaders: readonly string[];
  /** Query parameters left out of the key. */
  readonly ignoreQuery: readonly string[];
  /** JSON pointers (RFC 6901) left out of a JSON body: nonces, timestamps. */
  readonly ignoreBodyPaths: readonly string[];
}

export const matchFields = ["host", "port", "scheme", "method", "path", "query", "body", "headers"] as const;
export type MatchField = (typeof matchFields)[number];
export type MatchFields = Readonly<Record<MatchField, string>>;

export function matchKey(fields: MatchFields): string {
  return JSON.stringify(matchFields.map((name) => fields[name]));
}

/** A body for the key: its bytes when small, else only its SHA-256. */
export type BodyForKey = { readonly bytes: Buffer } | { readonly sha256: string } | null;

/**
 * A request body as the recorder keeps it and the replay matches it: the guest's placeholders
 * turned into their tokens, whatever the body's type or bytes. The recorder did this only for a
 * body it stored as text (by its Content-Type), the replay for any valid UTF-8, so a
 * placeholder in an `application/octet-stream` body never matched, even with the same
 * placeholders (black-box finding); one rule on both sides now. Placeholders and tokens are
 * ASCII, and Latin-1 maps each byte to one character and back, so bytes that are not text
 * (a protobuf, a gRPC frame) come back unchanged around them.
 */
export function bodyWithTokens(bytes: Buffer, secrets: SecretStore | undefined): Buffer {
  // Every placeholder starts so: a body without it is left as it is, undecoded.
  if (secrets === undefined || !bytes.includes("EGRESSGATE_SECRET_")) return bytes;
  const text = bytes.toString("latin1");
  const tokenized = secrets.tokenizePlaceholders(text);
  return tokenized === text ? bytes : Buffer.from(tokenized, "latin1");
}

export function fieldsOf(method: string, url: URL, headers: readonly (readonly [string, string])[], body: BodyForKey, options: MatchOptions): MatchFields {
  const ignored = new Set(options.ignoreQuery);
  const query = [...url.searchParams]
    .filter(([name]) => !ignored.has(name))
    .map(([name, value]) => `${encodeURIComponent(name)}=${encodeURIComponent(value)}`)
    .sort()
    .join("&");
  const wanted: string[] = [];
  for (const name of options.matchHeaders) {
    // Cookie values are masked in a recording (unless --record-cookies): names are what both sides still have.
    const values = headers.filter(([n]) => n.toLowerCase() === name).map(([, v]) => (name === "cookie" ? maskCookieHeader(v) : v));
    wanted.push(`${name}: ${values.join(", ")}`);
  }
  return {
    method: method.toUpperCase(),
    scheme: url.protocol.replace(/:$/, ""),
    host: bareHostname(url.hostname).toLowerCase().replace(/\.$/, ""),
    port: url.port || (url.protocol === "https:" ? "443" : "80"),
    path: url.pathname,
    query,
    body: bodyKey(body, options.ignoreBodyPaths),
    headers: wanted.join("\n"),
  };
}

function bodyKey(body: BodyForKey, ignorePaths: readonly string[]): string {
  if (body === null) return "";
  if ("sha256" in body) return `sha256:${body.sha256}`;
  if (body.bytes.length === 0) return "";
  const text = body.bytes.toString("utf8");
  const first = text.trimStart()[0];
  if (first === "{" || first === "[") {
    try {
      const value: unknown = JSON.parse(text);
      for (const pointer of ignorePaths) removePointer(value, pointer);
      return `json:${canonical(value)}`;
    } catch {
      // Not JSON after all: hashed like any body.
    }
  }
  return `sha256:${createHash("sha256").update(body.bytes).digest("hex")}`;
}

/** JSON with object keys sorted at every level, so key order never decides a match. */
export function canonical(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const record = value as Record<string, unknown>;
    return `{${Object.keys(record)
      .sort()
      .map((key) => `${JSON.stringify(key)}:${canonical(record[key])}`)
      .join(",")}}`;
  }
  return JSON.stringify(value);
}

/** Removes what a JSON pointer names (an array element becomes null, so the others keep their places). */
function removePointer(root: unknown, pointer: string): void {
  if (!pointer.startsWith("/")) return;
  const segments = pointer.slice(1).split("/").map((s) => s.replaceAll("~1", "/").replaceAll("~0", "~"));
  let at: unknown = root;
  for (const segment of segments.slice(0, -1)) {
    if (at === null || typeof at !== "object") return;
    at = (at as Record<string, unknown>)[segment];
  }
  const last = segments.at(-1)!;
  if (Array.isArray(at)) {
    const i = Number(last);
    if (Number.isInteger(i) && i >= 0 && i < at.length) at[i] = null;
  } else if (at !== null && typeof at === "object") {
    delete (at as Record<string, unknown>)[last];
  }
}

/** The candidate closest to `wanted` (most fields equal, the earlier fields weighing more), and the first field that differs. */
export function nearest(candidates: readonly MatchFields[], wanted: MatchFields): { index: number; field: MatchField } | undefined {
  let best: { index: number; score: number; field: MatchField } | undefined;
  candidates.forEach((fields, index) => {
    let score = 0;
    let field: MatchField | undefined;
    matchFields.forEach((name, i) => {
      if (fields[name] === wanted[name]) score += 2 ** (matchFields.length - i);
      else field ??= name;
    });
    if (field !== undefined && (best === undefined || score > best.score)) best = { index, score, field };
  });
  return best === undefined ? undefined : { index: best.index, field: best.field };
}
