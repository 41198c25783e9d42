import { readFileSync } from "node:fs";
import { rootCertificates } from "node:tls";

/**
 * Where Linux distributions and macOS keep the system trust store. Node 20 verifies against its
 * own bundled Mozilla list unless told otherwise; operators expect the system store (which may
 * carry a corporate root), so egressgate reads it and falls back to Node's list.
 */
const bundlePaths = [
  "/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine, Arch
  "/etc/pki/tls/certs/ca-bundle.crt", // Fedora, RHEL
  "/etc/ssl/ca-bundle.pem", // openSUSE
  "/etc/ssl/cert.pem", // macOS, some BSDs
];

let cached: string | undefined;

/** The system roots as one PEM bundle. */
export function systemRootsPem(): string {
  if (cached !== undefined) return cached;
  for (const path of bundlePaths) {
    try {
      const pem = readFileSync(path, "utf8");
      if (pem.includes("BEGIN CERTIFICATE")) return (cached = pem.endsWith("\n") ? pem : `${pem}\n`);
    } catch {
      // try the next location
    }
  }
  return (cached = `${rootCertificates.join("\n")}\n`);
}
