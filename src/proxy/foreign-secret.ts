import type { SecretStore, SecretTarget } from "../policy/secrets.js";

/**
 * The name of a secret whose placeholder is somewhere in the request (URL, header names in any
 * letter case, header values, Basic credentials decoded) and which one of `neighbours`, the other
 * guests' stores, holds. The
 * pipeline asks after the guest's own placeholders were replaced: what is left is nobody's, or a
 * neighbour's, which is refused (a guest must not even learn that a neighbour's placeholder works
 * somewhere). `neighbours` is read only when the request holds a placeholder.
 */
export function foreignSecret(request: SecretTarget, neighbours: Iterable<SecretStore | undefined>): string | undefined {
  const found = placeholdersIn(request);
  if (found.size === 0) return undefined;
  for (const store of neighbours) {
    for (const info of store?.list() ?? []) if (found.has(info.placeholder)) return info.name;
  }
  return undefined;
}

const placeholderPattern = /EGRESSGATE_SECRET_[0-9a-f]{48}/g;
const basicValue = /^basic[ \t]+([A-Za-z0-9+/=_-]+)/i;

const placeholderInName = /egressgate_secret_([0-9a-f]{48})/g;

/** Every placeholder-shaped string in the URL and headers, Basic credentials decoded too. */
function placeholdersIn(request: SecretTarget): Set<string> {
  const found = new Set<string>();
  const scan = (text: string): void => {
    if (!text.includes("EGRESSGATE_SECRET_")) return;
    for (const match of text.matchAll(placeholderPattern)) found.add(match[0]);
  };
  scan(request.url.href);
  const headers = request.headers;
  for (let i = 0; i < headers.length; i += 2) {
    // Names are case-insensitive (HTTP/2 lowercases them); a placeholder's hex digits are lowercase.
    const name = headers[i]!.toLowerCase();
    if (name.includes("egressgate_secret_")) for (const match of name.matchAll(placeholderInName)) found.add(`EGRESSGATE_SECRET_${match[1]!}`);
    const value = headers[i + 1]!;
    scan(value);
    const basic = basicValue.exec(value);
    if (basic !== null) scan(Buffer.from(basic[1]!, "base64").toString("latin1"));
  }
  return found;
}
