import { writeFile } from "node:fs/promises";

export interface GuestEnvInput {
  /** `http://HOST:PORT`, without credentials. */
  readonly proxyUrl: string;
  /** The guest's name and token, when the proxy asks for them: they go into the proxy URLs. */
  readonly credentials?: { readonly user: string; readonly password: string };
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
  const proxyUrl = input.credentials === undefined ? input.proxyUrl : withCredentials(input.proxyUrl, input.credentials);
  return {
    HTTPS_PROXY: proxyUrl,
    HTTP_PROXY: proxyUrl,
    https_proxy: proxyUrl,
    http_proxy: proxyUrl,
    // git sends proxy credentials only after a 407 unless told the method (one wasted round trip
    // per connection, and some proxies' 407 ends the CONNECT for good).
    ...(input.credentials !== undefined ? { GIT_HTTP_PROXY_AUTHMETHOD: "basic" } : {}),
    SSL_CERT_FILE: bundle,
    NODE_EXTRA_CA_CERTS: input.caCertPath,
    REQUESTS_CA_BUNDLE: bundle,
    CURL_CA_BUNDLE: bundle,
    GIT_SSL_CAINFO: bundle,
    // gRPC's C core and grpc-js ignore the variables above and read only this one.
    GRPC_DEFAULT_SSL_ROOTS_FILE_PATH: bundle,
    ...input.extra,
  };
}

/** `http://NAME:TOKEN@HOST:PORT`: guest names and tokens need no percent-encoding (see auth.ts). */
function withCredentials(proxyUrl: string, credentials: { readonly user: string; readonly password: string }): string {
  return proxyUrl.replace(/^http:\/\//, `http://${credentials.user}:${credentials.password}@`);
}

/**
 * `KEY=value` lines, the format of `docker run --env-file` and systemd's EnvironmentFile. The two
 * share no quoting (docker takes a value to the line's end as it is, quotes included), so a line
 * break or NUL in a value (a CA folder's path, say) cannot be written: it would end the line and
 * start a variable of its own (`HTTPS_PROXY=` pointing elsewhere). Such a value is refused.
 */
export function formatEnvFile(env: Readonly<Record<string, string>>): string {
  return Object.entries(env)
    .map(([k, v]) => {
      if (!/^[^\s=\0]+$/.test(k)) throw new Error(`the variable name ${JSON.stringify(k)} cannot be written as KEY=value`);
      if (/[\r\n\0]/.test(v)) throw new Error(`the value of ${k} holds a line break or NUL, which a KEY=value line cannot carry`);
      return `${k}=${v}\n`;
    })
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
