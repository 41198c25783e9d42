/**
 * Cookie values as a recording keeps them: masked (`name=[MASKED]`) unless `--record-cookies`. A
 * session cookie is a credential of its own, which egressgate's secrets know nothing of, and
 * recordings are made to be committed.
 */

const masked = "[MASKED]";

/** A `Set-Cookie` value, `name=value; attrs`, with the value masked and the attributes kept. */
export function maskSetCookie(value: string): string {
  const eq = value.indexOf("=");
  if (eq < 0) return value;
  const end = value.indexOf(";", eq);
  return `${value.slice(0, eq)}=${masked}${end < 0 ? "" : value.slice(end)}`;
}

/**
 * A `Cookie` request header, `a=1; b=2`, with every value masked and the names kept (RFC 6265
 * §4.2.1); a pair without `=` (a bare value, as browsers send an unnamed cookie) is masked whole.
 * The Set-Cookie a response gave was masked while the very next request sent the same session
 * in clear (black-box finding).
 */
export function maskCookieHeader(value: string): string {
  return value
    .split(";")
    .map((pair) => pair.trim())
    .filter((pair) => pair !== "")
    .map((pair) => {
      const eq = pair.indexOf("=");
      return eq < 0 ? masked : `${pair.slice(0, eq).trim()}=${masked}`;
    })
    .join("; ");
}
