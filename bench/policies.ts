/**
 * The tier-2 policies the bench runs: a no-op pair (the cost of the sandbox round trips alone)
 * and a header allowlist of the usual shape (parse the URL, check method, host, path, headers).
 * The hostname set includes the bench's origin, so every bench request is allowed.
 */
/** For the 1 GiB download: a policy that looks at every response but never reads a body. */
export const onResponseOnlySource = `export function onResponse(response) { if (response.status >= 500) console.warn("upstream error", response.status); }`;

export const noopPairSource = `export function onRequest() {}\nexport function onResponse() {}`;

export const headerAllowlistSource = `
const allowedHosts = new Set(["api.github.com", "registry.npmjs.org", "pypi.org", "files.pythonhosted.org", "origin.bench.test"]);
const allowedMethods = new Set(["GET", "HEAD", "OPTIONS"]);
const allowedAgents = [/^curl\\//, /^undici/, /^node/, /^python-requests\\//, /^pip\\//, /^npm\\//, /^git\\//];
const blockedPaths = [/^\\/admin(\\/|$)/, /\\/\\.git\\//, /\\/\\.env$/];
const requiredAccept = new Set(["*/*", "application/json", "application/vnd.github+json", "text/html", "application/octet-stream"]);
export function isRequestAllowed(request) {
  const url = new URL(request.url);
  if (!allowedHosts.has(url.hostname)) return false;
  if (!allowedMethods.has(request.method)) return false;
  if (blockedPaths.some((re) => re.test(url.pathname))) return false;
  const agent = request.headers.get("user-agent");
  if (agent !== null && !allowedAgents.some((re) => re.test(agent))) return false;
  const accept = request.headers.get("accept");
  if (accept !== null && !accept.split(",").some((a) => requiredAccept.has(a.split(";")[0].trim()))) return false;
  return request.headers.get("x-forbidden") === null;
}`;
