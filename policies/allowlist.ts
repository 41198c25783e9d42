// An allowlist kept in a JSON file next to this policy: exact hostnames, or "*.example.com" for
// any subdomain. Everything else is refused with 403 before any connection is made.
//
//   egressgate --allow-host '*' --hooks-script policies/allowlist.ts
import hosts from "./hosts.json" with { type: "json" };

const exact = new Set<string>();
const suffixes: string[] = [];
for (const entry of hosts as string[]) {
  const host = entry.toLowerCase().replace(/\.$/, "");
  if (host.startsWith("*.")) suffixes.push(host.slice(1));
  else exact.add(host);
}

export function isRequestAllowed(request: Request): boolean {
  const host = new URL(request.url).hostname;
  if (exact.has(host) || suffixes.some((suffix) => host.endsWith(suffix))) return true;
  throw new HttpRequestBlockedError(`allowlist.ts: ${host} is not in hosts.json`, 403);
}
