import { statSync } from "node:fs";
import type { LeafKeyType } from "../tls/x509.js";
import type { LogLevel } from "../log.js";
import type { SecretRedirects } from "../policy/secrets.js";
import { defaults } from "./defaults.js";
import { parseHostPort } from "./nodes.js";
import { makeIssue, type OptionIssue, type Segment } from "./option-error.js";
import { configFileSchema } from "./schema.js";
import { readSecret, type InlineSecret } from "./secret-source.js";
import { resolveHookChain, type HookChainConfig } from "./hook-chain.js";
import { documentPath } from "./paths.js";
import { validate } from "./validate.js";
import type { UpstreamOptions } from "../record/network.js";
import { maxTextFileBytes, readFailure, readRegularFileSync } from "../regular-file.js";

/**
 * A config document (a parsed file, or the CLI's flags in the same shape) turned into a
 * `ProxyConfig`: checked against the schema as a whole, relative paths taken from the
 * document's folder, and secret values read from their sources. Nothing starts here: no policy
 * is loaded and nothing listens, so a bad document costs nothing.
 */

export interface SecretConfig {
  readonly hosts: readonly string[];
  readonly value: string;
  /** Where the value came from, safe to print: `env:GH_TOKEN`, `file:/run/secrets/gh`, `inline`. */
  readonly from: string;
  readonly secretRedirects?: SecretRedirects;
  readonly followRedirectsTo?: readonly string[];
}

export interface GuestConfig {
  readonly allowHosts?: readonly string[];
  readonly allowInternalHosts?: readonly string[];
  readonly blockInternalRanges?: boolean;
  readonly secrets?: Readonly<Record<string, SecretConfig>>;
  readonly replaceSecretsInQuery?: boolean;
  readonly secretRedirects?: SecretRedirects;
  readonly followRedirectsTo?: readonly string[];
  /** An absolute path. */
  /** The guest's tier-2 policies, in chain order (one path in a file is a list of one). */
  readonly hooksScript?: readonly string[];
  readonly hooksTimeoutMs?: number;
  /** The hook chain (`hooks`): policies and external deciders, in order. */
  readonly hooks?: readonly HookChainConfig[];
  readonly resolve?: Readonly<Record<string, readonly string[]>>;
  readonly sources?: readonly string[];
}

/** The proxy-wide options, spelled as startProxy takes them. */
export interface ProxyWideConfig {
  readonly listen?: { readonly host: string; readonly port: number };
  readonly caDir?: string;
  readonly resolve?: Readonly<Record<string, readonly string[]>>;
  readonly upstreamCa?: readonly string[];
  readonly leafKeyType?: LeafKeyType;
  readonly leafCacheSize?: number;
  readonly maxRedirects?: number;
  readonly refuseInTunnel?: boolean;
  readonly maxHttpBodyBytes?: number;
  readonly maxHttpResponseBodyBytes?: number;
  readonly timeouts?: Readonly<Partial<Record<keyof typeof defaults.timeouts, number>>>;
  readonly limits?: Readonly<{ connections?: number; connectionsPerSource?: number; pipelinedRequests?: number; h2Streams?: number; h2HeaderListBytes?: number; h2SessionMemoryMiB?: number; h2ResetsPer10s?: number; h2StreamWindowBytes?: number; h2ConnectionWindowBytes?: number; h2ConnectionBufferBytes?: number; sourceBufferBytes?: number }>;
  readonly logLevel?: LogLevel;
  readonly guestEnvFile?: string;
  /** A recorded network; its paths absolute. */
  readonly upstream?: UpstreamOptions;
  /** An absolute path. */
  readonly auditLog?: string;
  /** HOST:PORT of the metrics listener. */
  readonly metricsListen?: string;
  readonly auth?: boolean;
}

export interface ProxyConfig {
  /** The file it came from, or `flags`. */
  readonly source: string;
  readonly proxy: ProxyWideConfig;
  readonly workers: number;
  /** `watch: true` (`--watch`): reload when the files it was read from change. */
  readonly watch?: boolean;
  /**
   * true: the document described one guest at its top level (as the flags do), named
   * `default`, served in startProxy's single-guest form. false: it listed `guests`.
   */
  readonly single: boolean;
  readonly guests: Readonly<Record<string, GuestConfig>>;
}

export interface DocumentOptions {
  /** What relative paths are relative to: the config file's folder, or the working directory. */
  readonly baseDir: string;
  /** Where `env:` secret sources are looked up. */
  readonly env: NodeJS.ProcessEnv;
  /** The flags may carry secret values inline (`InlineSecret`); a file never. */
  readonly inlineSecrets?: boolean;
  /** Called `flags` or the file's path in ProxyConfig.source. */
  readonly source: string;
}

/** The name of the one guest a document describes at its top level, as the flags do. */
export const singleGuestName = "default";

type Doc = Record<string, unknown>;
type SecretDoc = { hosts: string[]; value: string | InlineSecret; secretRedirects?: SecretRedirects; followRedirectsTo?: string[] };

const pemMarker = "-----BEGIN CERTIFICATE-----";

/** Checks and resolves a whole document; issues come back all together, none thrown. */
export function resolveDocument(document: unknown, options: DocumentOptions): { config?: ProxyConfig; issues: OptionIssue[] } {
  const issues: OptionIssue[] = [];
  scriptsAsLists(document);
  validate(configFileSchema, document, [], issues, { inlineSecrets: options.inlineSecrets ?? false, env: options.env });
  if (issues.length > 0) return { issues };
  const doc = (document ?? {}) as Doc;
  const at = (segments: readonly Segment[], reason: string): void => void issues.push(makeIssue(segments, reason));
  const proxy = resolveProxyWide(doc, options.baseDir, at, options.env);
  const single = doc["guests"] === undefined;
  const guestDocs: Record<string, Doc> = single ? { [singleGuestName]: doc } : (doc["guests"] as Record<string, Doc>);
  const guests: Record<string, GuestConfig> = {};
  for (const [name, guest] of Object.entries(guestDocs)) {
    guests[name] = resolveGuest(guest, single ? [] : ["guests", name], single, options, at);
  }
  if (issues.length > 0) return { issues };
  const watch = doc["watch"] === true ? { watch: true } : {};
  return { config: { source: options.source, proxy, workers: (doc["workers"] as number | undefined) ?? defaults.workers, ...watch, single, guests }, issues };
}

/** The proxy-wide part of a valid document; `at` hears about files that cannot be used. */
export function resolveProxyWide(doc: Doc, baseDir: string, at: (segments: readonly Segment[], reason: string) => void, env: NodeJS.ProcessEnv): ProxyWideConfig {
  const out: Record<string, unknown> = {};
  const pathOf = documentPath(baseDir, env, at);
  for (const key of ["resolve", "leafKeyType", "leafCacheSize", "maxRedirects", "refuseInTunnel", "maxHttpBodyBytes", "maxHttpResponseBodyBytes", "timeouts", "limits", "logLevel", "auth", "metricsListen"]) {
    if (doc[key] !== undefined) out[key] = doc[key];
  }
  if (typeof doc["listen"] === "string") out["listen"] = parseHostPort(doc["listen"], defaults.listen.host);
  if (typeof doc["caDir"] === "string") out["caDir"] = pathOf(["caDir"], doc["caDir"]);
  if (typeof doc["guestEnvFile"] === "string") out["guestEnvFile"] = pathOf(["guestEnvFile"], doc["guestEnvFile"]);
  if (typeof doc["upstream"] === "object" && doc["upstream"] !== null) {
    const upstream: Record<string, unknown> = {};
    for (const [key, value] of Object.entries(doc["upstream"] as Record<string, { path?: unknown }>)) {
      upstream[key] = typeof value?.path === "string" ? { ...value, path: pathOf(["upstream", key, "path"], value.path) } : value;
    }
    out["upstream"] = upstream;
  }
  if (typeof doc["auditLog"] === "string") out["auditLog"] = pathOf(["auditLog"], doc["auditLog"]);
  if (Array.isArray(doc["upstreamCa"])) {
    out["upstreamCa"] = (doc["upstreamCa"] as string[]).map((entry, i) => {
      if (entry.includes(pemMarker)) return entry;
      const file = pathOf(["upstreamCa", i], entry);
      if (file === undefined) return entry;
      // Read here as well as at start, so check-config finds a missing file offline.
      try {
        if (!readRegularFileSync(file, maxTextFileBytes).toString("utf8").includes(pemMarker)) at(["upstreamCa", i], `names ${file}, which holds no PEM certificate`);
      } catch (error) {
        at(["upstreamCa", i], `cannot read ${file}: ${readFailure(error)}`);
      }
      return file;
    });
  }
  return out as ProxyWideConfig;
}

function resolveGuest(doc: Doc, base: readonly Segment[], single: boolean, options: DocumentOptions, at: (segments: readonly Segment[], reason: string) => void): GuestConfig {
  const out: Record<string, unknown> = {};
  const keys = ["allowHosts", "allowInternalHosts", "blockInternalRanges", "replaceSecretsInQuery", "secretRedirects", "followRedirectsTo", "hooksTimeoutMs"];
  // At the top level, resolve is proxy-wide; a listed guest's resolve and sources are its own.
  if (!single) keys.push("resolve", "sources");
  for (const key of keys) if (doc[key] !== undefined) out[key] = doc[key];
  const pathOf = documentPath(options.baseDir, options.env, at);
  if (Array.isArray(doc["hooksScript"])) {
    out["hooksScript"] = (doc["hooksScript"] as string[]).map((entry, i) => {
      const list = doc["hooksScript"] as string[];
      const segments = list.length === 1 ? [...base, "hooksScript"] : [...base, "hooksScript", i];
      const script = pathOf(segments, entry);
      if (script !== undefined && !isFile(script)) at(segments, `names ${script}, which is not a readable file`);
      return script;
    });
  }
  if (Array.isArray(doc["hooks"])) out["hooks"] = resolveHookChain(doc["hooks"] as Record<string, unknown>[], pathOf, options.env, at, base, isFile);
  const secrets: Record<string, SecretConfig> = {};
  for (const [name, secret] of Object.entries((doc["secrets"] ?? {}) as Record<string, SecretDoc>)) {
    const read = readSecret(secret.value, options.baseDir, options.env);
    if ("reason" in read) {
      at([...base, "secrets", name, "value"], read.reason);
      continue;
    }
    secrets[name] = {
      hosts: secret.hosts,
      value: read.value,
      from: read.from,
      ...(secret.secretRedirects !== undefined ? { secretRedirects: secret.secretRedirects } : {}),
      ...(secret.followRedirectsTo !== undefined ? { followRedirectsTo: secret.followRedirectsTo } : {}),
    };
  }
  if (doc["secrets"] !== undefined) out["secrets"] = secrets;
  return out as GuestConfig;
}

function isFile(file: string): boolean {
  try {
    return statSync(file).isFile();
  } catch {
    return false;
  }
}

/**
 * `hooksScript: policy.ts` is the common case: one path is a chain of one. Made a list before the
 * schema sees it, at the top level and in every listed guest, so every later step has one shape.
 */
export function scriptsAsLists(document: unknown): void {
  const lift = (holder: unknown): void => {
    if (typeof holder !== "object" || holder === null) return;
    const record = holder as Record<string, unknown>;
    if (typeof record["hooksScript"] === "string") record["hooksScript"] = [record["hooksScript"]];
  };
  lift(document);
  const guests = (document as Record<string, unknown> | null)?.["guests"];
  if (typeof guests === "object" && guests !== null) for (const guest of Object.values(guests)) lift(guest);
}
