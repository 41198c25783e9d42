# An example egress policy for OPA, queried by egressgate as an external decider:
#
#   opa run --server policies/egress.rego
#   egressgate --allow-host '*' --hook-opa http://127.0.0.1:8181/v1/data/egress
#
# egressgate POSTs {"input": <document>} to the Data API. The document (README "External
# deciders") is:
#
#   {
#     "phase": "request",                      # or "response", with phases: [request, response]
#     "guest": "default",                      # the guest's name
#     "request": {
#       "method": "GET",
#       "url": "https://api.github.com/repos/o/r?per_page=5",
#       "url_parsed": {"scheme": "https", "host": "api.github.com", "port": 443,
#                      "path": "/repos/o/r", "query": "per_page=5"},
#       "headers": {"accept": "*/*", "authorization": "Bearer EGRESSGATE_SECRET_<48 hex>"}
#     },
#     "response": {"status": 200, "headers": {...}}   # response phase only
#   }
#
# Header names are lowercase; header values hold secret placeholders, never the values. The
# result at /v1/data/egress is this package as an object: egressgate reads `allow`, and, when
# it is not true, `reason` and `status`; when it is, `set_headers` and `remove_headers` rewrite
# the request. An undefined result (a wrong path, say) denies.
package egress

import rego.v1

default allow := false

# Hosts any guest may reach, read-only.
read_only_hosts := {"api.github.com", "registry.npmjs.org", "pypi.org", "files.pythonhosted.org"}

read_only_methods := {"GET", "HEAD", "OPTIONS"}

# Guests that may also write to api.github.com.
writers := {"ci"}

request := input.request

allow if {
	input.phase == "request"
	request.url_parsed.scheme == "https"
	request.url_parsed.host in read_only_hosts
	request.method in read_only_methods
}

allow if {
	input.phase == "request"
	input.guest in writers
	request.url_parsed.scheme == "https"
	request.url_parsed.host == "api.github.com"
	not startswith(request.url_parsed.path, "/admin")
}

# Responses (when asked with phases: [request, response]): anything but an executable download.
executable_types := {"application/x-msdownload", "application/x-executable", "application/x-sh", "application/x-elf"}

allow if {
	input.phase == "response"
	not executable
}

executable if {
	some type in executable_types
	startswith(lower(object.get(input.response.headers, "content-type", "")), type)
}

reason := sprintf("%s %s://%s%s is not allowed by policies/egress.rego for guest %v", [
	request.method,
	request.url_parsed.scheme,
	request.url_parsed.host,
	request.url_parsed.path,
	input.guest,
]) if {
	input.phase == "request"
	not allow
}

reason := "executable downloads are refused by policies/egress.rego" if executable

status := 403 if not allow

# Requests that pass carry the guest's name, so upstream logs can tell the sandboxes apart.
set_headers := {"x-egress-guest": sprintf("%v", [input.guest])} if {
	input.phase == "request"
	allow
}
