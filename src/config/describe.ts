import { stringify } from "yaml";
import { computedDefaults, defaults } from "./defaults.js";
import type { GuestConfig, ProxyConfig } from "./document.js";
import type { HookChainConfig } from "./hook-chain.js";

/**
 * What `egressgate check-config` prints: the configuration as it will run, guest by guest, with
 * defaults filled in. Built from names, hosts and sources only: a secret's value is never read
 * here, so it cannot be printed by mistake.
 */
export function describeConfig(config: ProxyConfig): string {
  const proxy = config.proxy;
  const listen = proxy.listen ?? defaults.listen;
  const summary = {
    config: config.source,
    listen: `${listen.host.includes(":") ? `[${listen.host}]` : listen.host}:${listen.port}`,
    caDir: proxy.caDir ?? `(default: ${computedDefaults.caDir})`,
    workers: config.workers,
    logLevel: proxy.logLevel ?? defaults.logLevel,
    ...(proxy.guestEnvFile !== undefined ? { guestEnvFile: config.single ? proxy.guestEnvFile : `${proxy.guestEnvFile}.<guest>` } : {}),
    ...(proxy.upstreamCa !== undefined ? { upstreamCa: proxy.upstreamCa.map((ca) => (ca.includes("-----BEGIN") ? "(PEM text)" : ca)) } : {}),
    ...(proxy.resolve !== undefined ? { resolve: proxy.resolve } : {}),
    guests: Object.fromEntries(Object.entries(config.guests).map(([name, guest]) => [name, describeGuest(guest, config)])),
  };
  return stringify(summary, { lineWidth: 0 });
}

function describeGuest(guest: GuestConfig, config: ProxyConfig): Record<string, unknown> {
  return {
    credentials: credentials(guest, config),
    allowHosts: guest.allowHosts ?? [],
    ...(guest.allowInternalHosts !== undefined ? { allowInternalHosts: guest.allowInternalHosts } : {}),
    blockInternalRanges: guest.blockInternalRanges ?? defaults.guest.blockInternalRanges,
    secrets: Object.fromEntries(
      Object.entries(guest.secrets ?? {}).map(([name, secret]) => [
        name,
        {
          hosts: secret.hosts,
          value: `(redacted; from ${secret.from})`,
          ...(secret.secretRedirects !== undefined ? { secretRedirects: secret.secretRedirects } : {}),
          ...(secret.followRedirectsTo !== undefined ? { followRedirectsTo: secret.followRedirectsTo } : {}),
        },
      ]),
    ),
    ...(guest.replaceSecretsInQuery !== undefined ? { replaceSecretsInQuery: guest.replaceSecretsInQuery } : {}),
    ...(guest.secretRedirects !== undefined ? { secretRedirects: guest.secretRedirects } : {}),
    ...(guest.followRedirectsTo !== undefined ? { followRedirectsTo: guest.followRedirectsTo } : {}),
    ...(guest.hooksScript !== undefined
      ? { hooksScript: guest.hooksScript, hooksTimeoutMs: guest.hooksTimeoutMs ?? defaults.guest.hooksTimeoutMs }
      : {}),
    ...(guest.hooks !== undefined ? { hooks: guest.hooks.map(describeHook), ...(guest.hooks.some((h) => h.kind === "script") ? { hooksTimeoutMs: guest.hooksTimeoutMs ?? defaults.guest.hooksTimeoutMs } : {}) } : {}),
    ...(guest.resolve !== undefined ? { resolve: guest.resolve } : {}),
    ...(guest.sources !== undefined ? { sources: guest.sources } : {}),
  };
}

/** A chain entry as check-config prints it: a decider's options with defaults, and header names but never their values. */
function describeHook(entry: HookChainConfig): Record<string, unknown> {
  if (entry.kind === "script") return { script: entry.path };
  const d = entry.decider;
  const common = { phases: [...d.phases], timeoutMs: d.timeoutMs, failOpen: d.failOpen, includeBody: d.includeBody, maxBodyBytes: d.maxBodyBytes, cacheMs: d.cacheMs };
  if (d.kind === "command") {
    return { command: d.argv, ...(d.shell ? { shell: true } : {}), ...common, env: Object.keys(d.env), concurrency: d.concurrency, queue: d.queue };
  }
  // As written when it holds ${NAME} references: a variable's value may be a credential.
  return { [d.kind]: d.written ?? d.url.href, ...common, ...(Object.keys(d.headers).length > 0 ? { headers: Object.fromEntries(Object.keys(d.headers).map((name) => [name, "(redacted)"])) } : {}) };
}

function credentials(guest: GuestConfig, config: ProxyConfig): string {
  if (!config.single) {
    return guest.sources === undefined ? "required" : `required, or a connection from ${guest.sources.join(", ")}`;
  }
  if (config.proxy.auth === true) return "required (auth: true)";
  return config.proxy.auth === false ? "none (auth: false)" : "none (single guest; listening beyond loopback needs auth)";
}
