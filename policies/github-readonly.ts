// Read-only access to the GitHub API: GET and HEAD to api.github.com, nothing else. A token can
// then be handed over with --host-secret GH_TOKEN@api.github.com without letting the guest
// write anything with it.
//
//   egressgate --allow-host api.github.com --host-secret GH_TOKEN@api.github.com \
//     --hooks-script policies/github-readonly.ts
const readMethods = new Set(["GET", "HEAD"]);

export function isRequestAllowed(request: Request): boolean {
  const host = new URL(request.url).hostname;
  if (host !== "api.github.com") {
    throw new HttpRequestBlockedError(`github-readonly: only api.github.com may be reached, not ${host}`, 403);
  }
  if (!readMethods.has(request.method)) {
    throw new HttpRequestBlockedError(`github-readonly: ${request.method} is refused; this policy allows GET and HEAD only`, 403);
  }
  return true;
}
