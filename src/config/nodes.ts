import { isIP } from "node:net";
import { hookNames } from "../hooks/http-hooks.js";
import { cidrProblem } from "../policy/cidr.js";
import { validateHostPattern } from "../policy/host-pattern.js";
import { reservedVariableReason } from "../guest-variables.js";
import type { BooleanNode, IntegerNode, ListNode, MapNode, ObjectNode, OptionNode, StringNode } from "./validate.js";

/** Small constructors for schema nodes, and the value kinds that several options share. */

export function integer(min: number, max: number, doc: string, extra: Partial<Pick<IntegerNode, "default" | "required">> = {}): IntegerNode {
  return { kind: "integer", min, max, doc, ...extra };
}

export function boolean(doc: string, extra: Partial<Pick<BooleanNode, "default">> = {}): BooleanNode {
  return { kind: "boolean", doc, ...extra };
}

export function string(expect: string, doc: string, extra: Partial<Pick<StringNode, "choices" | "check" | "default" | "required" | "allowEmpty">> = {}): StringNode {
  return { kind: "string", expect, doc, ...extra };
}

export function list(items: OptionNode, expect: string, doc: string, extra: Partial<Pick<ListNode, "minItems" | "required">> = {}): ListNode {
  return { kind: "list", items, expect, doc, ...extra };
}

export function object(fields: Record<string, OptionNode>, doc: string, extra: Partial<Pick<ObjectNode, "hints" | "rules">> = {}): ObjectNode {
  return { kind: "object", fields, doc, ...extra };
}

export function map(keyDoc: string, checkKey: (key: string) => string | undefined, values: OptionNode, doc: string, extra: Partial<Pick<MapNode, "minEntries" | "keyIdentity">> = {}): MapNode {
  return { kind: "map", keyDoc, checkKey, values, doc, ...extra };
}

/** Guest names go into proxy URLs (`http://NAME:TOKEN@host`) and file names (`guest.env.NAME`). */
export const guestNamePattern = /^[a-z0-9._-]{1,64}$/;

export function checkGuestName(name: string): string | undefined {
  if (!guestNamePattern.test(name)) return `a guest name must be 1 to 64 of a-z, 0-9, ".", "_" and "-" (it goes into proxy URLs and file names)`;
  return undefined;
}

/** Secret names become environment variables in the guest. */
export function checkSecretName(name: string): string | undefined {
  if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) return "a secret name must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)";
  return reservedVariableReason(name);
}

/** The host a resolve key names, as buildStaticHosts keys it: case and one final dot aside. */
export function hostnameIdentity(name: string): string {
  return name.toLowerCase().replace(/\.$/, "");
}

/** What buildStaticHosts takes as a name: letters, digits, ".", "-" and "_", one trailing dot. */
export function checkHostname(name: string): string | undefined {
  const key = hostnameIdentity(name);
  if (key === "" || /[^a-z0-9.\-_]/.test(key)) return 'a hostname has only letters, digits, ".", "-" and "_"';
  return undefined;
}

/** `[::1]` is taken as `::1`; a zone (`fe80::1%eth0`) names an interface, not an address. */
export function checkIp(value: string): string | undefined {
  const bare = value.startsWith("[") && value.endsWith("]") ? value.slice(1, -1) : value;
  if (isIP(bare) === 0 || bare.includes("%")) return `is not an IP address (got ${JSON.stringify(value)})`;
  return undefined;
}

export function checkHostPattern(value: string): string | undefined {
  try {
    validateHostPattern(value, "pattern");
    return undefined;
  } catch {
    return `is not a host pattern: letters, digits, ".", "-", "_" and "*" only, with no scheme, port or path (got ${JSON.stringify(value)})`;
  }
}

/** `10.88.0.2/32`, `fd00::/64`, or a bare address (one host): what the proxy's own parser takes. */
export function checkCidr(value: string): string | undefined {
  return cidrProblem(value);
}

/** `HOST:PORT`, `[v6]:PORT` or a bare `PORT` (on 127.0.0.1); undefined when it is none of them. */
export function parseHostPort(value: string, defaultHost: string): { host: string; port: number } | undefined {
  const match = /^(?:(\[[0-9a-fA-F:.]+\]|[^:[\]]+):)?([0-9]{1,5})$/.exec(value);
  const port = Number(match?.[2]);
  if (match === null || port > 65535) return undefined;
  const host = match[1] ?? defaultHost;
  return { host: host.startsWith("[") ? host.slice(1, -1) : host, port };
}

export function checkListenHost(host: string): string | undefined {
  if (isIP(host) === 0 && !/^[a-zA-Z0-9.-]+$/.test(host)) return `must be an IP address or hostname (got ${JSON.stringify(host)})`;
  return undefined;
}

export const hostPatterns = (doc: string): ListNode => list(string("a host pattern", doc, { check: checkHostPattern }), "host patterns", doc);

/** `resolve: { host: [ips] }`, proxy-wide or per guest. */
export const resolveMap = (doc: string): MapNode =>
  map("hostname", checkHostname, list(string("an IP address", "an address", { check: checkIp }), "IP addresses", "the name's addresses", { minItems: 1 }), doc, { keyIdentity: hostnameIdentity });

/** The four tier-3 hooks, the only keys an `httpHooks` object has. */
export const httpHooksNode: ObjectNode = object(
  Object.fromEntries(hookNames.map((name) => [name, { kind: "function", doc: `tier-3 ${name}` } as const])),
  "From createHttpHooks(): the allowlist, secrets and hooks. Without it every request is refused.",
  {
    // A policy spread in here (`...createDjsHooks(p)`) would never run: refused, with the way that works.
    hints: { djsHooks: "pass a tier-2 policy through createHttpHooks({ ...createDjsHooks(policy) })" },
  },
);

/**
 * A guest environment's variable name: what a secret's name may be. Any other went into
 * guestEnv(), `egressgate env` printed `export A#='…'` (a shell error), and the env file a line
 * that docker and systemd read otherwise, or (a name with a space) failed to be written at start,
 * blamed on guestEnvFile.
 */
export function checkEnvName(name: string): string | undefined {
  if (!envVariableName.test(name)) return "is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*): a shell's export and an env file's KEY=value line cannot carry it";
  return undefined;
}

const envVariableName = /^[A-Za-z_][A-Za-z0-9_]*$/;

export const envMap = (doc: string): MapNode => map("name", checkEnvName, string("a string", "the value", { allowEmpty: true }), doc);
