import { constants } from "node:fs";
import { randomBytes } from "node:crypto";
import { copyFile, link, mkdir, open, rename, unlink, writeFile } from "node:fs/promises";
import { byteSize, fileKind, maxTextFileBytes, readRegularFile } from "../regular-file.js";
import { hostname, homedir } from "node:os";
import { dirname, join } from "node:path";
import { EgressError } from "../errors.js";
import { systemRootsPem } from "./system-roots.js";
import { checkCa, type CaFile } from "./ca-check.js";
import { createCaCertificate, importKeyPair, type CaMaterial } from "./x509.js";

export interface LoadedCa extends CaMaterial {
  readonly dir: string;
  readonly certPath: string;
  readonly keyPath: string;
  /** System roots plus this CA, for a guest's SSL_CERT_FILE; undefined if it could not be written. */
  readonly bundlePath: string | undefined;
  readonly certPem: string;
}

/** `$XDG_CONFIG_HOME/egressgate`, else `~/.config/egressgate`. */
export function defaultCaDir(env: NodeJS.ProcessEnv = process.env): string {
  const xdg = env["XDG_CONFIG_HOME"];
  return join(xdg && xdg !== "" ? xdg : join(homedir(), ".config"), "egressgate");
}

async function readIfExists(path: string): Promise<string | undefined> {
  try {
    // A FIFO in the bundle's place would hold the start until written to, as one at ca.key did.
    return (await readRegularFile(path, maxTextFileBytes)).toString("utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw error;
  }
}

/**
 * Reads a CA file, or undefined if there is none. Opened non-blocking: a FIFO where ca.key should
 * be would otherwise hold the start until something wrote to it.
 */
async function readCaFile(path: string): Promise<CaFile | undefined> {
  let handle;
  try {
    handle = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new Error(`cannot read ${path}: ${(error as Error).message}`, { cause: error });
  }
  try {
    const stats = await handle.stat();
    if (!stats.isFile()) throw new Error(`${path} is ${fileKind(stats)}, not a PEM file`);
    if (stats.size > maxTextFileBytes) throw new Error(`${path} is larger than ${byteSize(maxTextFileBytes)}, not a CA's PEM file`);
    return { path, text: await handle.readFile("utf8"), mode: stats.mode, uid: stats.uid };
  } finally {
    await handle.close();
  }
}

/** How long a load that finds one of ca.crt and ca.key waits for another process to publish the other. */
const publishWaitMs = 2_000;

/**
 * Loads the CA from `dir`, creating it on first use. Processes starting together on an empty
 * directory all end with the same CA: see publishNewCa.
 */
export async function loadOrCreateCa(dir: string): Promise<LoadedCa> {
  const certPath = join(dir, "ca.crt");
  const keyPath = join(dir, "ca.key");
  try {
    const { certFile, keyFile } = await readOrCreate(dir, certPath, keyPath);
    const problems: string[] = [];
    const cert = checkCa(certFile, keyFile, problems);
    if (cert === undefined || problems.length > 0) throw new EgressError("EG_CA", 500, `cannot use the CA in ${dir}: ${problems.join("; ")}`);
    const key = await importKeyPair(keyFile.text);
    const bundlePath = await writeBundle(dir, certFile.text);
    return { dir, certPath, keyPath, bundlePath, certPem: certFile.text, cert, key };
  } catch (error) {
    if (error instanceof EgressError) throw error;
    throw new EgressError("EG_CA", 500, `cannot load or create the CA in ${dir}: ${(error as Error).message}`, {
      cause: error,
    });
  }
}

/**
 * `mkdir -p`, each directory it makes 0700. Node 20's recursive mkdir never settles for a path
 * under /proc: mkdir there fails with ENOENT although the parent exists, and Node goes back to the
 * parent and tries again, forever. Here a second ENOENT, with the parent there, is the answer.
 */
async function makeDirectory(dir: string): Promise<void> {
  const made = (error: unknown): void => {
    if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
  };
  try {
    await mkdir(dir, { mode: 0o700 });
  } catch (error) {
    const parent = dirname(dir);
    if ((error as NodeJS.ErrnoException).code !== "ENOENT" || parent === dir) return made(error);
    await makeDirectory(parent);
    await mkdir(dir, { mode: 0o700 }).catch(made);
  }
}

/** Both CA files, read whole; the CA is created first if neither exists. */
async function readOrCreate(dir: string, certPath: string, keyPath: string): Promise<{ certFile: CaFile; keyFile: CaFile }> {
  let created = false;
  let waitingSince: number | undefined;
  for (;;) {
    const certFile = await readCaFile(certPath);
    const keyFile = await readCaFile(keyPath);
    if (certFile !== undefined && keyFile !== undefined) return { certFile, keyFile };
    if (certFile === undefined && keyFile === undefined && !created) {
      await makeDirectory(dir);
      await publishNewCa(dir, certPath, keyPath);
      created = true;
      continue;
    }
    // Another process publishes ca.key, then ca.crt: finding one alone may be the moment between.
    // Monotonic: a wall clock stepped back meanwhile would have kept this loop waiting as long.
    waitingSince ??= performance.now();
    if (performance.now() - waitingSince >= publishWaitMs) {
      if (certFile !== undefined || keyFile !== undefined) throw new Error(`found only one of ca.crt and ca.key in ${dir}; restore the other or remove both`);
      throw new Error(`ca.crt and ca.key were removed from ${dir} while the CA was being created`);
    }
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/**
 * Creates a CA and publishes it as ca.key and ca.crt, unless another process has published its
 * own. Both are written whole under temporary names and then hard-linked into place: link() fails
 * if the name exists, so one process's ca.key wins, and no reader sees half a file. The key goes
 * first and only its publisher links ca.crt, so a reader that finds ca.key alone waits for the
 * certificate (readOrCreate) rather than telling the operator to delete a good CA.
 */
async function publishNewCa(dir: string, certPath: string, keyPath: string): Promise<void> {
  const created = await createCaCertificate(`egressgate CA (${hostname()})`);
  const tag = `${process.pid}-${randomBytes(6).toString("hex")}`;
  const keyTemp = join(dir, `.ca.key.${tag}.tmp`);
  const certTemp = join(dir, `.ca.crt.${tag}.tmp`);
  try {
    // Created 0600 (a umask can only take bits away); the permission check names any other mode.
    await writeFile(keyTemp, created.keyPem, { flag: "wx", mode: 0o600 });
    await writeFile(certTemp, created.certPem, { flag: "wx", mode: 0o644 });
    if (!(await publishExclusive(keyTemp, keyPath))) return;
    try {
      // A ca.crt already here (put there by hand) is kept, and the check reports the mismatch.
      await publishExclusive(certTemp, certPath);
    } catch (error) {
      // A key without its certificate would stop every later start: nobody can have used it yet.
      await unlink(keyPath).catch(() => undefined);
      throw error;
    }
  } finally {
    await Promise.all([keyTemp, certTemp].map((temp) => unlink(temp).catch(() => undefined)));
  }
}

/** Gives `temp`'s file the name `path` too, unless `path` exists: then false. */
async function publishExclusive(temp: string, path: string): Promise<boolean> {
  try {
    await link(temp, path);
    return true;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "EEXIST") return false;
    if (code !== "EPERM" && code !== "ENOTSUP" && code !== "ENOSYS") throw error;
  }
  // A filesystem without hard links (FAT, some network and FUSE mounts): an exclusive copy still
  // publishes one process's file, though a reader may find it part-written for the copy's moment.
  try {
    await copyFile(temp, path, constants.COPYFILE_EXCL);
    return true;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") return false;
    throw error;
  }
}

/**
 * ca-bundle.crt, written again when the system roots (or the CA) changed. Written whole under a
 * temporary name and renamed into place: written in place, a full disk (ENOSPC) left it cut
 * short, without the CA at its end, and the start went on handing guests that file as their
 * SSL_CERT_FILE (every request through the proxy failed verification, and nothing said why);
 * instances starting together on one caDir also wrote one file at once.
 */
async function writeBundle(dir: string, caPem: string): Promise<string | undefined> {
  const bundlePath = join(dir, "ca-bundle.crt");
  const content = `${systemRootsPem()}\n# egressgate CA\n${caPem}`;
  const existing = await readIfExists(bundlePath);
  if (existing === content) return bundlePath;
  const temp = join(dir, `.ca-bundle.crt.${process.pid}-${randomBytes(6).toString("hex")}.tmp`);
  try {
    await writeFile(temp, content, { flag: "wx", mode: 0o644 });
    await rename(temp, bundlePath);
    return bundlePath;
  } catch {
    await unlink(temp).catch(() => undefined);
    // A read-only caDir (shared between instances), or a full disk: the bundle there serves if it
    // holds this CA (its system roots may be older); else the guest is given ca.crt alone.
    return existing?.includes(caPem.trim()) === true ? bundlePath : undefined;
  }
}
