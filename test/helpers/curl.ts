import { execFile } from "node:child_process";

export interface CurlResult {
  readonly exitCode: number;
  readonly status: number;
  readonly body: string;
  readonly stderr: string;
}

/** Runs the real curl through the proxy (`-x`), trusting `caFile`. Never follows redirects itself. */
export function curlVia(proxyUrl: string, caFile: string, url: string, extra: readonly string[] = []): Promise<CurlResult> {
  const marker = "\n__status:";
  return new Promise((resolve) => {
    execFile(
      "curl",
      ["-sS", "--noproxy", "", "-x", proxyUrl, "--cacert", caFile, "--max-time", "20", "-w", `${marker}%{http_code}`, ...extra, url],
      { maxBuffer: 64 * 1024 * 1024, env: { PATH: process.env["PATH"] ?? "/usr/bin:/bin" } },
      (error, stdout, stderr) => {
        const at = stdout.lastIndexOf(marker);
        resolve({
          exitCode: error === null ? 0 : typeof error.code === "number" ? error.code : 1,
          status: at >= 0 ? Number(stdout.slice(at + marker.length)) : 0,
          body: at >= 0 ? stdout.slice(0, at) : stdout,
          stderr,
        });
      },
    );
  });
}
