// Removes headers that identify the guest or tie its requests together (client addresses,
// referrers, tracing IDs) before a request leaves. A script: it defines global functions.
//
//   egressgate --allow-host '*' --hooks-script policies/strip-tracking.js
var trackingHeaders = [
  "forwarded",
  "referer",
  "via",
  "x-forwarded-for",
  "x-forwarded-host",
  "x-real-ip",
  "x-client-ip",
  "x-request-id",
  "x-correlation-id",
  "x-amzn-trace-id",
  "x-cloud-trace-context",
  "traceparent",
  "tracestate",
  "baggage",
  "x-device-id",
];
var trackingPrefixes = ["x-b3-"];

function onRequest(request) {
  var names = [];
  request.headers.forEach(function (_value, name) {
    names.push(name);
  });
  for (var i = 0; i < names.length; i++) {
    var name = names[i];
    var tracked = trackingHeaders.indexOf(name) !== -1 || trackingPrefixes.some(function (prefix) {
      return name.indexOf(prefix) === 0;
    });
    if (tracked) request.headers.delete(name);
  }
}
