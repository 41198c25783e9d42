import { UnscannableError, unscannedMarker } from "./secret-scan.js";
import type { SecretStore } from "./secrets.js";

/**
 * Redirect hops whose URL the proxy's outputs show as its origin only.
 *
 * An upstream within a secret's hosts may write the value into a redirect's `Location` (an
 * OAuth `state`, a debug echo), and the hop goes as it asked. The URL parser then rewrites that
 * copy where redaction can no longer see it: a JSON-escaped `\/` becomes `//` (the parser reads
 * `\` as `/` in an http(s) path), a `\u0053` becomes `/u0053`, a value holding `?` is split over
 * the path and the query. Redaction searches the hop's URL as the parser wrote it, so the value
 * reached the 508 body, the log, the audit record, a decider's document and the HAR (black-box
 * finding). The `Location` as the upstream wrote it still holds a copy the scan recognises: when
 * it does, the hop's path and query are shown as `/[REDACTED:NAME]` everywhere, and so are those
 * of every later hop of that request (an upstream handed the rewritten copy can write it into
 * its own `Location`, as a loop does, where nothing recognises it any more).
 */

/** Where a hidden hop's path and query would stand: `/[REDACTED:NAME]`. */
export function hiddenPath(name: string): string {
  return `/[REDACTED:${name}]`;
}

/** The name {@link secretInLocation} gives a Location too complex to scan, as redaction names such a text. */
export const unscannedName = unscannedMarker.slice("[REDACTED:".length, -1);

/**
 * The name of a secret whose value, current or retired, `location` holds in any encoding the
 * scan decodes (as the upstream wrote it, before the URL parser saw it); {@link unscannedName}
 * for one too complex to scan; undefined for neither.
 */
export function secretInLocation(secrets: Pick<SecretStore, "size" | "findValue"> | undefined, location: string): string | undefined {
  if (secrets === undefined || secrets.size === 0) return undefined;
  try {
    return secrets.findValue(location);
  } catch (error) {
    if (error instanceof UnscannableError) return unscannedName;
    throw error;
  }
}

/** A URL as an output names it: whole, or its origin and {@link hiddenPath} for a hidden hop. */
export function shownUrl(url: URL, hidden: string | undefined): string {
  return hidden === undefined ? url.href : `${url.origin}${hiddenPath(hidden)}`;
}

/**
 * What a text about a hidden hop is also redacted for, besides the values, under the secret's
 * name: the hop's path and query exactly as they went out, and each alone, which an upstream
 * echoes (a body quoting its request target, a `Content-Location`, the next `Location`) and a
 * policy logs (`url.pathname`). A copy of a smaller part is not recognised.
 */
export function hiddenCopies(url: URL, hidden: string): { readonly name: string; readonly value: string }[] {
  const pieces = new Set([`${url.pathname}${url.search}`, url.pathname, url.search.slice(1)]);
  return [...pieces].filter((piece) => piece.length > 1).map((value) => ({ name: hidden, value }));
}
