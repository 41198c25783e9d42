import { closeSync, constants, fstatSync, openSync, readSync, type Stats } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";

/**
 * Reading a file the operator named (the config file, a `file:` secret, an upstream CA, a HAR
 * file) that must be a regular file. A FIFO with no writer blocks the read until one comes, which
 * froze a start, or a reload with every guest waiting on it; `/dev/zero` and `/dev/urandom` never
 * end. Each is refused, with what it is, before a byte is read; and a cap bounds what a regular
 * file may cost.
 */

/**
 * The most read of a file of text an operator writes (a config file, an upstream CA bundle): a
 * hundred times a large real one (the system's CA bundle is about 220 KiB, the example
 * configurations under 4 KiB), and parsed in well under a second; a reload holds every guest
 * while it reads and parses.
 */
export const maxTextFileBytes = 4 * 1024 * 1024;

/** Why a file could not be read: the errno code (`ENOENT`), or what was wrong with it. */
export class FileReadError extends Error {
  /** `limit`: set when the file holds more than the bytes it may. */
  constructor(
    readonly reason: string,
    readonly limit?: number,
  ) {
    super(reason);
    this.name = "FileReadError";
  }
}

/** What a path is, for messages: "a FIFO", "a character device". */
export function fileKind(stats: Stats): string {
  if (stats.isFile()) return "a regular file";
  if (stats.isDirectory()) return "a directory";
  if (stats.isFIFO()) return "a FIFO";
  if (stats.isCharacterDevice()) return "a character device";
  if (stats.isBlockDevice()) return "a block device";
  if (stats.isSocket()) return "a socket";
  return "not a regular file";
}

/** The short reason a read failed, for "cannot read FILE: REASON": an errno code, or ours. */
export function readFailure(error: unknown): string {
  if (error instanceof FileReadError) return error.reason;
  return (error as NodeJS.ErrnoException).code ?? (error as Error).message;
}

/** `1048576` as "1 MiB", `16384` as "16 KiB". */
export function byteSize(bytes: number): string {
  if (bytes >= 1024 * 1024 && bytes % (1024 * 1024) === 0) return `${bytes / (1024 * 1024)} MiB`;
  if (bytes >= 1024 && bytes % 1024 === 0) return `${bytes / 1024} KiB`;
  return `${bytes} bytes`;
}

// Opening a FIFO for reading waits for a writer; with O_NONBLOCK it returns at once, and the
// fstat below refuses it. On a regular file the flag changes nothing. The check is on the open
// descriptor, so no rename between a stat and the open can slip a FIFO in.
const openFlags = constants.O_RDONLY | (constants.O_NONBLOCK ?? 0);

function refuseIrregular(stats: Stats): void {
  if (!stats.isFile()) throw new FileReadError(`${fileKind(stats)}, not a regular file`);
}

function tooLarge(maxBytes: number): FileReadError {
  return new FileReadError(`larger than ${byteSize(maxBytes)}, the most it may hold`, maxBytes);
}

/**
 * The bytes of `file`, which must be a regular file of at most `maxBytes`. Throws a
 * FileReadError (not a regular file, too large) or the system's error (`ENOENT`, `EACCES`).
 */
export function readRegularFileSync(file: string, maxBytes: number): Buffer {
  const fd = openSync(file, openFlags);
  try {
    refuseIrregular(fstatSync(fd));
    // Read to the end rather than trust the size: the file may grow while it is read.
    const chunks: Buffer[] = [];
    let total = 0;
    for (;;) {
      const chunk = Buffer.allocUnsafe(Math.min(64 * 1024, maxBytes + 1 - total));
      const read = readSync(fd, chunk, 0, chunk.length, null);
      if (read === 0) break;
      chunks.push(chunk.subarray(0, read));
      total += read;
      if (total > maxBytes) throw tooLarge(maxBytes);
    }
    return Buffer.concat(chunks, total);
  } finally {
    closeSync(fd);
  }
}

/**
 * `file` opened for reading, off the event loop, once it is known to be a regular file (else a
 * FileReadError, and nothing is left open): for a caller that streams it. The caller closes it.
 */
export async function openRegularFile(file: string): Promise<{ readonly handle: FileHandle; readonly stats: Stats }> {
  const handle = await open(file, openFlags);
  try {
    const stats = await handle.stat();
    refuseIrregular(stats);
    return { handle, stats };
  } catch (error) {
    await handle.close();
    throw error;
  }
}

/** As {@link readRegularFileSync}, off the event loop; `maxBytes` may be left out (no cap but the file's own size). */
export async function readRegularFile(file: string, maxBytes = Number.POSITIVE_INFINITY): Promise<Buffer> {
  const { handle, stats } = await openRegularFile(file);
  try {
    if (stats.size > maxBytes) throw tooLarge(maxBytes);
    const data = await handle.readFile();
    if (data.length > maxBytes) throw tooLarge(maxBytes);
    return data;
  } finally {
    await handle.close();
  }
}
