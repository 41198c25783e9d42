/**
 * What a fuzz run's cases aim at: three loopback names, each with a TLS and a plain upstream on
 * an address of its own, and one secret. `api.test` and `secret.test` are allowed (the secret's
 * only host is `secret.test`); `denied.test` is not, and its upstreams must never see a byte.
 */
export interface FuzzWorld {
  /** The secret's placeholder, which the cases sprinkle into requests. */
  readonly placeholder: string;
  readonly ports: Readonly<Record<UpstreamName, { readonly tls: number; readonly plain: number }>>;
  /**
   * The case's tag, which its request paths carry as `c=TAG` (and the upstream's redirects pass
   * on): an upstream request is counted against its own case even when it arrives late.
   */
  readonly tag?: string;
  /** With `--auth`: the guest's `Proxy-Authorization` value, which requests on the listener carry. */
  readonly proxyAuthorization?: string;
  /** The hostile upstreams' ports (test/helpers/fuzz/hostile-upstream.ts), on the names' own addresses. */
  readonly hostile?: Readonly<Record<"api" | "secret", { readonly h1tls: number; readonly h1plain: number; readonly h2: number }>>;
  /** The secret's value: the secret's hostile upstream quotes it into a redirect now and then. */
  readonly secretValue?: string;
}

/** `path` with the case's tag. */
export function tagged(world: FuzzWorld, path: string): string {
  return world.tag === undefined ? path : `${path}${path.includes("?") ? "&" : "?"}c=${world.tag}`;
}

/** The tag in a request target, if any. */
export function tagOf(target: string): string | undefined {
  return /[?&]c=([a-z0-9]+-[0-9]+)/.exec(target)?.[1];
}

export type UpstreamName = "api" | "secret" | "denied";

export const upstreamNames: readonly UpstreamName[] = ["api", "secret", "denied"];

/** Each name's address: its own, so a port changed by a mutation cannot reach another name's upstream. */
export const upstreamAddress: Readonly<Record<UpstreamName, string>> = { api: "127.0.0.1", secret: "127.0.0.2", denied: "127.0.0.3" };

export const hostName = (name: UpstreamName): string => `${name}.test`;

export const secretName = "FUZZ_TOKEN";

/**
 * Where `/r/STATUS/N` redirects (N indexes this list): every name, scheme-relative, userinfo
 * and IP-literal spellings, so a redirect the proxy follows meets every oracle too.
 */
export function redirectLocations(ports: FuzzWorld["ports"]): string[] {
  return [
    `http://api.test:${ports.api.plain}/hop`,
    `https://api.test:${ports.api.tls}/hop`,
    `http://secret.test:${ports.secret.plain}/hop`,
    `https://secret.test:${ports.secret.tls}/hop`,
    `http://denied.test:${ports.denied.plain}/hop`,
    `https://denied.test:${ports.denied.tls}/hop`,
    `//api.test:${ports.api.tls}/hop`,
    "/hop-same",
    `http://127.0.0.3:${ports.denied.plain}/hop`,
    `http://api.test:${ports.api.plain}@denied.test:${ports.denied.plain}/hop`,
    `https://API.TEST.:${ports.api.tls}/hop`,
    `http://[::ffff:127.0.0.3]:${ports.denied.plain}/hop`,
    "/r/302/0",
  ];
}

/** `/r/STATUS/N`: the redirect a fuzz upstream answers with, or undefined. */
export function redirectFor(ports: FuzzWorld["ports"], target: string): { status: number; location: string } | undefined {
  const match = /^\/r\/(30[12378])\/([0-9]+)/.exec(target);
  if (match === null) return undefined;
  const location = redirectLocations(ports)[Number(match[2])];
  const tag = tagOf(target);
  return location === undefined ? undefined : { status: Number(match[1]), location: tag === undefined ? location : `${location}?c=${tag}` };
}
