import { isIP } from "node:net";
import { EgressError } from "../errors.js";
import { makeIssue, OptionError } from "../option-error.js";
import { bareHostname } from "../hostname.js";
import type { Logger } from "../log.js";
import type { Executor } from "../pipeline/exchange.js";
import type { SecretStore } from "../policy/secrets.js";
import { Resolver, type ResolvedAddress, type StaticHosts } from "../upstream/resolve.js";
import type { RecordedEntry, RecordedHar } from "./har.js";
import { readHarJson } from "./har-file.js";
import { recordingExecutor } from "./recorder.js";
import { Recording } from "./recording.js";
import { replayExecutor } from "./replay-executor.js";
import { ReplaySource, type Exhausted } from "./replay-source.js";
import { withFields } from "../objects.js";

/** `startProxy({ upstream: { record } })`: write every exchange to a HAR file. */
export interface RecordOptions {
  /** The HAR file (`--record FILE.har`); bodies over 1 MiB go to `FILE.har.d/`. */
  readonly path: string;
  /** Keep cookie values, of Set-Cookie and of Cookie (`--record-cookies`); masked by default. */
  readonly cookies?: boolean;
}

/** `startProxy({ upstream: { replay } })`: answer from a HAR file, with no network. */
export interface ReplayOptions {
  /** The HAR file (`--replay FILE.har`): ours, or one exported by Chrome DevTools or mitmproxy. */
  readonly path: string;
  /** Headers whose values must match too (`--replay-match-header`). */
  readonly matchHeaders?: readonly string[];
  /** Query parameters left out of the match (`--replay-ignore-query`). */
  readonly ignoreQuery?: readonly string[];
  /** JSON pointers left out of a JSON body's match (`--replay-ignore-body-path /nonce`). */
  readonly ignoreBodyPaths?: readonly string[];
  /** Once every recorded answer to a request was used: the last again (default), or 502. */
  readonly exhausted?: Exhausted;
  /** `recorded` waits as the recording did; `none` (default) answers at once. */
  readonly latency?: "none" | "recorded";
  /** Misses go to the real network and are recorded into the same file (`--record-missing`); cookie values stay masked. */
  readonly recordMissing?: boolean;
  /**
   * Any guest may be answered with any entry (`--replay-any-guest`), as when a recording made as
   * guest `ci` is replayed as `ci2`. Off by default: an entry a named guest recorded answers only
   * that guest, as it holds what that guest's credentials earned.
   */
  readonly anyGuest?: boolean;
}

/** `startProxy({ upstream })`: what the innermost executor is. Default: the network. */
export interface UpstreamOptions {
  readonly record?: RecordOptions;
  readonly replay?: ReplayOptions;
}

/**
 * The proxy's recorded network: a recording, a replay, or both (`--record-missing`). Each guest
 * gets an executor and a resolver from it; one file serves every guest, each entry naming its guest.
 */
export class RecordedNetwork {
  private constructor(
    private readonly log: Logger,
    readonly recording: Recording | undefined,
    private readonly replay: { source: ReplaySource; options: ReplayOptions } | undefined,
    private readonly cookies: boolean,
  ) {}

  /** Opens the files; throws an Error that names what is wrong with them. */
  static async start(options: UpstreamOptions, log: Logger): Promise<RecordedNetwork> {
    const replay = options.replay;
    if (replay === undefined) {
      const recording = await Recording.open(options.record!.path, log);
      return new RecordedNetwork(log, recording, undefined, options.record?.cookies === true);
    }
    const match = {
      matchHeaders: (replay.matchHeaders ?? []).map((h) => h.toLowerCase()),
      ignoreQuery: replay.ignoreQuery ?? [],
      ignoreBodyPaths: replay.ignoreBodyPaths ?? [],
    };
    const source = await ReplaySource.load(replay.path, match, replay.exhausted ?? "repeat-last", replay.anyGuest === true);
    let recording: Recording | undefined;
    if (replay.recordMissing === true) {
      // The file grows: what it held is written first, then what the misses add.
      const har = (await readHarJson(replay.path)) as RecordedHar;
      recording = await Recording.open(replay.path, log, har.log.entries as RecordedEntry[]);
    }
    log.info("replaying a recorded network", { path: replay.path, entries: source.entries.length, recordMissing: replay.recordMissing === true, anyGuest: replay.anyGuest === true });
    return new RecordedNetwork(log, recording, { source, options: withFields(replay, match) }, false);
  }

  get replaying(): boolean {
    return this.replay !== undefined;
  }

  /** The guest's resolver: in replay, the addresses recorded in the entries it may use (no DNS), else the usual one. */
  resolver(guest: string, staticHosts: StaticHosts, dnsMs: number): Resolver {
    if (this.replay === undefined) return new Resolver(staticHosts, dnsMs);
    return new ReplayResolver(this.replay.source, guest, staticHosts, dnsMs, this.recording !== undefined);
  }

  /**
   * The guest's executor, wrapping (record) or replacing (replay) the upstream. `neighbours` are
   * the other guests' secrets: the file holds every guest's entries, so each is kept free of
   * every guest's values. `named`: whether the guest, even if called `default`, is one of
   * several (its entries then answer only it on replay).
   */
  executor(guest: string, named: () => boolean, secrets: () => SecretStore | undefined, neighbours: () => Iterable<SecretStore | undefined>): (upstream: Executor) => Executor {
    return (upstream) => {
      const recorder =
        this.recording === undefined ? undefined : recordingExecutor(upstream, { recording: this.recording, guest, named, secrets, neighbours, cookies: this.cookies, log: this.log });
      if (this.replay === undefined) return recorder!;
      const { source, options } = this.replay;
      return replayExecutor({
        source,
        match: { matchHeaders: options.matchHeaders ?? [], ignoreQuery: options.ignoreQuery ?? [], ignoreBodyPaths: options.ignoreBodyPaths ?? [] },
        latency: options.latency ?? "none",
        missing: recorder,
        guest,
        secrets,
        log: this.log,
      });
    };
  }

  /** Writes the HAR from what is recorded so far (SIGTERM does, before the drain). */
  async flush(): Promise<void> {
    await this.recording?.flush();
  }

  async close(): Promise<void> {
    await this.recording?.close();
  }

  /** For a start that failed: the recording is let go without writing FILE.har (Recording.abandon). */
  async abandon(): Promise<void> {
    await this.recording?.abandon();
  }
}

/**
 * In replay, a host's addresses are the ones recorded (`serverIPAddress`) in the entries the
 * guest may use, so the IP rules judge what was really reached; a host without one falls back to
 * `resolve`, and otherwise (unless misses may go to the network) has no address: the request is
 * a miss, with no DNS.
 */
class ReplayResolver extends Resolver {
  constructor(
    private readonly source: ReplaySource,
    private readonly guest: string,
    staticHosts: StaticHosts,
    dnsMs: number,
    network: boolean,
  ) {
    super(
      staticHosts,
      dnsMs,
      network
        ? undefined
        : (hostname) => {
            const known = source.hasHost(hostname, guest);
            return Promise.reject(
              new EgressError(
                "EG_REPLAY_MISS",
                502,
                known
                  ? `the recording has entries for "${hostname}" but no serverIPAddress; give its address with --resolve ${hostname}=IP`
                  : `the recording has no entry for host "${hostname}"`,
              ),
            );
          },
    );
  }

  override async resolve(hostname: string): Promise<readonly ResolvedAddress[]> {
    const bare = bareHostname(hostname).toLowerCase().replace(/\.$/, "");
    if (isIP(bare) === 0) {
      const recorded = this.source.addressesOf(bare, this.guest);
      if (recorded !== undefined) return recorded;
    }
    return super.resolve(hostname);
  }
}

/** Opens the recorded network of startProxy's `upstream` option; a file that cannot be used is an option error naming it. */
export async function startRecordedNetwork(options: UpstreamOptions, log: Logger): Promise<RecordedNetwork> {
  try {
    return await RecordedNetwork.start(options, log);
  } catch (error) {
    const at = options.replay !== undefined ? ["upstream", "replay", "path"] : ["upstream", "record", "path"];
    throw new OptionError(makeIssue(at, (error as Error).message), { prefix: "startProxy: ", cause: error });
  }
}
