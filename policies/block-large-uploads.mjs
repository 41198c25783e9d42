// Refuses uploads over 1 MiB by their declared length, before a byte of the body is read.
// An upload that declares no length (chunked) gets 411, so the limit cannot be dodged.
//
//   egressgate --allow-host '*' --hooks-script policies/block-large-uploads.mjs
const maxBytes = 1024 * 1024;

export function onRequest(request) {
  if (request.body === null) return;
  const declared = request.headers.get("content-length");
  if (declared === null) {
    throw new HttpRequestBlockedError("block-large-uploads: an upload must declare its Content-Length", 411, "Length Required");
  }
  const size = Number(declared);
  if (!Number.isSafeInteger(size) || size > maxBytes) {
    throw new HttpRequestBlockedError(`block-large-uploads: ${declared} bytes is over the ${maxBytes}-byte limit`, 413, "Payload Too Large");
  }
}
