import { isIP } from "node:net";
import { join } from "node:path";
import { EgressError } from "../errors.js";
import { readFailure } from "../regular-file.js";
import { readHarJson } from "./har-file.js";
import type { ResolvedAddress } from "../upstream/resolve.js";
import { sidecarDir, singleGuest, type RecordedEntry, type RecordedHar } from "./har.js";
import { replayProblems, sidecarFileProblem } from "./har-check.js";
import { fieldsOf, matchKey, nearest, type BodyForKey, type MatchFields, type MatchOptions } from "./match.js";

export interface LoadedEntry {
  /** Its place in the file, from 0. */
  readonly index: number;
  readonly entry: RecordedEntry;
  readonly fields: MatchFields;
  /** The one guest it answers ({@link entryOwner}); undefined: any guest. */
  readonly owner: string | undefined;
}

/**
 * The guest an entry answers on replay, or undefined for any guest. An entry holds what its
 * guest's credentials earned (its secret fetched that body): a named guest's answers only that
 * guest. One a proxy without named guests recorded (`default`), or with no guest at all (a
 * browser's or mitmproxy's export), answers any: its file has only one guest's exchanges. A guest
 * named `default` beside others is told apart by `named` (entry.ts), as it holds a tenant's own.
 */
export function entryOwner(entry: RecordedEntry): string | undefined {
  const info = entry._egressgate;
  if (info?.guest === undefined) return undefined;
  return info.guest === singleGuest && info.named !== true ? undefined : info.guest;
}

export type Exhausted = "repeat-last" | "error";

/** The most problems a refused start names; `har check` lists them all. */
const maxProblemsShown = 20;

/** The answers a replay has for one request, or why it has none. */
export type Take = { readonly hit: LoadedEntry } | { readonly miss: string; readonly code: "EG_REPLAY_MISS" | "EG_REPLAY_EXHAUSTED" };

/**
 * A HAR file loaded for replay: every entry keyed by what it asked (see match.ts). Identical
 * requests get their answers in recorded order, then the last again (or an error), the way a
 * VCR cassette plays back. Also the addresses each host had when recorded, for the IP rules.
 */
export class ReplaySource {
  private readonly byKey = new Map<string, LoadedEntry[]>();
  private readonly used = new Map<string, number>();
  /** Recorded addresses by host: of the entries any guest may use (every entry, with anyGuest). */
  private readonly sharedAddresses = new Map<string, ResolvedAddress[]>();
  /** Recorded addresses by host of the entries one guest may use alone, by that guest. */
  private readonly ownAddresses = new Map<string, Map<string, ResolvedAddress[]>>();

  private constructor(
    readonly path: string,
    readonly entries: readonly LoadedEntry[],
    private readonly exhausted: Exhausted,
    private readonly anyGuest: boolean,
  ) {
    for (const loaded of entries) {
      const key = matchKey(loaded.fields);
      const list = this.byKey.get(key);
      if (list === undefined) this.byKey.set(key, [loaded]);
      else list.push(loaded);
      const ip = recordedIp(loaded.entry.serverIPAddress);
      if (ip === undefined) continue;
      let hosts = this.sharedAddresses;
      if (!anyGuest && loaded.owner !== undefined) {
        hosts = this.ownAddresses.get(loaded.owner) ?? new Map<string, ResolvedAddress[]>();
        this.ownAddresses.set(loaded.owner, hosts);
      }
      const known = hosts.get(loaded.fields.host) ?? [];
      if (!known.some((a) => a.ip === ip)) known.push({ ip, family: isIP(ip) === 6 ? 6 : 4 });
      hosts.set(loaded.fields.host, known);
    }
  }

  /** Reads and indexes a HAR file; throws an Error that says what is wrong with it. */
  static async load(path: string, match: MatchOptions, exhausted: Exhausted, anyGuest = false): Promise<ReplaySource> {
    let har: RecordedHar;
    try {
      // A FIFO there would hold the start until written to; /dev/zero would never end.
      har = (await readHarJson(path)) as RecordedHar;
    } catch (error) {
      throw new Error(`cannot read ${path} as a HAR file: ${readFailure(error)}`, { cause: error });
    }
    const list: unknown = (har as { log?: { entries?: unknown } } | null)?.log?.entries;
    if (!Array.isArray(list)) throw new Error(`${path} is not a HAR file: log.entries is missing`);
    // Every entry is checked before any is used, and every problem named: a field of the wrong
    // type must never reach the code below as a JavaScript error, or a request as a 502.
    const problems: string[] = [];
    for (const [index, entry] of (list as unknown[]).entries()) {
      const found = replayProblems(entry, `log.entries[${index}]`);
      // The response's sidecar file is read at each request: one that is not a regular file (a
      // FIFO would hold a threadpool thread in open()) or is missing fails the start instead.
      const file = found.length === 0 ? (entry as RecordedEntry).response.content?._file : undefined;
      if (file !== undefined) {
        const problem = sidecarFileProblem(path, file, `log.entries[${index}].response.content`);
        if (problem !== undefined) found.push(problem);
      }
      // One by one: an entry may hold any number of problems (one per header), too many to spread as arguments.
      for (const problem of found) problems.push(problem);
    }
    if (problems.length > 0) {
      const shown = problems.slice(0, maxProblemsShown).join("; ");
      const more = problems.length > maxProblemsShown ? `; and ${problems.length - maxProblemsShown} more (egressgate har check lists them all)` : "";
      throw new Error(`${path} cannot be replayed (${problems.length} ${problems.length === 1 ? "problem" : "problems"}): ${shown}${more}`);
    }
    const entries: LoadedEntry[] = [];
    for (const [index, entry] of (list as RecordedEntry[]).entries()) {
      // No response (0, an aborted request in a browser's export) or an informational one (a
      // WebSocket's 101): nothing a request can be answered with.
      if (entry.response.status < 200) continue;
      const url = new URL(entry.request.url);
      if (url.protocol !== "http:" && url.protocol !== "https:") continue;
      const headers = (entry.request.headers ?? []).map((h) => [h.name, h.value] as const);
      const body = await requestBodyOf(entry, path);
      entries.push({ index, entry, fields: fieldsOf(entry.request.method, url, headers, body, match), owner: entryOwner(entry) });
    }
    return new ReplaySource(path, entries, exhausted, anyGuest);
  }

  /** Whether `guest` may be answered with `loaded`: its own entries and those of no one guest (see {@link entryOwner}). */
  private usable(loaded: LoadedEntry, guest: string): boolean {
    return this.anyGuest || loaded.owner === undefined || loaded.owner === guest;
  }

  /**
   * The recorded addresses of a host (lowercase, no trailing dot) in the entries `guest` may
   * use, if any has one. Another guest's addresses are not lent: the IP rules would judge, and
   * their answer tell, a host only that guest's recording holds.
   */
  addressesOf(host: string, guest: string): readonly ResolvedAddress[] | undefined {
    const shared = this.sharedAddresses.get(host);
    const own = this.ownAddresses.get(guest)?.get(host);
    if (own === undefined || shared === undefined) return own ?? shared;
    return [...shared, ...own.filter((a) => !shared.some((s) => s.ip === a.ip))];
  }

  /** Whether an entry `guest` may use names `host`. */
  hasHost(host: string, guest: string): boolean {
    return this.entries.some((e) => e.fields.host === host && this.usable(e, guest));
  }

  /**
   * The answer to `guest`'s request, from the entries it may use. Repeats are counted per guest
   * where the guest has entries of its own among them (another guest's use takes none of its
   * answers), and for every guest together where all are shared, as a one-guest recording always was.
   */
  take(fields: MatchFields, guest: string): Take {
    const key = matchKey(fields);
    const list = this.byKey.get(key)?.filter((loaded) => this.usable(loaded, guest));
    if (list === undefined || list.length === 0) return { miss: this.describeMiss(fields, guest), code: "EG_REPLAY_MISS" };
    const counter = list.some((loaded) => loaded.owner !== undefined) && !this.anyGuest ? `${guest}\n${key}` : key;
    const n = this.used.get(counter) ?? 0;
    this.used.set(counter, n + 1);
    if (n < list.length) return { hit: list[n]! };
    if (this.exhausted === "error") {
      return { miss: `every one of the ${list.length} recorded answers to this request was used (--replay-exhausted error)`, code: "EG_REPLAY_EXHAUSTED" };
    }
    return { hit: list.at(-1)! };
  }

  /**
   * Why nothing answers: the nearest of the entries `guest` may use, never another guest's (its
   * path can say whose it is, and what that guest did). Whether another guest's entry would have
   * matched is not said either; only that such entries are not used, when the file has any.
   */
  private describeMiss(fields: MatchFields, guest: string): string {
    const usable = this.entries.filter((loaded) => this.usable(loaded, guest));
    const near = nearest(
      usable.map((e) => e.fields),
      fields,
    );
    const othersHeld = !this.anyGuest && usable.length < this.entries.length;
    const others = othersHeld ? "; entries another guest recorded are not used (upstream.replay.anyGuest, --replay-any-guest, lets any guest use any entry)" : "";
    if (near === undefined) return othersHeld ? `the recording has no entries guest "${guest}" may use${others}` : "the recording has no entries";
    const entry = usable[near.index]!;
    return `nearest is entry ${entry.index} (${entry.entry.request.method} ${withoutQuery(entry.entry.request.url)}), which differs in ${near.field}${others}`;
  }
}

/**
 * A recorded URL as a miss may name it: without its query, userinfo or fragment, which can carry
 * credentials (another guest's, in a recording several guests made), as the log leaves them out.
 */
function withoutQuery(recorded: string): string {
  try {
    const url = new URL(recorded);
    return `${url.origin}${url.pathname}${url.search !== "" ? "?…" : ""}`;
  } catch {
    return "(a URL that does not parse)";
  }
}

/** `[::1]` as Chrome writes it, `::1`; nothing for an empty or odd value. */
function recordedIp(value: string | undefined): string | undefined {
  if (typeof value !== "string" || value === "") return undefined;
  const bare = value.startsWith("[") && value.endsWith("]") ? value.slice(1, -1) : value;
  return isIP(bare) === 0 ? undefined : bare;
}

/** The recorded request body, as the key wants it. */
async function requestBodyOf(entry: RecordedEntry, path: string): Promise<BodyForKey> {
  const post = entry.request.postData;
  if (post === undefined) return null;
  if (post._file !== undefined) return { sha256: post._file };
  if (typeof post.text === "string") return { bytes: Buffer.from(post.text, post._encoding === "base64" ? "base64" : "utf8") };
  // Chrome writes form bodies as params only.
  if (Array.isArray(post.params)) {
    return { bytes: Buffer.from(new URLSearchParams(post.params.map((p): [string, string] => [p.name, p.value ?? ""])).toString(), "utf8") };
  }
  void path;
  return null;
}

/** The path of a sidecar file named in an entry. */
export function sidecarPath(harPath: string, file: string): string {
  // A name from the file is a hash: anything else (../, a slash) is refused, never followed.
  if (!/^[0-9a-f]{64}$/.test(file)) throw new EgressError("EG_REPLAY_MISS", 502, `the recording names a sidecar file ${JSON.stringify(file.slice(0, 80))} that is not a SHA-256`);
  return join(sidecarDir(harPath), file);
}
