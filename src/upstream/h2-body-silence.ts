import { afterReads } from "../after-reads.js";
import type { ClientHttp2Stream } from "node:http2";

/** What {@link onBodySilence} needs of an upstream HTTP/2 stream's readable side. */
type SilenceWatched = Pick<ClientHttp2Stream, "destroyed" | "push" | "setTimeout" | "_read">;

/**
 * `timeouts.upstreamBodyMs` on an upstream HTTP/2 stream: `onSilent` once the upstream has sent
 * nothing of the body for `ms` **while the proxy asked for more**, as undici counts it on HTTP/1.1
 * (no body timer while its reader holds the body, the timer restarted when the reader resumes).
 *
 * Node's own stream timer counts any quiet spell, and an HTTP/2 upstream is quiet whenever the
 * proxy holds its body: Node stops taking the stream's data once the readable side's buffer is
 * full (the guest's window shut, a slow guest, a hook that has not read yet), so no WINDOW_UPDATE
 * goes and the upstream, its window spent, waits. A guest behind for longer than upstreamBodyMs
 * had its download from an h2 upstream cut, "upstream body timed out", when the same guest got
 * the whole body from an HTTP/1.1 upstream (found by the soak's HTTP/2 kinds).
 *
 * The proxy holds the body from the push that Node is told is one too many (`push` returns
 * false: Node then stops taking data) until the reader asks again (`_read`: Node takes the
 * data it held back, and the WINDOW_UPDATE goes). The stream's timer, which Node restarts on
 * every frame, is re-armed while the body is held; otherwise the silence is measured from the
 * later of the last data and the last ask, so a reader that has just resumed gives the upstream
 * the whole of `ms` to answer its WINDOW_UPDATE.
 */
export function onBodySilence(stream: SilenceWatched, ms: number, onSilent: () => void): void {
  let held = false;
  /** The last data, or the last ask: what the silence is measured from. */
  let since = performance.now();
  const push = stream.push.bind(stream);
  stream.push = (chunk: unknown, encoding?: BufferEncoding): boolean => {
    since = performance.now();
    const more = push(chunk, encoding);
    if (!more) held = true;
    return more;
  };
  const read = stream._read.bind(stream);
  stream._read = (size: number): void => {
    held = false;
    since = performance.now();
    read(size);
  };
  // Judged after this turn's reads: a timer that came due while the proxy was paused fires
  // before the poll, and data the upstream sent meanwhile would not have counted yet.
  const check = (): void => afterReads(judge);
  const judge = (): void => {
    if (stream.destroyed) return;
    const quiet = performance.now() - since;
    if (held || quiet < ms) {
      stream.setTimeout(held ? ms : Math.max(1, Math.ceil(ms - quiet)), check);
      return;
    }
    onSilent();
  };
  stream.setTimeout(ms, check);
}
