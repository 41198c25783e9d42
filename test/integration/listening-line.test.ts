import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { linesOf, startCli } from "../helpers/cli-process.js";
import { tempDir } from "../helpers/proxy.js";

const loopback = "none (single guest on loopback)";
const open = (where: string): RegExp => new RegExp(`^none \\(open proxy on ${where.replace(/[.[\]]/g, "\\$&")}: auth is off, so anyone who can reach port \\d+ can use it\\)$`);

// The start line is what an operator reads to learn who can use the proxy. An open proxy on every
// interface (--no-auth) was logged as a single guest on loopback, `--auth --no-auth` was accepted
// with the last word winning, and `--allow-internal-host '*'` (every host) showed allowedHosts []
// (black-box finding).
describe("the listening line says who can use the proxy", { timeout: 120_000 }, () => {
  it.each([
    { listen: "127.0.0.1:0", flags: [], authentication: loopback },
    { listen: "127.0.0.1:0", flags: ["--no-auth"], authentication: loopback },
    { listen: "127.0.0.1:0", flags: ["--auth"], authentication: "required" },
    { listen: "[::1]:0", flags: [], authentication: loopback },
    { listen: "0.0.0.0:0", flags: ["--no-auth"], authentication: open("every interface") },
    { listen: "0.0.0.0:0", flags: ["--auth=false"], authentication: open("every interface") },
    { listen: "0.0.0.0:0", flags: ["--auth"], authentication: "required" },
    { listen: "[::]:0", flags: ["--no-auth"], authentication: open("every interface") },
    { listen: "[::]:0", flags: ["--auth"], authentication: "required" },
  ])("--listen $listen $flags: $authentication", async ({ listen, flags, authentication }) => {
    const cli = startCli(["--listen", listen, ...flags, "--log-format", "json", "--log-level", "info", "--ca-dir", join(tempDir(), "ca")]);
    // stdout's line comes once the signal handlers are in place.
    await cli.until("the listening lines", () => linesOf(cli.stderr(), "listening").length > 0 && cli.stdout().includes("egressgate listening on"));
    const line = linesOf(cli.stderr(), "listening")[0]!;
    if (typeof authentication === "string") expect(line["authentication"]).toBe(authentication);
    else expect(line["authentication"]).toMatch(authentication);
    process.kill(cli.pid, "SIGTERM");
    expect((await cli.exited).code).toBe(0);
  });

  it.each([
    [["--auth", "--no-auth"], /^egressgate: --auth and --no-auth: given both ways; give one\n/],
    [["--no-auth", "--auth"], /^egressgate: --no-auth and --auth: given both ways; give one\n/],
    [["--auth=true", "--auth=false"], /^egressgate: --auth=true and --auth=false: given both ways; give one\n/],
    [["--no-block-internal-ranges", "--block-internal-ranges"], /^egressgate: --no-block-internal-ranges and --block-internal-ranges: given both ways; give one\n/],
  ])("%j is a usage error (exit 2), not the last one winning", async (flags, message) => {
    const cli = startCli(["--listen", "0.0.0.0:0", ...flags, "--ca-dir", join(tempDir(), "ca")]);
    // An exit, or a proxy that serves (which fails the test now, not at its timeout).
    await cli.until("an exit", () => cli.stdout().includes("egressgate listening on")).catch(() => undefined);
    expect(cli.stdout()).toBe("");
    expect((await cli.exited).code).toBe(2);
    expect(cli.stderr()).toMatch(message);
  });

  it("--allow-internal-host patterns are listed beside allowedHosts: '*' allows every host", async () => {
    const cli = startCli(["--listen", "127.0.0.1:0", "--allow-host", "api.test", "--allow-internal-host", "*", "--log-format", "json", "--log-level", "info", "--ca-dir", join(tempDir(), "ca")]);
    // stdout's line comes once the signal handlers are in place.
    await cli.until("the listening lines", () => linesOf(cli.stderr(), "listening").length > 0 && cli.stdout().includes("egressgate listening on"));
    expect(linesOf(cli.stderr(), "listening")[0]).toMatchObject({ allowedHosts: ["api.test"], allowedInternalHosts: ["*"] });
    process.kill(cli.pid, "SIGTERM");
    expect((await cli.exited).code).toBe(0);
  });
});
