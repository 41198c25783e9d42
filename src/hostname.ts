/** A URL hostname without the brackets of an IPv6 literal (`[::1]` → `::1`), as resolvers and SNI want it. */
export function bareHostname(hostname: string): string {
  return hostname.startsWith("[") && hostname.endsWith("]") ? hostname.slice(1, -1) : hostname;
}
