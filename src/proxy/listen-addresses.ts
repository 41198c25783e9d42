import { networkInterfaces } from "node:os";
import type { ListenAddress } from "../policy/declarative-policy.js";

/**
 * The addresses a listener bound to `bound` answers on: the bound one, or for a wildcard
 * (`0.0.0.0`, `::`) loopback and every interface's. The proxy refuses them all as destinations
 * (DESIGN §4): dialling one would loop it into itself.
 */
export function listenAddresses(bound: string, port: number): ListenAddress[] {
  if (bound !== "0.0.0.0" && bound !== "::") return [{ ip: bound, port }];
  const ips = new Set<string>(["127.0.0.1", "::1", bound]);
  for (const list of Object.values(networkInterfaces())) for (const nic of list ?? []) ips.add(nic.address);
  return [...ips].map((ip) => ({ ip, port }));
}
