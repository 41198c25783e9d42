import type { ServerHttp2Stream } from "node:http2";
import { PassThrough, type Readable } from "node:stream";
import { markEmptyEnd, onCutEnd } from "../streams.js";
import type { StallWatch } from "./h2-respond.js";

/**
 * The stream's readable side as a body of its own. The stream itself cannot be handed on: its
 * consumers destroy a body once they are done with it (undici does after writing it), and
 * destroying an Http2Stream ends the response half too.
 */
export function requestBodyOf(stream: ServerHttp2Stream, stall: StallWatch, heldUntil?: Promise<void>): Readable {
  const body = new PassThrough();
  // Its consumers (a hook's read, the upstream upload) come and go, and each listens for itself;
  // a cut while none is listening must not be an uncaught 'error'.
  body.on("error", () => undefined);
  // A reset with CANCEL (or NO_ERROR) mid-upload ends the stream as if whole: cut the body instead.
  onCutEnd(stream, () => body.destroy(new Error("the guest reset the stream during its upload")));
  stream.pipe(body);
  // Unpiped before the stream's end: the proxy let the rest go (finishRequestBody, an answer that
  // went out first). Whoever still reads the body gets a cut, not a wait for bytes that never come.
  body.once("unpipe", () => {
    if (!stream.readableEnded) body.destroy(new Error("the rest of the upload was let go: the answer went out before it"));
  });
  // A guest that waits for `100 Continue` sends nothing until it comes, however long the hooks
  // before it take: its silence is the proxy's until then (a chain slower than idleMs cut it).
  if (heldUntil === undefined) watchUpload(stream, stall);
  else void heldUntil.then(() => watchUpload(stream, stall));
  markEmptyEnd(stream, body);
  stream.once("close", () => {
    if (!stream.readableEnded) body.destroy(new Error("the guest reset the stream during its upload"));
  });
  return body;
}

/**
 * An upload the guest stops sending: while the proxy is ready for more (the stream flows), no
 * byte for `stall.ms` runs `stall.onStall`. A guest answering PINGs kept such a stream, and the
 * pipeline and upstream request behind it, for good: undici's header timeout starts only once
 * the body is sent. Time the proxy held the stream paused (its consumer was slow) does not count,
 * nor time before a `100 Continue` the guest waits for.
 */
function watchUpload(stream: ServerHttp2Stream, stall: StallWatch): void {
  if (stream.closed || stream.destroyed || stream.readableEnded) return;
  let last = performance.now();
  const moved = (): void => {
    last = performance.now();
  };
  stream.on("data", moved);
  stream.on("resume", moved);
  const timer = setInterval(() => {
    if (stream.readableFlowing !== false && performance.now() - last >= stall.ms) {
      clearInterval(timer);
      stall.onStall();
    }
  }, Math.max(1, Math.floor(stall.ms / 4)));
  timer.unref();
  stream.once("end", () => clearInterval(timer));
  stream.once("close", () => clearInterval(timer));
}
