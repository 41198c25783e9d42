import { constants } from "node:fs";
import { chmod, mkdir, open, readFile, writeFile } from "node:fs/promises";
import { hostname, homedir } from "node:os";
import { join } from "node:path";
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
    return await readFile(path, "utf8");
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
    if (!stats.isFile()) throw new Error(`${path} is ${stats.isDirectory() ? "a directory" : stats.isFIFO() ? "a FIFO" : "not a regular file"}, not a PEM file`);
    return { path, text: await handle.readFile("utf8"), mode: stats.mode, uid: stats.uid };
  } finally {
    await handle.close();
  }
}

/**
 * Loads the CA from `dir`, creating it on first use. Creation writes the key with `wx`, so two
 * processes starting together cannot overwrite each other's key: the loser re-reads the winner's.
 */
export async function loadOrCreateCa(dir: string): Promise<LoadedCa> {
  const certPath = join(dir, "ca.crt");
  const keyPath = join(dir, "ca.key");
  try {
    let certFile = await readCaFile(certPath);
    let keyFile = await readCaFile(keyPath);
    if (certFile === undefined || keyFile === undefined) {
      if (certFile !== undefined || keyFile !== undefined) {
        throw new Error(`found only one of ca.crt and ca.key in ${dir}; restore the other or remove both`);
      }
      await mkdir(dir, { recursive: true, mode: 0o700 });
      const created = await createCaCertificate(`egressgate CA (${hostname()})`);
      try {
        await writeFile(keyPath, created.keyPem, { flag: "wx", mode: 0o600 });
        await writeFile(certPath, created.certPem, { flag: "wx", mode: 0o644 });
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
        await new Promise((r) => setTimeout(r, 100));
      }
      // writeFile's mode is filtered by the umask; the key must end up 0600 regardless.
      await chmod(keyPath, 0o600).catch(() => undefined);
      certFile = await readCaFile(certPath);
      keyFile = await readCaFile(keyPath);
      if (certFile === undefined || keyFile === undefined) throw new Error(`ca.crt or ca.key vanished from ${dir} as it was created`);
    }
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

async function writeBundle(dir: string, caPem: string): Promise<string | undefined> {
  const bundlePath = join(dir, "ca-bundle.crt");
  const content = `${systemRootsPem()}\n# egressgate CA\n${caPem}`;
  try {
    if ((await readIfExists(bundlePath)) !== content) await writeFile(bundlePath, content, { mode: 0o644 });
    return bundlePath;
  } catch {
    // A read-only caDir (shared between instances) is fine as long as the bundle already exists.
    return (await readIfExists(bundlePath)) === undefined ? undefined : bundlePath;
  }
}
