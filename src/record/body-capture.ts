import { createCipheriv, createDecipheriv, createHash, randomBytes, type Cipher, type Hash } from "node:crypto";
import { createWriteStream, type WriteStream } from "node:fs";
import { open, rename, rm, stat } from "node:fs/promises";
import { once } from "node:events";
import { join } from "node:path";
import { pipeline, Transform, type Readable } from "node:stream";
import { removeAtExit } from "./exit-cleanup.js";
import { inlineBodyLimit, partialBodyName } from "./har.js";
import type { LiteralScanner } from "./leak-scan.js";
import { writeAll } from "./write-all.js";

/** A body as the recorder kept it: its bytes when small, else the sidecar file that holds them. */
export interface CapturedBody {
  readonly size: number;
  readonly sha256: string;
  /** The bytes, when at most {@link inlineBodyLimit}. */
  readonly bytes?: Buffer;
  /** The sidecar file's name (its SHA-256), when larger. */
  readonly file?: string;
  /** `[bytes, ms since the capture began]` per chunk, when asked for. */
  readonly chunks?: [number, number][];
  /**
   * Set when the bytes were not kept: the capture's search found a secret's value in them (or
   * the caller withheld them). `file` names no file then; the entry is not written.
   */
  readonly withheld?: true;
}

/** More chunk timings than this are not kept: the body still replays, in larger pieces. */
const maxChunkTimings = 10_000;

/** How much of a partial sidecar file is turned back into plaintext at a time. */
const decryptChunkBytes = 1024 * 1024;

/**
 * Keeps a copy of a body as it streams past: in memory up to {@link inlineBodyLimit}, then in a
 * sidecar file written with backpressure (the stream waits for the disk, so a 256 MiB download
 * costs constant memory). The file is named by the SHA-256 of its bytes once complete. A
 * capture that fails (a full disk) stops capturing; the stream it watches carries on.
 *
 * The partial file (`.<hex>.part`) holds the bytes encrypted (AES-256-CTR, with a key only this
 * capture's memory holds): they have not been searched for secrets until the body has ended,
 * and a process killed meanwhile (SIGKILL, out of memory) left them in clear, in the folder
 * that gets committed (black-box finding: an upstream that echoed a token held it 61,278 times).
 * Once complete and found clean, the file is decrypted in place and renamed to its SHA-256; a
 * body in which the search found a value is never written in clear. The file is also removed
 * at the process's exit (exit-cleanup.ts) and by the next recording on the path.
 */
export class BodyCapture {
  private readonly hash: Hash = createHash("sha256");
  private readonly memory: Buffer[] = [];
  private size = 0;
  private file: WriteStream | undefined;
  private tmp: string | undefined;
  /** Lets go of the temporary file's removal at exit, once it is renamed or removed. */
  private release: (() => void) | undefined;
  /** The partial file's key and IV, made when a body first spills (most bodies never do). */
  private key: Buffer | undefined;
  private iv: Buffer | undefined;
  private cipher: Cipher | undefined;
  private readonly started = performance.now();
  private readonly chunks: [number, number][] | undefined;
  /** Why the copy is incomplete, once it is. */
  failure: Error | undefined;

  constructor(
    private readonly dir: string,
    options: { readonly chunks?: boolean; readonly scanner?: LiteralScanner | undefined } = {},
  ) {
    this.chunks = options.chunks === true ? [] : undefined;
    this.scanner = options.scanner;
  }

  private readonly scanner: LiteralScanner | undefined;

  /** Takes one chunk; a promise when the caller should wait (the sidecar file is behind). */
  write(chunk: Buffer): Promise<void> | undefined {
    if (this.failure !== undefined || chunk.length === 0) return undefined;
    this.hash.update(chunk);
    this.scanner?.push(chunk);
    this.size += chunk.length;
    if (this.chunks !== undefined && this.chunks.length < maxChunkTimings) this.chunks.push([chunk.length, Math.round(performance.now() - this.started)]);
    if (this.file === undefined && this.size <= inlineBodyLimit) {
      this.memory.push(chunk);
      return undefined;
    }
    return this.spill(chunk).catch((error: unknown) => {
      this.fail(error as Error);
    });
  }

  private async spill(chunk: Buffer): Promise<void> {
    if (this.file === undefined) {
      this.tmp = join(this.dir, partialBodyName(randomBytes(8).toString("hex")));
      this.release = removeAtExit(this.tmp);
      this.key = randomBytes(32);
      this.iv = randomBytes(16);
      this.cipher = createCipheriv("aes-256-ctr", this.key, this.iv);
      const file = createWriteStream(this.tmp, { flags: "wx", mode: 0o600 });
      // An error is taken by whoever waits next (write or end); never an unhandled event.
      file.on("error", (error) => this.fail(error));
      this.file = file;
      // CTR turns each chunk into as many bytes at once: nothing is held back.
      for (const held of this.memory.splice(0)) if (!file.write(this.cipher.update(held))) await this.drain(file);
    }
    if (!this.file.write(this.cipher!.update(chunk))) await this.drain(this.file);
  }

  private async drain(file: WriteStream): Promise<void> {
    if (this.failure !== undefined) throw this.failure;
    await once(file, "drain");
  }

  private fail(error: Error): void {
    if (this.failure !== undefined) return;
    this.failure = error;
    this.memory.length = 0;
    this.file?.destroy();
  }

  /**
   * The body as kept; throws when the copy failed (the file, if any, is removed). A sidecar body
   * in which the capture's search found a value, or one the caller `withhold`s (it cannot be
   * searched), is removed instead of decrypted: it comes back `withheld`.
   */
  async finish(options: { readonly withhold?: boolean } = {}): Promise<CapturedBody> {
    const sha256 = this.hash.digest("hex");
    const chunks = this.chunks === undefined ? {} : { chunks: this.chunks };
    if (this.failure === undefined && this.file === undefined) {
      return { size: this.size, sha256, bytes: Buffer.concat(this.memory), ...chunks };
    }
    try {
      if (this.failure !== undefined) throw this.failure;
      const file = this.file!;
      file.end();
      await once(file, "close");
      if (this.failure !== undefined) throw this.failure;
      if (options.withhold === true || this.scanner?.found !== undefined) {
        await this.discard();
        return { size: this.size, sha256, file: sha256, withheld: true, ...chunks };
      }
      await this.decrypt(this.tmp!);
      // Content-addressed: the same body recorded twice is one file.
      await rename(this.tmp!, join(this.dir, sha256));
      this.release?.();
      return { size: this.size, sha256, file: sha256, ...chunks };
    } catch (error) {
      await this.discard();
      throw error;
    }
  }

  /** The partial file turned back into the body's bytes, in place (CTR keeps every byte where it was). */
  private async decrypt(path: string): Promise<void> {
    const decipher = createDecipheriv("aes-256-ctr", this.key!, this.iv!);
    const handle = await open(path, "r+");
    try {
      const buffer = Buffer.alloc(decryptChunkBytes);
      for (let position = 0; ; ) {
        const { bytesRead } = await handle.read(buffer, 0, buffer.length, position);
        if (bytesRead === 0) break;
        const plain = decipher.update(buffer.subarray(0, bytesRead));
        await writeAll(handle, plain, position);
        position += bytesRead;
      }
    } finally {
      await handle.close();
    }
  }

  /** Gives up on the copy and removes a partial file. */
  async discard(): Promise<void> {
    this.fail(new Error("discarded"));
    if (this.tmp !== undefined) await rm(this.tmp, { force: true }).catch(() => undefined);
    this.release?.();
  }
}

/**
 * `source` as a stream that also feeds `capture`: each chunk moves on once the capture has it
 * (so the slower of the guest and the disk sets the pace). `done` settles when the source has
 * ended (true) or failed or was cut (false).
 */
export function teeBody(source: Readable, capture: BodyCapture): { readonly body: Readable; readonly done: Promise<boolean> } {
  let complete!: (ended: boolean) => void;
  const done = new Promise<boolean>((resolve) => (complete = resolve));
  const tee = new Transform({
    transform(chunk: Buffer, _encoding, callback) {
      const waiting = capture.write(chunk);
      if (waiting === undefined) callback(null, chunk);
      else void waiting.then(() => callback(null, chunk));
    },
    flush(callback) {
      complete(true);
      callback();
    },
  });
  tee.once("close", () => complete(false));
  // Errors and early closes travel both ways (a guest that leaves cancels the upstream body);
  // the callback keeps them from being unhandled.
  pipeline(source, tee, () => undefined);
  return { body: tee, done };
}

/** The size of a sidecar file, or undefined when it is missing. */
export async function sidecarSize(path: string): Promise<number | undefined> {
  try {
    return (await stat(path)).size;
  } catch {
    return undefined;
  }
}
