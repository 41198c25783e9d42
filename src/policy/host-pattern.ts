import { isIP } from "node:net";

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

/** Throws a TypeError naming `optionName` when a pattern is empty or has characters no hostname has. */
export function validateHostPattern(pattern: unknown, optionName: string): string {
  if (typeof pattern !== "string" || pattern.trim() === "") {
    throw new TypeError(`${optionName}: expected a non-empty host pattern, got ${JSON.stringify(pattern)}`);
  }
  const normalized = normalizeHostname(pattern.trim());
  // An IPv6 literal is the one pattern with colons; anything else with ":" has a port or scheme.
  if (!patternChars.test(normalized) && isIP(normalized) !== 6) {
    throw new TypeError(
      `${optionName}: ${JSON.stringify(pattern)} is not a host pattern (letters, digits, ".", "-", "_" and "*" only; no scheme, port or path)`,
    );
  }
  return normalized;
}

export function compileHostPatterns(patterns: readonly string[]): HostMatcher {
  const normalized = patterns.map(normalizeHostname);
  const exact = new Set<string>();
  const wildcards: { pattern: string; re: RegExp }[] = [];
  let matchAll = false;
  for (const p of normalized) {
    if (p === "*") matchAll = true;
    else if (p.includes("*")) {
      const body = p
        .split("*")
        .map((part) => part.replace(/[.+?^${}()|[\]\\-]/g, "\\$&"))
        .join(".*");
      wildcards.push({ pattern: p, re: new RegExp(`^${body}$`) });
    } else exact.add(p);
  }
  return {
    patterns: normalized,
    match(host) {
      const h = normalizeHostname(host);
      if (exact.has(h)) return h;
      for (const w of wildcards) if (w.re.test(h)) return w.pattern;
      return matchAll ? "*" : undefined;
    },
  };
}
