// The names of the variables egressgate sets in a guest's environment (proxy/guest-env.ts
// writes them). Kept below every layer: the config schema, createHttpHooks and the guest options
// refuse them as secret and env names.

/**
 * The variables the proxy itself sets in a guest's environment. A secret or an `env` entry of
 * one of these names replaced it: a secret named `HTTPS_PROXY` took the guest off the proxy.
 */
export const proxyVariables: ReadonlySet<string> = new Set([
  "HTTPS_PROXY",
  "HTTP_PROXY",
  "https_proxy",
  "http_proxy",
  "GIT_HTTP_PROXY_AUTHMETHOD",
  "SSL_CERT_FILE",
  "NODE_EXTRA_CA_CERTS",
  "REQUESTS_CA_BUNDLE",
  "CURL_CA_BUNDLE",
  "GIT_SSL_CAINFO",
  "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
]);

/** Why `name` cannot be a secret's or an `env` entry's, or undefined when it can. */
export function reservedVariableReason(name: string): string | undefined {
  return proxyVariables.has(name) ? `${name} is a variable the proxy sets in the guest's environment (its proxy or its CA): a secret or env entry of that name would replace it` : undefined;
}
