import { constants, fstatSync, type Stats } from "node:fs";
import { randomBytes } from "node:crypto";
import { open, rename, unlink, type FileHandle } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { firstFullWaitMs, longestFullWaitMs, openWaitingForReader } from "../fifo-writer.js";

export interface GuestEnvInput {
  /** `http://HOST:PORT`, without credentials. */
  readonly proxyUrl: string;
  /** The guest's name and token, when the proxy asks for them: they go into the proxy URLs. */
  readonly credentials?: { readonly user: string; readonly password: string };
  readonly caCertPath: string;
  /** System roots plus the CA; tools that replace their trust store need both. */
  readonly caBundlePath: string | undefined;
  readonly extra: Readonly<Record<string, string>>;
}

/**
 * The environment a guest needs: both proxy variable spellings (curl reads only lowercase
 * `http_proxy`; Go and Python read both), and each ecosystem's CA variable. Tools whose variable
 * replaces the trust store get the bundle; Node's NODE_EXTRA_CA_CERTS adds to it, so it gets
 * the CA alone.
 */
export function guestEnvironment(input: GuestEnvInput): Record<string, string> {
  const bundle = input.caBundlePath ?? input.caCertPath;
  const proxyUrl = input.credentials === undefined ? input.proxyUrl : withCredentials(input.proxyUrl, input.credentials);
  return {
    HTTPS_PROXY: proxyUrl,
    HTTP_PROXY: proxyUrl,
    https_proxy: proxyUrl,
    http_proxy: proxyUrl,
    // git sends proxy credentials only after a 407 unless told the method (one wasted round trip
    // per connection, and some proxies' 407 ends the CONNECT for good).
    ...(input.credentials !== undefined ? { GIT_HTTP_PROXY_AUTHMETHOD: "basic" } : {}),
    SSL_CERT_FILE: bundle,
    NODE_EXTRA_CA_CERTS: input.caCertPath,
    REQUESTS_CA_BUNDLE: bundle,
    CURL_CA_BUNDLE: bundle,
    GIT_SSL_CAINFO: bundle,
    // gRPC's C core and grpc-js ignore the variables above and read only this one.
    GRPC_DEFAULT_SSL_ROOTS_FILE_PATH: bundle,
    ...input.extra,
  };
}

/** `http://NAME:TOKEN@HOST:PORT`: guest names and tokens need no percent-encoding (see auth.ts). */
function withCredentials(proxyUrl: string, credentials: { readonly user: string; readonly password: string }): string {
  return proxyUrl.replace(/^http:\/\//, `http://${credentials.user}:${credentials.password}@`);
}

/**
 * `KEY=value` lines, the format of `docker run --env-file` and systemd's EnvironmentFile. The two
 * share no quoting (docker takes a value to the line's end as it is, quotes included), so a line
 * break or NUL in a value (a CA folder's path, say) cannot be written: it would end the line and
 * start a variable of its own (`HTTPS_PROXY=` pointing elsewhere). Such a value is refused.
 */
export function formatEnvFile(env: Readonly<Record<string, string>>): string {
  return Object.entries(env)
    .map(([k, v]) => {
      if (!/^[^\s=\0]+$/.test(k)) throw new Error(`the variable name ${JSON.stringify(k)} cannot be written as KEY=value`);
      if (/[\r\n\0]/.test(v)) throw new Error(`the value of ${k} holds a line break or NUL, which a KEY=value line cannot carry`);
      return `${k}=${v}\n`;
    })
    .join("");
}

/** `export KEY='value'` lines for `eval "$(egressgate env)"`. */
export function formatShellExports(env: Readonly<Record<string, string>>): string {
  return Object.entries(env)
    .map(([k, v]) => `export ${k}='${v.replaceAll("'", "'\\''")}'\n`)
    .join("");
}

/**
 * Writes a guest's environment, never readable by everyone: it holds the guest's credentials
 * and placeholders. A file the proxy makes is 0600. A file that was there already kept its mode
 * (writeFile's `mode` applies only when it creates the file), so a `touch`ed or earlier 0644 file
 * got every guest's token readable by every local user. Now such a file, when the proxy's user
 * owns it, is replaced by a new one without what others could do with it (its group keeps what
 * its owner gave, as ca.key's may), and its old and new modes are returned for the log: a chmod
 * alone left a reader who had opened it while others could reading every later write through
 * its handle.
 * One another user owns (root, handing it over through its group) that everyone may read or
 * write is refused before anything is written, as ca.key is. So is the process's own stdout or
 * stderr (`/dev/stdout`). Another path that is no regular file (a FIFO, a device) is written as
 * it is; a FIFO with no reader yet is waited for
 * ({@link openForWriting}), `waiting` called once.
 */
export async function writeGuestEnvFile(
  path: string,
  env: Readonly<Record<string, string>>,
  waiting: () => void = () => undefined,
): Promise<{ readonly was: number; readonly now: number } | undefined> {
  const text = formatEnvFile(env);
  // Not truncated at open: a file refused or replaced below keeps what it held.
  const handle = await openForWriting(path, waiting);
  let replaceFrom: { mode: number; gid: number } | undefined;
  try {
    const stats = await handle.stat();
    const own = ownOutput(stats);
    if (own !== undefined) {
      throw new Error(`it is this process's ${own}, where the proxy writes its own output: the guest's credentials would go out among its lines; name a file, or a FIFO its reader opens`);
    }
    if (stats.isFile()) {
      const mode = stats.mode & 0o777;
      const uid = process.getuid?.();
      const problem = envFilePermissionProblem(path, mode, stats.uid, uid);
      if (problem !== undefined) throw new Error(problem);
      if (uid !== undefined && stats.uid === uid && (mode & 0o007) !== 0) replaceFrom = { mode, gid: stats.gid };
      else await handle.truncate(0);
    }
    if (replaceFrom === undefined) await writeWhole(handle, Buffer.from(text));
  } finally {
    await handle.close();
  }
  if (replaceFrom === undefined) return undefined;
  const now = replaceFrom.mode & 0o770;
  await replaceFile(path, text, now, replaceFrom.gid);
  return { was: replaceFrom.mode, now };
}

/**
 * Which of the process's own stdout and stderr the opened file is, if one: `/dev/stdout`,
 * `/proc/self/fd/2`, or the file a shell sent stdout to. Written there, the environment came out
 * among the listening line and the log, and a regular file behind stdout was truncated (or
 * replaced) under the output already in it.
 */
function ownOutput(stats: Stats): "stdout" | "stderr" | undefined {
  for (const [fd, name] of [[1, "stdout"], [2, "stderr"]] as const) {
    let output: Stats;
    try {
      output = fstatSync(fd);
    } catch {
      continue;
    }
    if (output.dev === stats.dev && output.ino === stats.ino) return name;
  }
  return undefined;
}

/**
 * Opens `path` for writing without blocking: a FIFO with no reader held the start for good in a
 * blocking open(), with no listening line and no word of why (black-box finding). It is waited
 * for instead ({@link openWaitingForReader}); a socket or a device without its driver fails the
 * start.
 */
function openForWriting(path: string, waiting: () => void): Promise<FileHandle> {
  return openWaitingForReader(path, () => open(path, constants.O_WRONLY | constants.O_CREAT | (constants.O_NONBLOCK ?? 0), 0o600), waiting);
}

/**
 * Writes all of `bytes` at the handle's position. Opened non-blocking, a pipe whose reader has
 * not taken what it holds (64 KiB on Linux; a guest with many secrets has more) answers EAGAIN,
 * which is waited out rather than failing the start; a reader that went away is EPIPE, which
 * fails it. A write cut short (a full disk) goes on with the rest, which fails with the disk's
 * error.
 */
async function writeWhole(handle: FileHandle, bytes: Buffer): Promise<void> {
  let waitMs = firstFullWaitMs;
  for (let done = 0; done < bytes.length; ) {
    try {
      const { bytesWritten } = await handle.write(bytes, done, bytes.length - done);
      if (bytesWritten === 0) throw new Error("the file took none of a write");
      done += bytesWritten;
      waitMs = firstFullWaitMs;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EAGAIN") throw error;
      await sleep(waitMs);
      waitMs = Math.min(longestFullWaitMs, waitMs * 2);
    }
  }
}

/** A file mode as `ls -l`'s octal users write it: `0644`. */
export function modeText(mode: number): string {
  return (mode & 0o777).toString(8).padStart(4, "0");
}

/** Puts a new file with `text` at `path` (a rename, so no reader sees it half-written), mode `mode`, its group `gid` where the proxy may give it. */
async function replaceFile(path: string, text: string, mode: number, gid: number): Promise<void> {
  const temporary = `${path}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`;
  const handle = await open(temporary, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o600);
  try {
    await handle.writeFile(text);
    // The group the old file was shared with, where the proxy's user belongs to it; else its own.
    await handle.chown(process.getuid?.() ?? -1, gid).catch(() => undefined);
    await handle.chmod(mode);
    await handle.close();
    await rename(temporary, path);
  } catch (error) {
    await handle.close().catch(() => undefined);
    await unlink(temporary).catch(() => undefined);
    throw error;
  }
}

/**
 * Why an existing guest environment file that another user owns cannot be written without
 * showing its credentials to everyone; undefined when it can (the proxy's own file loses what others may do with it).
 * The rule is ca.key's (src/tls/ca-check.ts): the owner may share it with its group, not with all.
 */
export function envFilePermissionProblem(path: string, mode: number, owner: number, uid: number | undefined): string | undefined {
  // Windows has no such bits (process.getuid is undefined there).
  if (uid === undefined || owner === uid || (mode & 0o006) === 0) return undefined;
  return `${path} can be read or written by users other than its owner and group (mode ${modeText(mode)}), and it would hold the guest's proxy credentials and placeholders: run "chmod o-rwx ${path}", or remove it and the proxy makes it 0600`;
}
