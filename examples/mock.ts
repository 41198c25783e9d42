/**
 * Embedding egressgate as a mock: a tier-3 `onRequest` hook answers chosen URLs itself, so the
 * guest gets a canned response with no DNS lookup and no upstream connection. Requests for any
 * other URL go through the allowlist as usual.
 *
 *   npx tsx examples/mock.ts api.github.com
 *   # in the guest: curl https://api.mock.test/v1/status   →  {"ok":true}
 *
 * prints the guest environment and serves until Ctrl-C. Tests call `startMockProxy()`.
 * The package name resolves to dist/, so run `npm run build` first.
 *
 * A Response from `onRequest` short-circuits (DESIGN.md §2): the allowlist, the internal-range
 * block and `onResponse` never run for it. So a mocked host need not be in `allowedHosts`, and
 * need not exist.
 */
import { pathToFileURL } from "node:url";
import { createHttpHooks, startProxy, type HttpHooksOptions, type ProxyOptions, type RunningProxy } from "egressgate";

/**
 * Canned answers by origin and path (`https://host/path`, no query), as functions because a
 * Response's body can be sent only once.
 */
export type MockRoutes = Readonly<Record<string, (request: Request) => Response>>;

function json(body: unknown, status = 200): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
}

export const defaultMocks: MockRoutes = {
  "https://api.mock.test/v1/status": () => json({ ok: true }),
  "https://api.mock.test/v1/echo": (request) => json({ method: request.method, url: request.url }),
};

/** An `onRequest` hook answering the routes in `mocks`, and passing every other request on. */
export function mockRequests(mocks: MockRoutes): (request: Request) => Response | undefined {
  return (request) => {
    const url = new URL(request.url);
    return mocks[`${url.origin}${url.pathname}`]?.(request);
  };
}

export async function startMockProxy(
  policy: Omit<HttpHooksOptions, "onRequest">,
  options: Omit<ProxyOptions, "httpHooks" | "env"> = {},
  mocks: MockRoutes = defaultMocks,
): Promise<RunningProxy> {
  const { httpHooks, env } = createHttpHooks({ ...policy, onRequest: mockRequests(mocks) });
  return startProxy({ httpHooks, env, listen: { host: "127.0.0.1", port: 0 }, ...options });
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) {
  const proxy = await startMockProxy({ allowedHosts: process.argv.slice(2) });
  for (const [key, value] of Object.entries(proxy.guestEnv())) console.log(`${key}=${value}`);
  console.error(`mocked: ${Object.keys(defaultMocks).join(", ")}`);
  process.once("SIGINT", () => void proxy.close());
}
