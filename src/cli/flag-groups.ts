import type { FlagPath } from "../config/flags.js";

/** `--help` sections, in the order they print. */
export const flagGroups = {
  listening: "Listening:",
  policy: "Policy:",
  secrets: "Secrets:",
  hooks: "Hooks:",
  guests: "Guests:",
  logs: "Logs and metrics:",
  limits: "Limits:",
  network: "Recorded network:",
} as const;

/** Which `--help` section each option flag prints in. */
export const flagGroupOf: Readonly<Record<FlagPath | "hookCommand" | "hookUrl" | "hookOpa" | "config" | "logFormat", keyof typeof flagGroups>> = {
  config: "listening",
  listen: "listening",
  caDir: "listening",
  leafKeyType: "listening",
  upstreamCa: "listening",
  workers: "listening",
  watch: "listening",
  guestEnvFile: "guests",
  auth: "guests",
  resolve: "policy",
  allowHosts: "policy",
  allowInternalHosts: "policy",
  blockInternalRanges: "policy",
  maxRedirects: "policy",
  refuseInTunnel: "policy",
  followRedirectsTo: "secrets",
  secrets: "secrets",
  replaceSecretsInQuery: "secrets",
  secretRedirects: "secrets",
  hooksScript: "hooks",
  hooksTimeoutMs: "hooks",
  hookCommand: "hooks",
  hookUrl: "hooks",
  hookOpa: "hooks",
  logLevel: "logs",
  logFormat: "logs",
  auditLog: "logs",
  metricsListen: "logs",
  maxHttpBodyBytes: "limits",
  maxHttpResponseBodyBytes: "limits",
  "timeouts.upstreamBodyMs": "limits",
  "timeouts.requestMs": "limits",
  "limits.connections": "limits",
  "limits.connectionsPerSource": "limits",
  "upstream.record.path": "network",
  "upstream.record.cookies": "network",
  "upstream.replay.path": "network",
  "upstream.replay.matchHeaders": "network",
  "upstream.replay.ignoreQuery": "network",
  "upstream.replay.ignoreBodyPaths": "network",
  "upstream.replay.exhausted": "network",
  "upstream.replay.latency": "network",
  "upstream.replay.recordMissing": "network",
  "upstream.replay.anyGuest": "network",
};

/** The section title for a flag (its option path, or a key of {@link flagGroupOf}). */
export function groupTitle(key: string): string | undefined {
  const group = (flagGroupOf as Record<string, keyof typeof flagGroups>)[key];
  return group === undefined ? undefined : flagGroups[group];
}
