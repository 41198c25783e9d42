import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { parseCli, UsageError } from "../../src/cli/args.js";
import { buildProxyOptions } from "../../src/config/build.js";
import { describeConfig } from "../../src/config/describe.js";
import { loadConfigFile } from "../../src/config/file.js";
import { ConfigFileError, isOptionError } from "../../src/config/option-error.js";
import { chainOf } from "../../src/hooks/http-hooks.js";
import type { ChainEntry } from "../../src/hooks/declarative-binding.js";
import type { HttpHooks } from "../../src/index.js";
import { tempDir } from "../helpers/proxy.js";
import { fileErrorOf } from "../helpers/config-file.js";

const policy = "export function onRequest() {}\n";

/** What each chain entry is: `policy:<file name>` or the decider's label. */
function chainShape(hooks: HttpHooks | undefined): string[] {
  return (chainOf(hooks!) ?? []).map((entry: ChainEntry) =>
    entry.kind === "policy" ? `policy:${entry.djs.engine.filename.split("/").at(-1)}` : entry.kind === "decider" ? entry.decider.label : `hooks[${entry.index}]`,
  );
}


function serve(argv: readonly string[], env: NodeJS.ProcessEnv = {}) {
  const command = parseCli(argv, env);
  if (command.kind !== "serve") throw new Error(`expected serve, got ${command.kind}`);
  return command;
}

describe("CLI: --hook-command, --hook-url and --hook-opa", () => {
  it("each is repeatable, and the chain follows the command line's order across them and --hooks-script", async () => {
    const dir = tempDir();
    writeFileSync(join(dir, "a.mjs"), policy);
    writeFileSync(join(dir, "b.mjs"), policy);
    const command = serve([
      "--allow-host", "api.test",
      "--hook-url", "http://127.0.0.1:9000/decide",
      "--hooks-script", join(dir, "a.mjs"),
      // Programs that exist: one that does not is refused at load (below).
      "--hook-command", "./test/fixtures/deciders/decide.sh --strict",
      "--hook-opa=http://127.0.0.1:8181/v1/data/egress",
      "--hooks-script", join(dir, "b.mjs"),
      "--hook-command", "sh decide.sh",
    ]);
    try {
      expect(chainShape(command.options.httpHooks)).toEqual([
        "webhook:http://127.0.0.1:9000/decide",
        "policy:a.mjs",
        "command:./test/fixtures/deciders/decide.sh",
        "opa:http://127.0.0.1:8181/v1/data/egress",
        "policy:b.mjs",
        "command:sh",
      ]);
      const decider = chainOf(command.options.httpHooks!)!.find((e) => e.kind === "decider" && e.decider.label === "command:./test/fixtures/deciders/decide.sh");
      // A relative program is taken from the working directory, as any path flag.
      expect(decider?.kind === "decider" && decider.decider.options.kind === "command" && decider.decider.options.argv).toEqual([join(process.cwd(), "test/fixtures/deciders/decide.sh"), "--strict"]);
    } finally {
      await command.built.close();
    }
  });

  it("--hook-command naming a program that cannot be started is an option error naming the flag and the program", () => {
    const errorOf = (argv: string[], env: NodeJS.ProcessEnv): Error => {
      try {
        serve(argv, env);
      } catch (error) {
        return error as Error;
      }
      throw new Error("no error");
    };
    const bare = errorOf(["--allow-host", "a.test", "--hook-command", "no-such-decider-program --strict"], { PATH: "/bin" });
    expect(isOptionError(bare)).toBe(true);
    expect(bare.message).toBe('--hook-command: names the program "no-such-decider-program", which is not an executable file in any folder of PATH (PATH is "/bin"): install it, or give its path');
    // A relative path from the working directory, as for any path flag.
    expect(errorOf(["--hook-command", "./no-such-decider.sh"], {}).message).toBe(`--hook-command: names ${join(process.cwd(), "no-such-decider.sh")}, which does not exist`);
  });

  it("a bad value is an option error naming the flag", () => {
    const errorOf = (argv: string[]): Error => {
      try {
        serve(argv);
      } catch (error) {
        return error as Error;
      }
      throw new Error("no error");
    };
    const url = errorOf(["--hook-url", "ftp://nowhere"]);
    expect(isOptionError(url)).toBe(true);
    expect(url.message).toBe('--hook-url: must be an http:// or https:// URL (got "ftp://nowhere")');
    expect(errorOf(["--hook-command", "x 'open"]).message).toMatch(/^--hook-command: has an unterminated single quote/);
    expect(errorOf(["--hook-opa", "nope"]).message).toMatch(/^--hook-opa: must be an http/);
  });

  it("they cannot be combined with --config", () => {
    const file = join(tempDir(), "c.yaml");
    writeFileSync(file, "allowHosts: [a.test]\n");
    expect(() => serve(["--config", file, "--hook-url", "http://127.0.0.1:1/"])).toThrow(UsageError);
  });
});

describe("config file: hooks", () => {
  it("lists policies and deciders in order, relative paths from the file's folder, with their options", async () => {
    const dir = tempDir();
    writeFileSync(join(dir, "p.mjs"), policy);
    writeFileSync(join(dir, "check.sh"), "#!/bin/sh\nexit 0\n", { mode: 0o755 });
    const file = join(dir, "egressgate.yaml");
    writeFileSync(
      file,
      [
        "allowHosts: [api.test]",
        "hooks:",
        "  - command: [./check.sh, --strict]",
        "    timeoutMs: 2000",
        "    env: [LANG]",
        "  - script: p.mjs",
        "  - webhook: http://127.0.0.1:9000/decide",
        "    failOpen: true",
        "    headers: { authorization: 'Bearer ${HOOK_TOKEN}' }",
        "    allowEnv: [HOOK_TOKEN]",
        "  - opa: http://127.0.0.1:8181/v1/data/egress",
        "    phases: [request, response]",
        "    cacheMs: 1000",
      ].join("\n"),
    );
    const env = { HOOK_TOKEN: "tok-secret", LANG: "C", PATH: "/usr/bin" };
    const config = loadConfigFile(file, env);
    const hooks = config.guests["default"]!.hooks!;
    expect(hooks.map((h) => h.kind)).toEqual(["decider", "script", "decider", "decider"]);
    expect(hooks[0]).toMatchObject({ decider: { argv: [join(dir, "check.sh"), "--strict"], timeoutMs: 2000, env: { PATH: "/usr/bin", LANG: "C" }, label: "command:./check.sh" } });
    expect(hooks[1]).toEqual({ kind: "script", path: join(dir, "p.mjs") });
    expect(hooks[2]).toMatchObject({ decider: { failOpen: true, headers: { authorization: "Bearer tok-secret" } } });
    // check-config shows the chain, never a header's value.
    const described = describeConfig(config);
    expect(described).toContain("webhook: http://127.0.0.1:9000/decide");
    expect(described).toContain("authorization: (redacted)");
    expect(described).not.toContain("tok-secret");
    const built = buildProxyOptions(config);
    try {
      expect(chainShape(built.options.httpHooks)).toEqual(["command:./check.sh", "policy:p.mjs", "webhook:http://127.0.0.1:9000/decide", "opa:http://127.0.0.1:8181/v1/data/egress"]);
    } finally {
      await built.close();
    }
  });

  it("reports a bad entry with its path and line, and hooks with hooksScript", () => {
    const dir = tempDir();
    const file = join(dir, "bad.yaml");
    writeFileSync(file, ["hooksScript: p.mjs", "hooks:", "  - webhook: http://127.0.0.1:1/", "    headers: { authorization: '${NOT_LISTED}' }", "  - nothing: 1", "  - script: missing.mjs"].join("\n"));
    let error: ConfigFileError | undefined;
    try {
      loadConfigFile(file, {});
    } catch (e) {
      error = e as ConfigFileError;
    }
    expect(error).toBeInstanceOf(ConfigFileError);
    expect(error!.issues.map((i) => i.path)).toEqual(["hooks[0].headers.authorization", "hooks[1]"]);
    expect(error!.issues[0]!.line).toBe(4);
    const mixed = join(dir, "mixed.yaml");
    writeFileSync(join(dir, "p.mjs"), policy);
    writeFileSync(mixed, ["hooksScript: p.mjs", "hooks:", "  - webhook: http://127.0.0.1:1/"].join("\n"));
    expect(() => loadConfigFile(mixed, {})).toThrow(/hooksScript.*cannot be combined with hooks/);
    const missing = join(dir, "missing.yaml");
    writeFileSync(missing, ["hooks:", "  - script: missing.mjs"].join("\n"));
    expect(() => loadConfigFile(missing, {})).toThrow(/hooks\[0\]\.script.*not a readable file/);
  });

  // A program that was not there was taken, and every request the decider was asked about got
  // 502 "could not start: ENOENT"; check-config said nothing (black-box finding).
  it("a command whose program cannot be started is refused at load, with its path and the program", () => {
    const dir = tempDir();
    const bin = join(dir, "bin");
    const other = join(dir, "other");
    mkdirSync(bin);
    mkdirSync(other);
    writeFileSync(join(dir, "check.sh"), "#!/bin/sh\nexit 0\n", { mode: 0o755 });
    writeFileSync(join(dir, "plain.sh"), "exit 0\n", { mode: 0o644 });
    // A file of the name that cannot run is passed over for the next folder, as execvp does.
    writeFileSync(join(bin, "decide"), "exit 0\n", { mode: 0o644 });
    writeFileSync(join(other, "decide"), "#!/bin/sh\nexit 0\n", { mode: 0o755 });
    const file = join(dir, "hooks.yaml");
    writeFileSync(
      file,
      [
        "hooks:",
        "  - command: [no-such-decider-program, --strict]",
        "  - command: ./missing.sh",
        "  - command: [./plain.sh]",
        "  - command: [./bin]",
        "  - command: [./check.sh]",
        "  - command: decide",
        "  - command: 'no-such-decider-program && true'",
        "    shell: true",
      ].join("\n"),
    );
    const error = fileErrorOf(file, { PATH: `${bin}:${other}` });
    expect(error.issues.map((issue) => [issue.path, issue.line, issue.reason])).toEqual([
      ["hooks[0].command", 2, `names the program "no-such-decider-program", which is not an executable file in any folder of PATH (PATH is ${JSON.stringify(`${bin}:${other}`)}): install it, or give its path`],
      ["hooks[1].command", 3, `names ${join(dir, "missing.sh")}, which does not exist`],
      ["hooks[2].command", 4, expect.stringMatching(new RegExp(`^names ${join(dir, "plain.sh")}, which is not executable: make it so \\(chmod \\+x\\)`))],
      ["hooks[3].command", 5, `names ${bin}, which is not a file`],
    ]);
    // Without PATH, the child searches /usr/bin:/bin, and so does the check.
    const withoutPath = fileErrorOf(file, {}).issues;
    expect(withoutPath.map((issue) => issue.path)).toEqual(["hooks[0].command", "hooks[1].command", "hooks[2].command", "hooks[3].command", "hooks[5].command"]);
    expect(withoutPath[4]!.reason).toContain('names the program "decide", which is not an executable file in any folder of PATH (PATH is not set, so /usr/bin:/bin is searched)');
    // Found on PATH, as the child will find it; a shell script is the shell's to run.
    writeFileSync(file, ["hooks:", "  - command: [./check.sh]", "  - command: decide", "  - command: sh -c true", "  - command: 'no-such-decider-program || true'", "    shell: true"].join("\n"));
    expect(loadConfigFile(file, { PATH: `${bin}:${other}:/bin:/usr/bin` }).guests["default"]!.hooks).toHaveLength(4);
  });

  it("check-config shows a webhook URL with ${NAME} references as written, never what a variable filled in", () => {
    const dir = tempDir();
    const file = join(dir, "hook.yaml");
    writeFileSync(file, ["hooks:", "  - webhook: 'http://127.0.0.1:9000/decide?token=${HOOK_TOKEN}'", "    allowEnv: [HOOK_TOKEN]"].join("\n"));
    const config = loadConfigFile(file, { HOOK_TOKEN: "tok-in-query" });
    const hook = config.guests["default"]!.hooks![0]!;
    expect(hook.kind === "decider" && hook.decider.kind === "webhook" && hook.decider.url.href).toBe("http://127.0.0.1:9000/decide?token=tok-in-query");
    const described = describeConfig(config);
    expect(described).toContain("webhook: http://127.0.0.1:9000/decide?token=${HOOK_TOKEN}");
    expect(described).not.toContain("tok-in-query");
  });

  it("hooksTimeoutMs applies to the policies in hooks", () => {
    const dir = tempDir();
    writeFileSync(join(dir, "p.mjs"), policy);
    const ok = join(dir, "ok.yaml");
    writeFileSync(ok, ["hooksTimeoutMs: 50", "hooks:", "  - script: p.mjs"].join("\n"));
    expect(loadConfigFile(ok, {}).guests["default"]!.hooksTimeoutMs).toBe(50);
    const bad = join(dir, "bad.yaml");
    writeFileSync(bad, ["hooksTimeoutMs: 50", "hooks:", "  - opa: http://127.0.0.1:1/"].join("\n"));
    expect(() => loadConfigFile(bad, {})).toThrow(/hooksTimeoutMs only applies with hooksScript/);
  });
});
