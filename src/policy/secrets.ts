import { createHmac, randomBytes } from "node:crypto";
import { withFields } from "../objects.js";
import { EgressError, secretDenied } from "../errors.js";
import { breaksFieldValue, controlInFieldValue, type HeaderList } from "../headers.js";
import { bareHostname, hostSpelling, unicodeHostname } from "../hostname.js";
import { OptionError, shownValue } from "../option-error.js";
import { compileHostPatterns, validateHostPattern, type HostMatcher } from "./host-pattern.js";
import { findFirst, maxExpansion, needle, NeedleSet, redactText, scan, ScanBudget, tallyReplacement, UnscannableError, type ConcealTally, type Match, type Needle } from "./secret-scan.js";

/**
 * What happens to a redirect hop that leaves the hosts of a secret the request carried:
 * `"scan"` follows it unless the hop's URL or headers hold the value in some encoding;
 * `"refuse"` refuses it whatever it holds, unless its host is in `followRedirectsTo` and it
 * stays on https://. A hop to plain http://, even to the secret's own hosts, is such a hop.
 */
export type SecretRedirects = "scan" | "refuse";

export const secretRedirectModes: readonly SecretRedirects[] = ["scan", "refuse"];

/**
 * The longest secret value, in UTF-8 bytes. A value goes into one header field, where servers
 * take 8 KiB (nginx, Apache) to 16 KiB (Node) by default, so nothing longer can be used. The
 * scanner's work grows with a value's length: a 1 MB value took 7 s to start, and 133 MB
 * aborted the process (black-box finding); one at this length costs a few milliseconds.
 */
export const maxSecretValueBytes = 16 * 1024;

/** Why a value over {@link maxSecretValueBytes} is refused; it quotes nothing of the value. */
export const secretTooLongReason = `is longer than ${maxSecretValueBytes / 1024} KiB (${maxSecretValueBytes} bytes), the most a secret's value may hold: it goes into one header field`;

/**
 * The most a request's head (its URL and header fields) may hold once placeholders are
 * substituted: twice the 64 KiB a guest may send. A placeholder is 66 characters and a value up
 * to 16 KiB, so without a bound a 60 KB head that repeats one placeholder became a 15 MB one,
 * built in memory for each request, and 30 of them on one connection took 700 MB and held every
 * guest for seconds (black-box finding). No server takes a head that size.
 */
export const maxSubstitutedHeadBytes = 128 * 1024;

/** What is left of {@link maxSubstitutedHeadBytes} while one request's head is substituted. */
interface HeadRoom {
  left: number;
}

function headTooLarge(): EgressError {
  return new EgressError("EG_HEADERS_TOO_LARGE", 431, `the request's head would be larger than ${maxSubstitutedHeadBytes} bytes once its secrets are substituted`);
}

/**
 * Why a value holding a control character other than tab (ESC, DEL, U+0001…) is refused; it
 * quotes nothing of the value. A value goes only into header fields (and, percent-encoded, the
 * query; Basic credentials may hold no control character either, RFC 7617 §2), never into a
 * body, and no header field can carry one: over HTTP/1.1 every request that used it was a 502,
 * over HTTP/2 the field was dropped without a word.
 */
export const secretControlReason = "must not contain a control character other than tab (ESC, DEL, U+0001 to U+001F): it goes into a header field, which cannot carry one";

export function secretValueTooLong(value: string): boolean {
  // Each UTF-16 unit is at least one UTF-8 byte: a longer string is not counted at all.
  return value.length > maxSecretValueBytes || Buffer.byteLength(value, "utf8") > maxSecretValueBytes;
}

/** A UTF-16 unit of a surrogate pair standing alone (with the `u` flag, a pair is one code point and never matches). */
const loneSurrogate = /\p{Cs}/u;

/**
 * Why a value given as a string (`createHttpHooks`, `updateSecret`) cannot be sent as it is, or
 * undefined; it quotes nothing of the value. A value goes out as its UTF-8 bytes, so U+FFFD
 * (what a decoder, Buffer's `toString()` or `readFileSync(file, "utf8")`, puts in place of
 * bytes that are not UTF-8) and a lone surrogate (which UTF-8 encodes as U+FFFD) mean the value
 * the caller had was not the one the upstream would get, and its 401 would say nothing of why;
 * a byte order mark is an editor's, kept by `readFileSync`, and no credential's. `env:` and
 * `file:` values are refused for the same in `config/secret-source.ts`, naming their source.
 */
export function secretValueProblem(value: string): string | undefined {
  // A value goes into header fields: CR, LF and NUL would split or truncate them.
  if (breaksFieldValue.test(value)) return "must not contain CR, LF or NUL";
  if (controlInFieldValue.test(value)) return secretControlReason;
  if (secretValueTooLong(value)) return secretTooLongReason;
  if (value.includes("\uFFFD")) return "must not contain U+FFFD, the character a decoder puts in place of bytes that are not UTF-8 (Buffer's toString, readFileSync with \"utf8\"): it is sent as EF BF BD, not the bytes it replaced";
  if (loneSurrogate.test(value)) return "must not contain a lone surrogate (U+D800 to U+DFFF outside a pair): UTF-8 has no bytes for one, and it is sent as U+FFFD's, EF BF BD";
  if (value.startsWith("\uFEFF")) return "must not start with a byte order mark, U+FEFF, which editors add (readFileSync keeps it) and no credential holds: it is sent as three bytes before the value";
  return undefined;
}

/** What a secret is, as configured: the hosts it may reach and its real value. */
export interface SecretOptions {
  readonly hosts: readonly string[];
  readonly value: string;
  /** Overrides the store's `secretRedirects` for this secret. */
  readonly secretRedirects?: SecretRedirects;
  /** Overrides the store's `followRedirectsTo` for this secret: host patterns a `"refuse"` secret's redirects may still reach. */
  readonly followRedirectsTo?: readonly string[];
}

/** The defaults for every secret that does not set its own. */
export interface SecretRedirectOptions {
  readonly secretRedirects?: SecretRedirects;
  readonly followRedirectsTo?: readonly string[];
}

/** A redirect hop about to be followed, before its fragment is dropped. */
export interface RedirectHop {
  /** The URL that answered with the redirect. */
  readonly from: URL;
  /** The next hop's URL, fragment included. */
  readonly url: URL;
  /** The Location header as the upstream sent it. */
  readonly location: string;
  /** The next hop's request headers. */
  readonly headers: HeaderList;
}

const secretKeys = ["hosts", "value", "secretRedirects", "followRedirectsTo"];

/** The values one secret had before its rotations or its delete, oldest first. */
export interface RetiredValues {
  readonly name: string;
  readonly values: readonly string[];
}

/** A secret as `listSecrets()` shows it: never the value. */
export interface SecretInfo {
  readonly name: string;
  /** `EGRESSGATE_SECRET_<48 hex>`; the empty string once deleted. */
  readonly placeholder: string;
  readonly hosts: readonly string[];
  readonly deleted: boolean;
}

interface Entry {
  readonly name: string;
  readonly placeholder: string;
  hosts: readonly string[];
  matcher: HostMatcher;
  value: string;
  deleted: boolean;
  /** Values this secret had before a rotation or delete: refused everywhere from then on. */
  readonly retired: string[];
  readonly redirects: SecretRedirects;
  readonly followRedirectsTo: HostMatcher;
}

/** The part of a request that secrets may touch: header values and (optionally) the query. */
export interface SecretTarget {
  readonly url: URL;
  readonly headers: readonly string[];
}

const basicCredentials = /^(basic)([ \t]+)([A-Za-z0-9+/=_-]+)[ \t]*$/i;
const credentialHeaders = new Set(["authorization", "proxy-authorization"]);

/** 48 hex digits from the key and the name, like a random placeholder's. */
function derived(key: string, name: string): string {
  return createHmac("sha256", key).update(`egressgate placeholder\0${name}`).digest("hex").slice(0, 48);
}

/**
 * How many times any store's values have changed (a rotation, a delete, a reload's inherit,
 * values adopted from another worker). The log's redactor indexes every guest's values
 * (src/proxy/redactor.ts), and asks its stores for them again only when this has moved: asking
 * each of them for each line was a pass over every guest again.
 */
let valueChanges = 0;

export function secretValueChanges(): number {
  return valueChanges;
}

/**
 * Secrets for one `createHttpHooks` call (DESIGN §3 step 3, §4 "Secrets"). A guest holds only
 * placeholders; the real value goes into header values (and the query, when enabled) of requests
 * whose final destination is one of the secret's hosts. A placeholder or a real value bound for
 * any other host, and a retired value bound anywhere, refuses the whole request.
 */
export class SecretStore {
  private readonly entries = new Map<string, Entry>();
  /** Every value, current and retired, for redaction; rebuilt after a change. */
  private redaction: NeedleSet | undefined;

  /**
   * `placeholderKey`, when given, derives each placeholder from the key and the secret's name
   * (HMAC-SHA256), so every process started with the same key hands guests the same
   * placeholders (DESIGN §9: `--workers N`, several instances, restarts). Without it they are
   * random per store.
   */
  constructor(
    secrets: Readonly<Record<string, SecretOptions>>,
    readonly replaceInQuery: boolean,
    private readonly validateHosts: (hosts: unknown, path: string) => readonly string[],
    placeholderKey?: string,
    redirectDefaults: SecretRedirectOptions = {},
  ) {
    const defaultMode = checkMode(redirectDefaults.secretRedirects ?? "scan", "secretRedirects");
    const defaultFollow = followPatterns(redirectDefaults.followRedirectsTo, "followRedirectsTo");
    for (const [name, options] of Object.entries(secrets)) {
      const path = `secrets.${name}`;
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) {
        throw new TypeError(`${path}: a secret name must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)`);
      }
      if (typeof options !== "object" || options === null) throw new TypeError(`${path}: expected { hosts, value }`);
      for (const key of Object.keys(options)) {
        if (!secretKeys.includes(key)) throw new TypeError(`${path}: unknown option "${key}" (known: ${secretKeys.join(", ")})`);
      }
      const hosts = this.validateHosts(options.hosts, `${path}.hosts`);
      const value = checkValue(options.value, `${path}.value`);
      const redirects = options.secretRedirects === undefined ? defaultMode : checkMode(options.secretRedirects, `${path}.secretRedirects`);
      const follow = options.followRedirectsTo === undefined ? defaultFollow : followPatterns(options.followRedirectsTo, `${path}.followRedirectsTo`);
      if (options.followRedirectsTo !== undefined && redirects !== "refuse") {
        // Hosts to let through where nothing is refused: a mistake in the configuration, not something to ignore.
        throw new TypeError(`${path}.followRedirectsTo: only applies with secretRedirects: "refuse"`);
      }
      this.entries.set(name, {
        name,
        placeholder: `EGRESSGATE_SECRET_${placeholderKey === undefined ? randomBytes(24).toString("hex") : derived(placeholderKey, name)}`,
        hosts,
        matcher: compileHostPatterns(hosts),
        value,
        deleted: false,
        retired: [],
        redirects,
        followRedirectsTo: compileHostPatterns(follow),
      });
    }
    if (defaultFollow.length > 0 && defaultMode !== "refuse" && ![...this.entries.values()].some((e) => e.redirects === "refuse")) {
      throw new TypeError('followRedirectsTo: only applies with secretRedirects: "refuse"');
    }
  }

  get size(): number {
    return this.entries.size;
  }

  /** `{ NAME: placeholder }` for the guest's environment. */
  env(): Record<string, string> {
    const env: Record<string, string> = {};
    for (const e of this.entries.values()) if (!e.deleted) env[e.name] = e.placeholder;
    return env;
  }

  list(): SecretInfo[] {
    return [...this.entries.values()].map((e) => ({
      name: e.name,
      placeholder: e.deleted ? "" : e.placeholder,
      hosts: [...e.hosts],
      deleted: e.deleted,
    }));
  }

  update(name: string, change: { value?: string; hosts?: readonly string[] }): void {
    const entry = this.entries.get(name);
    if (entry === undefined) throw new TypeError(`updateSecret: no secret named "${name}"`);
    if (entry.deleted) throw new TypeError(`updateSecret: secret "${name}" was deleted`);
    if (typeof change !== "object" || change === null) throw new TypeError("updateSecret: expected { value?, hosts? }");
    for (const key of Object.keys(change)) {
      if (key !== "hosts" && key !== "value") throw new TypeError(`updateSecret: unknown option "${key}" (known: hosts, value)`);
    }
    // Validate everything before changing anything, so a bad call leaves the secret as it was.
    const hosts = change.hosts === undefined ? undefined : this.updatedHosts(name, change.hosts);
    const value = change.value === undefined ? undefined : checkValue(change.value, "updateSecret: value");
    if (hosts !== undefined) {
      entry.hosts = hosts;
      entry.matcher = compileHostPatterns(hosts);
    }
    if (value !== undefined && value !== entry.value) {
      retire(entry, entry.value);
      entry.value = value;
      this.valuesChanged();
    }
  }

  /**
   * updateSecret's hosts, checked as createHttpHooks checks a secret's: a bad pattern is named by
   * its place in `secrets.NAME.hosts`, and an empty list is refused (it was taken, leaving a
   * secret no host could get, where createHttpHooks refuses one; black-box finding).
   */
  private updatedHosts(name: string, hosts: unknown): readonly string[] {
    let list: readonly string[];
    try {
      list = this.validateHosts(hosts, `secrets.${name}.hosts`);
    } catch (error) {
      if (error instanceof OptionError) throw new TypeError(`updateSecret: ${error.path}: ${error.reason}`, { cause: error });
      throw error;
    }
    if (list.length === 0) throw new TypeError(`updateSecret: secrets.${name}.hosts: a secret needs at least one host`);
    return list;
  }

  delete(name: string): void {
    const entry = this.entries.get(name);
    if (entry === undefined) throw new TypeError(`deleteSecret: no secret named "${name}"`);
    if (entry.deleted) return;
    entry.deleted = true;
    retire(entry, entry.value);
    entry.value = "";
    this.valuesChanged();
  }

  /**
   * A reload built this store anew for a guest that `previous` served: every value `previous`
   * held or had retired is retired here too, unless a secret of this store holds it now (a
   * rename). A secret the reload removed stays as a deleted one, with nothing but its values to
   * refuse. So a rotation by reload is refused and redacted as one by updateSecret() is.
   */
  inherit(previous: SecretStore): void {
    const live = this.liveValues();
    for (const old of previous.entries.values()) {
      const values = [...old.retired, ...(old.deleted ? [] : [old.value])].filter((v) => v !== "" && !live.has(v));
      const entry = this.entries.get(old.name);
      if (entry === undefined) {
        this.entries.set(old.name, withFields(old, { hosts: [], matcher: compileHostPatterns([]), value: "", deleted: true, retired: values.slice(-maxRetired) }));
        continue;
      }
      for (const value of values) if (!entry.retired.includes(value)) retire(entry, value);
    }
    this.valuesChanged();
  }

  /**
   * The values this store holds only as retired (rotated or deleted), by secret, oldest first:
   * what another process serving the same guest must refuse and redact too (`--workers N`: a
   * replacement worker builds its stores from the files, which hold only current values).
   */
  retiredValues(): RetiredValues[] {
    const live = this.liveValues();
    return [...this.entries.values()].flatMap((e) => {
      const values = e.retired.filter((v) => v !== "" && !live.has(v));
      return values.length === 0 ? [] : [{ name: e.name, values }];
    });
  }

  /**
   * Retires here too what another process's store retired ({@link retiredValues}), unless a
   * secret of this store holds it now (rotated back, or renamed). A secret this store lacks
   * stays as a deleted one, with nothing but those values to refuse, as after a reload that
   * removed it ({@link inherit}). Returns whether anything was added.
   */
  adoptRetired(carried: readonly RetiredValues[]): boolean {
    // Checked whole before anything changes: a bad list leaves the store as it was.
    for (const { name, values } of carried) {
      if (typeof name !== "string" || !/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) throw new TypeError("retired values: not a secret name");
      if (!Array.isArray(values)) throw new TypeError(`retired values of ${name}: expected an array`);
      for (const value of values) checkValue(value, `retired values of ${name}`);
    }
    const live = this.liveValues();
    let added = false;
    for (const { name, values } of carried) {
      const fresh = values.filter((v) => !live.has(v));
      if (fresh.length === 0) continue;
      let entry = this.entries.get(name);
      if (entry === undefined) {
        entry = { name, placeholder: "", hosts: [], matcher: compileHostPatterns([]), value: "", deleted: true, retired: [], redirects: "scan", followRedirectsTo: compileHostPatterns([]) };
        this.entries.set(name, entry);
      }
      for (const value of fresh.slice(-maxRetired)) {
        if (entry.retired.includes(value)) continue;
        retire(entry, value);
        added = true;
      }
    }
    if (added) this.valuesChanged();
    return added;
  }

  /** Every current value: not retired, whatever another store says of it. */
  private liveValues(): Set<string> {
    return new Set([...this.entries.values()].filter((e) => !e.deleted).map((e) => e.value));
  }

  /**
   * Substitutes placeholders for `hostname` and refuses what must not leave. Returns the
   * request's new headers and URL, or undefined when nothing changed. The names of the secrets
   * substituted are added to `substituted`, so that later redirect hops of the same request
   * know which values they could carry ({@link checkRedirect}).
   */
  apply(target: SecretTarget, hostname: string, substituted?: Set<string>): { headers: string[]; url: URL } | undefined {
    if (this.entries.size === 0) return undefined;
    const secure = target.url.protocol === "https:";
    this.checkUrl(target.url, hostname, secure);
    let changed = false;
    const headers: string[] = [];
    const raw = target.headers;
    // Counted as written: each field's name, value, ": " and CRLF, and the URL.
    const room: HeadRoom = { left: maxSubstitutedHeadBytes - target.url.href.length };
    for (let i = 0; i < raw.length; i += 2) {
      const name = raw[i]!;
      const value = raw[i + 1]!;
      this.checkName(name, hostname, secure);
      room.left -= name.length + 4;
      let next = this.substitute(value, hostname, secure, `header ${name}`, headerForm, substituted, room);
      if (credentialHeaders.has(name.toLowerCase())) next = this.substituteBasic(next, hostname, secure, name, substituted, room);
      if (next !== value) changed = true;
      headers.push(name, next);
    }
    let url = target.url;
    if (this.replaceInQuery && url.search.length > 1) {
      const query = this.substituteQuery(url.search.slice(1), hostname, secure, substituted, room);
      if (query !== url.search.slice(1)) {
        url = new URL(url.href);
        url.search = `?${query}`;
        changed = true;
      }
    }
    return changed ? { headers, url } : undefined;
  }

  /**
   * The text with every secret value, current and retired, replaced by `[REDACTED:NAME]`. The
   * text is decoded before it is searched (percent-encoding, `+` for space, JSON escapes,
   * base64, hex, any letter case; see secret-scan.ts), and the span each match came from is
   * replaced in the original. So `/loop/p@ss%20word|x`, where the URL parser encoded some
   * characters of a value and left others, is redacted as a whole. With `keep`, the text is cut
   * there after it was searched, so that a value the cut goes through is redacted whole: cut
   * first, its first part would no longer be recognised (see {@link reach}). With `tally`, adds
   * what the redactions took out of the text ({@link ConcealTally}).
   */
  redact(text: string, keep?: number, tally?: ConcealTally): string {
    this.redaction ??= valuesOf([...this.entries.values()]);
    return redactText(text, this.redaction, undefined, keep, tally);
  }

  /** A value was added or retired: what {@link redact} looks for is built again at its next use. */
  private valuesChanged(): void {
    this.redaction = undefined;
    valueChanges += 1;
  }

  /** What {@link redact} looks for: every value, current and retired, as scan needles. */
  needles(): readonly Needle[] {
    this.redaction ??= valuesOf([...this.entries.values()]);
    return this.redaction.needles;
  }

  /**
   * How long, in bytes, a copy of a value the scan recognises can be: the longest value, current
   * or retired, in its longest encoding ({@link maxExpansion}), and a little more. 0 without
   * values. A value is counted as its UTF-8 bytes encoded in UTF-8 again, the longest form the
   * scan looks for (see secret-scan.ts), in the longest of the spellings it looks for: one outside
   * ASCII upper- and lower-cased too, and upper case can be longer (`ß` is `SS`).
   */
  reach(): number {
    let longest = 0;
    for (const e of this.entries.values()) {
      for (const v of [e.value, ...e.retired]) {
        for (const spelling of /[\u0080-\uffff]/.test(v) ? [v, v.toUpperCase(), v.toLowerCase()] : [v]) longest = Math.max(longest, Buffer.byteLength(headerForm(spelling)));
      }
    }
    return longest === 0 ? 0 : maxExpansion * longest + 16;
  }

  /**
   * For recordings (issue 18): `text` with every placeholder of this store, and every value
   * (current and retired, in any encoding the scan decodes), replaced by the stable token
   * `EGRESSGATE_SECRET{NAME}`, which means the same in every run whatever the placeholders are.
   * A text too complex to scan comes back undefined: the caller must not write it.
   */
  tokenize(text: string): string | undefined {
    const out = this.tokenizePlaceholders(text);
    this.redaction ??= valuesOf([...this.entries.values()]);
    return replaceMatches(out, this.redaction, secretToken);
  }

  /**
   * `text` with this store's placeholders, and nothing else, turned into their tokens: for what
   * went out or came back as it was (a body), where a value would be a leak, not a token.
   */
  tokenizePlaceholders(text: string): string {
    let out = text;
    for (const e of this.entries.values()) {
      if (e.placeholder !== "" && out.includes(e.placeholder)) out = out.replaceAll(e.placeholder, secretToken(e.name));
    }
    return out;
  }

  /**
   * The reverse, for a replayed response: each token of a secret of this store becomes this
   * run's placeholder for it, so a guest reads back what it sent, as from the live upstream.
   */
  placeholdersForTokens(text: string): string {
    if (!text.includes(tokenPrefix)) return text;
    let out = text;
    for (const e of this.entries.values()) if (e.placeholder !== "") out = out.replaceAll(secretToken(e.name), e.placeholder);
    return out;
  }

  /**
   * The name of a secret whose value, current or retired, `text` holds in any encoding; the
   * last check before a recording is written. Throws UnscannableError for a text too complex to
   * scan (the caller treats it as holding one).
   */
  findValue(text: string): string | undefined {
    this.redaction ??= valuesOf([...this.entries.values()]);
    return findFirst(text, this.redaction, ScanBudget.forLength(text.length))?.needle.name;
  }

  /**
   * Every value, current and retired, with its secret's name: for the recorder's search of
   * bodies too large for the decoding scan (src/record/leak-scan.ts). Never logged or written.
   */
  valuesToFind(): { readonly name: string; readonly value: string }[] {
    return [...this.entries.values()].flatMap((e) => [e.value, ...e.retired].filter((v) => v !== "").map((value) => ({ name: e.name, value })));
  }

  /**
   * The text as a third party may see it (an external decider's document): every current value
   * back to its placeholder, in `Basic` credentials too when `header` is Authorization or
   * Proxy-Authorization, and anything left of any value, current or retired, in any encoding,
   * redacted to `[REDACTED:NAME]` ({@link redact}). On a redirect hop, or after substitution, a
   * request carries real values; what leaves the proxy for a decider must not. With `tally`,
   * adds what the replacements took out of the text, for a caller that cuts the result
   * ({@link ConcealTally}).
   */
  placeholdersFor(text: string, header?: string, tally?: ConcealTally): string {
    if (this.entries.size === 0) return text;
    let out = this.toPlaceholders(text, tally);
    if (header !== undefined && credentialHeaders.has(header.toLowerCase())) {
      const match = basicCredentials.exec(out);
      if (match !== null) {
        const decoded = Buffer.from(match[3]!, "base64").toString("utf8");
        const mapped = this.toPlaceholders(decoded);
        if (mapped !== decoded) {
          const encoded = Buffer.from(mapped, "utf8").toString("base64");
          if (tally !== undefined) tallyReplacement(tally, out.slice(match[1]!.length + match[2]!.length), encoded);
          out = `${match[1]}${match[2]}${encoded}`;
        }
      }
    }
    return this.redact(out, undefined, tally);
  }

  /**
   * Current values replaced by their placeholders, longest value first (one value may hold
   * another): as text, and as a header holds them once substituted ({@link headerForm}).
   */
  private toPlaceholders(text: string, tally?: ConcealTally): string {
    let out = text;
    const forms = [...this.entries.values()]
      .filter((e) => !e.deleted)
      .flatMap((e) => [...new Set([e.value, headerForm(e.value)])].map((form) => ({ form, placeholder: e.placeholder })))
      .sort((a, b) => b.form.length - a.form.length);
    for (const { form, placeholder } of forms) {
      if (!out.includes(form)) continue;
      out = out.replaceAll(form, () => {
        if (tally !== undefined) tallyReplacement(tally, form, placeholder);
        return placeholder;
      });
    }
    return out;
  }

  /**
   * Called before a redirect hop is followed (issue 14). `substituted` names the secrets whose
   * values this request carried on an earlier hop. For each whose hosts the hop leaves (or
   * that the hop would send over plain http://):
   * - `"refuse"`: the hop is refused, unless it goes over https:// to a host that matches the
 *   secret's `followRedirectsTo` (a hop to plain http:// is refused even to the secret's hosts);
   * - then, in both modes, the hop's URL (userinfo, host, path, query and fragment, and the
   *   Location as sent) and every header are decoded and searched for the value, and a match
   *   refuses the hop. So does a hop too complex to search within the scan's budget.
   * A refusal never quotes the hop's URL or the host it came from (an earlier hop's host, from
   * some upstream's Location, can hold a value, lowercased, where redaction cannot see it). It
   * names the hop's host only when neither the host nor the Location as sent holds a copy of the
   * value: the URL parser lowercases the host, which leaves a base64 copy unrecognisable, and
   * the guest gets the refusal instead of the 3xx.
   */
  checkRedirect(hop: RedirectHop, substituted: ReadonlySet<string>): void {
    const { url } = hop;
    const hostname = bareHostname(url.hostname);
    const secure = url.protocol === "https:";
    const leaving: Entry[] = [];
    for (const name of substituted) {
      const e = this.entries.get(name);
      if (e === undefined) continue;
      const inScope = !e.deleted && e.matcher.match(hostname) !== undefined;
      if (inScope && secure) continue;
      if (e.redirects === "refuse" && !secure) {
        // Even to its own hosts, or to followRedirectsTo (which admits hosts, not cleartext): a
        // copy the scan cannot see (split over two parameters) would cross the network readable
        // by anyone on the path (black-box finding, sixth session).
        throw secretDenied(
          e.name,
          `a redirect goes to plain http:// after this request carried secret ${e.name}; ` +
            `with secretRedirects "refuse" a hop over plain http:// is never followed, whatever its host`,
          `redirect over plain http:// to ${hostIsClean(hop, valuesOf([e])) ? `host "${hostname}"` : "a host that holds a copy of the value"}`,
        );
      }
      if (!inScope && e.redirects === "refuse" && e.followRedirectsTo.match(hostname) === undefined) {
        const to = hostIsClean(hop, valuesOf([e])) ? `host "${hostname}"` : "a host that holds a copy of the value";
        throw secretDenied(
          e.name,
          `a redirect leaves the hosts of secret ${e.name}, which this request carried; ` +
            `with secretRedirects "refuse" only hosts in followRedirectsTo are followed`,
          `redirect to ${to}`,
        );
      }
      leaving.push(e);
    }
    if (leaving.length === 0) return;
    const needles = valuesOf(leaving);
    const parts: [string, string][] = [
      ["userinfo", url.username === "" && url.password === "" ? "" : `${url.username}:${url.password}`],
      ["host", url.hostname],
      ["path", url.pathname],
      ["query", url.search],
      ["fragment", url.hash],
      // As sent: the URL parser lowercases the host and re-encodes the rest.
      ["Location header", hop.location],
    ];
    for (let i = 0; i < hop.headers.length; i += 2) parts.push([`header ${hop.headers[i]!.toLowerCase()}`, `${hop.headers[i]!}: ${hop.headers[i + 1]!}`]);
    // One budget for the whole hop, so a hop of many headers costs no more than one of their total length.
    const budget = ScanBudget.forLength(parts.reduce((n, [, text]) => n + text.length, 0));
    for (const [where, text] of parts) {
      let match: Match | undefined;
      try {
        match = findFirst(text, needles, budget);
      } catch (error) {
        if (!(error instanceof UnscannableError)) throw error;
        throw secretDenied(
          leaving[0]!.name,
          `a redirect leaves the hosts of secret ${leaving.map((e) => e.name).join(", ")}, which this request carried, ` +
            "and is too complex to scan for secrets, so it is not followed",
        );
      }
      if (match === undefined) continue;
      const e = this.entries.get(match.needle.name)!;
      let to: string;
      if (!e.deleted && e.matcher.match(hostname) !== undefined) to = "over plain http://; secrets are only sent over https://";
      else if (hostIsClean(hop, needles)) to = `to host "${hostname}", which is not in its hosts`;
      else to = "to a host outside its hosts";
      const subject = where.startsWith("header ") ? where : "URL";
      throw secretDenied(
        e.name,
        `a redirect's ${subject} carries the value of secret ${e.name} ${to}; ` +
          `it was found ${encoding(match)} in the ${where}, so the redirect is not followed`,
      );
    }
  }

  /**
   * Called before every redirect hop is followed, after {@link checkRedirect}: a hop whose host
   * name holds a copy of any secret's value, current or retired, in any encoding the scan
   * decodes, is refused wherever it goes, the secret's own hosts included. A host name crosses
   * the network in the clear whatever the scheme: in the DNS query for it and in the TLS server
   * name (SNI). An upstream within a wildcard scope (`*.api.test`) that wrote the value into the
   * host of its redirect had the hop followed, the value went to the resolver and out in SNI,
   * lowercased by the URL parser, and every output named the host (black-box finding, eleventh
   * session). The host is searched as the Location wrote it, in its own letter case, where a
   * base64 copy is still recognised, and as the parser made it. The refusal never names it.
   */
  checkRedirectHost(hop: RedirectHop): void {
    if (this.entries.size === 0) return;
    const host = bareHostname(hop.url.hostname);
    // A host written outside ASCII reaches the parser's host as punycode (`pässwörd.api.test` is
    // `xn--psswrd-bfb7y.api.test`), which no span of the Location spells: the hop was followed,
    // and the value left in the DNS query, SNI and Host (secrets hunt, fifteenth session). The
    // scan decodes punycode labels (scan-decoders.ts), so the parser's host is read as anyone reads it.
    const texts = [host, ...writtenHosts(hop.location, host)];
    this.redaction ??= valuesOf([...this.entries.values()]);
    const budget = ScanBudget.forLength(texts.reduce((n, text) => n + text.length, 0));
    for (const text of texts) {
      let match: Match | undefined;
      try {
        match = findFirst(text, this.redaction, budget);
      } catch (error) {
        if (!(error instanceof UnscannableError)) throw error;
        const first = [...this.entries.values()][0]!;
        throw secretDenied(first.name, "a redirect's host name is too complex to scan for secrets, so the redirect is not followed");
      }
      if (match === undefined) continue;
      throw hostCarries(match.needle.name, encoding(match));
    }
    const unicode = unicodeHostname(host);
    if (unicode === undefined) return;
    // The parser also maps what it punycodes (UTS #46: NFC, full-width forms made narrow, and
    // lowercase, which the scan follows only as a whole value's lower and upper case): each value
    // outside ASCII, so spelled, too.
    for (const e of this.entries.values()) {
      for (const value of [e.value, ...e.retired]) {
        const spelled = value === "" ? undefined : hostSpelling(value);
        if (spelled !== undefined && unicode.includes(spelled)) throw hostCarries(e.name, "as an internationalised host name, in punycode");
      }
    }
  }

  /**
   * A hop's URL never carries a value, or a placeholder, to a host outside the secret's hosts.
   * A redirect builds it from the upstream's Location, which can quote a value substituted into
   * the hop before (a "return to" cookie, an open redirect), and a cross-origin hop drops the
   * header that held it. Checked exactly, raw and percent-decoded, like a header; the hostname,
   * which the URL parser lowercases, is also checked case-folded.
   */
  private checkUrl(url: URL, hostname: string, secure: boolean): void {
    const { href } = url;
    const decoded = href.includes("%") ? decodePercent(href) : undefined;
    for (const e of this.entries.values()) {
      const inScope = !e.deleted && e.matcher.match(hostname) !== undefined;
      refuseValues(e, href, hostname, inScope, secure, "the URL", false);
      if (decoded !== undefined) refuseValues(e, decoded, hostname, inScope, secure, "the URL", false);
      refuseValues(e, url.hostname, hostname, inScope, secure, "the URL", true);
      // A placeholder is never substituted into the path (nor the query, unless asked), but one
      // bound for a host outside its secret's hosts is refused there as it is in a header.
      if (!inScope && !e.deleted && (href.includes(e.placeholder) || decoded?.includes(e.placeholder) === true || url.hostname.includes(e.placeholder.toLowerCase()))) {
        throw secretDenied(e.name, `the URL carries the placeholder of secret ${e.name} to host "${hostname}", which is not in its hosts`);
      }
    }
  }

  /**
   * A header name is never substituted, so a placeholder in one is refused whatever the host (on
   * the secret's own host it would go out as the placeholder, a mistake better reported; to any
   * other it would hand the placeholder to a host outside the secret's hosts: a black-box
   * finding). A real value in a name is refused where it would be in a value. Names are
   * case-insensitive (HTTP/2 lowercases them), so both are compared case-folded.
   */
  private checkName(name: string, hostname: string, secure: boolean): void {
    // A placeholder is 66 characters: most names are shorter than it and than any value.
    let folded: string | undefined;
    for (const e of this.entries.values()) {
      const inScope = !e.deleted && e.matcher.match(hostname) !== undefined;
      if (!e.deleted && name.length >= e.placeholder.length) {
        folded ??= name.toLowerCase();
        if (folded.includes(e.placeholder.toLowerCase())) {
          throw secretDenied(
            e.name,
            inScope
              ? `a header name carries the placeholder of secret ${e.name}; a placeholder is substituted in header values, never in names`
              : `a header name carries the placeholder of secret ${e.name} to host "${hostname}", which is not in its hosts`,
          );
        }
      }
      if (holdsAValueOfLength(e, name.length)) {
        folded ??= name.toLowerCase();
        refuseValues(e, folded, hostname, inScope, secure, "a header name", true);
      }
    }
  }

  /** Checks and substitutes one piece of text; `encode` wraps the value (the query escapes it). */
  private substitute(
    text: string,
    hostname: string,
    secure: boolean,
    where: string,
    encode?: (v: string) => string,
    substituted?: Set<string>,
    room?: HeadRoom,
  ): string {
    let out = text;
    for (const e of this.entries.values()) {
      const inScope = !e.deleted && e.matcher.match(hostname) !== undefined;
      refuseValues(e, text, hostname, inScope, secure, where, false);
      if (e.deleted) continue;
      if (out.includes(e.placeholder)) {
        if (!inScope) {
          throw secretDenied(e.name, `${where} carries the placeholder of secret ${e.name} to host "${hostname}", which is not in its hosts`);
        }
        if (!secure) {
          // Anyone on the path could read it: a secret is only ever inserted into TLS traffic.
          throw secretDenied(e.name, `${where} carries the placeholder of secret ${e.name} over plain http://; secrets are only sent over https://`);
        }
        const replacement = encode === undefined ? e.value : encode(e.value);
        // Measured before it is built: the text grows by this much per placeholder.
        if (room !== undefined && out.length + occurrences(out, e.placeholder) * (replacement.length - e.placeholder.length) > room.left) {
          throw headTooLarge();
        }
        // A function, so that `$&`, `$'`, `` $` `` and `$$` in a value are not replacement patterns.
        out = out.replaceAll(e.placeholder, () => replacement);
        substituted?.add(e.name);
      }
    }
    if (room !== undefined) {
      room.left -= out.length;
      // Only a substitution is refused here: a head that is large by itself is not its doing.
      if (room.left < 0 && out !== text) throw headTooLarge();
    }
    return out;
  }

  private substituteBasic(value: string, hostname: string, secure: boolean, header: string, substituted?: Set<string>, room?: HeadRoom): string {
    const match = basicCredentials.exec(value);
    if (match === null) return value;
    const decoded = Buffer.from(match[3]!, "base64").toString("utf8");
    // The field's value was counted as it stood; its credentials are counted again as they grow.
    const inner: HeadRoom | undefined = room === undefined ? undefined : { left: Math.floor(((room.left + value.length) * 3) / 4) };
    const next = this.substitute(decoded, hostname, secure, `${header} Basic credentials`, undefined, substituted, inner);
    if (next === decoded) return value;
    const out = `${match[1]}${match[2]}${Buffer.from(next, "utf8").toString("base64")}`;
    if (room !== undefined) {
      room.left -= out.length - value.length;
      if (room.left < 0 && out !== value) throw headTooLarge();
    }
    return out;
  }

  /**
   * Only the placeholder tokens change, so the rest of the query keeps its exact bytes. The
   * value is percent-encoded (`+/=?&` included) so it decodes back to itself. Names and values
   * are also checked decoded, so an encoded real value is refused like a plain one.
   */
  private substituteQuery(query: string, hostname: string, secure: boolean, substituted?: Set<string>, room?: HeadRoom): string {
    for (const part of query.split("&")) {
      for (const piece of part.split("=")) {
        const decoded = decodeQueryComponent(piece);
        // Checked only: what it would become is not kept, but is bounded all the same.
        if (decoded !== piece) this.substitute(decoded, hostname, secure, "query", undefined, undefined, { left: maxSubstitutedHeadBytes });
      }
    }
    // The URL was counted whole: only what the query grows by counts again.
    const grown: HeadRoom | undefined = room === undefined ? undefined : { left: room.left + query.length };
    const out = this.substitute(query, hostname, secure, "query", encodeURIComponent, substituted, grown);
    if (room !== undefined) room.left = grown!.left;
    return out;
  }
}

/** The refusal of a redirect hop whose host name holds a copy of secret `name`'s value; it never names the host. */
function hostCarries(name: string, how: string): EgressError {
  return secretDenied(
    name,
    `a redirect's host name carries the value of secret ${name} (found ${how}); ` +
      "a host name leaves in the clear, in the DNS query and the TLS server name, so the redirect is not followed",
  );
}

/**
 * The most places in a Location that {@link writtenHosts} looks at, and returns: a host is
 * written once, in the authority, after a userinfo at most.
 */
const maxHostPlaces = 64;
const maxWrittenHosts = 4;

/**
 * The spans of `location` (as written, and percent-decoded) that read as `host` in any letter
 * case: the host as the upstream wrote it, before the URL parser lowercased it (and decoded its
 * percent-escapes), where a base64 copy of a value is still recognisable. Tabs and line breaks,
 * which the parser drops, are dropped first.
 */
function writtenHosts(location: string, host: string): string[] {
  const stripped = location.replace(/[\t\n\r]/g, "");
  const out = new Set<string>();
  for (const text of stripped.includes("%") ? [stripped, decodePercent(stripped)] : [stripped]) {
    // ASCII only, so each character keeps its place: the parser's host is ASCII (punycode).
    const folded = text.replace(/[A-Z]+/g, (run) => run.toLowerCase());
    let places = 0;
    for (let at = folded.indexOf(host); at >= 0 && places < maxHostPlaces && out.size < maxWrittenHosts; at = folded.indexOf(host, at + 1), places++) {
      const written = text.slice(at, at + host.length);
      if (written !== host) out.add(written);
    }
  }
  return [...out];
}

/** How many times `needle` occurs in `text`, without overlaps. */
function occurrences(text: string, needle: string): number {
  let count = 0;
  for (let at = text.indexOf(needle); at !== -1; at = text.indexOf(needle, at + needle.length)) count += 1;
  return count;
}

const tokenPrefix = "EGRESSGATE_SECRET{";

/** The stable token a recording holds for secret `name`, in place of its placeholder or value. */
export function secretToken(name: string): string {
  return `${tokenPrefix}${name}}`;
}

/** `text` with every span where a needle was found replaced by `label(name)`; undefined when it could not be scanned. */
function replaceMatches(text: string, needles: NeedleSet, label: (name: string) => string): string | undefined {
  const spans: { start: number; end: number; name: string }[] = [];
  const outcome = scan(text, needles, (match) => {
    spans.push({ start: match.start, end: match.end, name: match.needle.name });
    return false;
  });
  if (outcome === "unscanned") return undefined;
  if (spans.length === 0) return text;
  spans.sort((a, b) => a.start - b.start || b.end - a.end);
  let out = "";
  let at = 0;
  for (let i = 0; i < spans.length; ) {
    const { start, name } = spans[i]!;
    let end = spans[i]!.end;
    for (i++; i < spans.length && spans[i]!.start < end; i++) end = Math.max(end, spans[i]!.end);
    out += `${text.slice(at, start)}${label(name)}`;
    at = end;
  }
  return out + text.slice(at);
}

/**
 * Retired values kept per secret: every one is looked for in every request and log line, and a
 * token a `file:` source refreshes hourly under --watch would otherwise add one an hour for the
 * life of the process. The oldest goes first.
 */
export const maxRetired = 64;

function retire(entry: Entry, value: string): void {
  entry.retired.push(value);
  if (entry.retired.length > maxRetired) entry.retired.shift();
}

/** Whether `e` has a value, current or retired, no longer than `length`: one a text that long could hold. */
function holdsAValueOfLength(e: Entry, length: number): boolean {
  if (e.value !== "" && e.value.length <= length) return true;
  for (const old of e.retired) if (old !== "" && old.length <= length) return true;
  return false;
}

/** Every value, current and retired, of the entries. */
function valuesOf(entries: readonly Entry[]): NeedleSet {
  return new NeedleSet(entries.flatMap((e) => [e.value, ...e.retired].filter((v) => v !== "").map((v) => needle(e.name, v))));
}

/**
 * Whether a message may name the hop's host: neither the host nor the Location as the upstream
 * wrote it (original letter case, where a base64 copy is still readable) holds a value. A text
 * too complex to scan counts as holding one.
 */
function hostIsClean(hop: RedirectHop, needles: NeedleSet): boolean {
  try {
    // The scan reads a punycode host as anyone reads it back (a host the upstream wrote in punycode
    // was named: secrets hunt, fifteenth session).
    return findFirst(hop.url.hostname, needles) === undefined && findFirst(hop.location, needles) === undefined;
  } catch (error) {
    if (error instanceof UnscannableError) return false;
    throw error;
  }
}

/**
 * Refuses `text` if it holds a retired value of `e` anywhere, or its current value bound for a
 * host outside its hosts or over plain http://. `fold` compares case-insensitively (`text` is
 * already lowercased). Each value is looked for as text and in {@link headerForm} (its UTF-8
 * bytes as Latin-1 characters): a header holds it that way once substituted, and so reads a
 * value a guest sent as UTF-8.
 */
function refuseValues(e: Entry, text: string, hostname: string, inScope: boolean, secure: boolean, where: string, fold: boolean): void {
  const spellings = (v: string): string[] => {
    const wire = headerForm(v);
    const forms = wire === v ? [v] : [v, wire];
    return fold ? forms.map((form) => form.toLowerCase()) : forms;
  };
  const current = spellings(e.value);
  for (const retired of e.retired) {
    if (retired === "") continue;
    for (const [i, old] of spellings(retired).entries()) {
      if (text.includes(old) && !onlyInside(text, old, current[i] ?? current[0]!)) {
        throw secretDenied(e.name, `${where} carries a retired value of secret ${e.name}; rotated and deleted values are refused everywhere`);
      }
    }
  }
  if (e.deleted || !current.some((form) => text.includes(form))) return;
  if (!inScope) throw secretDenied(e.name, `${where} carries the value of secret ${e.name} to host "${hostname}", which is not in its hosts`);
  // A redirect to http:// carries the values substituted for the previous hop.
  if (!secure) throw secretDenied(e.name, `${where} carries the value of secret ${e.name} over plain http://; secrets are only sent over https://`);
}

/**
 * A value as it travels in a header field: its UTF-8 bytes, one Latin-1 character each. Node
 * writes a header's string as Latin-1 on both HTTP/1.1 and HTTP/2 (undici refuses a character
 * past U+00FF on HTTP/1.1; HTTP/2 kept its low byte), and reads one back the same way, so the
 * JavaScript string sent `pässwörd` as `70 e4 …` where the value is `70 c3 a4 …` (black-box
 * finding). The same as `value` when it is ASCII.
 */
function headerForm(value: string): string {
  return /[\u0080-\uffff]/.test(value) ? Buffer.from(value, "utf8").toString("latin1") : value;
}

/**
 * Every %XX run decoded as UTF-8, with U+FFFD for bytes that are not (so no stray byte keeps a
 * run encoded, where decodeURIComponent would throw); a lone `%` stays as it is.
 */
function decodePercent(text: string): string {
  return text.replace(/(?:%[0-9a-fA-F]{2})+/g, (run) => Buffer.from(run.replaceAll("%", ""), "hex").toString("utf8"));
}

function decodeQueryComponent(text: string): string {
  try {
    return decodeURIComponent(text.replaceAll("+", " "));
  } catch {
    return text;
  }
}

function checkValue(value: unknown, path: string): string {
  if (typeof value !== "string" || value === "") throw new TypeError(`${path}: expected a non-empty string`);
  const problem = secretValueProblem(value);
  if (problem !== undefined) throw new TypeError(`${path}: ${problem}`);
  return value;
}

/**
 * True when every occurrence of `old` lies inside an occurrence of `current`: a retired value
 * may legitimately sit inside the value that replaced it (an extended token), and only there.
 */
function onlyInside(text: string, old: string, current: string): boolean {
  if (current === "" || !current.includes(old)) return false;
  const covered: [number, number][] = [];
  for (let at = text.indexOf(current); at >= 0; at = text.indexOf(current, at + 1)) covered.push([at, at + current.length]);
  for (let at = text.indexOf(old); at >= 0; at = text.indexOf(old, at + 1)) {
    if (!covered.some(([start, end]) => at >= start && at + old.length <= end)) return false;
  }
  return true;
}

function checkMode(mode: unknown, path: string): SecretRedirects {
  if (!secretRedirectModes.includes(mode as SecretRedirects)) {
    throw new TypeError(`${path}: expected "scan" or "refuse" (got ${shownValue(mode)})`);
  }
  return mode as SecretRedirects;
}

function followPatterns(value: unknown, path: string): string[] {
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw new TypeError(`${path}: expected an array of host patterns`);
  return value.map((p, i) => validateHostPattern(p, `${path}[${i}]`));
}

/** How a match was encoded, innermost first: "base64-encoded, then percent-encoded". */
function encoding(match: Match): string {
  return match.via.length === 0 ? "as it is (in any letter case)" : [...match.via].reverse().map((name) => encodingLabels[name] ?? name).join(", then ");
}

const encodingLabels: Record<string, string> = {
  percent: "percent-encoded",
  plus: "with + for space",
  json: "JSON-escaped",
  base64: "base64-encoded",
  hex: "hex-encoded",
  punycode: "punycode-encoded",
};
