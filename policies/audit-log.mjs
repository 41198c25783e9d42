// Writes one line per answered request (method, host, path, status) to the proxy's
// log, and changes nothing. Query strings are left out: they may hold tokens.
//
//   egressgate --allow-host '*' --hooks-script policies/audit-log.mjs
export function onResponse(response, request) {
  const url = new URL(request.url);
  console.log(`audit ${request.method} ${url.host}${url.pathname} -> ${response.status}`);
}
