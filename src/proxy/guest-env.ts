import { writeFile } from "node:fs/promises";

export interface GuestEnvInput {
  readonly proxyUrl: string;
  readonly caCertPath: string;
  /** System roots plus the CA; tools that replace their trust store need both. */
  readonly caBundlePath: string | undefined;
  readonly extra: Readonly<Record<string, string>>;
}

/**
 * The environment a guest needs: both proxy variable spellings (curl reads only lowercase
 * `http_proxy`; Go and Python read both), and each ecosystem's CA variable. Tools whose variable
 * replaces the trust store get the bundle; Node's NODE_EXTRA_CA_CERTS adds to it, so it gets
 * the CA alone.
 */
export function guestEnvironment(input: GuestEnvInput): Record<string, string> {
  const bundle = input.caBundlePath ?? input.caCertPath;
  return {
    HTTPS_PROXY: input.proxyUrl,
    HTTP_PROXY: input.proxyUrl,
    https_proxy: input.proxyUrl,
    http_proxy: input.proxyUrl,
    SSL_CERT_FILE: bundle,
    NODE_EXTRA_CA_CERTS: input.caCertPath,
    REQUESTS_CA_BUNDLE: bundle,
    CURL_CA_BUNDLE: bundle,
    GIT_SSL_CAINFO: bundle,
    ...input.extra,
  };
}

/** `KEY=value` lines, the format of `docker run --env-file` and systemd's EnvironmentFile. */
export function formatEnvFile(env: Readonly<Record<string, string>>): string {
  return Object.entries(env)
    .map(([k, v]) => `${k}=${v}\n`)
    .join("");
}

/** `export KEY='value'` lines for `eval "$(egressgate env)"`. */
export function formatShellExports(env: Readonly<Record<string, string>>): string {
  return Object.entries(env)
    .map(([k, v]) => `export ${k}='${v.replaceAll("'", "'\\''")}'\n`)
    .join("");
}

export async function writeGuestEnvFile(path: string, env: Readonly<Record<string, string>>): Promise<void> {
  await writeFile(path, formatEnvFile(env), { mode: 0o600 });
}
