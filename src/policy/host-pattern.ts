import { isIP } from "node:net";
import { mappedCounterpart, mappedIPv4, normalizeHost } from "../hostname.js";

/**
 * Host patterns for allowlists: `*` matches any run of characters, dots included, so
 * `*.example.com` matches `a.b.example.com` but not `example.com`. Matching is anchored and
 * case-insensitive, and a trailing dot on either side is ignored (`example.com.` is the same
 * name as `example.com`; treating them differently is a classic allowlist bypass).
 */
export interface HostMatcher {
  /** The patterns as given, normalised (lowercase, no trailing dot). */
  readonly patterns: readonly string[];
  /**
   * The most specific pattern that matches `host` (an exact name, else the first matching
   * wildcard, else `*`), or undefined. The decision log reports it as the deciding rule.
   */
  match(host: string): string | undefined;
}

const patternChars = /^[a-z0-9.*_-]+$/;

/** Lowercases a hostname, strips one trailing dot, and unwraps an `[IPv6]` literal. */
export function normalizeHostname(host: string): string {
  const lower = host.toLowerCase();
  if (lower.startsWith("[") && lower.endsWith("]") && isIP(lower.slice(1, -1)) === 6) return lower.slice(1, -1);
  return lower.endsWith(".") ? lower.slice(0, -1) : lower;
}

/**
 * A pattern as the proxy spells the hosts it is matched against: an address in any of the forms
 * the URL parser reads (`127.1`, `2130706433`, `0:0:0:0:0:0:0:1`, `::ffff:127.0.0.1`) becomes the
 * one a guest's URL naming it becomes, so it matches that URL (written otherwise, it never did).
 * Wildcards are left as they are.
 */
function canonicalPattern(pattern: string): string {
  const normalized = normalizeHostname(pattern);
  // Only a name or an address is read as one: a URL, a path or a port is refused as it was written.
  if (normalized.includes("*") || !(patternChars.test(normalized) || isIP(normalized) === 6)) return normalized;
  try {
    return normalizeHostname(normalizeHost(isIP(normalized) === 6 ? `[${normalized}]` : normalized));
  } catch {
    return normalized;
  }
}

/** Throws a TypeError naming `optionName` when a pattern is empty or has characters no hostname has. */
export function validateHostPattern(pattern: unknown, optionName: string): string {
  if (typeof pattern !== "string" || pattern.trim() === "") {
    throw new TypeError(`${optionName}: expected a non-empty host pattern, got ${JSON.stringify(pattern)}`);
  }
  const normalized = canonicalPattern(pattern.trim());
  // An IPv6 literal is the one pattern with colons; anything else with ":" has a port or scheme.
  if (!patternChars.test(normalized) && isIP(normalized) !== 6) {
    throw new TypeError(
      `${optionName}: ${JSON.stringify(pattern)} is not a host pattern (letters, digits, ".", "-", "_" and "*" only; no scheme, port or path)`,
    );
  }
  return normalized;
}

/**
 * Matches a `*` glob in linear time: the first and last pieces are anchored, and the middle
 * pieces are found left to right. A regex would backtrack, so a pattern with two stars and a
 * long hostile hostname could stall the event loop for a second per request.
 */
function globMatch(pieces: readonly string[], host: string): boolean {
  const first = pieces[0]!;
  const last = pieces[pieces.length - 1]!;
  if (host.length < first.length + last.length || !host.startsWith(first) || !host.endsWith(last)) return false;
  let at = first.length;
  const end = host.length - last.length;
  for (let i = 1; i < pieces.length - 1; i++) {
    const piece = pieces[i]!;
    if (piece === "") continue;
    const found = host.indexOf(piece, at);
    if (found < 0 || found + piece.length > end) return false;
    at = found + piece.length;
  }
  return true;
}

export function compileHostPatterns(patterns: readonly string[]): HostMatcher {
  const normalized = patterns.map(canonicalPattern);
  /** Each exact pattern, and the other spelling of an IP one, to the pattern as written. */
  const exact = new Map<string, string>();
  const wildcards: { pattern: string; pieces: string[] }[] = [];
  let matchAll = false;
  for (const p of normalized) {
    if (p === "*") matchAll = true;
    else if (p.includes("*")) wildcards.push({ pattern: p, pieces: p.split("*") });
    else {
      exact.set(p, p);
      // `::ffff:127.0.0.1` is 127.0.0.1 (a dual-stack socket dials it as that): an address allowed
      // in either spelling is allowed in both.
      const other = mappedCounterpart(p);
      if (other !== undefined && !exact.has(other)) exact.set(other, p);
    }
  }
  const find = (h: string): string | undefined => {
    const named = exact.get(h);
    if (named !== undefined) return named;
    for (const w of wildcards) if (globMatch(w.pieces, h)) return w.pattern;
    return matchAll ? "*" : undefined;
  };
  return {
    patterns: normalized,
    match(host) {
      const h = normalizeHostname(host);
      const found = find(h);
      if (found !== undefined || !h.includes(":")) return found;
      // A mapped address, however written, is tried as its IPv4 address (`10.0.*` admits
      // `::ffff:a00:1`), never the other way: globbed, the `::ffff:HHHH:HHHH` spelling of an IPv4
      // address matched patterns its dotted form does not (`*f*` admitted 8.8.8.8).
      const v4 = mappedIPv4(h);
      return v4 === undefined ? undefined : find(v4);
    },
  };
}
