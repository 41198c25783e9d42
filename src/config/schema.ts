import { isIP } from "node:net";
import { httpToken } from "../headers.js";
import { logLevels } from "../log.js";
import { secretRedirectModes } from "../policy/secrets.js";
import { defaults } from "./defaults.js";
import {
  boolean,
  checkCidr,
  checkGuestName,
  checkListenHost,
  checkSecretName,
  envMap,
  hostPatterns,
  httpHooksNode,
  integer,
  list,
  map,
  object,
  parseHostPort,
  resolveMap,
  string,
} from "./nodes.js";
import { secretValueNode } from "./secret-source.js";
import { hookEntryNode } from "./hook-chain.js";
import { requiresReason, type OptionRequirement, type Segment } from "./option-error.js";
import type { ObjectNode, OptionNode, Report } from "./validate.js";

/**
 * The one options schema. startProxy's options (`apiOptionsSchema`) and the config file
 * (`configFileSchema`) share every proxy-wide option below, with its bounds, doc and default
 * (from the defaults table); the CLI's flags are turned into a config document and checked
 * against `configFileSchema` too, so the three spellings cannot drift apart.
 */

const day = 24 * 3600_000;
const timeoutDocs: Record<keyof typeof defaults.timeouts, string> = {
  handshakeMs: "From CONNECT until the guest's TLS handshake (or first plain byte) completes.",
  headersMs: "For the guest to send a complete request head.",
  idleMs: "A guest connection with no traffic either way is closed after this; a connection (HTTP/1.1) or stream (HTTP/2) waiting on its upstream with nothing to write is left to upstreamHeadersMs and upstreamBodyMs.",
  h2PingMs: "An HTTP/2 guest connection silent this long is sent a PING, and closed if the answer takes as long again (each at most idleMs), and one whose guest has not acknowledged the proxy's SETTINGS this long after connecting gets GOAWAY(SETTINGS_TIMEOUT); an HTTP/2 upstream connection, sent a PING every 4 s while it has streams and as a request is put on it again (at most once a second), is given up at once if the proxy's HTTP/2 client holds that PING unsent (it has ended the connection on a frame it could not take), and if neither the answer nor any other byte comes within this long (upstreamHeadersMs once it was sent over 65,535 bytes of request body since it last answered one; none is sent once the upstream has closed it gracefully with GOAWAY(NO_ERROR)).",
  dnsMs: "A DNS lookup (504 after).",
  upstreamConnectMs: "TCP and TLS connect to the upstream.",
  upstreamHeadersMs: "Until the upstream's response head arrives (504 after).",
  upstreamBodyMs: "Longest silence inside an upstream response body.",
  drainMs: "How long closing lets in-flight requests finish before cutting them.",
  hookMs: "Each tier-3 hook call must settle within this (504 after), and a tier-2 call must have a worker within it (504 after); so must the reading of a body a tier-2 policy or a decider with includeBody reads whole.",
  requestMs: "A request that passes through layers (handle), over all its descents and sleeps, until its response head (504 after).",
};

const timeoutsNode = object(
  Object.fromEntries(
    Object.entries(timeoutDocs).map(([key, doc]) => [key, integer(1, day, doc, { default: defaults.timeouts[key as keyof typeof timeoutDocs] })]),
  ),
  "Timeouts, in milliseconds.",
);

const limitsNode = object(
  {
    connections: integer(1, 1_000_000, "Guest connections open at once, tunnels and upgrades included (503 beyond)."),
    connectionsPerSource: integer(1, 1_000_000, "Guest connections open at once from one source address (503 beyond).", {
      default: defaults.limits.connectionsPerSource,
    }),
    pipelinedRequests: integer(0, 10_000, "Requests one connection may have waiting behind the one being served.", {
      default: defaults.limits.pipelinedRequests,
    }),
    h2Streams: integer(1, 10_000, "HTTP/2 streams one guest connection may have open, and pipeline work running, resets counted (a stream past it waits; GOAWAY ENHANCE_YOUR_CALM past as many waiting).", {
      default: defaults.limits.h2Streams,
    }),
    h2HeaderListBytes: integer(4096, 1024 * 1024, "Bytes of one HTTP/2 request's header list, as HPACK decodes it (the stream reset, or 431, beyond; one field stays under 64 KiB whatever this says).", {
      default: defaults.limits.h2HeaderListBytes,
    }),
    h2SessionMemoryMiB: integer(1, 1024, "MiB of HTTP/2 state and queued frames one guest connection may hold (new streams refused beyond).", {
      default: defaults.limits.h2SessionMemoryMiB,
    }),
    h2ResetsPer10s: integer(1, 1_000_000, "HTTP/2 streams one guest connection may reset in 10 s within 1 s of opening them, before their response ended (GOAWAY ENHANCE_YOUR_CALM beyond).", {
      default: defaults.limits.h2ResetsPer10s,
    }),
    h2StreamWindowBytes: integer(65_535, 2 ** 31 - 1, "Bytes one HTTP/2 stream may send the proxy ahead of its reader, both ways (an upstream's response, an HTTP/2 guest's upload): the most the proxy holds for one stream whose reader has stopped. A guest connection's window is at most h2ConnectionBufferBytes ÷ h2Streams.", {
      default: defaults.limits.h2StreamWindowBytes,
    }),
    h2ConnectionWindowBytes: integer(65_535, 2 ** 31 - 1, "Bytes one HTTP/2 connection may send the proxy ahead of it, over all its streams (an upstream's, an HTTP/2 guest's); the proxy takes them as they arrive, so this caps a connection's pace, not what it holds.", {
      default: defaults.limits.h2ConnectionWindowBytes,
    }),
    h2ConnectionBufferBytes: integer(65_535, 2 ** 31 - 1, "Bytes the stream windows of one HTTP/2 connection (a guest's, an upstream's) may add up to: the most the proxy holds for one connection whose readers have stopped. A guest connection's stream window is fixed at this ÷ h2Streams (the largest value one byte under a power of two within it, at most h2StreamWindowBytes, never below 65,535); an upstream connection's is lowered past h2ConnectionBufferBytes ÷ h2StreamWindowBytes responses coming at once, so that together they stay within it (never below 65,535 bytes).", {
      default: defaults.limits.h2ConnectionBufferBytes,
    }),
    sourceBufferBytes: integer(131_070, 2 ** 53 - 1, "Bytes the HTTP/2 streams under way from one source address may make the proxy hold together in flow-control windows (a body a hook reads is bounded by maxHttpBodyBytes instead), each charged the most its windows let in as it arrives (h2StreamWindowBytes for its response, and the guest connection's stream window for a request body): a stream past it is answered 503 before any work, and those under way go on. 1,048,575 a request at the defaults (1,179,646 with a body), 256 of them in the default. Must be at least one request with a body's charge.", {
      default: defaults.limits.sourceBufferBytes,
    }),
  },
  "What guests may hold at once.",
);

const replayMatchDoc = "Part of a replay's match key";
const upstreamNode = object(
  {
    record: object(
      {
        path: string("a file path", "Write every exchange to this HAR 1.2 file (bodies over 1 MiB to FILE.d/), secrets never in it.", { required: true }),
        cookies: boolean("Keep cookie values (Set-Cookie and Cookie) in the recording; masked by default.", { default: defaults.upstream.record.cookies }),
      },
      "Record the network to a HAR file.",
    ),
    replay: object(
      {
        path: string("a file path", "Answer from this HAR file with no DNS, TCP or TLS; every check still runs.", { required: true }),
        matchHeaders: list(
          string("a header name", `${replayMatchDoc}: this header's value.`, {
            // A name no request can carry (`bad header`, `x:y`) matched nothing, without a word.
            check: (value) => (httpToken.test(value) ? undefined : `must be a header name: letters, digits and !#$%&'*+-.^_\`|~ only (got ${JSON.stringify(value)})`),
          }),
          "header names",
          "Headers whose values must match too (none by default).",
        ),
        ignoreQuery: list(string("a query parameter", "A parameter the match leaves out."), "query parameters", "Query parameters the match leaves out."),
        ignoreBodyPaths: list(
          string("a JSON pointer", "A part of a JSON body the match leaves out.", { check: (value) => (value.startsWith("/") ? undefined : `must be a JSON pointer such as /nonce (got ${JSON.stringify(value)})`) }),
          "JSON pointers",
          "Parts of a JSON request body the match leaves out (nonces, timestamps).",
        ),
        exhausted: string("repeat-last or error", "Once every recorded answer to a request was used: repeat the last, or answer 502.", { choices: ["repeat-last", "error"], default: defaults.upstream.replay.exhausted }),
        latency: string("none or recorded", "recorded: wait as long as the recording did for the head and between chunks.", { choices: ["none", "recorded"], default: defaults.upstream.replay.latency }),
        recordMissing: boolean("Send misses to the real network and record them into the same file.", { default: defaults.upstream.replay.recordMissing }),
        anyGuest: boolean("Let any guest be answered with any entry, whichever guest recorded it; by default an entry a named guest recorded answers only that guest.", {
          default: defaults.upstream.replay.anyGuest,
        }),
      },
      "Replay a recorded network from a HAR file.",
    ),
  },
  "A recorded network in place of the real one (README, \"Recorded network\").",
  {
    rules(value, report) {
      if (value["record"] !== undefined && value["replay"] !== undefined) {
        report("cannot be combined with replay: to add what a replay misses to its file, use replay.recordMissing", ["record"]);
      }
    },
  },
);

/** The options that mean the same in every spelling. */
const proxyWideFields = {
  caDir: string("a directory path", "Where ca.crt and ca.key live; the CA is created there on first start."),
  resolve: resolveMap("Static names, for every guest: { host: [ips] }. IP checks still apply."),
  upstreamCa: list(string("PEM text or a file path", "a root"), "PEM texts or file paths", "Extra roots for upstream TLS."),
  leafKeyType: string("a key type", 'Leaf certificate key: "ecdsa" (P-256) or "rsa" (2048, for legacy clients).', {
    choices: ["ecdsa", "rsa"],
    default: defaults.leafKeyType,
  }),
  leafCacheSize: integer(1, 1_000_000, "How many leaf certificates to keep.", { default: defaults.leafCacheSize }),
  maxRedirects: integer(0, 100, "Redirect hops the proxy follows before answering 508.", { default: defaults.maxRedirects }),
  refuseInTunnel: boolean(
    "Open the tunnel to a host the allowlist refuses and refuse each request inside it (403, or PERMISSION_DENIED to gRPC), for clients that do not show a refused CONNECT's reason.",
    { default: defaults.refuseInTunnel },
  ),
  maxHttpBodyBytes: integer(0, Number.MAX_SAFE_INTEGER, "Largest request body a hook may read (413 beyond).", { default: defaults.maxHttpBodyBytes }),
  maxHttpResponseBodyBytes: integer(0, Number.MAX_SAFE_INTEGER, "Largest response body a hook may read (502 beyond).", {
    default: defaults.maxHttpResponseBodyBytes,
  }),
  timeouts: timeoutsNode,
  limits: limitsNode,
  logLevel: string("a log level", "Log verbosity (JSON lines on stderr).", { choices: logLevels, default: defaults.logLevel }),
  guestEnvFile: string("a file path", "Write the guest environment (KEY=value lines) here once listening; with several guests, FILE.<guest> each."),
  upstream: upstreamNode,
  auditLog: string("a file path", "Append one JSON line per decision here, whatever the log level; SIGUSR1 reopens it (logrotate)."),
  metricsListen: string("HOST:PORT", "Serve Prometheus metrics (/metrics), /healthz and /readyz on this address, apart from the proxy's.", {
    check(value) {
      const parsed = parseHostPort(value, defaults.listen.host);
      if (parsed === undefined) return `must be HOST:PORT (got ${JSON.stringify(value)})`;
      return checkListenHost(parsed.host);
    },
  }),
};

const withGuestsAuth = "applies only without guests: every guest authenticates, or is named by its sources";

/** startProxy's options. */
export const apiOptionsSchema: ObjectNode = object(
  {
    httpHooks: httpHooksNode,
    env: envMap("Extra guest environment (the env from createHttpHooks()), merged into guestEnv()."),
    guests: map(
      "guest name",
      checkGuestName,
      object(
        {
          httpHooks: httpHooksNode,
          env: envMap("This guest's environment (the env from its createHttpHooks())."),
          resolve: resolveMap("This guest's static names, over the proxy-wide resolve."),
          sources: list(string("an address range", "a CIDR", { check: checkCidr }), "address ranges", "Source ranges that identify this guest without credentials."),
        },
        "One guest: its hooks, environment, names and source ranges.",
      ),
      "Several guests, each authenticating with its own credentials.",
      { minEntries: 1 },
    ),
    auth: boolean('Single-guest form: true makes the one guest ("default") need credentials; false opts out of the open-proxy refusal.'),
    deploymentKey: string("a key of at least 32 characters", "Derives guest tokens and placeholders, so restarts and workers agree.", {
      // Never quoted: it is a secret.
      check: (key) => (key.length < 32 ? "must be at least 32 characters long" : undefined),
    }),
    listen: object(
      {
        host: string("an IP address or hostname", "The address to listen on.", { check: checkListenHost, default: defaults.listen.host }),
        port: integer(0, 65535, "The port; 0 picks a free one.", { default: defaults.listen.port }),
      },
      "Where the proxy listens.",
    ),
    ...proxyWideFields,
    logSink: { kind: "function", doc: "Where log lines go. Default: stderr." },
    onDecision: { kind: "function", doc: "Called with every decision's audit record (the audit log's line as an object)." },
    metrics: boolean("Collect Prometheus metrics for proxy.metrics() (metricsListen implies it)."),
    ownAddresses: list(
      string("IP:PORT", "A listener of the same deployment.", {
        check(value) {
          const parsed = parseHostPort(value, defaults.listen.host);
          return parsed === undefined || isIP(parsed.host) === 0 ? `must be IP:PORT (got ${JSON.stringify(value)})` : undefined;
        },
      }),
      "a list of IP:PORT",
      "Other listeners of this deployment (an admin server, a cluster primary's metrics): refused as targets, like the proxy's own listen and metrics addresses.",
    ),
  },
  "startProxy options",
  {
    rules(value, report) {
      if (value["guests"] === undefined) return;
      for (const key of ["httpHooks", "env"]) {
        if (value[key] !== undefined) report(`cannot be combined with guests: give each guest its own (guests.NAME.${key})`, [key]);
      }
      if (value["auth"] !== undefined) report(withGuestsAuth, ["auth"]);
    },
  },
);

const redirectMode = (doc: string): OptionNode => string("a redirect mode", doc, { choices: secretRedirectModes, default: defaults.guest.secretRedirects });

const secretNode = object(
  {
    hosts: { ...hostPatterns("The hosts the value may be sent to; the placeholder is refused anywhere else."), minItems: 1, required: true },
    value: secretValueNode,
    secretRedirects: redirectMode("This secret's redirect mode, over the guest's."),
    followRedirectsTo: hostPatterns('Hosts this secret\'s redirects may still reach over https:// in "refuse" mode.'),
  },
  "One secret: the guest holds a placeholder, the proxy puts the value in on the way out.",
);

/** What describes one guest in the file (and the flags' one guest, at the top level). */
const guestFields = {
  allowHosts: hostPatterns("Host patterns the guest may reach; * matches any run of characters. None: deny-all."),
  allowInternalHosts: hostPatterns("Host patterns that may resolve to internal addresses; they count as allowed hosts too."),
  blockInternalRanges: boolean("Refuse loopback, private, link-local and other internal addresses.", { default: defaults.guest.blockInternalRanges }),
  secrets: map("secret name", checkSecretName, secretNode, "Secrets the guest holds only as placeholders."),
  replaceSecretsInQuery: boolean("Also substitute placeholders in query strings.", { default: defaults.guest.replaceSecretsInQuery }),
  secretRedirects: redirectMode('A redirect leaving a sent secret\'s hosts, or going to plain http://: "scan" it for the value, or "refuse" it.'),
  followRedirectsTo: hostPatterns('Hosts that redirects may still reach over https:// with secretRedirects: "refuse".'),
  hooksScript: list(
    string("a file path", "A tier-2 policy file."),
    "a file path or a list of them",
    "Tier-2 policies run in a QuickJS sandbox (.js script, .mjs module, .ts/.mts TypeScript), in the order given: a chain (one path or a list).",
    { minItems: 1 },
  ),
  hooksTimeoutMs: integer(1, 60_000, "Time limit of one policy call (502 beyond); needs hooksScript.", { default: defaults.guest.hooksTimeoutMs }),
  hooks: list(
    hookEntryNode,
    "chain entries",
    "The hook chain in order: tier-2 policies ({ script: FILE }) and external deciders ({ command }, { webhook }, { opa }); instead of hooksScript.",
    { minItems: 1 },
  ),
};

/** The keys that describe a guest; at the top level of a file they describe the one guest "default". */
export const singleGuestKeys: readonly string[] = Object.keys(guestFields);

/** Checks between a guest's fields that the fields alone cannot see. */
function guestRules(guest: Readonly<Record<string, unknown>>, report: Report): void {
  const needs = (at: readonly Segment[], requires: OptionRequirement): void => report(requiresReason(requires), at, "invalid", requires);
  const scripts = guest["hooksScript"] !== undefined || ((guest["hooks"] ?? []) as Record<string, unknown>[]).some((entry) => entry["script"] !== undefined);
  if (guest["hooksTimeoutMs"] !== undefined && !scripts) needs(["hooksTimeoutMs"], { path: "hooksScript" });
  if (guest["hooks"] !== undefined && guest["hooksScript"] !== undefined) {
    report("cannot be combined with hooks: list the policies in hooks as { script: FILE }, where their place in the order is explicit", ["hooksScript"]);
  }
  const mode = guest["secretRedirects"] ?? defaults.guest.secretRedirects;
  const secrets = Object.entries((guest["secrets"] ?? {}) as Record<string, Record<string, unknown>>);
  const refuse = { path: "secretRedirects", value: "refuse" };
  for (const [name, secret] of secrets) {
    if (secret["followRedirectsTo"] !== undefined && (secret["secretRedirects"] ?? mode) !== "refuse") needs(["secrets", name, "followRedirectsTo"], refuse);
  }
  const anyRefuses = mode === "refuse" || secrets.some(([, secret]) => secret["secretRedirects"] === "refuse");
  if (guest["followRedirectsTo"] !== undefined && !anyRefuses) needs(["followRedirectsTo"], refuse);
}

const fileGuestNode = object(
  {
    ...guestFields,
    resolve: resolveMap("This guest's static names, over the top-level resolve."),
    sources: list(string("an address range", "a CIDR", { check: checkCidr }), "address ranges", "Source ranges (10.88.0.2/32) that identify this guest without credentials."),
  },
  "One guest.",
  { rules: guestRules },
);

/** The config file, and the config document the CLI's flags are turned into. */
export const configFileSchema: ObjectNode = object(
  {
    listen: string("HOST:PORT", "HOST:PORT to listen on ([v6]:PORT for IPv6; a bare PORT is on 127.0.0.1); port 0 picks a free port.", {
      default: `${defaults.listen.host}:${defaults.listen.port}`,
      check(value) {
        const parsed = parseHostPort(value, defaults.listen.host);
        if (parsed === undefined) return `must be HOST:PORT (got ${JSON.stringify(value)})`;
        return checkListenHost(parsed.host);
      },
    }),
    ...proxyWideFields,
    workers: integer(1, 64, "Processes that share the listening port (node:cluster).", { default: defaults.workers }),
    watch: boolean("Reload, as SIGHUP does, when the config file, a policy file or a file: secret changes (debounced).", { default: defaults.watch }),
    auth: boolean('Without guests: true makes the one guest ("default") need credentials; false opts out of the open-proxy refusal.'),
    ...guestFields,
    guests: map("guest name", checkGuestName, fileGuestNode, "Several guests, each with its own credentials, allowlist, secrets and policy.", { minEntries: 1 }),
  },
  "egressgate config file",
  {
    hints: {
      allowedHosts: 'did you mean "allowHosts"?',
      port: 'did you mean "listen"? (listen: HOST:PORT)',
      host: 'did you mean "listen"? (listen: HOST:PORT)',
    },
    rules(value, report) {
      if (value["guests"] === undefined) return guestRules(value, report);
      for (const key of [...singleGuestKeys, "auth"]) {
        if (value[key] === undefined) continue;
        report(
          key === "auth"
            ? withGuestsAuth
            : `describes the single guest "default" and cannot be mixed with guests: move it under guests.NAME`,
          [key],
        );
      }
    },
  },
);

/** Every option path below `node`, with its node: map keys appear as `*` (`guests.*.allowHosts`). */
export function schemaPaths(node: OptionNode, prefix = ""): Array<{ readonly path: string; readonly node: OptionNode }> {
  const join = (key: string): string => (prefix === "" ? key : `${prefix}.${key}`);
  if (node.kind === "object") {
    return Object.entries(node.fields).flatMap(([key, field]) => [{ path: join(key), node: field }, ...schemaPaths(field, join(key))]);
  }
  if (node.kind === "map") return [{ path: join("*"), node: node.values }, ...schemaPaths(node.values, join("*"))];
  return [];
}
