import type { FileHandle } from "node:fs/promises";

/**
 * Writes all of `bytes` at `position`. A write that a full disk (or a quota, or a file size
 * limit) cuts short returns fewer bytes, not an error; `FileHandle.write` hands that back as it
 * is, and the caller took the whole as written: the journal indexed an entry it held only the
 * start of, and the HAR made from it had the rest as NUL bytes (not JSON; `--replay` refused the
 * whole recording). The rest is written here, which fails with the disk's error.
 */
export async function writeAll(handle: FileHandle, bytes: Uint8Array, position: number): Promise<void> {
  for (let done = 0; done < bytes.length; ) {
    const { bytesWritten } = await handle.write(bytes, done, bytes.length - done, position + done);
    if (bytesWritten === 0) throw new Error("the file took none of a write");
    done += bytesWritten;
  }
}
